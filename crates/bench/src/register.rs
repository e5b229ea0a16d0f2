//! `-R`, with nccl-tests' meaning (its `src/common.cu`, 2.19.6): both buffers of every GPU come from
//! `ncclMemAlloc` in every mode; `-R 1` registers each with `ncclCommRegister`, `-R 2` with
//! `ncclCommWindowRegister(..., NCCL_WIN_COLL_SYMMETRIC)`, each over the whole allocation, inside one
//! `ncclGroupStart/End` for all GPUs (a window registration is collective: one thread driving every rank
//! must group it). They are deregistered before the communicators are destroyed.

use std::os::raw::c_void;

use metrale_gpu_sys::nccl::*;

use crate::args::Register;

/// One registered buffer.
pub enum Handle {
    /// From `ncclCommRegister` (`-R 1`).
    Local(*mut c_void),
    /// From `ncclCommWindowRegister` (`-R 2`).
    Window(ncclWindow_t),
}

impl Register {
    /// The header line that says how the buffers were obtained and registered.
    pub fn describe(self) -> &'static str {
        match self {
            Register::Off => "ncclMemAlloc, not registered (-R 0)",
            Register::Local => "ncclMemAlloc, registered with ncclCommRegister (-R 1)",
            Register::Symmetric => {
                "ncclMemAlloc, registered with ncclCommWindowRegister(NCCL_WIN_COLL_SYMMETRIC) (-R 2)"
            }
        }
    }
}

/// Registers `bytes` at `buffer` with `comm` as `mode` asks; `None` for `-R 0`. Call it between
/// `ncclGroupStart` and `ncclGroupEnd` when the process drives several ranks.
///
/// # Safety
/// `comm` is a live communicator and `buffer` an `ncclMemAlloc` allocation of at least `bytes` bytes on
/// its device, which outlives the registration.
pub unsafe fn register(
    mode: Register,
    comm: ncclComm_t,
    buffer: *mut c_void,
    bytes: usize,
) -> Result<Option<Handle>, GpuError> {
    match mode {
        Register::Off => Ok(None),
        Register::Local => {
            let mut handle = std::ptr::null_mut();
            // SAFETY: guaranteed by the caller; NCCL writes one handle.
            let r = unsafe { ncclCommRegister(comm, buffer, bytes, &mut handle) };
            check_nccl(r, "ncclCommRegister")?;
            Ok(Some(Handle::Local(handle)))
        }
        Register::Symmetric => {
            let mut window: ncclWindow_t = std::ptr::null_mut();
            let flags = NCCL_WIN_COLL_SYMMETRIC as i32;
            // SAFETY: guaranteed by the caller; NCCL writes one window handle.
            let r = unsafe { ncclCommWindowRegister(comm, buffer, bytes, &mut window, flags) };
            check_nccl(r, "ncclCommWindowRegister")?;
            Ok(Some(Handle::Window(window)))
        }
    }
}

/// Releases a registration made by [`register`] with the same communicator.
///
/// # Safety
/// `comm` is the live communicator `handle` was registered with, no queued GPU work uses the buffer, and
/// `handle` is released once.
pub unsafe fn deregister(comm: ncclComm_t, handle: &Handle) -> Result<(), GpuError> {
    match *handle {
        Handle::Local(h) => {
            // SAFETY: guaranteed by the caller.
            let r = unsafe { ncclCommDeregister(comm, h) };
            check_nccl(r, "ncclCommDeregister")
        }
        Handle::Window(w) => {
            // SAFETY: guaranteed by the caller.
            let r = unsafe { ncclCommWindowDeregister(comm, w) };
            check_nccl(r, "ncclCommWindowDeregister")
        }
    }
}
