//! The functions of bindgen's `extern "C"` blocks, read by syn: what the generated tables
//! (`driver_table.rs`, `nccl_table.rs`) wrap.

/// A function as bindgen declared it.
pub struct Function<'a> {
    /// bindgen's item (its attributes: docs, `#[must_use]`).
    pub item: &'a syn::ForeignItemFn,
    pub name: &'a syn::Ident,
    /// `(name, Type)` of each parameter.
    pub params: Vec<(&'a syn::Ident, &'a syn::Type)>,
    /// The return type; `None` for none.
    pub ret: Option<&'a syn::Type>,
}

/// Every function of `file`'s `extern "C"` blocks, in order.
pub fn functions(file: &syn::File) -> Result<Vec<Function<'_>>, String> {
    let mut found = Vec::new();
    for item in &file.items {
        let syn::Item::ForeignMod(block) = item else {
            continue;
        };
        for item in &block.items {
            let syn::ForeignItem::Fn(f) = item else {
                continue;
            };
            let name = &f.sig.ident;
            let mut params = Vec::new();
            for input in &f.sig.inputs {
                let syn::FnArg::Typed(param) = input else {
                    return Err(format!("bindgen declared {name} with a receiver"));
                };
                let syn::Pat::Ident(ident) = &*param.pat else {
                    return Err(format!("bindgen declared {name} with an unnamed parameter"));
                };
                params.push((&ident.ident, &*param.ty));
            }
            let ret = match &f.sig.output {
                syn::ReturnType::Default => None,
                syn::ReturnType::Type(_, ty) => Some(&**ty),
            };
            found.push(Function {
                item: f,
                name,
                params,
                ret,
            });
        }
    }
    Ok(found)
}

/// A type's tokens as text (`* mut CUstream`): a key that two spellings of one type share, and what an
/// error message shows.
pub fn key(ty: &syn::Type) -> String {
    quote::quote!(#ty).to_string()
}
