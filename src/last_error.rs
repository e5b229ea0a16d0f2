//! NCCL's detailed message for its last error (`ncclGetLastError`), read only as an explicit `unsafe`
//! step: NCCL keeps one message per process, in a buffer it rewrites under a lock of its own (which a
//! caller cannot take) whenever a call of any thread fails or warns. A read during such a write is a
//! data race, undefined behaviour whatever the reading side does, so no safe function reads it:
//! [`check_nccl`](crate::nccl::check_nccl) carries the code, its string and the context only, and
//! [`check_nccl_with_last_error`] adds the message where the caller promises that nothing writes it.

use crate::bindings::{ncclGetLastError, ncclResult_t};
use crate::c_text::c_text_within;
use crate::check::nccl_error;
use crate::error::GpuError;

/// The size of NCCL's last-error buffer (`char ncclLastError[1024]` in NCCL's src/debug.cc, not in the
/// headers), which `ncclGetLastError(NULL)` returns: the copy reads up to its first NUL, and never
/// further than this, NUL or not.
const NCCL_LAST_ERROR_BYTES: usize = 1024;

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
        // SAFETY: ncclGetLastError(NULL) returns NCCL's process-wide buffer (a NUL-terminated text within
        // its NCCL_LAST_ERROR_BYTES bytes, living as long as the library), a static string of the loader
        // or of a library standing in for NCCL, or NULL; no other thread writes it meanwhile, as the
        // caller promises. The copy reads no byte past the first NUL.
        *last_error = unsafe {
            c_text_within(
                ncclGetLastError(std::ptr::null_mut()),
                NCCL_LAST_ERROR_BYTES,
            )
        };
    }
    Err(error)
}
