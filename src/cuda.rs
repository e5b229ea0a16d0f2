//! The CUDA driver, loaded at run time: build and CI machines have no `libcuda.so.1`, so nothing links
//! against it. The first helper that needs it loads it, resolves the table's functions, checks the
//! driver's CUDA major version and calls `cuInit`; every later call costs one atomic load.
//!
//! # The driver contract
//! - Required: the functions the helpers call ([`api::REQUIRED_FUNCTIONS`]). Each is older than every driver
//!   of the headers' CUDA major version (CUDA 12: R525 and newer; CUDA 13: R580 and newer), which the crate
//!   checks against cudaTypedefs.h when it compiles. A driver lacking one, or of an older CUDA major
//!   version than the headers, is [`GpuError::DriverUnavailable`]. A driver older than the headers' minor
//!   version is accepted, as CUDA's minor-version compatibility promises.
//! - Optional: everything else the table offers (graphs, memory copies, timing, …), resolved one by one.
//!   Their methods return `Result<CUresult, GpuError>`: calling one the driver lacks is
//!   [`GpuError::DriverFunctionMissing`], naming it and the CUDA version that introduced it, never a
//!   crash. [`check_cuda`] takes either kind of result. `cuEventElapsedTime` calls `cuEventElapsedTime_v2`
//!   (CUDA 12.8+) where the driver has it, else the original.
//!
//! # One table, never unloaded
//! Only [`driver`] builds a [`DriverApi`], once, and keeps it for the process's life: unloading a driver
//! whose functions ran is undefined behaviour, so no caller can load a table and drop it.
//! ```compile_fail,E0624
//! // SAFETY: none is needed: the call does not compile (`from_library` is the crate's own).
//! let library = unsafe { libloading::Library::new("libcuda.so.1") }.expect("libcuda");
//! let api = unsafe { metrale_gpu_sys::cuda::DriverApi::from_library(library) };
//! ```

use std::sync::{Mutex, OnceLock};

pub use crate::bindings::{
    CUcontext, CUdevice, CUdeviceptr, CUevent, CUevent_flags, CUgraph, CUgraphExec, CUresult,
    CUstream, CUstreamCaptureMode, CUstream_flags, CUDA_VERSION,
};
use crate::error::{c_text, CudaVersion, GpuError};

/// The driver's function table, generated around bindgen's declarations from cuda.h
/// (`build/driver_table.rs` lists the functions), and cuda.h's names of `CUresult` values.
pub mod api {
    #![allow(non_snake_case, missing_docs)]
    use crate::bindings::*;
    include!(concat!(env!("OUT_DIR"), "/cuda_driver.rs"));
}
pub use api::DriverApi;

// The contract's promise for the required functions: none is newer than the headers' CUDA major version.
const _: () = {
    let mut i = 0;
    while i < api::REQUIRED_FUNCTIONS.len() {
        if let Some(since) = api::REQUIRED_FUNCTIONS[i].1 {
            assert!(
                since <= CUDA_VERSION / 1000 * 1000,
                "a required driver function is newer than the headers' CUDA major version: make it optional"
            );
        }
        i += 1;
    }
};

impl std::fmt::Debug for DriverApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DriverApi").finish_non_exhaustive()
    }
}

impl DriverApi {
    /// The error for an optional function the loaded driver lacks.
    #[cold]
    fn missing(&self, function: &'static str, needs: Option<u32>) -> GpuError {
        let mut driver = 0;
        // SAFETY: writes one int through a valid pointer; needs no initialised driver.
        if unsafe { self.cuDriverGetVersion(&mut driver) } != CUresult::CUDA_SUCCESS {
            driver = 0; // the version it could not tell
        }
        GpuError::DriverFunctionMissing {
            function,
            needs,
            driver,
        }
    }
}

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

/// The file name the driver is loaded by; the dynamic loader searches its usual path.
pub const DRIVER_LIBRARY: &str = "libcuda.so.1";

/// The driver once loaded: kept for the process's life (a static is never dropped) whether or not `cuInit`
/// succeeded, since unloading a driver whose functions ran is not safe. `Err` only when loading or
/// resolving failed, before any of its functions ran.
static DRIVER: OnceLock<Result<Loaded, GpuError>> = OnceLock::new();

struct Loaded {
    api: DriverApi,
    /// `cuInit`'s outcome.
    init: Result<(), GpuError>,
}

/// The loaded and initialised driver, or why it is unavailable (no driver, a driver older than the
/// headers, or `cuInit` failing, e.g. no GPU). `context` names the caller in the error.
#[inline]
pub fn driver(context: &str) -> Result<&'static DriverApi, GpuError> {
    match DRIVER.get() {
        Some(Ok(Loaded { api, init: Ok(()) })) => Ok(api),
        _ => driver_slow(context),
    }
}

