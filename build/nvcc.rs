//! Where nvcc is, for dependents that compile kernels against the headers found (NCCL's device API):
//! found as the headers are, and exported as `DEP_NCCL_NVCC`. The crate itself compiles no CUDA, so a
//! missing nvcc is no error here: a dependent that needs one says so.
//!
//! In order: the `NVCC` variable (the operator's choice); beside the CUDA headers found (a toolkit's
//! `bin/`, pip's `nvidia/cu13/bin/` where `nvidia-cuda-nvcc` 13 is installed with them; CUDA 12's pip
//! wheels have no nvcc, only ptxas); in this repository, what `ci/setup --nvcc` installed for the headers'
//! CUDA version (`.deps/nvcc-13.0/`). Not `PATH`: reading it would rebuild the bindings whenever it changes; the
//! kernel builder (`crates/nvcc`) looks there itself.

use std::path::{Path, PathBuf};

use crate::env;

/// nvcc for the CUDA headers in `cuda_include` (cuda.h's folder first) of `CUDA_VERSION` `cuda`; `deps`:
/// ci/setup's folder, in this repository.
pub fn find(cuda_include: &[PathBuf], cuda: u32, deps: Option<&Path>) -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = env::var("NVCC").map(PathBuf::from).into_iter().collect();
    if let Some(dir) = cuda_include.first() {
        // A toolkit's include/ or pip's cu13/include; a toolkit's targets/<target>/include.
        for up in ["..", "../../.."] {
            candidates.push(dir.join(up).join("bin/nvcc"));
        }
    }
    if let Some(deps) = deps {
        let (major, minor) = (cuda / 1000, cuda % 1000 / 10);
        candidates.push(deps.join(format!("nvcc-{major}.{minor}/nvidia/cu{major}/bin/nvcc")));
    }
    candidates
        .into_iter()
        .find(|nvcc| nvcc.is_file())
        .map(|nvcc| nvcc.canonicalize().unwrap_or(nvcc))
}
