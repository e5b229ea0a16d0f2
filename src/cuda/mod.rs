//! The CUDA driver, loaded at run time: build and CI machines have no `libcuda.so.1`, so nothing links
//! against it. The first helper that needs it loads it, resolves the table's functions, checks the
//! driver's CUDA major version and calls `cuInit`; every later call costs one atomic load.
//!
//! # The driver contract
//! - Required: the functions the helpers call ([`REQUIRED_FUNCTIONS`]). Each is older than every driver
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
//!
//! # Where each part lives
//! The driver's items are reachable here, at `cuda::`, and only here ([`check_cuda`] also at the old
//! `nccl::` path; the `CU…` types are [`bindings`](crate::bindings)' own, re-exported). The private files
//! behind it hold one concern each: the generated table (`table.rs`), loading the driver (`loader.rs`),
//! naming a `CUresult` (`status.rs`), [`check_cuda`] (`check.rs`), the primary contexts (`context.rs`)
//! and kernels of one's own, loaded from a compiled image and launched (`module.rs`: [`Module`]).
//!
//! [`GpuError::DriverUnavailable`]: crate::nccl::GpuError::DriverUnavailable
//! [`GpuError::DriverFunctionMissing`]: crate::nccl::GpuError::DriverFunctionMissing

mod check;
mod context;
mod loader;
mod module;
mod status;
mod table;

pub use crate::bindings::{
    CUcontext, CUdevice, CUdevice_attribute, CUdeviceptr, CUevent, CUevent_flags, CUfunction,
    CUgraph, CUgraphExec, CUmodule, CUresult, CUstream, CUstreamCaptureMode, CUstream_flags,
    CUDA_VERSION,
};
pub use check::{check_cuda, CudaStatus};
pub use context::use_device;
pub use loader::{driver, DRIVER_LIBRARY};
pub use module::{arg, Kernel, LaunchConfig, Module};
pub use table::{DriverApi, REQUIRED_FUNCTIONS};
