//! Compiles a CUDA C++ kernel that uses NCCL's device API (`nccl_device.h`) into a fatbin, from the build
//! script of a crate that depends on `metrale-gpu-sys`: with the NCCL and CUDA headers that crate was built
//! against and the nvcc its build found beside them (`DEP_NCCL_*`, which cargo gives only to the build
//! scripts of direct dependents), so the kernel and the host bindings agree on every struct.
//!
//! ```no_run
//! // build.rs of a crate with `metrale-gpu-sys` in [dependencies] and this crate in [build-dependencies]
//! let fatbin = metrale_gpu_nvcc::Fatbin::new("kernels/all_reduce.cu")
//!     .arch(90)
//!     .compile()
//!     .unwrap_or_else(|e| panic!("{e}"));
//! println!("cargo:rustc-env=ALL_REDUCE_FATBIN={}", fatbin.display());
//! // and in the crate: static IMAGE: &[u8] = include_bytes!(env!("ALL_REDUCE_FATBIN"));
//! ```
//!
//! nvcc is, in order: the `NVCC` variable, beside the CUDA headers metrale-gpu-sys found (a toolkit's
//! `bin/`, pip's `nvidia/cu13/bin/` from `nvidia-cuda-nvcc` with `nvidia-nvvm`), then `PATH`. The
//! architectures are `METRALE_CUDA_ARCHS` where set (`80,90`: the operator's choice wins), else the ones
//! asked for with [`Fatbin::arch`], else [`DEFAULT_ARCH`]; the fatbin holds each one's machine code and the
//! newest one's PTX, which a newer GPU's driver compiles.

use std::fmt;
use std::path::PathBuf;
use std::process::Command;

/// The architecture compiled for when none is asked: sm_90 (H100, H200).
pub const DEFAULT_ARCH: u32 = 90;
/// The variable that overrides the architectures: a comma-separated list of compute capabilities
/// without the dot (`80,90,100`).
pub const ARCHS_VAR: &str = "METRALE_CUDA_ARCHS";

/// A kernel source to compile into a fatbin.
#[derive(Debug, Clone)]
pub struct Fatbin {
    source: PathBuf,
    archs: Vec<u32>,
}

