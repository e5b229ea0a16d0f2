//! NCCL's detailed message for its last error (`ncclGetLastError`), read only as an explicit `unsafe`
//! step: NCCL keeps one message per process, in a buffer it rewrites under a lock of its own (which a
//! caller cannot take) whenever a call of any thread fails or warns. A read during such a write is a
//! data race, undefined behaviour whatever the reading side does, so no safe function reads it:
//! [`check_nccl`](crate::nccl::check_nccl) carries the code, its string and the context only, and
//! [`check_nccl_with_last_error`] adds the message where the caller promises that nothing writes it.

use crate::bindings::{ncclGetLastError, ncclResult_t};
use crate::error::{nccl_error, GpuError};

/// The size of NCCL's last-error buffer (`char ncclLastError[1024]` in NCCL's src/debug.cc, not in the
/// headers), which `ncclGetLastError(NULL)` returns: the copy reads no further, NUL or not.
pub(crate) const NCCL_LAST_ERROR_BYTES: usize = 1024;

/// [`check_nccl`](crate::nccl::check_nccl), and on failure NCCL's message for its last error
/// (`ncclGetLastError(NULL)`) in [`GpuError::Nccl`]'s `last_error` (`None` where it is empty). NCCL
/// records no message for some failures (`ncclGetVersion(NULL)`), so the message may still be an earlier
/// failure's of this thread.
///
/// # Safety
/// Nothing writes NCCL's message between the failed call and this check's return. NCCL writes it with
/// every warning of any thread, and reading it meanwhile is a data race: no other thread of the process
/// calls NCCL, and no communicator has work of NCCL's own running that may warn (a non-blocking init's or
/// a revoke's background job, a proxy thread that sees a peer fail). A process that drives NCCL from one
/// thread with blocking communicators, or serialises its NCCL calls under one lock while its
/// communicators are healthy, promises that.
pub unsafe fn check_nccl_with_last_error(
    result: ncclResult_t,
    context: &str,
) -> Result<(), GpuError> {
    if result == ncclResult_t::ncclSuccess {
        return Ok(());
    }
    let mut error = nccl_error(result, context);
    if let GpuError::Nccl { last_error, .. } = &mut error {
        // SAFETY: ncclGetLastError(NULL) returns NCCL's process-wide buffer, which lives as long as the
        // library, or NULL; no other thread writes it meanwhile, as the caller promises.
        *last_error = unsafe { last_error_text(ncclGetLastError(std::ptr::null_mut())) };
    }
    Err(error)
}

/// The text of NCCL's last-error buffer up to its first NUL (at most its size); `None` for NULL or an
/// empty message.
///
/// # Safety
/// `buffer` is NULL or NCCL's last-error buffer, which nothing writes during the call.
unsafe fn last_error_text(buffer: *const std::os::raw::c_char) -> Option<String> {
    if buffer.is_null() {
        return None;
    }
    // SAFETY: the buffer holds NCCL_LAST_ERROR_BYTES bytes and nothing writes it meanwhile (the caller's
    // promise); the slice is dropped before the call returns.
    let bytes = unsafe { std::slice::from_raw_parts(buffer.cast::<u8>(), NCCL_LAST_ERROR_BYTES) };
    let len = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    (len > 0).then(|| String::from_utf8_lossy(&bytes[..len]).into_owned())
}
