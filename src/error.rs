//! The one error type of the helpers, and `check_nccl`, which turns an `ncclResult_t` into it.

use std::ffi::CStr;
use std::fmt;

use crate::bindings::{ncclGetErrorString, ncclGetLastError, ncclResult_t, CUresult};
use crate::version::NcclVersion;

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
        /// `ncclGetLastError(NULL)`: NCCL's detailed message for the last error it recorded. NCCL keeps one
        /// message per process, so with several threads it may describe another call's failure.
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
    /// The CUDA driver library could not be loaded, or lacks a function the headers promise.
    DriverUnavailable {
        /// The helper that needed the driver.
        context: String,
        /// What the dynamic loader said, and what to do.
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
                        NcclVersion::HEADERS
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
                     would fail or misbehave. Load libnccl {headers} or newer (LD_LIBRARY_PATH, or the RUNPATH set at \
                     build time), or rebuild against the {library} headers (NCCL_HOME=<its root>)."
                )
            }
        }
    }
}

impl std::error::Error for GpuError {}

/// `Ok(())` for `ncclSuccess`; otherwise an error naming `context`, the text of `ncclGetErrorString`, the
/// code, and `ncclGetLastError`'s message when NCCL has one. Codes the headers do not list are errors too.
#[inline]
pub fn check_nccl(result: ncclResult_t, context: &str) -> Result<(), GpuError> {
    if result == ncclResult_t::ncclSuccess {
        return Ok(());
    }
    Err(nccl_error(result, context))
}

/// The failure path of `check_nccl`, kept out of line so the success path inlines to one compare.
#[cold]
#[inline(never)]
fn nccl_error(result: ncclResult_t, context: &str) -> GpuError {
    // SAFETY: ncclGetErrorString returns a static string for any code; ncclGetLastError returns NCCL's
    // process-wide, NUL-terminated message buffer, which lives as long as the library. Another thread's
    // failure may rewrite that buffer while it is copied (the text may then be torn or another call's:
    // `last_error`'s doc says so); the buffer stays terminated, so the copy stays in bounds.
    let (text, last) = unsafe {
        (
            c_text(ncclGetErrorString(result)),
            c_text(ncclGetLastError(std::ptr::null_mut())),
        )
    };
    GpuError::Nccl {
        context: context.to_string(),
        code: result,
        text: text.unwrap_or_else(|| "no description".into()),
        last_error: last.filter(|s| !s.is_empty()),
    }
}

/// Copies a C string the library owns; `None` for NULL.
///
/// # Safety
/// `ptr` is NULL or points to a NUL-terminated string that lives for the duration of the call.
pub(crate) unsafe fn c_text(ptr: *const std::os::raw::c_char) -> Option<String> {
    // SAFETY: guaranteed by the caller.
    (!ptr.is_null()).then(|| {
        unsafe { CStr::from_ptr(ptr) }
            .to_string_lossy()
            .into_owned()
    })
}
