//! `cuda_driver.rs`: the driver table, loaded from libcuda.so.1 at run time (build and CI machines have
//! no driver), generated around bindgen's declarations of the driver functions listed here: required
//! functions fail the load when missing, optional ones fail only their own call (the driver contract). It
//! names types from `bindings.rs`, which it `use`s.

use proc_macro2::{Literal, TokenStream};
use quote::{format_ident, quote};

use crate::declared::{key, Function};
use crate::print::{docs, file, safety};

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

/// A driver function as bindgen declared it, with its signature with every type alias resolved (to
/// compare with cudaTypedefs.h's).
struct Declaration<'a> {
    function: Function<'a>,
    ret: &'a syn::Type,
    signature: Signature,
}

/// Parameter and return types, type aliases resolved (`CUdeviceptr` and `CUdeviceptr_v2` are one type),
/// as their tokens' text ([`key`]).
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

    /// `ty` with every alias resolved, through pointers, as its tokens' text.
    fn resolve(&self, ty: &syn::Type) -> String {
        match ty {
            syn::Type::Ptr(ptr) => {
                let kind = if ptr.mutability.is_some() {
                    "* mut"
                } else {
                    "* const"
                };
                format!("{kind} {}", self.resolve(&ptr.elem))
            }
            syn::Type::Path(path) => match path
                .path
                .get_ident()
                .and_then(|i| self.0.get(&i.to_string()))
            {
                Some(aliased) => self.resolve(aliased),
                None => key(ty),
            },
            _ => key(ty),
        }
    }

    fn signature<'t>(
        &self,
        params: impl Iterator<Item = &'t syn::Type>,
        ret: &syn::ReturnType,
    ) -> Signature {
        let params = params.map(|ty| self.resolve(ty)).collect();
        let ret = match ret {
            syn::ReturnType::Type(_, ty) => self.resolve(ty),
            syn::ReturnType::Default => "()".to_string(),
        };
        (params, ret)
    }
}

