//! The layout of each struct the shim fills, as clang lays it out for bindgen (whose layout tests, compiled
//! with the bindings, hold the Rust type to the same): its size and the offset of every field. It is what
//! `bundled-bindings` has the shim check the headers found against (`src/snapshot/facts.rs`), so that a
//! struct whose fields moved is refused even where its size stayed.
//!
//! Nothing here reads C or bindgen's Rust text: bindgen's callbacks say which struct a typedef names and
//! what its fields are called, and clang evaluates `sizeof` and `offsetof` for each in a probe header that
//! bindgen translates into constants.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use bindgen::callbacks::{DiscoveredItem, DiscoveredItemId, FieldInfo, ParseCallbacks};

/// A filled struct's layout: its C typedef name, its size and each field's offset, in declaration order.
#[derive(Debug)]
pub struct Layout {
    pub c_name: String,
    pub size: u64,
    pub fields: Vec<(String, u64)>,
}

/// What bindgen's callbacks report while it generates the bindings: the structs and typedefs it emits,
/// and the fields of each struct, under their C names.
#[derive(Debug, Default, Clone)]
pub struct Fields(Arc<Mutex<Seen>>);

#[derive(Debug, Default)]
struct Seen {
    /// Each emitted struct's name, by bindgen's id for it.
    structs: HashMap<DiscoveredItemId, String>,
    /// Each typedef's name, and the id of the type it names.
    aliases: Vec<(String, DiscoveredItemId)>,
    /// (struct name, field name), in declaration order.
    fields: Vec<(String, String)>,
}

impl ParseCallbacks for Fields {
    fn new_item_found(&self, id: DiscoveredItemId, item: DiscoveredItem) {
        let mut seen = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match item {
            DiscoveredItem::Struct { final_name, .. } => {
                seen.structs.insert(id, final_name);
            }
            DiscoveredItem::Alias {
                alias_name,
                alias_for,
            } => seen.aliases.push((alias_name, alias_for)),
            _ => {}
        }
    }

    fn field_visibility(&self, info: FieldInfo<'_>) -> Option<bindgen::FieldVisibilityKind> {
        let mut seen = self.0.lock().unwrap_or_else(|p| p.into_inner());
        seen.fields
            .push((info.type_name.to_string(), info.field_name.to_string()));
        None // bindgen's own choice of visibility
    }
}

impl Fields {
    /// The fields of the struct `c_name` is (a struct of that name, or a typedef of one).
    fn of(&self, c_name: &str) -> Option<Vec<String>> {
        let seen = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let name = match seen.aliases.iter().find(|(alias, _)| alias == c_name) {
            Some((_, id)) => seen.structs.get(id)?.as_str(),
            None => seen.structs.values().find(|s| *s == c_name)?.as_str(),
        };
        let fields: Vec<String> = seen
            .fields
            .iter()
            .filter(|(owner, _)| owner == name)
            .map(|(_, field)| field.clone())
            .collect();
        (!fields.is_empty()).then_some(fields)
    }
}

/// The probe: a header whose constants clang evaluates to each filled struct's size and field offsets.
pub struct Probe {
    /// `#include <nccl.h>` and one `static const` per number.
    pub header: String,
    /// The structs and fields the constants stand for: `metrale_layout_<i>` is struct i's size,
    /// `metrale_layout_<i>_<j>` the offset of its field j.
    structs: Vec<(String, Vec<String>)>,
}

impl Probe {
    /// The probe's file name (bindgen's unsaved file; nothing is written).
    pub const NAME: &'static str = "metrale_layout_probe.h";
    /// The constants' names, for bindgen's allowlist.
    pub const VARS: &'static str = "metrale_layout_.*";

    /// The probe for the structs a shim fills (`filled`, by C name), declared by `include` (`nccl.h`), with
    /// the fields `fields` saw.
    pub fn new(include: &str, filled: &[&str], fields: &Fields) -> Result<Probe, String> {
        let mut header = format!("#include <stddef.h>\n#include <{include}>\n");
        let mut structs = Vec::new();
        for (i, &c_name) in filled.iter().enumerate() {
            let names = fields.of(c_name).ok_or_else(|| {
                format!("bindgen reported no fields of {c_name}, a struct the shim fills")
            })?;
            writeln!(
                header,
                "static const unsigned long long metrale_layout_{i} = sizeof({c_name});"
            )
            .ok();
            for (j, field) in names.iter().enumerate() {
                writeln!(
                    header,
                    "static const unsigned long long metrale_layout_{i}_{j} = offsetof({c_name}, {field});"
                )
                .ok();
            }
            structs.push((c_name.to_string(), names));
        }
        Ok(Probe { header, structs })
    }

    /// The layouts, from the constants bindgen generated for the probe.
    pub fn read(self, probed: &syn::File) -> Result<Vec<Layout>, String> {
        let value = |name: String| {
            probed
                .items
                .iter()
                .find_map(|item| match item {
                    syn::Item::Const(c) if c.ident == name => match &*c.expr {
                        syn::Expr::Lit(syn::ExprLit {
                            lit: syn::Lit::Int(n),
                            ..
                        }) => n.base10_parse::<u64>().ok(),
                        _ => None,
                    },
                    _ => None,
                })
                .ok_or_else(|| format!("clang did not evaluate {name} in bindgen's layout probe"))
        };
        self.structs
            .into_iter()
            .enumerate()
            .map(|(i, (c_name, names))| {
                let size = value(format!("metrale_layout_{i}"))?;
                let fields = names
                    .into_iter()
                    .enumerate()
                    .map(|(j, field)| Ok((field, value(format!("metrale_layout_{i}_{j}"))?)))
                    .collect::<Result<_, String>>()?;
                Ok(Layout {
                    c_name,
                    size,
                    fields,
                })
            })
            .collect()
    }
}
