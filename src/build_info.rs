//! Where the build script found the headers and the library these bindings come from, and the headers'
//! NCCL version. Public as `version::build_info` and `NcclVersion::HEADERS`.

use crate::ffi::{NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH, NCCL_VERSION_CODE};
use crate::nccl_version::NcclVersion;

/// The NCCL version this crate release pins (its version's `+nccl-…`), which `ci/setup` installs and
/// the bundled snapshot was generated from.
pub const PINNED_NCCL: &str = env!("METRALE_PINNED_NCCL");
/// The directory holding the `nccl.h` the bindings were generated from.
pub const NCCL_INCLUDE: &str = env!("METRALE_NCCL_INCLUDE");
/// The directory libnccl was found in at build time: searched at run time last, while it still holds the
/// library, and never in secure-execution mode (with feature `link`: linked from, and the binaries'
/// RUNPATH).
pub const NCCL_LIB_DIR: &str = env!("METRALE_NCCL_LIB_DIR");
/// The discovery step that found NCCL (e.g. `NCCL_HOME=…`, `ci/setup's folder`).
pub const NCCL_FOUND_BY: &str = env!("METRALE_NCCL_FOUND_BY");
/// The directory holding the `cuda.h` the bindings were generated from.
pub const CUDA_INCLUDE: &str = env!("METRALE_CUDA_INCLUDE");
/// The discovery step that found the CUDA headers.
pub const CUDA_FOUND_BY: &str = env!("METRALE_CUDA_FOUND_BY");

impl NcclVersion {
    /// The version of the nccl.h these bindings were generated from.
    pub const HEADERS: NcclVersion = NcclVersion {
        major: NCCL_MAJOR,
        minor: NCCL_MINOR,
        patch: NCCL_PATCH,
    };
}

// The header's code and its parts must agree, or `code` and `from_code` are wrong.
const _: () = assert!(NcclVersion::HEADERS.code() == NCCL_VERSION_CODE);
