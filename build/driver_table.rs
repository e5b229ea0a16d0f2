//! `cuda_driver.rs`: the driver table, loaded from libcuda.so.1 at run time (build and CI machines have
//! no driver), generated around bindgen's declarations of the driver functions listed here: required
//! functions fail the load when missing, optional ones fail only their own call (the driver contract). It
//! names types from `bindings.rs`, which it `use`s.

use std::fmt::Write;

use crate::declared::rust;

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
    // Kernels of one's own (`cuda::Module`): loading a compiled image, launching its functions, and the
    // GPU's architecture for the error of an image without code for it.
    ("cuCtxGetDevice", &["cuCtxGetDevice"]),
    ("cuDeviceGetAttribute", &["cuDeviceGetAttribute"]),
    ("cuModuleLoadData", &["cuModuleLoadData"]),
    ("cuModuleGetFunction", &["cuModuleGetFunction"]),
    ("cuModuleUnload", &["cuModuleUnload"]),
    ("cuLaunchKernel", &["cuLaunchKernel"]),
];

/// Every symbol the table resolves: what bindgen is asked to declare.
pub fn symbols() -> impl Iterator<Item = &'static str> {
    REQUIRED_FUNCTIONS.iter().copied().chain(
        OPTIONAL_FUNCTIONS
            .iter()
            .flat_map(|(_, s)| s.iter().copied()),
    )
}

/// Base names of the driver functions the table resolves (`cuMemAlloc` for `cuMemAlloc_v2`): what
/// bindgen is asked to declare cudaTypedefs.h's `PFN_<base>_v<version>` typedefs for.
pub fn bases() -> Vec<&'static str> {
    let mut bases: Vec<&str> = symbols().map(base).collect();
    bases.sort_unstable();
    bases.dedup();
    bases
}

/// A symbol's base name: `cuMemAlloc` for `cuMemAlloc_v2` (cuda.h's naming of a function's later ABIs;
/// the symbols are this file's own).
fn base(symbol: &str) -> &str {
    match symbol.rsplit_once("_v") {
        Some((base, n)) if n.parse::<u32>().is_ok() => base,
        _ => symbol,
    }
}

/// A driver function as bindgen declared it: its parameters (`name: Type`) and return type, as Rust text,
/// and its signature with every type alias resolved (to compare with cudaTypedefs.h's).
struct Declaration {
    params: Vec<(String, String)>,
    ret: String,
    signature: Signature,
}

/// Parameter and return types, type aliases resolved (`CUdeviceptr` and `CUdeviceptr_v2` are one type).
type Signature = (Vec<String>, String);

/// bindgen's type aliases (`pub type CUdeviceptr = CUdeviceptr_v2;`), by name.
struct Aliases<'a>(std::collections::HashMap<String, &'a syn::Type>);

impl<'a> Aliases<'a> {
    fn of(file: &'a syn::File) -> Aliases<'a> {
        Aliases(
            file.items
                .iter()
                .filter_map(|item| match item {
                    syn::Item::Type(alias) => Some((alias.ident.to_string(), &*alias.ty)),
                    _ => None,
                })
                .collect(),
        )
    }

    /// `ty` with every alias resolved, through pointers, as Rust text.
    fn resolve(&self, ty: &syn::Type) -> Result<String, String> {
        match ty {
            syn::Type::Ptr(ptr) => {
                let kind = if ptr.mutability.is_some() {
                    "*mut"
                } else {
                    "*const"
                };
                Ok(format!("{kind} {}", self.resolve(&ptr.elem)?))
            }
            syn::Type::Path(path) => match path
                .path
                .get_ident()
                .and_then(|i| self.0.get(&i.to_string()))
            {
                Some(aliased) => self.resolve(aliased),
                None => rust(ty),
            },
            _ => rust(ty),
        }
    }

    fn signature<'t>(
        &self,
        params: impl Iterator<Item = &'t syn::Type>,
        ret: &syn::ReturnType,
    ) -> Result<Signature, String> {
        let params = params
            .map(|ty| self.resolve(ty))
            .collect::<Result<_, _>>()?;
        let ret = match ret {
            syn::ReturnType::Type(_, ty) => self.resolve(ty)?,
            syn::ReturnType::Default => "()".to_string(),
        };
        Ok((params, ret))
    }
}

