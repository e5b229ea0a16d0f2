//! `nccl_loaded.rs`: NCCL's functions, loaded from libnccl at run time (the default; feature `link` links
//! instead), and `nccl_functions.rs`: their names and types, the table the loader reads. Both are generated
//! from bindgen's declarations of every `nccl*` function in `bindings.rs`: nothing here names a function.
//! Each keeps its C name and signature as an `unsafe extern "C" fn` that loads one slot and calls through
//! it. A slot starts at the function's resolver, which loads the library (once, in `crate::loader`) and
//! looks the one symbol up: found, the slot then holds the library's function; missing, the call returns
//! the loader's status for it (`check_nccl` then names the function) and the slot keeps the resolver.

use proc_macro2::{Literal, TokenStream};
use quote::quote;

use crate::declared::{key, Function};
use crate::print::{docs, file, safety};

/// How a call of a function the loaded library lacks returns, by the function's return type: the crate's
/// status for `ncclResult_t`, a static text for a C string (`ncclGetErrorString`, `ncclGetLastError`),
/// nothing for a function that returns nothing (`ncclResetDebugInit`): the statement its resolver runs
/// then. A function that returns no status (the device API's `ncclTeamLsa`, `ncclTeamRankToWorld`) has no
/// value that could say so: its call ends the process with a message naming it, as the dynamic linker
/// ends a linked build's.
fn missing_return(f: &Function, index: &Literal) -> TokenStream {
    let Some(ret) = f.ret else {
        return quote!(return;);
    };
    let status: syn::Type = syn::parse_quote!(ncclResult_t);
    let text: syn::Type = syn::parse_quote!(*const ::std::os::raw::c_char);
    match key(ret) {
        k if k == key(&status) => quote!(return crate::loader::missing_status(#index);),
        k if k == key(&text) => quote!(return crate::loader::missing_text();),
        _ => quote!(crate::loader::missing_abort(#index)),
    }
}

/// The `nccl*` functions of bindgen's `extern "C"` blocks, in the order bindgen wrote them.
fn declarations(file: &syn::File) -> Result<Vec<Function<'_>>, String> {
    let found: Vec<Function> = crate::declared::functions(file)?
        .into_iter()
        .filter(|f| f.name.to_string().starts_with("nccl"))
        .collect();
    if found.is_empty() {
        return Err("bindgen declared no nccl* function: is nccl.h NCCL's?".into());
    }
    Ok(found)
}

/// Whether a wrapper keeps bindgen's attribute: the docs (nccl.h's comments) and `#[must_use]`.
fn kept(attr: &&syn::Attribute) -> bool {
    attr.path().is_ident("must_use") || attr.path().is_ident("doc")
}

/// The two generated files: `nccl_functions.rs` (the table the loader reads: the functions' names and
/// types, beside bindgen's types in the crate's private `ffi` module) and `nccl_loaded.rs` (the functions
/// themselves, their slots and resolvers, in `bindings`, which calls the loader).
pub struct Generated {
    /// `nccl_functions.rs`.
    pub functions: String,
    /// `nccl_loaded.rs`.
    pub loaded: String,
}

/// `nccl_functions.rs` and `nccl_loaded.rs` from bindgen's `bindings.rs` (as syn reads it).
pub fn generate(bindings: &syn::File) -> Result<Generated, String> {
    let declared = declarations(bindings)?;
    let mut wrappers = Vec::new();
    let mut signatures = Vec::new();
    let mut resolvers = Vec::new();
    for (i, f) in declared.iter().enumerate() {
        let index = Literal::usize_unsuffixed(i);
        let name = f.name;
        let attrs = f.item.attrs.iter().filter(kept);
        let params: Vec<TokenStream> = f.params.iter().map(|(n, t)| quote!(#n: #t)).collect();
        let args: Vec<&syn::Ident> = f.params.iter().map(|(n, _)| *n).collect();
        let ret = f.ret.map(|r| quote!(-> #r));
        let missing = missing_return(f, &index);
        let slot_safety = safety(&format!(
            "slot {i} holds `{name}`'s resolver or the function libnccl exports as `{name}`, both of the \
             signature nccl.h declares for it; the caller upholds nccl.h's contract for the call."
        ));
        wrappers.push(quote! {
            #(#attrs)*
            #[inline]
            pub unsafe extern "C" fn #name(#(#params),*) #ret {
                #slot_safety
                unsafe {
                    let slot = loaded_slots::SLOTS[#index].load(::core::sync::atomic::Ordering::Acquire);
                    let f = ::core::mem::transmute::<*mut (), signatures::#name>(slot);
                    f(#(#args),*)
                }
            }
        });
        signatures.push(quote! {
            pub type #name = unsafe extern "C" fn(#(#params),*) #ret;
        });
        let doc = docs(&format!(
            "`{name}`'s first call: resolves it, then calls it, or returns the status for a missing function."
        ));
        let found_safety = safety(&format!(
            "`resolve` returns what libnccl exports as `{name}`, which has nccl.h's signature; the caller \
             upholds nccl.h's contract for the call."
        ));
        resolvers.push(quote! {
            #doc
            pub(super) unsafe extern "C" fn #name(#(#params),*) #ret {
                let Some(f) = crate::loader::resolve(&SLOTS[#index], NAMES[#index]) else {
                    #missing
                };
                #found_safety
                unsafe { ::core::mem::transmute::<*mut (), signatures::#name>(f)(#(#args),*) }
            }
        });
    }
    let count = Literal::usize_unsuffixed(declared.len());
    let names = declared.iter().map(|f| f.name.to_string());
    let slots = declared
        .iter()
        .map(|f| f.name)
        .map(|name| quote!(AtomicPtr::new(resolve::#name as signatures::#name as *mut ())));
    let table_doc = docs(
        "The loaded functions' table, which the loader reads: their C names and types, by index.",
    );
    let names_doc = docs("The functions' C names, by index: what the loader looks up, and what a missing one's status names.");
    let signatures_doc = docs("Each function's type, as nccl.h declares it.");
    let functions = file(
        "build/nccl_table.rs from bindgen's declarations of nccl.h's functions",
        quote! {
            #table_doc
            pub(crate) mod loaded_functions {
                #names_doc
                pub(crate) const NAMES: [&str; #count] = [#(#names),*];

                #signatures_doc
                pub(crate) mod signatures {
                    use super::super::*;
                    #(#signatures)*
                }
            }
        },
    )?;
    let slots_doc = docs(
        "Where each function's call goes: its resolver until the library's function is found.",
    );
    let loader_doc = docs("The loader's side of the functions above: their slots and resolvers.");
    let loaded = file(
        "build/nccl_table.rs from bindgen's declarations of nccl.h's functions",
        quote! {
            use crate::ffi::loaded_functions::signatures;

            #(#wrappers)*

            #loader_doc
            mod loaded_slots {
                use ::core::sync::atomic::AtomicPtr;
                use crate::ffi::loaded_functions::signatures;

                #slots_doc
                pub(super) static SLOTS: [AtomicPtr<()>; #count] = [#(#slots),*];

                mod resolve {
                    use super::super::*;
                    use super::SLOTS;
                    use crate::ffi::loaded_functions::NAMES;
                    #(#resolvers)*
                }
            }
        },
    )?;
    Ok(Generated { functions, loaded })
}
