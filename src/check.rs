//! [`check_nccl`]: an `ncclResult_t` as a `Result`, with [`GpuError`]'s text for a failure. A status the
//! loader returned for a call that could not reach the library becomes the loader's own error.

use crate::bindings::{ncclGetErrorString, ncclResult_t};
use crate::c_text::c_text;
use crate::error::GpuError;

/// `Ok(())` for `ncclSuccess`; otherwise an error naming `context`, the code and the text of
/// `ncclGetErrorString` (a static string per code). Codes the headers do not list are errors too. It never
/// reads NCCL's process-wide last-error message, which another thread's failing call may be writing:
/// [`check_nccl_with_last_error`](crate::nccl::check_nccl_with_last_error) adds it where the caller can
/// promise that no other thread is.
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
pub(crate) fn nccl_error(result: ncclResult_t, context: &str) -> GpuError {
    // A call that could not reach the library (no libnccl, a refused one, a missing function).
    #[cfg(not(feature = "link"))]
    if let Some(error) = crate::loader::missing_error(result, context) {
        return error;
    }
    // SAFETY: ncclGetErrorString returns a static string for any code.
    let text = unsafe { c_text(ncclGetErrorString(result)) };
    GpuError::Nccl {
        context: context.to_string(),
        code: result,
        text: text.unwrap_or_else(|| "no description".into()),
        last_error: None,
    }
}
