//! [`Window`]: a buffer registered as a window of a communicator (`ncclCommWindowRegister`), deregistered
//! when dropped.

use std::ffi::{c_int, c_void};

use crate::bindings::{ncclCommWindowDeregister, ncclCommWindowRegister, ncclComm_t, ncclWindow_t};
use crate::check::check_nccl;
use crate::error::GpuError;

/// A registered window: the `ncclWindow_t` a kernel takes by value ([`Window::handle`]), deregistered
/// (`ncclCommWindowDeregister`) by [`Window::deregister`], or when dropped on any other path.
#[derive(Debug)]
pub struct Window {
    comm: ncclComm_t,
    window: ncclWindow_t,
}

impl Window {
    /// Registers `size` bytes at `buffer` as a window of `comm` with `flags` (`NCCL_WIN_COLL_SYMMETRIC`
    /// for symmetric memory, which the device API's LSA pointers need). Collective: every rank of `comm`
    /// registers its buffer of the same size, in the same order.
    ///
    /// # Safety
    /// `comm` is a live communicator that outlives the window (it is deregistered before `comm` is
    /// destroyed); `buffer` is device memory from `ncclMemAlloc` (or [`nccl_mem_alloc`]) of at least
    /// `size` bytes on `comm`'s device, freed only after the window is deregistered.
    ///
    /// [`nccl_mem_alloc`]: crate::nccl::nccl_mem_alloc
    pub unsafe fn register(
        comm: ncclComm_t,
        buffer: *mut c_void,
        size: usize,
        flags: c_int,
    ) -> Result<Window, GpuError> {
        let mut window: ncclWindow_t = std::ptr::null_mut();
        // SAFETY: the caller promises `comm` and the buffer; NCCL writes one handle.
        let result = unsafe { ncclCommWindowRegister(comm, buffer, size, &mut window, flags) };
        check_nccl(result, "ncclCommWindowRegister")?;
        Ok(Window { comm, window })
    }

    /// The window's handle, as a kernel takes it (by value) and `ncclGetLsaDevicePointer` reads it.
    pub fn handle(&self) -> ncclWindow_t {
        self.window
    }

    /// Deregisters the window, reporting how it went (dropping it does the same and ignores the status).
    /// Collective, like the registration.
    pub fn deregister(self) -> Result<(), GpuError> {
        let status = self.release();
        std::mem::forget(self);
        status
    }

    fn release(&self) -> Result<(), GpuError> {
        // SAFETY: the window is registered on `comm`, which `register`'s caller keeps alive until then;
        // it is deregistered once (`deregister` forgets the value, so drop does not run after it).
        let result = unsafe { ncclCommWindowDeregister(self.comm, self.window) };
        check_nccl(result, "ncclCommWindowDeregister")
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        // Nothing to report to on this path; `deregister` reports.
        let _ = self.release();
    }
}
