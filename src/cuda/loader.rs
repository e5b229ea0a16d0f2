//! Loading the driver: once per process, on the first helper's call, and never unloaded. Every later call
//! costs one atomic load.

use std::sync::OnceLock;

use super::status::check_with;
use super::table::DriverApi;
use crate::bindings::CUDA_VERSION;
use crate::error::{CudaVersion, GpuError};

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

/// The driver's table whether or not `cuInit` succeeded (its error names need no initialised driver), or
/// why it could not be loaded.
pub(super) fn loaded() -> Result<&'static DriverApi, &'static GpuError> {
    DRIVER.get_or_init(load).as_ref().map(|loaded| &loaded.api)
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
