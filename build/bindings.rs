//! The two bindgen runs over `wrapper.h`:
//! - `bindings.rs`: every `nccl*` function, type and `NCCL_*` constant, the shim's functions, and the
//!   `cuda.h` types the helpers use; linked against libnccl.
//! - `cuda_driver.rs`: the driver table, loaded from libcuda.so.1 at run time (build and CI machines have
//!   no driver), generated here around bindgen's declarations of the driver functions: required functions
//!   fail the load when missing, optional ones fail only their own call (the driver contract). It names
//!   types from the first file, which it `use`s, and carries cuda.h's `CUresult` names.

use std::path::{Path, PathBuf};

/// The driver functions the helpers need, by the symbol cuda.h binds them to (its `#define cuFoo cuFoo_v2`
/// renames apply before bindgen sees a name, so the suffix is part of the ABI). Required: loading fails
/// without them, and each is older than every driver of the headers' CUDA major version (the crate checks
/// that against cudaTypedefs.h when it compiles), so a driver older than the headers' minor version loads.
const REQUIRED_DRIVER_FUNCTIONS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuDeviceGet",
    "cuDevicePrimaryCtxRetain",
    "cuCtxSetCurrent",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamQuery",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventRecord",
];

/// The other driver functions the table offers (what tests, examples and users call), each resolved on its
/// own: calling one the driver lacks is an error naming it. A method's name, then the symbols tried in
/// order; the first the headers declare gives the signature. `cuEventElapsedTime_v2` (CUDA 12.8+) falls
/// back to `cuEventElapsedTime`, whose signature cudaTypedefs.h gives as the same.
const OPTIONAL_DRIVER_FUNCTIONS: &[(&str, &[&str])] = &[
    ("cuDeviceGetCount", &["cuDeviceGetCount"]),
    ("cuDeviceGetName", &["cuDeviceGetName"]),
    ("cuCtxGetCurrent", &["cuCtxGetCurrent"]),
    ("cuStreamBeginCapture_v2", &["cuStreamBeginCapture_v2"]),
    ("cuStreamEndCapture", &["cuStreamEndCapture"]),
    ("cuEventSynchronize", &["cuEventSynchronize"]),
    (
        "cuEventElapsedTime",
        &["cuEventElapsedTime_v2", "cuEventElapsedTime"],
    ),
    ("cuMemGetInfo_v2", &["cuMemGetInfo_v2"]),
    ("cuMemAlloc_v2", &["cuMemAlloc_v2"]),
    ("cuMemFree_v2", &["cuMemFree_v2"]),
    ("cuMemcpyHtoD_v2", &["cuMemcpyHtoD_v2"]),
    ("cuMemcpyDtoH_v2", &["cuMemcpyDtoH_v2"]),
    ("cuMemsetD8_v2", &["cuMemsetD8_v2"]),
    ("cuMemsetD8Async", &["cuMemsetD8Async"]),
    (
        "cuGraphInstantiateWithFlags",
        &["cuGraphInstantiateWithFlags"],
    ),
    ("cuGraphLaunch", &["cuGraphLaunch"]),
    ("cuGraphDestroy", &["cuGraphDestroy"]),
    ("cuGraphExecDestroy", &["cuGraphExecDestroy"]),
    ("cuMemcpyHtoDAsync_v2", &["cuMemcpyHtoDAsync_v2"]),
    ("cuMemcpyDtoHAsync_v2", &["cuMemcpyDtoHAsync_v2"]),
    ("cuMemcpyDtoDAsync_v2", &["cuMemcpyDtoDAsync_v2"]),
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

    // The driver's functions as bindgen declares them; the table around them is generated below.
    let names = CuresultNames::default();
    let symbols = REQUIRED_DRIVER_FUNCTIONS
        .iter()
        .chain(OPTIONAL_DRIVER_FUNCTIONS.iter().flat_map(|(_, s)| s.iter()));
    let declarations = base(inputs)
        .parse_callbacks(Box::new(names.clone()))
        .allowlist_function(symbols.copied().collect::<Vec<_>>().join("|"))
        .allowlist_recursively(false)
        .generate_comments(false)
        .layout_tests(false)
        .generate()
        .map_err(bindgen_failed)?
        .to_string();
    // Which CUDA version added each function: the compile-time check that the required ones are no newer
    // than the headers' major version, and the errors naming what an older driver lacks.
    let typedefs = inputs.include_dirs.iter().find_map(|d| {
        let path = d.join("cudaTypedefs.h");
        let text = std::fs::read_to_string(&path).ok()?;
        println!("cargo:rerun-if-changed={}", path.display());
        Some(text)
    });
    if typedefs.is_none() {
        println!(
            "cargo:warning=metrale-gpu-sys found no cudaTypedefs.h beside cuda.h: the driver table cannot \
             say which CUDA version added a function, and the check that the required ones are old enough \
             is skipped (pip: nvidia-cuda-runtime has it)"
        );
    }
    let table = driver_table(&declarations, typedefs.as_deref())?;
    let path = inputs.out_dir.join("cuda_driver.rs");
    std::fs::write(&path, table + &names.table())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// A driver function as bindgen declared it: `(name: Type, …)` and the return type.
struct Declaration {
    params: Vec<(String, String)>,
    ret: String,
}

/// The functions of bindgen's `extern "C"` block, by symbol. Whitespace is normalised first, so the
/// parse holds whether or not rustfmt formatted bindgen's output.
fn declarations(text: &str) -> Vec<(String, Declaration)> {
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    text.split("pub fn ")
        .skip(1)
        .filter_map(|item| {
            let (name, rest) = item.split_once('(')?;
            let (params, rest) = split_close(rest)?;
            let ret = rest.trim().strip_prefix("->")?.split(';').next()?.trim();
            let params = split_top(params)
                .filter_map(|p| {
                    let (name, ty) = p.split_once(':')?;
                    Some((name.trim().to_string(), ty.trim().to_string()))
                })
                .collect();
            Some((
                name.trim().to_string(),
                Declaration {
                    params,
                    ret: ret.to_string(),
                },
            ))
        })
        .collect()
}

/// Splits `a, b) rest` at the `)` that closes the list.
fn split_close(text: &str) -> Option<(&str, &str)> {
    let mut depth = 0;
    for (i, c) in text.char_indices() {
        match c {
            '(' | '<' => depth += 1,
            ')' if depth == 0 => return Some((&text[..i], &text[i + 1..])),
            ')' | '>' => depth -= 1,
            _ => {}
        }
    }
    None
}

/// The comma-separated items of a parameter list, commas inside `()` and `<>` excluded.
fn split_top(text: &str) -> impl Iterator<Item = &str> {
    let mut depth = 0;
    let mut start = 0;
    let mut items = Vec::new();
    for (i, c) in text.char_indices() {
        match c {
            '(' | '<' => depth += 1,
            ')' | '>' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&text[start..]);
    items.into_iter().filter(|s| !s.trim().is_empty())
}

/// The CUDA version that introduced `symbol`, from cudaTypedefs.h: its `PFN_<name>_v<version>` typedefs list
/// each ABI of a function oldest first, and a symbol's `_v<n>` suffix names the n-th (none: the first).
fn introduced(typedefs: &str, symbol: &str) -> Option<u32> {
    let (base, abi) = match symbol.rsplit_once("_v") {
        Some((base, n)) if n.parse::<usize>().is_ok() => (base, n.parse::<usize>().ok()?),
        _ => (symbol, 1),
    };
    let prefix = format!("*PFN_{base}_v");
    let mut versions: Vec<u32> = typedefs
        .match_indices(&prefix)
        .filter_map(|(at, _)| {
            let rest = &typedefs[at + prefix.len()..];
            // The plain typedef only (`_v3020)`), not the per-thread-stream ones (`_v7000_ptds)`).
            let (version, _) = rest.split_once(')')?;
            version.parse().ok()
        })
        .collect();
    versions.sort_unstable();
    versions.dedup();
    versions.get(abi.checked_sub(1)?).copied()
}

/// `DriverApi`: the required functions as fields (loading fails without them), the optional ones as
/// `Option`s behind methods that return `Err` naming a missing one, never a panic.
fn driver_table(declarations_text: &str, typedefs: Option<&str>) -> Result<String, String> {
    use std::fmt::Write;
    let declared = declarations(declarations_text);
    let find = |symbols: &[&str]| {
        symbols
            .iter()
            .find_map(|s| declared.iter().find(|(name, _)| name == s).map(|(_, d)| d))
    };
    let needs = |symbol: &str| match typedefs.and_then(|t| introduced(t, symbol)) {
        Some(v) => format!("Some({v})"),
        None => "None".to_string(),
    };
    let mut fields = String::new();
    let mut resolve = String::new();
    let mut inits = String::new();
    let mut methods = String::new();
    let mut required_needs = String::new();
    for &name in REQUIRED_DRIVER_FUNCTIONS {
        let d = find(&[name]).ok_or_else(|| {
            format!("cuda.h declares no {name}, a driver function the helpers need: is it CUDA's cuda.h?")
        })?;
        let (params, args, ty) = signature(d);
        writeln!(fields, "    pub {name}: {ty},").ok();
        writeln!(
            resolve,
            "            let {name} = *library.get(b\"{name}\\0\").map_err(|e| (\"{name}\", e))?;"
        )
        .ok();
        writeln!(inits, "                {name},").ok();
        writeln!(required_needs, "    (\"{name}\", {}),", needs(name)).ok();
        writeln!(
            methods,
            "    /// `{name}` (required: every driver of the headers' CUDA major version has it).\n    \
             ///\n    /// # Safety\n    /// As cuda.h documents for `{name}`.\n    \
             #[inline]\n    pub unsafe fn {name}(&self{params}) -> {ret} {{\n        \
             // SAFETY: the caller upholds cuda.h's contract for the call.\n        \
             unsafe {{ (self.{name})({args}) }}\n    }}\n",
            ret = d.ret
        )
        .ok();
    }
    for &(name, symbols) in OPTIONAL_DRIVER_FUNCTIONS {
        let d = find(symbols).ok_or_else(|| {
            format!(
                "cuda.h declares none of {symbols:?}: is it CUDA's cuda.h, of CUDA 12 or newer?"
            )
        })?;
        let (params, args, ty) = signature(d);
        writeln!(fields, "    {name}: ::std::option::Option<{ty}>,").ok();
        let lookups: Vec<String> = symbols
            .iter()
            .map(|s| format!("library.get(b\"{s}\\0\")"))
            .collect();
        writeln!(
            resolve,
            "            let {name} = {}.ok().map(|f| *f);",
            lookups.join(".or_else(|_| ").to_string() + &")".repeat(symbols.len() - 1)
        )
        .ok();
        writeln!(inits, "                {name},").ok();
        let oldest = symbols[symbols.len() - 1];
        writeln!(
            methods,
            "    /// `{}` (optional): `Err` when the loaded driver lacks it.\n    \
             ///\n    /// # Safety\n    /// As cuda.h documents for `{name}`.\n    \
             #[inline]\n    pub unsafe fn {name}(&self{params}) -> Result<{ret}, GpuError> {{\n        \
             match self.{name} {{\n            \
             // SAFETY: the caller upholds cuda.h's contract for the call.\n            \
             Some(f) => Ok(unsafe {{ f({args}) }}),\n            \
             None => Err(self.missing(\"{oldest}\", {})),\n        }}\n    }}\n",
            symbols.join("`, else `"),
            needs(oldest),
            ret = d.ret
        )
        .ok();
    }
    Ok(format!(
        "/* Generated by build/bindings.rs from bindgen's declarations of cuda.h's driver functions. */\n\n\
         use crate::error::GpuError;\n\n\
         /// The CUDA driver's functions, loaded from libcuda.so.1 at run time: the required ones as fields, \
         the\n/// optional ones behind methods that return `Err` when the driver lacks them.\n\
         pub struct DriverApi {{\n    _library: ::libloading::Library,\n{fields}}}\n\n\
         impl DriverApi {{\n    \
         /// Resolves every function in `library`; `Err` names the first required one it lacks.\n    \
         ///\n    /// # Safety\n    \
         /// `library` is the CUDA driver: each symbol has the signature cuda.h declares for it.\n    \
         pub unsafe fn from_library(\n        library: ::libloading::Library,\n    \
         ) -> Result<DriverApi, (&'static str, ::libloading::Error)> {{\n        \
         // SAFETY: for every lookup below: the caller promises cuda.h's signatures; each function pointer \
         is\n        // copied out and stays valid while the library, kept in the table, is loaded.\n        \
         unsafe {{\n{resolve}            Ok(DriverApi {{\n                _library: library,\n{inits}            }})\n        \
         }}\n    }}\n\n{methods}}}\n\n\
         /// The required functions, and the CUDA version that introduced each (from cudaTypedefs.h).\n\
         pub const REQUIRED_FUNCTIONS: &[(&str, ::std::option::Option<u32>)] = &[\n{required_needs}];\n"
    ))
}

/// A declaration as `, name: Type` parameters, call arguments, and its function-pointer type.
fn signature(d: &Declaration) -> (String, String, String) {
    let params: String = d
        .params
        .iter()
        .map(|(n, t)| format!(", {n}: {t}"))
        .collect();
    let args: Vec<&str> = d.params.iter().map(|(n, _)| n.as_str()).collect();
    let types: Vec<String> = d.params.iter().map(|(n, t)| format!("{n}: {t}")).collect();
    let ty = format!("unsafe extern \"C\" fn({}) -> {}", types.join(", "), d.ret);
    (params, args.join(", "), ty)
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

fn bindgen_failed(e: bindgen::BindgenError) -> String {
    format!(
        "bindgen could not translate wrapper.h: {e}\n\
         The messages above are clang's. Usual causes: CUDA headers without crt/ (pip: nvidia-cuda-crt) or \
         without cccl/nv/target (pip: nvidia-cuda-cccl), or an nccl.h from another toolkit generation. \
         ci/setup installs a matching set."
    )
}

fn write(builder: bindgen::Builder, path: &Path) -> Result<(), String> {
    let bindings = builder.generate().map_err(bindgen_failed)?;
    bindings
        .write_to_file(path)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}
