//! [`GpuError`], the error of every helper (a deadline wait's [`WaitError`] converts into one), and
//! `check_nccl`, which turns an `ncclResult_t` into a `GpuError`.

use std::ffi::CStr;
use std::fmt;

use crate::bindings::{
    ncclGetErrorString, ncclGetLastError, ncclResult_t, CUresult, NCCL_VERSION_CODE,
};
use crate::nccl_version::NcclVersion;
use crate::watchdog::WaitError;

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
        /// `ncclGetLastError(NULL)`: NCCL's detailed message for the last error it recorded, best-effort.
        /// NCCL keeps one message per process and rewrites it under its own lock, which a caller cannot
        /// take: with several threads it may describe another call's failure, or be cut or mixed.
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
    /// The loaded libnccl is older than the nccl.h this crate was generated from.
    VersionSkew {
        /// The version of the headers the bindings come from.
        headers: NcclVersion,
        /// The version the loaded library reports (`ncclGetVersion`).
        library: NcclVersion,
        /// Where the loaded library lives, when the loader can tell.
        library_path: Option<String>,
    },
    /// A deadline wait gave up (see [`WaitError`]).
    Wait(Box<WaitError>),
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
                     (METRALE_NCCL_LIBRARY=<file or folder>), or call only what {library} has."
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
                     would fail. Load libnccl {headers} or newer (METRALE_NCCL_LIBRARY=<file or folder>; with feature \
                     `link`, LD_LIBRARY_PATH), rebuild against the {library} headers (NCCL_HOME=<its root>), or \
                     accept it with METRALE_NCCL_ALLOW_OLDER=1 (the calls it lacks then fail, naming the function)."
                )
            }
            GpuError::Wait(wait) => wait.fmt(f),
        }
    }
}

impl std::error::Error for GpuError {
    /// A wait's error is carried whole (`Display` and `source` are its own); the others come straight
    /// from a library's status and have nothing underneath.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            GpuError::Wait(wait) => wait.source(),
            _ => None,
        }
    }
}

/// `Ok(())` for `ncclSuccess`; otherwise an error naming `context`, the text of `ncclGetErrorString`, the
/// code, and `ncclGetLastError`'s message when NCCL has one (best-effort: see `GpuError::Nccl`). Codes
/// the headers do not list are errors too.
#[inline]
pub fn check_nccl(result: ncclResult_t, context: &str) -> Result<(), GpuError> {
    if result == ncclResult_t::ncclSuccess {
        return Ok(());
    }
    Err(nccl_error(result, context))
}

/// The size of NCCL's last-error buffer (`char ncclLastError[1024]` in NCCL's src/debug.cc), which
/// `ncclGetLastError(NULL)` returns: no copy reads past it, whatever another thread writes meanwhile.
const NCCL_LAST_ERROR_BYTES: usize = 1024;

/// The failure path of `check_nccl`, kept out of line so the success path inlines to one compare.
#[cold]
#[inline(never)]
pub(crate) fn nccl_error(result: ncclResult_t, context: &str) -> GpuError {
    // A call that could not reach the library (no libnccl, a refused one, a missing function).
    #[cfg(not(feature = "link"))]
    if let Some(error) = crate::loader::missing_error(result, context) {
        return error;
    }
    // SAFETY: ncclGetErrorString returns a static string for any code.
    let text = unsafe { c_text(ncclGetErrorString(result)) };
    // SAFETY: ncclGetLastError(NULL) returns NCCL's process-wide buffer (`char ncclLastError[1024]`,
    // src/debug.cc), which lives as long as the library; the copy reads at most its 1024 bytes, so it
    // never reads outside it. What holds beyond that, and what does not: NCCL rewrites the buffer
    // (vsnprintf under its private ncclDebugMutex) whenever a call of any thread fails, and a read during
    // that write is a data race, undefined by the C++ and Rust memory models; no read on this side
    // (volatile or atomic) removes it, and NCCL has no call that copies the text under its lock. It is
    // accepted, as by every program that prints ncclGetLastError, because on the targets this crate
    // builds for (x86_64, aarch64) a byte load racing a byte store yields some byte and cannot fault, and
    // nothing here assumes the bytes stable: each is read once, volatile (the compiler may neither re-read
    // nor reason about it), into a local array. The worst outcome is text that is cut, mixed or another
    // call's, which `last_error`'s doc says.
    let last =
        unsafe { c_text_bounded::<NCCL_LAST_ERROR_BYTES>(ncclGetLastError(std::ptr::null_mut())) };
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
    if ptr.is_null() {
        return None;
    }
    // SAFETY: not NULL, so a NUL-terminated string that lives for the call, as the caller promises.
    let text = unsafe { CStr::from_ptr(ptr) };
    Some(text.to_string_lossy().into_owned())
}

/// Copies the text of a C buffer of `N` bytes, up to its first NUL or its end; `None` for NULL. Another
/// thread may be writing the buffer (NCCL, under its own lock): each byte is read once, with a volatile
/// read, into a local copy, and no Rust reference ever points at the buffer. That bounds what a racing
/// write can do to the copy's text; it does not make the race defined (see `nccl_error`).
///
/// # Safety
/// `ptr` is NULL or points to `N` readable bytes that live for the duration of the call.
unsafe fn c_text_bounded<const N: usize>(ptr: *const std::os::raw::c_char) -> Option<String> {
    if ptr.is_null() {
        return None;
    }
    let mut copy = [0u8; N];
    for (i, byte) in copy.iter_mut().enumerate() {
        // SAFETY: i < N, and the caller promises N readable bytes.
        *byte = unsafe { ptr.cast::<u8>().add(i).read_volatile() };
        if *byte == 0 {
            break;
        }
    }
    let len = copy.iter().position(|&b| b == 0).unwrap_or(N);
    Some(String::from_utf8_lossy(&copy[..len]).into_owned())
}
