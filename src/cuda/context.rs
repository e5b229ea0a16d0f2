//! Primary contexts: retained once per device and kept for the process's life (as the CUDA runtime
//! does), so that any thread can make a device current before creating streams, events and memory there.

use std::sync::Mutex;

use super::loader::driver;
use super::status::check_with;
use super::table::DriverApi;
use crate::bindings::{CUcontext, CUdevice};
use crate::error::GpuError;

/// Primary contexts retained so far, by device ordinal.
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
