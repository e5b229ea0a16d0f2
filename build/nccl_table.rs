//! `nccl_loaded.rs`: NCCL's functions, loaded from libnccl at run time (the default; feature `link` links
//! instead), generated from bindgen's declarations of every `nccl*` function in `bindings.rs`: nothing here
//! names a function. Each keeps its C name and signature as an `unsafe extern "C" fn` that loads one slot and
//! calls through it. A slot starts at the function's resolver, which loads the library (once, in
//! `crate::loader`) and looks the one symbol up: found, the slot then holds the library's function; missing,
//! the call returns the loader's status for it (`check_nccl` then names the function) and the slot keeps
//! the resolver.

use std::fmt::Write;

/// A function bindgen declared, as Rust text: its name, attributes (docs, `#[must_use]`), `name: Type`
/// parameters and return type (empty for none).
struct Declaration {
    name: String,
    attrs: Vec<String>,
    params: Vec<(String, String)>,
    ret: Option<String>,
}

/// How a call of a function the loaded library lacks returns, by the function's return type: the crate's
/// status for `ncclResult_t`, a static text for a C string (`ncclGetErrorString`, `ncclGetLastError`),
/// nothing for a function that returns nothing (`ncclResetDebugInit`). A function that returns no status
/// (the device API's `ncclTeamLsa`, `ncclTeamRankToWorld`) has no value that could say so: its call ends
/// the process with a message naming it, as the dynamic linker ends a linked build's.
fn missing_return(d: &Declaration, index: usize) -> String {
    match d.ret.as_deref() {
        None => "()".into(),
        Some("ncclResult_t") => format!("crate::loader::missing_status({index})"),
        Some("*const ::std::os::raw::c_char") => "crate::loader::missing_text()".into(),
        Some(_) => format!("crate::loader::missing_abort({index})"),
    }
}

/// The `nccl*` functions of bindgen's `extern "C"` blocks, in the order bindgen wrote them.
fn declarations(file: &syn::File) -> Result<Vec<Declaration>, String> {
    let found: Vec<Declaration> = crate::declared::functions(file)?
        .into_iter()
        .filter(|f| f.name.starts_with("nccl"))
        .map(|f| Declaration {
            attrs: f.item.attrs.iter().filter_map(attribute).collect(),
            name: f.name,
            params: f.params,
            ret: f.ret,
        })
        .collect();
    if found.is_empty() {
        return Err("bindgen declared no nccl* function: is nccl.h NCCL's?".into());
    }
    Ok(found)
}

/// The attributes a wrapper keeps: the docs (nccl.h's comments) and `#[must_use]`.
fn attribute(attr: &syn::Attribute) -> Option<String> {
    match &attr.meta {
        syn::Meta::Path(p) if p.is_ident("must_use") => Some("#[must_use]".into()),
        syn::Meta::NameValue(nv) if nv.path.is_ident("doc") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(format!("#[doc = {:?}]", s.value())),
            _ => None,
        },
        _ => None,
    }
}

/// `nccl_loaded.rs` from bindgen's `bindings.rs` (as syn reads it).
pub fn generate(bindings: &syn::File) -> Result<String, String> {
    let declared = declarations(bindings)?;
    let mut names = String::new();
    let mut slots = String::new();
    let mut signatures = String::new();
    let mut wrappers = String::new();
    let mut resolvers = String::new();
    for (i, d) in declared.iter().enumerate() {
        let name = &d.name;
        let params: Vec<String> = d.params.iter().map(|(n, t)| format!("{n}: {t}")).collect();
        let params = params.join(", ");
        let args: Vec<&str> = d.params.iter().map(|(n, _)| n.as_str()).collect();
        let args = args.join(", ");
        let ret = d.ret.as_ref().map_or(String::new(), |r| format!(" -> {r}"));
        let missing = missing_return(d, i);
        writeln!(names, "        \"{name}\",").ok();
        writeln!(
            slots,
            "        AtomicPtr::new(resolve::{name} as signatures::{name} as *mut ()),"
        )
        .ok();
        writeln!(
            signatures,
            "        pub type {name} = unsafe extern \"C\" fn({params}){ret};"
        )
        .ok();
        let attrs: String = d.attrs.iter().map(|a| format!("{a}\n")).collect();
        write!(
            wrappers,
            "{attrs}#[inline]\npub unsafe extern \"C\" fn {name}({params}){ret} {{\n    \
             // SAFETY: slot {i} holds `{name}`'s resolver or the function libnccl exports as `{name}`, \
             both of\n    // the signature nccl.h declares for it; the caller upholds nccl.h's contract for \
             the call.\n    \
             unsafe {{\n        \
             let slot = loaded_functions::SLOTS[{i}].load(::core::sync::atomic::Ordering::Acquire);\n        \
             let f = ::core::mem::transmute::<*mut (), loaded_functions::signatures::{name}>(slot);\n        \
             f({args})\n    }}\n}}\n\n"
        )
        .ok();
        write!(
            resolvers,
            "        /// `{name}`'s first call: resolves it, then calls it, or returns the status for a missing \
             function.\n        \
             pub(super) unsafe extern \"C\" fn {name}({params}){ret} {{\n            \
             match crate::loader::resolve(&SLOTS[{i}], NAMES[{i}]) {{\n                \
             // SAFETY: `resolve` returns what libnccl exports as `{name}`, which has nccl.h's \
             signature;\n                // the caller upholds nccl.h's contract for the call.\n                \
             Some(f) => unsafe {{ ::core::mem::transmute::<*mut (), signatures::{name}>(f)({args}) }},\n                \
             None => {missing},\n            }}\n        }}\n\n"
        )
        .ok();
    }
    let count = declared.len();
    Ok(format!(
        "/* Generated by build/nccl_table.rs from bindgen's declarations of nccl.h's functions. */\n\n\
         {wrappers}\
         /// The loader's side of the functions above: their names, slots, types and resolvers.\n\
         pub(crate) mod loaded_functions {{\n    \
         use ::core::sync::atomic::AtomicPtr;\n\n    \
         /// The functions' C names, by index: what the loader looks up, and what a missing one's status \
         names.\n    \
         pub(crate) const NAMES: [&str; {count}] = [\n{names}    ];\n\n    \
         /// Where each function's call goes: its resolver until the library's function is found.\n    \
         pub(super) static SLOTS: [AtomicPtr<()>; {count}] = [\n{slots}    ];\n\n    \
         /// Each function's type, as nccl.h declares it.\n    \
         pub(crate) mod signatures {{\n        use super::super::*;\n{signatures}    }}\n\n    \
         // One shape for every return type: `None => ()` for the functions returning nothing.\n    \
         #[allow(clippy::single_match)]\n    \
         mod resolve {{\n        use super::super::*;\n        use super::{{signatures, NAMES, SLOTS}};\n\n{resolvers}    }}\n}}\n"
    ))
}
