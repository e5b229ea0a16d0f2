//! Checked stream and event helpers: one driver call each, plus the status check.
//!
//! Handles are the driver's raw `CUstream` / `CUevent` (a `CUstream` is the `cudaStream_t` NCCL takes).
//! The helpers that take a handle are `unsafe`: the driver dereferences it, and a destroyed handle may
//! have been reused, so only the caller can promise it is live.
//!
//! # The handle contract
//! Every handle passed in came from the matching `create_*` helper (or the driver), has not been
//! destroyed, and is not destroyed by another thread during the call. A null `CUstream` is the legacy
//! default stream, which the driver accepts.

use crate::cuda::check_cuda;
use crate::cuda::{driver, use_device, CUevent, CUevent_flags, CUstream, CUstream_flags};
use crate::error::GpuError;

/// Creates a non-blocking stream on `device` (an ordinal, as in `cuDeviceGet`), first making the device's
/// primary context current on this thread; works from any thread.
pub fn create_stream(device: i32) -> Result<CUstream, GpuError> {
    let api = use_device(device, "create_stream")?;
    let mut stream: CUstream = std::ptr::null_mut();
    // SAFETY: writes one handle through a valid pointer; the flags are cuda.h's.
    let result =
        unsafe { api.cuStreamCreate(&mut stream, CUstream_flags::CU_STREAM_NON_BLOCKING.0) };
    check_cuda(result, "cuStreamCreate")?;
    Ok(stream)
}

/// Destroys a stream from [`create_stream`]; work already queued on it still completes.
///
/// # Safety
/// `stream` follows the [handle contract](crate::stream#the-handle-contract).
#[inline]
pub unsafe fn destroy_stream(stream: CUstream) -> Result<(), GpuError> {
    let api = driver("destroy_stream")?;
    // SAFETY: the caller upholds the module's handle contract.
    check_cuda(unsafe { api.cuStreamDestroy_v2(stream) }, "cuStreamDestroy")
}

/// Creates an event on `device` for ordering (`CU_EVENT_DISABLE_TIMING`: cheaper to record and wait on).
pub fn create_event(device: i32) -> Result<CUevent, GpuError> {
    let api = use_device(device, "create_event")?;
    let mut event: CUevent = std::ptr::null_mut();
    // SAFETY: writes one handle through a valid pointer; the flags are cuda.h's.
    let result = unsafe { api.cuEventCreate(&mut event, CUevent_flags::CU_EVENT_DISABLE_TIMING.0) };
    check_cuda(result, "cuEventCreate")?;
    Ok(event)
}

/// Destroys an event from [`create_event`].
///
/// # Safety
/// `event` follows the [handle contract](crate::stream#the-handle-contract).
#[inline]
pub unsafe fn destroy_event(event: CUevent) -> Result<(), GpuError> {
    let api = driver("destroy_event")?;
    // SAFETY: the caller upholds the module's handle contract.
    check_cuda(unsafe { api.cuEventDestroy_v2(event) }, "cuEventDestroy")
}

/// Records `event` at the current end of `stream`'s work.
///
/// # Safety
/// `event` and `stream` follow the [handle contract](crate::stream#the-handle-contract).
#[inline]
pub unsafe fn record_event(event: CUevent, stream: CUstream) -> Result<(), GpuError> {
    let api = driver("record_event")?;
    // SAFETY: the caller upholds the module's handle contract.
    check_cuda(unsafe { api.cuEventRecord(event, stream) }, "cuEventRecord")
}

/// Makes work queued on `stream` from now on wait until `event` (as last recorded) has completed, without
/// blocking the host.
///
/// # Safety
/// `stream` and `event` follow the [handle contract](crate::stream#the-handle-contract).
#[inline]
pub unsafe fn stream_wait_event(stream: CUstream, event: CUevent) -> Result<(), GpuError> {
    let api = driver("stream_wait_event")?;
    // SAFETY: the caller upholds the module's handle contract; flags 0 is the only documented value.
    check_cuda(
        unsafe { api.cuStreamWaitEvent(stream, event, 0) },
        "cuStreamWaitEvent",
    )
}

/// Blocks until all work queued on `stream` has completed, returning the first error it raised.
///
/// # Safety
/// `stream` follows the [handle contract](crate::stream#the-handle-contract).
#[inline]
pub unsafe fn sync_stream(stream: CUstream) -> Result<(), GpuError> {
    let api = driver("sync_stream")?;
    // SAFETY: the caller upholds the module's handle contract.
    check_cuda(
        unsafe { api.cuStreamSynchronize(stream) },
        "cuStreamSynchronize",
    )
}

/// `cuStreamQuery`, without waiting: `true` when the stream's work is done, `false` while it runs
/// (`CUDA_ERROR_NOT_READY`, 600), an error otherwise.
///
/// # Safety
/// `stream` follows the [handle contract](crate::stream#the-handle-contract).
#[inline]
pub unsafe fn stream_ready(stream: CUstream) -> Result<bool, GpuError> {
    let api = driver("stream_ready")?;
    // SAFETY: the caller upholds the module's handle contract.
    match unsafe { api.cuStreamQuery(stream) } {
        crate::cuda::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        result => check_cuda(result, "cuStreamQuery").map(|()| true),
    }
}