/// Why no fatbin was made, with what to do.
#[derive(Debug)]
pub enum Error {
    /// The headers metrale-gpu-sys was built against have no device API (NCCL older than 2.28), or this
    /// build script's crate does not depend on metrale-gpu-sys (no `DEP_NCCL_*`).
    NoDeviceApi(String),
    /// No nvcc was found.
    NoNvcc(String),
    /// An architecture that is not a number, from `METRALE_CUDA_ARCHS`.
    BadArch(String),
    /// nvcc ran and failed, or could not be run.
    Nvcc(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NoDeviceApi(why)
            | Error::NoNvcc(why)
            | Error::BadArch(why)
            | Error::Nvcc(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for Error {}

impl Fatbin {
    /// The kernel in `source` (a `.cu` file, relative to the crate's root as cargo runs build scripts).
    pub fn new(source: impl Into<PathBuf>) -> Fatbin {
        Fatbin {
            source: source.into(),
            archs: Vec::new(),
        }
    }

    /// Adds machine code for compute capability `arch` without the dot (`90` for sm_90).
    pub fn arch(mut self, arch: u32) -> Fatbin {
        self.archs.push(arch);
        self
    }

    /// Compiles the kernel into `OUT_DIR/<source's stem>.fatbin` and returns that path; declares the
    /// source and the variables read to cargo, so that a change rebuilds it.
    pub fn compile(&self) -> Result<PathBuf, Error> {
        println!("cargo:rerun-if-changed={}", self.source.display());
        let var = |name: &str| {
            println!("cargo:rerun-if-env-changed={name}");
            std::env::var(name).ok().filter(|v| !v.is_empty())
        };
        let (Some(nccl_include), Some(cuda_include), Some(std)) = (
            var("DEP_NCCL_INCLUDE"),
            var("DEP_NCCL_CUDA_INCLUDE"),
            var("DEP_NCCL_DEVICE_CXX_STD"),
        ) else {
            return Err(Error::NoDeviceApi(format!(
                "cannot compile {}: metrale-gpu-sys reports no NCCL device API (DEP_NCCL_DEVICE_CXX_STD is \
                 unset). Either its headers are older than NCCL 2.28 (found: {}), or this build script's \
                 crate does not depend on metrale-gpu-sys directly (cargo gives DEP_NCCL_* only to direct \
                 dependents): add it to [dependencies]",
                self.source.display(),
                var("DEP_NCCL_VERSION").unwrap_or_else(|| "none".into())
            )));
        };
        let nvcc = nvcc(var("DEP_NCCL_NVCC"), var("PATH")).ok_or_else(|| {
            let cuda = var("DEP_NCCL_CUDA_VERSION")
                .and_then(|v| v.parse::<u32>().ok())
                .map_or("the headers'".to_string(), |v| {
                    format!("{}.{}", v / 1000, v % 1000 / 10)
                });
            Error::NoNvcc(format!(
                "cannot compile {}: no nvcc beside the CUDA {cuda} headers metrale-gpu-sys found ({cuda_include}) \
                 nor on PATH. Install one of that CUDA version (a toolkit; for CUDA 13 also pip's nvidia-cuda-nvcc \
                 and nvidia-nvvm of the headers' version, in this repository `ci/setup --nvcc`), or set \
                 NVCC=<path of nvcc>",
                self.source.display()
            ))
        })?;
        let archs = match var(ARCHS_VAR) {
            Some(list) => parse_archs(&list)?,
            None if self.archs.is_empty() => vec![DEFAULT_ARCH],
            None => self.archs.clone(),
        };
        let out_dir = PathBuf::from(var("OUT_DIR").ok_or_else(|| {
            Error::Nvcc("OUT_DIR is unset: call compile() from a build script".into())
        })?);
        let stem = self
            .source
            .file_stem()
            .map_or("kernel".into(), |s| s.to_string_lossy().into_owned());
        let output = out_dir.join(format!("{stem}.fatbin"));
        let mut command = Command::new(&nvcc);
        command
            .arg(format!("-std={std}"))
            .arg("-fatbin")
            .args(gencode(&archs))
            .arg("-I")
            .arg(&nccl_include)
            .args(std::env::split_paths(&cuda_include).flat_map(|dir| ["-I".into(), dir]))
            .arg("-o")
            .arg(&output)
            .arg(&self.source);
        let shown = format!("{command:?}");
        let result = command
            .output()
            .map_err(|e| Error::Nvcc(format!("cannot run {}: {e}", nvcc.display())))?;
        if !result.status.success() {
            return Err(Error::Nvcc(format!(
                "nvcc failed ({}) on {}:\n{shown}\n{}{}",
                result.status,
                self.source.display(),
                String::from_utf8_lossy(&result.stdout),
                String::from_utf8_lossy(&result.stderr)
            )));
        }
        Ok(output)
    }
}

/// `DEP_NCCL_NVCC` (metrale-gpu-sys's find: `NVCC`, beside the headers), else `nvcc` on `path`.
fn nvcc(found: Option<String>, path: Option<String>) -> Option<PathBuf> {
    found.map(PathBuf::from).or_else(|| {
        std::env::split_paths(&path?)
            .map(|dir| dir.join("nvcc"))
            .find(|nvcc| nvcc.is_file())
    })
}

/// `80,90` as compute capabilities.
fn parse_archs(list: &str) -> Result<Vec<u32>, Error> {
    list.split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(|a| {
            a.trim_start_matches("sm_").parse::<u32>().map_err(|_| {
                Error::BadArch(format!(
                    "{ARCHS_VAR}={list:?}: {a:?} is not a compute capability without the dot (90 for sm_90)"
                ))
            })
        })
        .collect()
}

/// nvcc's `-gencode` flags: machine code for each architecture, and PTX for the newest.
fn gencode(archs: &[u32]) -> Vec<String> {
    let newest = archs.iter().copied().max().unwrap_or(DEFAULT_ARCH);
    let mut flags: Vec<String> = archs
        .iter()
        .map(|a| format!("-gencode=arch=compute_{a},code=sm_{a}"))
        .collect();
    flags.push(format!(
        "-gencode=arch=compute_{newest},code=compute_{newest}"
    ));
    flags
}

/// A fatbin's first bytes (fatbinary's magic, little-endian): what a test can check without a GPU.
pub const FATBIN_MAGIC: [u8; 4] = [0x50, 0xed, 0x55, 0xba];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn architectures_parse_and_become_gencode_flags() {
        assert_eq!(parse_archs("80, sm_90,").unwrap(), [80, 90]);
        assert!(matches!(parse_archs("9.0"), Err(Error::BadArch(_))));
        assert_eq!(
            gencode(&[80, 90]),
            [
                "-gencode=arch=compute_80,code=sm_80",
                "-gencode=arch=compute_90,code=sm_90",
                "-gencode=arch=compute_90,code=compute_90"
            ]
        );
    }

    #[test]
    fn nvcc_from_the_sys_build_wins_over_path() {
        assert_eq!(
            nvcc(Some("/x/bin/nvcc".into()), Some("/usr/bin".into())),
            Some(PathBuf::from("/x/bin/nvcc"))
        );
        assert_eq!(nvcc(None, Some("/nonexistent-dir".into())), None);
    }
}
