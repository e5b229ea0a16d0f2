//! `CUresult` named: by cuda.h's list (no driver needed), and as [`GpuError::Cuda`] with the loaded
//! driver's `cuGetErrorName` and `cuGetErrorString`.

use super::table::{DriverApi, CURESULT_NAMES};
use crate::bindings::CUresult;
use crate::c_text::c_text;
use crate::error::GpuError;

/// `Ok(())` for `CUDA_SUCCESS`; otherwise [`GpuError::Cuda`] with `context`, the code, and the driver's
/// name and description of it (or placeholders for a code the driver does not know).
pub(super) fn check_with(api: &DriverApi, result: CUresult, context: &str) -> Result<(), GpuError> {
    if result == CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let (mut name, mut text) = (std::ptr::null(), std::ptr::null());
    // SAFETY: both write a pointer to a static string, or fail (and leave NULL) for a code they do not
    // know; the pointer is read only after a success.
    let (name, text) = unsafe {
        let named = (api.cuGetErrorName)(result, &mut name) == CUresult::CUDA_SUCCESS;
        let described = (api.cuGetErrorString)(result, &mut text) == CUresult::CUDA_SUCCESS;
        (
            named.then(|| c_text(name)).flatten(),
            described.then(|| c_text(text)).flatten(),
        )
    };
    Err(GpuError::Cuda {
        context: context.to_string(),
        code: result,
        name: name.unwrap_or_else(|| "an unknown CUresult".into()),
        text: text.unwrap_or_else(|| "no description".into()),
    })
}

impl CUresult {
    /// The name cuda.h gives this code (`CUDA_ERROR_OUT_OF_MEMORY`), `None` for a code it does not list.
    pub fn name(self) -> Option<&'static str> {
        CURESULT_NAMES
            .iter()
            .find(|(value, _)| *value == self.0)
            .map(|(_, name)| *name)
    }
}

/// `CUresult(CUDA_ERROR_OUT_OF_MEMORY = 2)`; `CUresult(12345)` for a code cuda.h does not list.
impl std::fmt::Debug for CUresult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.name() {
            Some(name) => write!(f, "CUresult({name} = {})", self.0),
            None => write!(f, "CUresult({})", self.0),
        }
    }
}

/// The name alone (`CUDA_ERROR_OUT_OF_MEMORY`), or `CUresult 12345` for a code cuda.h does not list.
impl std::fmt::Display for CUresult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "CUresult {}", self.0),
        }
    }
}