/// The first call (loading the driver), and every call once loading or initialising has failed.
#[cold]
#[inline(never)]
fn driver_slow(context: &str) -> Result<&'static DriverApi, GpuError> {
    match DRIVER.get_or_init(load) {
        Ok(Loaded { api, init: Ok(()) }) => Ok(api),
        Ok(Loaded { init: Err(e), .. }) | Err(e) => Err(with_context(e.clone(), context)),
    }
}

fn load() -> Result<Loaded, GpuError> {
    let unavailable = |reason: String| GpuError::DriverUnavailable {
        context: String::new(),
        reason,
    };
    // SAFETY: loading libcuda runs its initialisers, which have no preconditions.
    let library = unsafe { libloading::Library::new(DRIVER_LIBRARY) }.map_err(|e| {
        unavailable(format!(
            "cannot load {DRIVER_LIBRARY} ({e}). It ships with the NVIDIA kernel driver, not with the CUDA \
             toolkit or NCCL: on a GPU host, install the driver or add its directory to LD_LIBRARY_PATH; \
             on a machine without a GPU this is expected"
        ))
    })?;
    let headers = CudaVersion(CUDA_VERSION.into());
    // SAFETY: every symbol is looked up with the signature cuda.h declares for it. Nothing has been called
    // yet, so on failure the library may be unloaded.
    let api = unsafe { DriverApi::from_library(library) }.map_err(|(function, e)| {
        unavailable(format!(
            "{DRIVER_LIBRARY} lacks {function}, which every driver for CUDA {} has ({e}): it is not NVIDIA's \
             driver, or one older than the CUDA {headers} headers' major version; update the driver",
            CUDA_VERSION / 1000,
        ))
    })?;
    let mut driver = 0;
    // SAFETY: writes one int through a valid pointer; needs no initialised driver.
    let init = check_with(&api, unsafe { api.cuDriverGetVersion(&mut driver) }, "cuDriverGetVersion")
        .and_then(|()| {
            if driver / 1000 < CUDA_VERSION as i32 / 1000 {
                return Err(unavailable(format!(
                    "{DRIVER_LIBRARY} is a driver for CUDA {}, older than the major version of the CUDA \
                     {headers} headers this crate was built with: update the driver, or build against CUDA \
                     {} headers",
                    CudaVersion(driver.into()),
                    driver / 1000
                )));
            }
            // SAFETY: cuInit takes flags 0 and may be called any number of times.
            check_with(&api, unsafe { api.cuInit(0) }, "cuInit")
        });
    Ok(Loaded { api, init })
}

fn with_context(error: GpuError, context: &str) -> GpuError {
    match error {
        GpuError::DriverUnavailable { reason, .. } => GpuError::DriverUnavailable {
            context: context.into(),
            reason,
        },
        // The driver call that failed while loading (cuInit, cuDriverGetVersion), after the helper's name.
        GpuError::Cuda {
            context: call,
            code,
            name,
            text,
        } => GpuError::Cuda {
            context: format!("{context} ({call})"),
            code,
            name,
            text,
        },
        other => other,
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
    match DRIVER.get_or_init(load) {
        Ok(loaded) => check_with(&loaded.api, result, context),
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

fn check_with(api: &DriverApi, result: CUresult, context: &str) -> Result<(), GpuError> {
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
        api::CURESULT_NAMES
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

/// Primary contexts retained so far, by device ordinal (retained once, kept for the process's life,
/// as the CUDA runtime does).
static PRIMARY: Mutex<Vec<(CUdevice, usize)>> = Mutex::new(Vec::new());

/// Makes `device`'s primary context current on this thread (retaining it the first time), so that a
/// fresh thread can create streams, events and memory there. Returns the driver for the next call.
pub fn use_device(device: i32, context: &str) -> Result<&'static DriverApi, GpuError> {
    let api = driver(context)?;
    let ctx = primary_context(api, device, context)?;
    // SAFETY: ctx is a retained primary context, valid for the process's life.
    check_with(api, unsafe { api.cuCtxSetCurrent(ctx) }, context)?;
    Ok(api)
}

fn primary_context(api: &DriverApi, device: i32, context: &str) -> Result<CUcontext, GpuError> {
    let mut known = PRIMARY
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(&(_, ctx)) = known.iter().find(|(d, _)| *d == device) {
        return Ok(ctx as CUcontext);
    }
    let mut dev: CUdevice = 0;
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: both write one value through valid pointers; an out-of-range ordinal is an error code.
    unsafe {
        check_with(api, api.cuDeviceGet(&mut dev, device), context)?;
        check_with(api, api.cuDevicePrimaryCtxRetain(&mut ctx, dev), context)?;
    }
    known.push((device, ctx as usize));
    Ok(ctx)
}
