//! [`CudaContext`]: a thread's current CUDA context, made current on another thread that calls NCCL for
//! it (a bounded call's, a give-up's).

use metrale_gpu_sys::cuda::{self, check_cuda, CUcontext};
use metrale_gpu_sys::nccl::GpuError;

/// A thread's current CUDA context, to make current on a thread that calls NCCL in its stead: NCCL
/// allocates on the current device (`ncclCommGrow`'s pinned abort flag, a new rank's communicator), and
/// a thread that never set a context would use another device's.
#[derive(Clone, Copy, Debug)]
pub struct CudaContext(CUcontext);

// SAFETY: a CUDA context may be made current on any thread; this value never destroys it, and making
// it current is `unsafe` with the promise that it is alive.
unsafe impl Send for CudaContext {}

impl CudaContext {
    /// The calling thread's current context: `None` where it has none; an error where the CUDA driver
    /// cannot be loaded or the call fails.
    pub fn current() -> Result<Option<CudaContext>, GpuError> {
        let api = cuda::driver("the current CUDA context")?;
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: writes one handle through a valid pointer.
        check_cuda(unsafe { api.cuCtxGetCurrent(&mut ctx) }, "cuCtxGetCurrent")?;
        Ok((!ctx.is_null()).then_some(CudaContext(ctx)))
    }

    /// Makes it current on the calling thread.
    ///
    /// # Safety
    /// The context is alive: not destroyed since [`current`](Self::current) returned it (a primary
    /// context: still retained).
    pub unsafe fn make_current(self) -> Result<(), GpuError> {
        let api = cuda::driver("the current CUDA context")?;
        // SAFETY: a live context, as the caller promises.
        check_cuda(unsafe { api.cuCtxSetCurrent(self.0) }, "cuCtxSetCurrent")
    }
}