/// The functions of bindgen's `extern "C"` blocks, by symbol.
fn declarations(file: &syn::File) -> Result<Vec<(String, Declaration)>, String> {
    let aliases = Aliases::of(file);
    crate::declared::functions(file)?
        .into_iter()
        .map(|f| {
            let ret = f.ret.ok_or_else(|| {
                format!(
                    "bindgen declared {} returning nothing, not a CUresult",
                    f.name
                )
            })?;
            let signature = aliases.signature(
                f.item.sig.inputs.iter().filter_map(|input| match input {
                    syn::FnArg::Typed(param) => Some(&*param.ty),
                    syn::FnArg::Receiver(_) => None,
                }),
                &f.item.sig.output,
            )?;
            Ok((
                f.name,
                Declaration {
                    params: f.params,
                    ret,
                    signature,
                },
            ))
        })
        .collect()
}

/// cudaTypedefs.h's `PFN_<base>_v<version>` typedefs as bindgen translated them: the type of a driver
/// function's ABI introduced in CUDA `<version>` (what `cuGetProcAddress` hands out from that version on),
/// by base name, with its signature.
struct Abis(Vec<(String, u32, Signature)>);

impl Abis {
    fn of(file: &syn::File) -> Result<Abis, String> {
        let aliases = Aliases::of(file);
        let mut abis = Vec::new();
        for item in &file.items {
            let syn::Item::Type(alias) = item else {
                continue;
            };
            let name = alias.ident.to_string();
            let Some((base, version)) = name
                .strip_prefix("PFN_")
                .and_then(|rest| rest.rsplit_once("_v"))
                .and_then(|(base, v)| Some((base, v.parse::<u32>().ok()?)))
            else {
                continue;
            };
            let function = pointee(&alias.ty)
                .ok_or_else(|| format!("bindgen translated {name} as no function pointer"))?;
            let params = function.inputs.iter().map(|arg| &arg.ty);
            let signature = aliases.signature(params, &function.output)?;
            abis.push((base.to_string(), version, signature));
        }
        Ok(Abis(abis))
    }

    /// The CUDA version that introduced the ABI `symbol` names, whose signature is `signature`; `declared`:
    /// whether cuda.h declares `symbol` (outside its internal section, it declares exactly the ABI each name
    /// stands for now). The current ABI is the newest typedef of its signature; an older one, the one
    /// typedef of its signature older than the current ABI, if there is exactly one. `None` where
    /// cudaTypedefs.h does not say (no typedef matches, or several could).
    fn introduced(&self, symbol: &str, signature: &Signature, declared: bool) -> Option<u32> {
        let name = base(symbol);
        let of_name = || self.0.iter().filter(|(b, _, _)| b == name);
        let matching = || {
            of_name()
                .filter(|(_, _, s)| s == signature)
                .map(|(_, v, _)| *v)
        };
        if declared {
            return matching().max();
        }
        let current = of_name().map(|(_, v, _)| *v).max()?;
        let mut older = matching().filter(|&v| v < current);
        match (older.next(), older.next()) {
            (Some(version), None) => Some(version),
            _ => None,
        }
    }
}

/// The function type inside bindgen's `Option<unsafe extern "C" fn(…) -> …>` for a C function pointer.
fn pointee(ty: &syn::Type) -> Option<&syn::TypeBareFn> {
    let syn::Type::Path(path) = ty else {
        return None;
    };
    let option = path.path.segments.last()?;
    let syn::PathArguments::AngleBracketed(args) = &option.arguments else {
        return None;
    };
    match args.args.first()? {
        syn::GenericArgument::Type(syn::Type::BareFn(function)) if option.ident == "Option" => {
            Some(function)
        }
        _ => None,
    }
}

/// `DriverApi`, from bindgen's declarations of `symbols()`: the required functions as fields (loading
/// fails without them), the optional ones as `Option`s behind methods that return `Err` naming a missing
/// one, never a panic. `declared` also holds cudaTypedefs.h's `PFN_…` typedefs of the functions' bases,
/// where that header was found: they say which CUDA version introduced each symbol.
pub fn generate(declared: &syn::File) -> Result<String, String> {
    let abis = Abis::of(declared)?;
    let declared = declarations(declared)?;
    let find = |symbols: &[&str]| {
        symbols
            .iter()
            .find_map(|s| declared.iter().find(|(name, _)| name == s).map(|(_, d)| d))
    };
    let needs = |symbol: &str, signature: &Signature| {
        let is_declared = declared.iter().any(|(name, _)| name == symbol);
        match abis.introduced(symbol, signature, is_declared) {
            Some(v) => format!("Some({v})"),
            None => "None".to_string(),
        }
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
        writeln!(
            required_needs,
            "    (\"{name}\", {}),",
            needs(name, &d.signature)
        )
        .ok();
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
             Some(function) => Ok(unsafe {{ function({args}) }}),\n            \
             None => Err(self.missing(\"{oldest}\", {})),\n        }}\n    }}\n",
            symbols.join("`, else `"),
            needs(oldest, &d.signature),
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
