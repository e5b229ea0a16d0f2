//! The functions of bindgen's `extern "C"` blocks, read by syn, as Rust text: what the generated tables
//! (`driver_table.rs`, `nccl_table.rs`) wrap.

/// A function as bindgen declared it.
pub struct Function<'a> {
    /// bindgen's item (its attributes: docs, `#[must_use]`).
    pub item: &'a syn::ForeignItemFn,
    pub name: String,
    /// `(name, Type)` of each parameter.
    pub params: Vec<(String, String)>,
    /// The return type; `None` for none.
    pub ret: Option<String>,
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
            let name = f.sig.ident.to_string();
            let mut params = Vec::new();
            for input in &f.sig.inputs {
                let syn::FnArg::Typed(param) = input else {
                    return Err(format!("bindgen declared {name} with a receiver"));
                };
                let syn::Pat::Ident(ident) = &*param.pat else {
                    return Err(format!("bindgen declared {name} with an unnamed parameter"));
                };
                params.push((ident.ident.to_string(), rust(&param.ty)?));
            }
            let ret = match &f.sig.output {
                syn::ReturnType::Default => None,
                syn::ReturnType::Type(_, ty) => Some(rust(ty)?),
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

/// A type as Rust source, printed by prettyplease (`*mut CUstream`, not the token stream's `* mut CUstream`).
pub fn rust(ty: &syn::Type) -> Result<String, String> {
    let alias: syn::File = syn::parse_quote!(type T = #ty;);
    let text = prettyplease::unparse(&alias);
    text.trim()
        .strip_prefix("type T = ")
        .and_then(|t| t.strip_suffix(';'))
        .map(str::to_string)
        .ok_or_else(|| format!("prettyplease printed a type alias as {text:?}"))
}
