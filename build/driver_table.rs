//! `cuda_driver.rs`: the driver table, loaded from libcuda.so.1 at run time (build and CI machines have
//! no driver), generated around bindgen's declarations of the driver functions listed here: required
//! functions fail the load when missing, optional ones fail only their own call (the driver contract). It
//! names types from `bindings.rs`, which it `use`s.

use std::fmt::Write;

/// The driver functions the helpers need, by the symbol cuda.h binds them to (its `#define cuFoo cuFoo_v2`
/// renames apply before bindgen sees a name, so the suffix is part of the ABI). Required: loading fails
/// without them, and each is older than every driver of the headers' CUDA major version (the crate checks
/// that against cudaTypedefs.h when it compiles), so a driver older than the headers' minor version loads.
pub const REQUIRED_FUNCTIONS: &[&str] = &[
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
pub const OPTIONAL_FUNCTIONS: &[(&str, &[&str])] = &[
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

/// Every symbol the table resolves: what bindgen is asked to declare.
pub fn symbols() -> impl Iterator<Item = &'static str> {
    REQUIRED_FUNCTIONS.iter().copied().chain(
        OPTIONAL_FUNCTIONS
            .iter()
            .flat_map(|(_, s)| s.iter().copied()),
    )
}

/// A driver function as bindgen declared it: its parameters (`name: Type`) and return type, as Rust text.
struct Declaration {
    params: Vec<(String, String)>,
    ret: String,
}

/// The functions of bindgen's `extern "C"` blocks, by symbol.
fn declarations(file: &syn::File) -> Result<Vec<(String, Declaration)>, String> {
    crate::declared::functions(file)?
        .into_iter()
        .map(|f| {
            let ret = f.ret.ok_or_else(|| {
                format!(
                    "bindgen declared {} returning nothing, not a CUresult",
                    f.name
                )
            })?;
            Ok((
                f.name,
                Declaration {
                    params: f.params,
                    ret,
                },
            ))
        })
        .collect()
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

/// `DriverApi`, from bindgen's declarations of `symbols()`: the required functions as fields (loading
/// fails without them), the optional ones as `Option`s behind methods that return `Err` naming a missing
/// one, never a panic. `typedefs` is cudaTypedefs.h, where found.
pub fn generate(declared: &syn::File, typedefs: Option<&str>) -> Result<String, String> {
    let declared = declarations(declared)?;
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
    for &name in REQUIRED_FUNCTIONS {
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
    for &(name, symbols) in OPTIONAL_FUNCTIONS {
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
        "/* Generated by build/driver_table.rs from bindgen's declarations of cuda.h's driver functions. */\n\n\
         use crate::error::GpuError;\n\n\
         /// The CUDA driver's functions, loaded from libcuda.so.1 at run time: the required ones as fields, \
         the\n/// optional ones behind methods that return `Err` when the driver lacks them. Only the crate \
         builds\n/// one ([`crate::cuda::driver`]), and it never unloads the library: a table is never dropped.\n\
         pub struct DriverApi {{\n    _library: ::libloading::Library,\n{fields}}}\n\n\
         impl DriverApi {{\n    \
         /// Resolves every function in `library`; `Err` names the first required one it lacks.\n    \
         ///\n    /// # Safety\n    \
         /// `library` is the CUDA driver: each symbol has the signature cuda.h declares for it.\n    \
         /// The table is never dropped once one of its functions has run (that would unload the library).\n    \
         pub(crate) unsafe fn from_library(\n        library: ::libloading::Library,\n    \
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
