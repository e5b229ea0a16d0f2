//! [`GpuError`], the error of every helper: a leaf, straight from a library's status (what builds on it,
//! such as metrale-gpu-watchdog's wait errors, wraps it). The checks that make one from a status sit
//! above it (`check.rs`, `cuda/check.rs`).

use std::fmt;

use crate::ffi::{ncclResult_t, CUresult, NCCL_VERSION_CODE};
use crate::nccl_version::NcclVersion;

/// What went wrong in a helper, with enough to act on: the call, the code, the library's own text.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum GpuError {
    /// An NCCL call returned something other than `ncclSuccess`.
    Nccl {
        /// The call that failed, as the caller named it.
        context: String,
        /// The code NCCL returned; may be one the headers do not list (a newer library).
        code: ncclResult_t,
        /// `ncclGetErrorString(code)`.
        text: String,
        /// `ncclGetLastError(NULL)`: NCCL's detailed message for the last error it recorded. `None` from
        /// [`check_nccl`](crate::nccl::check_nccl), which never reads it; filled by the `unsafe`
        /// [`check_nccl_with_last_error`](crate::nccl::check_nccl_with_last_error), whose caller promises
        /// that no other thread is failing an NCCL call meanwhile (NCCL keeps one message per process and
        /// rewrites it under a lock of its own). It may still describe an earlier failure of this thread:
        /// NCCL records no message for some failures.
        last_error: Option<String>,
    },
    /// A CUDA driver call returned something other than `CUDA_SUCCESS`.
    Cuda {
        /// The call that failed.
        context: String,
        /// The code the driver returned.
        code: CUresult,
        /// `cuGetErrorName(code)`, e.g. `CUDA_ERROR_INVALID_VALUE`.
        name: String,
        /// `cuGetErrorString(code)`.
        text: String,
    },
    /// The CUDA driver library could not be loaded, or lacks a function every driver of the headers'
    /// CUDA major version has (see `cuda`'s driver contract).
    DriverUnavailable {
        /// The helper that needed the driver.
        context: String,
        /// What the dynamic loader said, and what to do.
        reason: String,
    },
    /// The loaded driver lacks an optional function (one the helpers do not need): it is older than the
    /// function.
    DriverFunctionMissing {
        /// The function's symbol, e.g. `cuEventElapsedTime_v2`.
        function: &'static str,
        /// The CUDA version that introduced it (`12080` for 12.8): a driver supporting this version or a
        /// newer one has it. `None` where the headers do not say.
        needs: Option<u32>,
        /// The CUDA version the loaded driver supports (`cuDriverGetVersion`).
        driver: i32,
    },
    /// No libnccl could be loaded (run-time loading, the default): every NCCL call fails with this.
    NcclUnavailable {
        /// The call that needed the library.
        context: String,
        /// Each place searched, in order, and what it gave; and what to do.
        search: String,
    },
    /// The loaded libnccl lacks a function the headers declare: it is older than the function.
    NcclFunctionMissing {
        /// The call that failed, as the caller named it.
        context: String,
        /// The function, e.g. `ncclCommGrow`.
        function: &'static str,
        /// The loaded library's version.
        library: NcclVersion,
        /// The loaded library's file.
        library_path: String,
    },
    /// A kernel image has no code the GPU can run (`cuModuleLoadData`: `CUDA_ERROR_NO_BINARY_FOR_GPU`, or
    /// PTX the driver cannot compile): it was built for another architecture.
    KernelImage {
        /// The call that failed.
        context: String,
        /// The device ordinal the image was loaded on.
        device: i32,
        /// The GPU's compute capability (major, minor), where the driver told it.
        compute_capability: Option<(i32, i32)>,
        /// The code the driver returned.
        code: CUresult,
    },
    /// A communicator that cannot serve NCCL's device API (`ncclCommQueryProperties`): no device
    /// communicator, window pointer or kernel of the device API works with it.
    DeviceApiUnsupported {
        /// The call that needed it.
        context: String,
        /// What the communicator's properties say, and what to do.
        reason: String,
    },
    /// The loaded libnccl is older than the nccl.h this crate was generated from.
    VersionSkew {
        /// The version of the headers the bindings come from.
        headers: NcclVersion,
        /// The version the loaded library reports (`ncclGetVersion`).
        library: NcclVersion,
        /// Where the loaded library lives, when the loader can tell.
        library_path: Option<String>,
    },
}

