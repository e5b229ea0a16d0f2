//! The sizes bindgen's layout tests state for the structs the shim fills, read from its output by syn:
//! what `bundled-bindings` has the shim check the C compiler's `sizeof` against (`src/snapshot/facts.rs`).

/// Each of the structs the shim fills (`filled`, by C typedef name) with the size bindgen gave its Rust
/// type, 0 where the headers declare none.
pub fn filled_struct_sizes<'a>(
    bindings: &syn::File,
    filled: &[&'a str],
) -> Result<Vec<(&'a str, usize)>, String> {
    filled
        .iter()
        .map(|&c_name| match rust_struct(bindings, c_name) {
            None => Ok((c_name, 0)),
            Some(rust) => asserted_size(bindings, &rust)
                .map(|size| (c_name, size))
                .ok_or_else(|| format!("bindgen's output has no layout test of {rust}'s size")),
        })
        .collect()
}

/// The struct a C name stands for: itself, or what `pub type ncclConfig_t = ncclConfig_v22800;` names.
fn rust_struct(bindings: &syn::File, c_name: &str) -> Option<String> {
    bindings.items.iter().find_map(|item| match item {
        syn::Item::Struct(s) if s.ident == c_name => Some(c_name.to_string()),
        syn::Item::Type(alias) if alias.ident == c_name => match &*alias.ty {
            syn::Type::Path(path) => Some(path.path.segments.last()?.ident.to_string()),
            _ => None,
        },
        _ => None,
    })
}

/// N in bindgen's `[…][::std::mem::size_of::<rust>() - Nusize];`, inside its `const _: () = { … };`.
fn asserted_size(bindings: &syn::File, rust: &str) -> Option<usize> {
    let statements = bindings.items.iter().filter_map(|item| match item {
        syn::Item::Const(c) => match &*c.expr {
            syn::Expr::Block(block) => Some(&block.block.stmts),
            _ => None,
        },
        _ => None,
    });
    statements.flatten().find_map(|statement| {
        let syn::Stmt::Expr(syn::Expr::Index(check), _) = statement else {
            return None;
        };
        let syn::Expr::Binary(difference) = &*check.index else {
            return None;
        };
        let (syn::Expr::Call(call), syn::BinOp::Sub(_), syn::Expr::Lit(size)) =
            (&*difference.left, &difference.op, &*difference.right)
        else {
            return None;
        };
        let syn::Expr::Path(function) = &*call.func else {
            return None;
        };
        let segment = function.path.segments.last()?;
        let syn::PathArguments::AngleBracketed(generics) = &segment.arguments else {
            return None;
        };
        let Some(syn::GenericArgument::Type(syn::Type::Path(ty))) = generics.args.first() else {
            return None;
        };
        let syn::Lit::Int(size) = &size.lit else {
            return None;
        };
        (segment.ident == "size_of" && ty.path.is_ident(rust))
            .then(|| size.base10_parse().ok())
            .flatten()
    })
}
