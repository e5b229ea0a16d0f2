//! NCCL's allocator (`ncclMemAlloc`): memory that suits buffer registration and symmetric windows.

use std::os::raw::c_void;

use crate::bindings::{ncclMemAlloc, ncclMemFree};
use crate::check::check_nccl;
use crate::cuda::use_device;
use crate::error::GpuError;

/// `ncclMemAlloc`: `size` bytes of device memory on `device` (its primary context is made current on
/// this thread first). nccl.h notes that the allocation may be larger than requested (granularity).
/// Free it with [`nccl_mem_free`].
pub fn nccl_mem_alloc(device: i32, size: usize) -> Result<*mut c_void, GpuError> {
    use_device(device, "nccl_mem_alloc")?;
    let mut ptr = std::ptr::null_mut();
    // SAFETY: writes one pointer through a valid pointer.
    check_nccl(unsafe { ncclMemAlloc(&mut ptr, size) }, "ncclMemAlloc")?;
    Ok(ptr)
}

/// `ncclMemFree` for a pointer from [`nccl_mem_alloc`].
///
/// # Safety
/// `ptr` came from [`nccl_mem_alloc`] (or `ncclMemAlloc`), is freed once, and no queued or running GPU
/// work still uses it.
pub unsafe fn nccl_mem_free(ptr: *mut c_void) -> Result<(), GpuError> {
    // Like every helper, say plainly when there is no driver (NCCL would report a CUDA error instead).
    crate::cuda::driver("nccl_mem_free")?;
    // SAFETY: guaranteed by the caller.
    check_nccl(unsafe { ncclMemFree(ptr) }, "ncclMemFree")
}
