//! The two bindgen runs over `wrapper.h`, their output read by syn:
//! - `bindings.rs`: every `nccl*` function, type and `NCCL_*` constant, the shim's functions, and the
//!   `cuda.h` types the helpers use (feature `link`: linked against libnccl). With it, `facts.rs`: the
//!   layout of the structs the shim fills (`layout.rs`), what `bundled-bindings` checks the headers found
//!   against.
//! - `nccl_loaded.rs`: the same `nccl*` functions, loaded from libnccl at run time (`nccl_table.rs`).
//! - `nccl_functions.rs`: their names and types, the table the loader reads (`nccl_table.rs`).
//! - `cuda_driver.rs`: the driver table (`driver_table.rs`) around bindgen's declarations of the driver
//!   functions, with cuda.h's `CUresult` names.

use std::path::Path;

use metrale_gpu_sys_build::bindgen_panic;

use crate::{device, driver_table, layout, nccl_table, snapshot, Inputs};

/// The `cuda.h` types the helpers name (with what they refer to).
const DRIVER_TYPES: &str =
    "CUresult|CUdevice|CUcontext|CUstream|CUevent|CUdeviceptr|CUgraph|CUgraphExec\
    |CUstream_flags(_enum)?|CUevent_flags(_enum)?|CUstreamCaptureMode(_enum)?\
    |CUmodule|CUfunction|CUdevice_attribute(_enum)?";

/// Writes `bindings.rs`, `cuda_driver.rs` and `facts.rs`; on failure, one message saying what to check
/// (clang's own diagnostics precede it). A panic in bindgen becomes a message too (`bindgen_panic`).
pub fn generate(inputs: &Inputs) -> Result<(), String> {
    let location = std::sync::Arc::new(std::sync::Mutex::new(None));
    let previous = std::panic::take_hook();
    let seen = location.clone();
    std::panic::set_hook(Box::new(move |info| {
        let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
        *seen = info.location().map(|l| l.to_string());
    }));
    let result = std::panic::catch_unwind(|| run(inputs));
    std::panic::set_hook(previous);
    result.unwrap_or_else(|panic| {
        let why = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        let location = location.lock().unwrap_or_else(|p| p.into_inner()).take();
        Err(bindgen_panic::message(&why, location.as_deref()))
    })
}

