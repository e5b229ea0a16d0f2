//! Kernels of one's own: a compiled image (a cubin, a fatbin, or PTX) loaded as a module through the
//! driver table (`cuModuleLoadData`), its functions (`cuModuleGetFunction`), and their launches
//! (`cuLaunchKernel`). An image with no code for the GPU is [`GpuError::KernelImage`], naming the GPU's
//! architecture and how to build for it.

use std::ffi::{c_void, CStr};
use std::marker::PhantomData;

use super::check::check_cuda;
use super::context::use_device;
use super::table::DriverApi;
use crate::bindings::{CUdevice, CUdevice_attribute, CUfunction, CUmodule, CUresult, CUstream};
use crate::error::GpuError;

/// A loaded module: unloaded when dropped (`cuModuleUnload`), after every launch of its functions that
/// was queued has been made (a [`Kernel`] borrows it).
#[derive(Debug)]
pub struct Module {
    module: CUmodule,
    device: i32,
}

/// The `CUresult`s of an image the GPU cannot run: no code for its architecture, or PTX of a newer
/// toolkit than the driver's.
const NOT_FOR_THIS_GPU: [CUresult; 3] = [
    CUresult::CUDA_ERROR_NO_BINARY_FOR_GPU,
    CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
    CUresult::CUDA_ERROR_INVALID_PTX,
];

impl Module {
    /// Loads `image` on `device` (its primary context made current on this thread first). The image is
    /// copied to 8-byte-aligned memory first: `include_bytes!` gives no alignment, and the driver reads
    /// the image's headers in place.
    ///
    /// # Safety
    /// `image` is what nvcc, ptxas or fatbinary wrote: a cubin or fatbin, or PTX text ending in a NUL byte.
    /// The driver reads it by its own headers (sizes and offsets inside it), so bytes of another kind
    /// may be read past their end.
    pub unsafe fn load(device: i32, image: &[u8]) -> Result<Module, GpuError> {
        let api = use_device(device, "Module::load")?;
        let mut aligned = vec![0u64; image.len().div_ceil(8)];
        // SAFETY: `aligned` holds at least `image.len()` bytes; the two do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(image.as_ptr(), aligned.as_mut_ptr().cast(), image.len())
        };
        let mut module: CUmodule = std::ptr::null_mut();
        // SAFETY: writes one handle; the image is what the caller promises, copied and aligned.
        let result = unsafe { api.cuModuleLoadData(&mut module, aligned.as_ptr().cast()) }?;
        if NOT_FOR_THIS_GPU.contains(&result) {
            return Err(kernel_image(api, device, result, "cuModuleLoadData"));
        }
        check_cuda(result, "cuModuleLoadData")?;
        Ok(Module { module, device })
    }

    /// The kernel `name` (an `extern "C" __global__` function of the image), or the driver's
    /// `CUDA_ERROR_NOT_FOUND` naming it.
    pub fn function(&self, name: &CStr) -> Result<Kernel<'_>, GpuError> {
        let api = use_device(self.device, "Module::function")?;
        let mut function: CUfunction = std::ptr::null_mut();
        // SAFETY: the module is loaded; writes one handle; `name` is NUL-terminated.
        let result = unsafe { api.cuModuleGetFunction(&mut function, self.module, name.as_ptr()) };
        check_cuda(result, &format!("cuModuleGetFunction({name:?})"))?;
        Ok(Kernel {
            function,
            device: self.device,
            _module: PhantomData,
        })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // Nothing to report to: a failed unload leaves the module loaded until the context ends.
        if let Ok(api) = use_device(self.device, "Module::drop") {
            // SAFETY: the module is loaded and no Kernel of it is alive (they borrow it).
            let _ = unsafe { api.cuModuleUnload(self.module) };
        }
    }
}

/// A kernel of a loaded [`Module`].
#[derive(Debug, Clone, Copy)]
pub struct Kernel<'m> {
    function: CUfunction,
    device: i32,
    _module: PhantomData<&'m Module>,
}

/// How a kernel is launched: its grid and blocks (x, y, z), and its dynamic shared memory in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in the grid.
    pub grid: [u32; 3],
    /// Threads per block.
    pub block: [u32; 3],
    /// Dynamic shared memory per block, in bytes.
    pub shared_bytes: u32,
}

impl Kernel<'_> {
    /// Queues the kernel on `stream` (`cuLaunchKernel`). `args` holds one pointer per kernel parameter, in
    /// order, each to a value of that parameter's type (the driver copies the values; they need not
    /// outlive the call).
    ///
    /// # Safety
    /// `args` matches the kernel's parameter list, count and types (a `ncclDevComm` passed as the kernel
    /// takes it, by value); `stream` belongs to the module's device and follows the [handle
    /// contract](crate::stream#the-handle-contract); whatever the kernel reads or writes is valid until
    /// the launch completes.
    pub unsafe fn launch(
        &self,
        config: &LaunchConfig,
        stream: CUstream,
        args: &[*const c_void],
    ) -> Result<(), GpuError> {
        let api = use_device(self.device, "Kernel::launch")?;
        let [gx, gy, gz] = config.grid;
        let [bx, by, bz] = config.block;
        // SAFETY: the caller promises the arguments and the stream; the driver only reads `args` (its C
        // type is `void **` without const).
        let result = unsafe {
            api.cuLaunchKernel(
                self.function,
                gx,
                gy,
                gz,
                bx,
                by,
                bz,
                config.shared_bytes,
                stream,
                args.as_ptr().cast_mut().cast(),
                std::ptr::null_mut(),
            )
        }?;
        check_cuda(result, "cuLaunchKernel")
    }
}

/// The pointer [`Kernel::launch`] takes for one argument.
pub fn arg<T>(value: &T) -> *const c_void {
    (value as *const T).cast()
}

/// [`GpuError::KernelImage`] for `device` (its context current), with its compute capability where the
/// driver tells it.
#[cold]
fn kernel_image(api: &DriverApi, device: i32, code: CUresult, context: &str) -> GpuError {
    let mut handle: CUdevice = 0;
    // SAFETY: writes one handle: the current context's device.
    let current = unsafe { api.cuCtxGetDevice(&mut handle) };
    let attribute = |attribute: CUdevice_attribute| {
        if current != Ok(CUresult::CUDA_SUCCESS) {
            return None;
        }
        let mut value = 0;
        // SAFETY: writes one int; an invalid device or attribute is an error code.
        match unsafe { api.cuDeviceGetAttribute(&mut value, attribute, handle) } {
            Ok(CUresult::CUDA_SUCCESS) => Some(value),
            _ => None,
        }
    };
    let major = attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    let minor = attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    GpuError::KernelImage {
        context: context.to_string(),
        device,
        compute_capability: major.zip(minor),
        code,
    }
}