/// A CUDA version as `cuDriverGetVersion` and `CUDA_VERSION` encode it (`12080`), as `12.8`.
pub(crate) struct CudaVersion(pub(crate) i64);

impl fmt::Display for CudaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.0 / 1000, self.0 % 1000 / 10)
    }
}

impl fmt::Display for GpuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuError::Nccl {
                context,
                code,
                text,
                last_error,
            } => {
                write!(f, "{context} failed: NCCL error {} ({text})", code.0)?;
                if code.0 >= ncclResult_t::ncclNumResults.0 {
                    write!(
                        f,
                        " [code {} is unknown to the NCCL {} headers this crate was built with: the library is newer]",
                        code.0,
                        NcclVersion::from_code(NCCL_VERSION_CODE)
                    )?;
                }
                match last_error {
                    Some(last) => write!(f, "; NCCL's last error: {last}"),
                    None => Ok(()),
                }
            }
            GpuError::Cuda {
                context,
                code,
                name,
                text,
            } => {
                write!(f, "{context} failed: CUDA error {} {name} ({text})", code.0)
            }
            GpuError::DriverUnavailable { context, reason } => {
                write!(
                    f,
                    "{context} needs the CUDA driver, which is unavailable: {reason}"
                )
            }
            GpuError::DriverFunctionMissing {
                function,
                needs,
                driver,
            } => {
                let driver = CudaVersion((*driver).into());
                write!(f, "the loaded CUDA driver (CUDA {driver}) lacks {function}")?;
                match needs {
                    Some(needs) => write!(
                        f,
                        ", which needs a driver for CUDA {} or newer: update the driver",
                        CudaVersion((*needs).into())
                    ),
                    None => write!(f, ": update the driver"),
                }
            }
            GpuError::KernelImage {
                context,
                device,
                compute_capability,
                code,
            } => {
                write!(
                    f,
                    "{context} failed: CUDA error {} {code}: the kernel image has no code that device {device}",
                    code.0
                )?;
                match compute_capability {
                    Some((major, minor)) => write!(
                        f,
                        " (compute capability {major}.{minor}) can run. Build the kernel for it (nvcc \
                         -gencode arch=compute_{major}{minor},code=sm_{major}{minor}), or embed PTX for \
                         compute_{major}{minor} or older (code=compute_{major}{minor}) from a CUDA toolkit no \
                         newer than the driver"
                    ),
                    None => write!(
                        f,
                        " can run. Build the kernel for the GPU's architecture (nvcc -gencode \
                         arch=compute_XY,code=sm_XY; `nvidia-smi --query-gpu=compute_cap --format=csv` names it)"
                    ),
                }
            }
            GpuError::DeviceApiUnsupported { context, reason } => {
                write!(
                    f,
                    "{context}: this communicator cannot use NCCL's device API: {reason}"
                )
            }
            GpuError::NcclUnavailable { context, search } => {
                write!(f, "{context} needs libnccl, which is unavailable: {search}")
            }
            GpuError::NcclFunctionMissing {
                context,
                function,
                library,
                library_path,
            } => {
                let headers = NcclVersion::from_code(NCCL_VERSION_CODE);
                write!(
                    f,
                    "{context} failed: the loaded libnccl {library} ({library_path}) lacks {function}, which the \
                     nccl.h {headers} this crate was built with declares: {function} exists since an NCCL newer \
                     than {library} (and no newer than {headers}). Load libnccl {headers} or newer \
                     (METRALE_NCCL_LIBRARY=<its absolute path or folder>), or call only what {library} has."
                )
            }
            GpuError::VersionSkew {
                headers,
                library,
                library_path,
            } => {
                write!(f, "NCCL version skew: the loaded libnccl is {library}")?;
                if let Some(path) = library_path {
                    write!(f, " ({path})")?;
                }
                write!(
                    f,
                    ", older than the nccl.h {headers} this crate was built against; calls added after {library} \
                     would fail. Load libnccl {headers} or newer (METRALE_NCCL_LIBRARY=<its absolute path or \
                     folder>, or in LD_PRELOAD where one is preloaded; with feature `link`, LD_LIBRARY_PATH), \
                     rebuild against the {library} headers (NCCL_HOME=<its root>), or accept it with \
                     METRALE_NCCL_ALLOW_OLDER=1 (the calls it lacks then fail, naming the function)."
                )
            }
        }
    }
}

/// Every variant comes straight from a library's status or the loader: nothing underneath (`source` is
/// `None`).
impl std::error::Error for GpuError {}
