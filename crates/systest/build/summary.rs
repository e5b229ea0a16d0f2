//! `api.json`: what the bindings declare, as one JSON object, for `ci/upgrade` to compare across NCCL
//! versions (ci/api-delta reads it): functions with their signatures, structs and unions by C name with
//! bindgen's size and their fields, constants, each enum's constants, and the initializer macros.

use std::collections::{BTreeMap, HashMap};

use quote::ToTokens;
use syn::{Expr, Fields, ForeignItem, Item, Lit, Stmt};

use crate::Initializer;

pub fn json(
    items: &[Item],
    c_names: &HashMap<String, String>,
    initializers: &[&Initializer],
) -> String {
    let c_of = |rust: &str| c_names.get(rust).cloned().unwrap_or_else(|| rust.into());
    let sizes = layout_sizes(items);
    let mut functions = BTreeMap::new();
    let mut records = BTreeMap::new();
    let mut constants = BTreeMap::new();
    let mut enums: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for item in items {
        match item {
            Item::ForeignMod(block) => {
                for item in &block.items {
                    if let ForeignItem::Fn(f) = item {
                        functions.insert(f.sig.ident.to_string(), string(tokens(&f.sig)));
                    }
                }
            }
            Item::Struct(s) => {
                if let Fields::Named(fields) = &s.fields {
                    let names = fields.named.iter().filter_map(|f| f.ident.as_ref());
                    record(&mut records, &s.ident, names, &sizes, &c_of);
                }
            }
            Item::Union(u) => {
                let names = u.fields.named.iter().filter_map(|f| f.ident.as_ref());
                record(&mut records, &u.ident, names, &sizes, &c_of);
            }
            Item::Const(k) if k.ident != "_" => {
                constants.insert(k.ident.to_string(), string(tokens(&k.expr)));
            }
            Item::Impl(imp) => {
                for (ty, k) in crate::impl_consts(imp) {
                    // `ncclResult_t(8)`: the value is the argument.
                    let value = match &k.expr {
                        Expr::Call(call) if call.args.len() == 1 => tokens(&call.args[0]),
                        other => tokens(other),
                    };
                    enums
                        .entry(c_of(&ty.to_string()))
                        .or_default()
                        .insert(k.ident.to_string(), string(value));
                }
            }
            _ => {}
        }
    }
    let initializers: BTreeMap<String, String> = initializers
        .iter()
        .map(|i| {
            let value = object([("type", string(&i.c_type)), ("definition", string(&i.body))]);
            (i.name.clone(), value)
        })
        .collect();
    let map = |m: BTreeMap<String, String>| object(m);
    let enums = enums.into_iter().map(|(k, v)| (k, map(v))).collect();
    object([
        ("functions", map(functions)),
        ("structs", map(records)),
        ("constants", map(constants)),
        ("enums", map(enums)),
        ("initializers", map(initializers)),
    ]) + "\n"
}

/// A struct or union under its C name: bindgen's name, its size (from bindgen's layout test), its fields
/// (without bindgen's synthetic `_bitfield_1`, `__bindgen_anon_1`). Anonymous nested types and opaque
/// structs have no C spelling or no layout, and are left out.
fn record<'a>(
    records: &mut BTreeMap<String, String>,
    ident: &syn::Ident,
    fields: impl Iterator<Item = &'a syn::Ident>,
    sizes: &HashMap<String, u64>,
    c_of: &impl Fn(&str) -> String,
) {
    let rust = ident.to_string();
    let Some(size) = sizes.get(&rust) else {
        return;
    };
    if rust.contains("__bindgen_ty_") {
        return;
    }
    let fields: Vec<String> = fields
        .map(|f| f.to_string())
        .filter(|f| !f.starts_with('_'))
        .map(|f| string(&f))
        .collect();
    let value = object([
        ("rust", string(&rust)),
        ("size", size.to_string()),
        ("fields", format!("[{}]", fields.join(", "))),
    ]);
    records.insert(c_of(&rust), value);
}

/// bindgen's layout tests, `["Size of T"][size_of::<T>() - 88usize];`: T's size by its Rust name.
fn layout_sizes(items: &[Item]) -> HashMap<String, u64> {
    let mut sizes = HashMap::new();
    for item in items {
        let Item::Const(k) = item else { continue };
        let Expr::Block(block) = &*k.expr else {
            continue;
        };
        for stmt in &block.block.stmts {
            let Stmt::Expr(Expr::Index(index), _) = stmt else {
                continue;
            };
            let (Expr::Array(label), Expr::Binary(sub)) = (&*index.expr, &*index.index) else {
                continue;
            };
            let Some(Expr::Lit(label)) = label.elems.first() else {
                continue;
            };
            let (Lit::Str(label), Expr::Lit(size)) = (&label.lit, &*sub.right) else {
                continue;
            };
            let Lit::Int(size) = &size.lit else { continue };
            if let (Some(name), Ok(size)) =
                (label.value().strip_prefix("Size of "), size.base10_parse())
            {
                sizes.insert(name.to_string(), size);
            }
        }
    }
    sizes
}

/// Tokens as a readable line: `*mut ncclComm_t`, `c_int`, `-1`, without the spaces quote puts between them.
fn tokens(t: &impl ToTokens) -> String {
    let text = t.to_token_stream().to_string();
    text.strip_prefix("- ")
        .map_or(text.clone(), |number| format!("-{number}"))
        .replace(":: std :: os :: raw :: ", "")
        .replace(":: std :: ffi :: ", "")
        .replace(" :: ", "::")
        .replace("* const ", "*const ")
        .replace("* mut ", "*mut ")
        .replace(" ,", ",")
        .replace(",)", ")")
        .replace(" (", "(")
        .replace("( ", "(")
        .replace(" )", ")")
        .replace(" :", ":")
}

fn object<K: AsRef<str>>(entries: impl IntoIterator<Item = (K, String)>) -> String {
    let entries: Vec<String> = entries
        .into_iter()
        .map(|(k, v)| format!("{}: {v}", string(k.as_ref())))
        .collect();
    format!("{{{}}}", entries.join(", "))
}

/// A JSON string.
fn string(s: impl AsRef<str>) -> String {
    let mut out = String::from('"');
    for c in s.as_ref().chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