/// The functions of bindgen's `extern "C"` blocks, by symbol.
fn declarations(file: &syn::File) -> Result<Vec<Declaration<'_>>, String> {
    let aliases = Aliases::of(file);
    crate::declared::functions(file)?
        .into_iter()
        .map(|function| {
            let ret = function.ret.ok_or_else(|| {
                format!(
                    "bindgen declared {} returning nothing, not a CUresult",
                    function.name
                )
            })?;
            let signature = aliases.signature(
                function.params.iter().map(|(_, ty)| *ty),
                &function.item.sig.output,
            );
            Ok(Declaration {
                function,
                ret,
                signature,
            })
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
            let signature = aliases.signature(params, &function.output);
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
/// where that header was found: they say which CUDA version introduced each symbol. `names`: cuda.h's
/// `CUresult` values and names.
pub fn generate(declared: &syn::File, names: &[(u64, String)]) -> Result<String, String> {
    let abis = Abis::of(declared)?;
    let declared = declarations(declared)?;
    let find = |symbols: &[&str]| {
        symbols
            .iter()
            .find_map(|s| declared.iter().find(|d| d.function.name == s))
    };
    let needs = |symbol: &str, signature: &Signature| {
        let is_declared = declared.iter().any(|d| d.function.name == symbol);
        match abis.introduced(symbol, signature, is_declared) {
            Some(v) => {
                let v = Literal::u32_unsuffixed(v);
                quote!(Some(#v))
            }
            None => quote!(None),
        }
    };
    let mut fields = Vec::new();
    let mut resolve = Vec::new();
    let mut inits = Vec::new();
    let mut methods = Vec::new();
    let mut required_needs = Vec::new();
    let call_safety = safety("the caller upholds cuda.h's contract for the call.");
    for &symbol in REQUIRED_FUNCTIONS {
        let d = find(&[symbol]).ok_or_else(|| {
            format!("cuda.h declares no {symbol}, a driver function the helpers need: is it CUDA's cuda.h?")
        })?;
        let name = format_ident!("{symbol}");
        let (params, args, ty) = signature(d);
        let ret = d.ret;
        let lookup = Literal::byte_string(format!("{symbol}\0").as_bytes());
        fields.push(quote!(pub #name: #ty));
        resolve.push(quote! {
            let #name = *library.get(#lookup).map_err(|e| (#symbol, e))?;
        });
        inits.push(name.clone());
        let since = needs(symbol, &d.signature);
        required_needs.push(quote!((#symbol, #since)));
        let doc = docs(&format!(
            "`{symbol}` (required: every driver of the headers' CUDA major version has it).\n\n\
             # Safety\nAs cuda.h documents for `{symbol}`."
        ));
        methods.push(quote! {
            #doc
            #[inline]
            pub unsafe fn #name(&self, #(#params),*) -> #ret {
                #call_safety
                unsafe { (self.#name)(#(#args),*) }
            }
        });
    }
    for &(method, symbols) in OPTIONAL_FUNCTIONS {
        let d = find(symbols).ok_or_else(|| {
            format!(
                "cuda.h declares none of {symbols:?}: is it CUDA's cuda.h, of CUDA 12 or newer?"
            )
        })?;
        let name = format_ident!("{method}");
        let (params, args, ty) = signature(d);
        let ret = d.ret;
        fields.push(quote!(#name: ::std::option::Option<#ty>));
        let lookups = symbols.iter().map(|s| {
            let lookup = Literal::byte_string(format!("{s}\0").as_bytes());
            quote!(library.get(#lookup))
        });
        let lookup = lookups
            .reduce(|first, next| quote!(#first.or_else(|_| #next)))
            .ok_or_else(|| format!("driver_table.rs lists no symbol for {method}"))?;
        resolve.push(quote! {
            let #name = #lookup.ok().map(|f| *f);
        });
        inits.push(name.clone());
        let oldest = symbols[symbols.len() - 1];
        let since = needs(oldest, &d.signature);
        let doc = docs(&format!(
            "`{}` (optional): `Err` when the loaded driver lacks it.\n\n# Safety\nAs cuda.h documents for `{method}`.",
            symbols.join("`, else `")
        ));
        methods.push(quote! {
            #doc
            #[inline]
            pub unsafe fn #name(&self, #(#params),*) -> Result<#ret, GpuError> {
                let Some(function) = self.#name else {
                    return Err(self.missing(#oldest, #since));
                };
                #call_safety
                Ok(unsafe { function(#(#args),*) })
            }
        });
    }
    let names = names.iter().map(|(value, name)| {
        let value = Literal::u64_unsuffixed(*value);
        quote!((#value, #name))
    });
    let struct_doc = docs(
        "The CUDA driver's functions, loaded from libcuda.so.1 at run time: the required ones as fields, the\n\
         optional ones behind methods that return `Err` when the driver lacks them. Only the crate builds\n\
         one ([`crate::cuda::driver`]), and it never unloads the library: a table is never dropped.",
    );
    let from_library_doc = docs(
        "Resolves every function in `library`; `Err` names the first required one it lacks.\n\n# Safety\n\
         `library` is the CUDA driver: each symbol has the signature cuda.h declares for it.\n\
         The table is never dropped once one of its functions has run (that would unload the library).",
    );
    let lookup_safety = safety(
        "for every lookup below: the caller promises cuda.h's signatures; each function pointer is copied \
         out and stays valid while the library, kept in the table, is loaded.",
    );
    let required_doc = docs(
        "The required functions, and the CUDA version that introduced each (from cudaTypedefs.h).",
    );
    let names_doc = docs(
        "`cudaError_enum`'s values and names, as cuda.h lists them (for `CUresult`'s `Debug`).",
    );
    file(
        "build/driver_table.rs from bindgen's declarations of cuda.h's driver functions",
        quote! {
            use crate::error::GpuError;

            #struct_doc
            pub struct DriverApi {
                _library: ::libloading::Library,
                #(#fields,)*
            }

            impl DriverApi {
                #from_library_doc
                pub(crate) unsafe fn from_library(
                    library: ::libloading::Library,
                ) -> Result<DriverApi, (&'static str, ::libloading::Error)> {
                    #lookup_safety
                    unsafe {
                        #(#resolve)*
                        Ok(DriverApi {
                            _library: library,
                            #(#inits,)*
                        })
                    }
                }

                #(#methods)*
            }

            #required_doc
            pub const REQUIRED_FUNCTIONS: &[(&str, ::std::option::Option<u32>)] = &[#(#required_needs),*];

            #names_doc
            pub const CURESULT_NAMES: &[(::std::os::raw::c_uint, &str)] = &[#(#names),*];
        },
    )
}

/// A declaration's `name: Type` parameters, its call arguments, and its function-pointer type.
fn signature<'d>(d: &'d Declaration) -> (Vec<TokenStream>, Vec<&'d syn::Ident>, TokenStream) {
    let params: Vec<TokenStream> = d
        .function
        .params
        .iter()
        .map(|(n, t)| quote!(#n: #t))
        .collect();
    let args = d.function.params.iter().map(|(n, _)| *n).collect();
    let ret = d.ret;
    let ty = quote!(unsafe extern "C" fn(#(#params),*) -> #ret);
    (params, args, ty)
}
