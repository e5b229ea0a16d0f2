//! The two bindgen runs over `wrapper.h`:
//! - `bindings.rs`: every `nccl*` function, type and `NCCL_*` constant, the shim's functions, and the
//!   `cuda.h` types the helpers use; linked against libnccl.
//! - `cuda_driver.rs`: the `cuda.h` functions the helpers call, as a table loaded from libcuda.so.1 at run
//!   time (build and CI machines have no driver). It names types from the first file, which it `use`s.

use std::path::{Path, PathBuf};

/// The driver functions the helpers, tests and examples call, by the symbol cuda.h binds them to: its
/// `#define cuFoo cuFoo_v2` renames apply before bindgen sees a name, so the suffix is part of the ABI.
const DRIVER_FUNCTIONS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuDeviceGet",
    "cuDeviceGetCount",
    "cuDeviceGetName",
    "cuDevicePrimaryCtxRetain",
    "cuCtxSetCurrent",
    "cuCtxGetCurrent",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamQuery",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuEventElapsedTime_v2",
    "cuMemGetInfo_v2",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "cuMemsetD8_v2",
    "cuMemsetD8Async",
    "cuGraphInstantiateWithFlags",
    "cuGraphLaunch",
    "cuGraphDestroy",
    "cuGraphExecDestroy",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
];

/// The `cuda.h` types the helpers name (with what they refer to).
const DRIVER_TYPES: &str =
    "CUresult|CUdevice|CUcontext|CUstream|CUevent|CUdeviceptr|CUgraph|CUgraphExec\
    |CUstream_flags(_enum)?|CUevent_flags(_enum)?|CUstreamCaptureMode(_enum)?";

pub struct Inputs<'a> {
    pub wrapper: &'a Path,
    pub shim_header: &'a Path,
    pub include_dirs: &'a [PathBuf],
    pub out_dir: &'a Path,
}

/// Writes both files; on failure, one message saying what to check (clang's own diagnostics precede it).
pub fn generate(inputs: &Inputs) -> Result<(), String> {
    let nccl = base(inputs)
        .header(inputs.shim_header.to_string_lossy())
        .allowlist_function("nccl.*")
        .allowlist_function("metrale_.*")
        .allowlist_type("nccl.*")
        .allowlist_var("NCCL_.*|METRALE_.*")
        .allowlist_type(DRIVER_TYPES)
        .allowlist_var("CUDA_VERSION")
        // Written by hand in src/: CUresult prints its name, the unique id its bytes in hex.
        .no_debug("cudaError_enum|ncclUniqueId");
    write(nccl, &inputs.out_dir.join("bindings.rs"))?;

    let names = CuresultNames::default();
    let driver = base(inputs)
        .parse_callbacks(Box::new(names.clone()))
        .allowlist_function(DRIVER_FUNCTIONS.join("|"))
        .allowlist_recursively(false)
        .dynamic_library_name("DriverApi")
        .dynamic_link_require_all(true)
        .generate_comments(false)
        .layout_tests(false);
    let path = inputs.out_dir.join("cuda_driver.rs");
    write(driver, &path)?;
    append(&path, &names.table())
}

/// Collects `cudaError_enum`'s names and values as bindgen parses cuda.h, for `CUresult`'s `Debug`.
#[derive(Debug, Default, Clone)]
struct CuresultNames(std::sync::Arc<std::sync::Mutex<Vec<(u64, String)>>>);

impl bindgen::callbacks::ParseCallbacks for CuresultNames {
    fn enum_variant_name(
        &self,
        enum_name: Option<&str>,
        name: &str,
        value: bindgen::callbacks::EnumVariantValue,
    ) -> Option<String> {
        use bindgen::callbacks::EnumVariantValue::{Signed, Unsigned};
        let value = match value {
            Unsigned(v) => Some(v),
            Signed(v) => u64::try_from(v).ok(),
            _ => None,
        };
        if let (Some(value), Some(true)) = (value, enum_name.map(|e| e.ends_with("cudaError_enum")))
        {
            let mut names = self.0.lock().unwrap_or_else(|p| p.into_inner());
            if !names.iter().any(|(_, n)| n == name) {
                names.push((value, name.to_string()));
            }
        }
        None
    }
}

impl CuresultNames {
    fn table(&self) -> String {
        let names = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let rows: String = names
            .iter()
            .map(|(value, name)| format!("    ({value}, \"{name}\"),\n"))
            .collect();
        format!(
            "\n/// `cudaError_enum`'s values and names, as cuda.h lists them (for `CUresult`'s `Debug`).\n\
             pub const CURESULT_NAMES: &[(::std::os::raw::c_uint, &str)] = &[\n{rows}];\n"
        )
    }
}

fn append(path: &Path, text: &str) -> Result<(), String> {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .and_then(|mut file| file.write_all(text.as_bytes()))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

fn base(inputs: &Inputs) -> bindgen::Builder {
    bindgen::Builder::default()
        .header(inputs.wrapper.to_string_lossy())
        .clang_args(["-x", "c", "-std=c11"])
        // nccl.h documents its API in plain /* */ comments: carry them over as rustdoc.
        .clang_arg("-fparse-all-comments")
        .clang_args(
            inputs
                .include_dirs
                .iter()
                .map(|d| format!("-I{}", d.display())),
        )
        // Every C enum becomes a transparent newtype: a value the header does not list (a newer
        // library's status, a custom reduction op) is then a value, never undefined behaviour.
        .default_enum_style(bindgen::EnumVariation::NewType {
            is_bitfield: false,
            is_global: false,
        })
        .derive_default(false)
        .derive_eq(true)
        .derive_hash(true)
        .layout_tests(true)
        .merge_extern_blocks(true)
        .rust_target(rust_target())
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
}

fn rust_target() -> bindgen::RustTarget {
    // The crate's rust-version: generated code must compile there too.
    bindgen::RustTarget::stable(82, 0).unwrap_or_default()
}

fn write(builder: bindgen::Builder, path: &Path) -> Result<(), String> {
    let bindings = builder.generate().map_err(|e| {
        format!(
            "bindgen could not translate wrapper.h: {e}\n\
             The messages above are clang's. Usual causes: CUDA headers without crt/ (pip: nvidia-cuda-crt) or \
             without cccl/nv/target (pip: nvidia-cuda-cccl), or an nccl.h from another toolkit generation. \
             ci/setup installs a matching set."
        )
    })?;
    bindings
        .write_to_file(path)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}