fn run(inputs: &Inputs) -> Result<(), String> {
    let fields = layout::Fields::default();
    let nccl = base(inputs)
        .parse_callbacks(Box::new(fields.clone()))
        .header(inputs.shim_header.to_string_lossy())
        .allowlist_function("nccl.*")
        .allowlist_function("metrale_.*")
        .allowlist_type("nccl.*")
        .allowlist_var("NCCL_.*|METRALE_.*")
        .allowlist_type(DRIVER_TYPES)
        .allowlist_var("CUDA_VERSION")
        // Written by hand in src/: CUresult prints its name, the unique id its bytes in hex.
        .no_debug("cudaError_enum|ncclUniqueId");
    let mut bindings = write(nccl, &inputs.out_dir.join("bindings.rs"))?;
    // The filled structs' layouts, as clang evaluates them (for `facts.rs`).
    let probe = layout::Probe::new("nccl.h", inputs.filled, &fields)?;
    let probed = base(inputs)
        .header_contents(layout::Probe::NAME, &probe.header)
        .allowlist_var(layout::Probe::VARS)
        .generate()
        .map_err(bindgen_failed)?;
    let mut layouts = probe.read(&parse(&probed.to_string())?)?;
    // The device API's host functions and types (C++, NCCL 2.28+), and its filled structs' layouts.
    if let Some(device) = inputs.device {
        let (declared, device_layouts) = device::translate::generate(inputs, device, &bindings)?;
        bindings.items.extend(declared.items);
        layouts.extend(device_layouts);
    }
    // The same functions, loaded at run time (the default; feature `link` uses the declarations' own).
    let loaded = nccl_table::generate(&bindings)?;
    write_text(&inputs.out_dir.join("nccl_functions.rs"), &loaded.functions)?;
    write_text(&inputs.out_dir.join("nccl_loaded.rs"), &loaded.loaded)?;
    let facts = snapshot::facts(inputs.nccl, inputs.cuda, &layouts)?;
    write_text(&inputs.out_dir.join("facts.rs"), &facts)?;

    // Which CUDA version added each function: cudaTypedefs.h's `PFN_<function>_v<version>` typedefs, as
    // bindgen translates them. For the compile-time check that the required ones are no newer than the
    // headers' major version, and the errors naming what an older driver lacks.
    let typedefs = inputs
        .include_dirs
        .iter()
        .map(|d| d.join("cudaTypedefs.h"))
        .find(|path| path.is_file());
    if typedefs.is_none() {
        println!(
            "cargo:warning=metrale-gpu-sys found no cudaTypedefs.h beside cuda.h: the driver table cannot \
             say which CUDA version added a function, and the check that the required ones are old enough \
             is skipped (pip: nvidia-cuda-runtime has it)"
        );
    }
    // The driver's functions as bindgen declares them (with the types they name, so that aliases
    // resolve); the table around them is generated from these.
    let names = CuresultNames::default();
    let mut declarations = base(inputs)
        .parse_callbacks(Box::new(names.clone()))
        .allowlist_function(driver_table::symbols().collect::<Vec<_>>().join("|"))
        .allowlist_type(format!("PFN_({})_v[0-9]+", driver_table::bases().join("|")))
        .generate_comments(false)
        .layout_tests(false);
    if let Some(path) = &typedefs {
        declarations = declarations.header(path.to_string_lossy());
    }
    let declarations = declarations.generate().map_err(bindgen_failed)?;
    let table = driver_table::generate(&parse(&declarations.to_string())?, &names.collected())?;
    write_text(&inputs.out_dir.join("cuda_driver.rs"), &table)
}

/// bindgen's output as syn reads it.
pub fn parse(text: &str) -> Result<syn::File, String> {
    syn::parse_file(text).map_err(|e| format!("syn cannot parse bindgen's output: {e}"))
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
    /// The names and values seen, in cuda.h's order.
    fn collected(&self) -> Vec<(u64, String)> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

fn base(inputs: &Inputs) -> bindgen::Builder {
    options(inputs)
        .header(inputs.wrapper.to_string_lossy())
        .clang_args(["-x", "c", "-std=c11"])
}

/// The crate's bindgen options, without a header or a language (`base`'s, and the device API's C++ run).
pub fn options(inputs: &Inputs) -> bindgen::Builder {
    bindgen::Builder::default()
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
        // Statuses: an ignored ncclResult_t or CUresult (cuda.h's `cudaError_enum`) warns.
        .must_use_type("ncclResult_t|cudaError_enum")
        // Not the host's rustfmt: the same bytes everywhere, as the snapshot test compares them.
        .formatter(bindgen::Formatter::Prettyplease)
        .rust_target(rust_target())
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
}

fn rust_target() -> bindgen::RustTarget {
    // The crate's rust-version: generated code must compile there too.
    bindgen::RustTarget::stable(82, 0).unwrap_or_default()
}

pub fn bindgen_failed(e: bindgen::BindgenError) -> String {
    format!(
        "bindgen could not translate wrapper.h: {e}\n\
         The messages above are clang's. Usual causes: CUDA headers without crt/ (pip: nvidia-cuda-crt) or \
         without cccl/nv/target (pip: nvidia-cuda-cccl), or an nccl.h from another toolkit generation. \
         NVIDIA's wheels nvidia-cuda-runtime, nvidia-cuda-crt and nvidia-cuda-cccl of one version are a \
         matching set (in this repository, ci/setup installs them)."
    )
}

/// Generates and writes `path`; returns the file as syn reads it.
fn write(builder: bindgen::Builder, path: &Path) -> Result<syn::File, String> {
    let text = builder.generate().map_err(bindgen_failed)?.to_string();
    write_text(path, &text)?;
    parse(&text)
}

fn write_text(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}
