//! [`check_cuda`]: a driver call's status as a `Result`, for either kind of driver call.

use super::loader::loaded;
use super::status::check_with;
use crate::bindings::CUresult;
use crate::error::GpuError;

/// What a driver call returns: a `CUresult`, or, from an optional function, `Result<CUresult, GpuError>`
/// (`Err` when the driver lacks it). [`check_cuda`] takes either.
pub trait CudaStatus {
    /// The call's `CUresult`, or why there is none.
    fn status(self) -> Result<CUresult, GpuError>;
}

impl CudaStatus for CUresult {
    #[inline]
    fn status(self) -> Result<CUresult, GpuError> {
        Ok(self)
    }
}

impl CudaStatus for Result<CUresult, GpuError> {
    #[inline]
    fn status(self) -> Result<CUresult, GpuError> {
        self
    }
}

/// `Ok(())` for `CUDA_SUCCESS`; otherwise [`GpuError::Cuda`] with `context`, the code, `cuGetErrorName`
/// and `cuGetErrorString` (named even where `cuInit` failed). Where the driver cannot be loaded at all,
/// the code is still the error's, named from cuda.h ([`CUresult::name`]), and the text says why the
/// driver is unavailable.
/// An optional function the driver lacks is that function's [`GpuError::DriverFunctionMissing`].
#[inline]
pub fn check_cuda(result: impl CudaStatus, context: &str) -> Result<(), GpuError> {
    let result = result.status()?;
    if result == CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    cuda_error(result, context)
}

/// The caller's code stays the error's code, named by the driver whenever it is loaded (even where
/// `cuInit` failed: the names need no initialised driver).
#[cold]
#[inline(never)]
fn cuda_error(result: CUresult, context: &str) -> Result<(), GpuError> {
    match loaded() {
        Ok(api) => check_with(api, result, context),
        Err(e) => Err(GpuError::Cuda {
            context: context.to_string(),
            code: result,
            name: result.name().unwrap_or("an unknown CUresult").to_string(),
            text: match e {
                GpuError::DriverUnavailable { reason, .. } => format!("no description: {reason}"),
                other => format!("no description: {other}"),
            },
        }),
    }
}
