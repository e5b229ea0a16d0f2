//! Generates the layout checks from the bindings the crate generated (`DEP_NCCL_BINDINGS`), in the style
//! of rust-lang/libc's ctest: a C file that records the C compiler's sizeof, _Alignof, offsetof and
//! constant values for every item, compiled with cc against the same headers (`DEP_NCCL_INCLUDE`,
//! `DEP_NCCL_CUDA_INCLUDE`), and a Rust file with the same tables from the Rust side. The initializer
//! macros come from the crate's build too (`DEP_NCCL_INITIALIZERS`, the list its `Default`s are made
//! from). NCCL 2.28+'s device API (`DEP_NCCL_DEVICE_BINDINGS`, translated from the C++ `nccl_device.h`)
//! gets the same tables from the C++ compiler: a C++ file over `shim/device.h`. Beside them, `api.json`:
//! the bindings' API in one structured file, which `ci/upgrade` compares between two NCCL versions.

mod summary;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use syn::{Expr, Fields, Item, Lit, Type, UnOp};

fn main() {
    let var = |name: &str| {
        println!("cargo:rerun-if-env-changed={name}");
        std::env::var(name)
            .unwrap_or_else(|_| panic!("{name} is unset: systest must depend on metrale-gpu-sys"))
    };
    let bindings = PathBuf::from(var("DEP_NCCL_BINDINGS"));
    let mut includes = vec![PathBuf::from(var("DEP_NCCL_INCLUDE"))];
    includes.extend(var("DEP_NCCL_CUDA_INCLUDE").split(':').map(PathBuf::from));
    let manifest = PathBuf::from(var("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(var("OUT_DIR"));
    println!("cargo:rerun-if-changed={}", bindings.display());
    println!(
        "cargo:rustc-link-arg=-Wl,--enable-new-dtags,-rpath,{}",
        var("DEP_NCCL_LIB_DIR")
    );

    let initializers_rs = PathBuf::from(var("DEP_NCCL_INITIALIZERS"));
    println!("cargo:rerun-if-changed={}", initializers_rs.display());

    let parse = |path: &PathBuf| {
        let source = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        syn::parse_file(&source).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
    };
    let file = parse(&bindings);
    let mut initializers = initializers(&parse(&initializers_rs).items);
    println!("cargo:rustc-check-cfg=cfg(systest_device)");
    println!("cargo:rerun-if-env-changed=DEP_NCCL_DEVICE_BINDINGS");
    // The device API's items, and the initializers of its types: checked by the C++ compiler.
    let device = std::env::var("DEP_NCCL_DEVICE_BINDINGS").ok().map(|path| {
        let path = PathBuf::from(path);
        println!("cargo:rerun-if-changed={}", path.display());
        let device = parse(&path);
        let (of_device, of_nccl) = initializers
            .drain(..)
            .partition(|i: &Initializer| declares(&device.items, &i.c_type));
        initializers = of_nccl;
        Tables::collect(&device.items, of_device, Language::CXX)
    });
    let tables = Tables::collect(&file.items, initializers, Language::C);

    let mut rust = tables.rust_source();
    let mut items = file.items.clone();
    let mut c_names = tables.c_names.clone();
    let mut all_initializers: Vec<&Initializer> = tables.initializers.iter().collect();
    let mut build = cc::Build::new();
    build
        .file(tables.write_source(&out))
        .include(manifest.join("../.."))
        .includes(&includes);
    build.compile("systest");
    if let Some(device) = &device {
        println!("cargo:rustc-cfg=systest_device");
        rust.push_str(&device.rust_source());
        items.extend(parse(&PathBuf::from(var("DEP_NCCL_DEVICE_BINDINGS"))).items);
        c_names.extend(device.c_names.clone());
        all_initializers.extend(&device.initializers);
        cc::Build::new()
            .cpp(true)
            .cpp_link_stdlib(None)
            .std(&var("DEP_NCCL_DEVICE_CXX_STD"))
            // NCCL_COMM_PROPERTIES_INITIALIZER fills three members; utility.h has kernel-only helpers.
            .flag_if_supported("-Wno-missing-field-initializers")
            .flag_if_supported("-Wno-unused-function")
            .file(device.write_source(&out))
            .include(manifest.join("../.."))
            .includes(&includes)
            .compile("systest_device");
    }
    std::fs::write(out.join("checks.rs"), rust).expect("write checks.rs");
    std::fs::write(
        out.join("api.json"),
        summary::json(&items, &c_names, &all_initializers),
    )
    .expect("write api.json");
}

/// Whether `items` declare a type named `name` (a struct or a type alias).
fn declares(items: &[Item], name: &str) -> bool {
    items.iter().any(|item| match item {
        Item::Struct(s) => s.ident == name,
        Item::Type(t) => t.ident == name,
        _ => false,
    })
}

/// The compiler a table's side is measured by: nccl.h's items by the C compiler, the device API's by
/// the C++ compiler (its header is C++).
#[derive(Clone, Copy)]
struct Language {
    /// The generated source's file name.
    file: &'static str,
    /// What it includes, after stddef.h.
    headers: &'static str,
    /// `_Alignof` or `alignof`.
    alignof: &'static str,
    /// Before each table and function: C++ gives them C linkage (and external linkage to the tables).
    linkage: &'static str,
    /// The tables' names start with it (`systest_` or `systest_device_`); the Rust side's constants with
    /// `rust`.
    symbols: &'static str,
    rust: &'static str,
}

impl Language {
    const C: Language = Language {
        file: "systest.c",
        headers: "#include \"wrapper.h\"\n#include \"shim/shim.h\"\n",
        alignof: "_Alignof",
        linkage: "",
        symbols: "systest_",
        rust: "",
    };
    const CXX: Language = Language {
        file: "systest_device.cc",
        headers: "#include \"shim/device.h\"\n",
        alignof: "alignof",
        linkage: "extern \"C\" ",
        symbols: "systest_device_",
        rust: "DEVICE_",
    };
}

/// An initializer macro the crate turned into a `Default`, as its generated `initializers.rs` lists it:
/// `initializer!(TYPE, SHIM_FUNCTION, "MACRO", "DEFINITION");`.
pub struct Initializer {
    pub c_type: String,
    pub shim: String,
    pub name: String,
    pub body: String,
}

fn initializers(items: &[Item]) -> Vec<Initializer> {
    use syn::parse::Parser;
    let list: Vec<Initializer> = items
        .iter()
        .filter_map(|item| match item {
            Item::Macro(m) if m.mac.path.is_ident("initializer") => Some(&m.mac),
            _ => None,
        })
        .map(|mac| {
            let args = syn::punctuated::Punctuated::<Expr, syn::Token![,]>::parse_terminated
                .parse2(mac.tokens.clone())
                .expect("initializer!'s arguments");
            let text = |i: usize| {
                match args.get(i) {
                    Some(Expr::Path(p)) => p.path.get_ident().map(|i| i.to_string()),
                    Some(Expr::Lit(l)) => match &l.lit {
                        Lit::Str(s) => Some(s.value()),
                        _ => None,
                    },
                    _ => None,
                }
                .unwrap_or_else(|| panic!("initializer! argument {i} is no identifier or string"))
            };
            Initializer {
                c_type: text(0),
                shim: text(1),
                name: text(2),
                body: text(3),
            }
        })
        .collect();
    assert!(
        !list.is_empty(),
        "the crate's initializers.rs lists no initializer"
    );
    list
}

struct Tables {
    /// Which compiler measures the C side.
    language: Language,
    /// (Rust path, C type) for sizeof/_Alignof.
    types: Vec<(String, String)>,
    /// (Rust type, Rust field, C type, C field).
    fields: Vec<(String, String, String, String)>,
    /// (Rust expression, C expression) of integer constants.
    ints: Vec<(String, String)>,
    /// The same for floating-point constants.
    floats: Vec<(String, String)>,
    /// The initializer macros, from the crate's build.
    initializers: Vec<Initializer>,
    /// The C names of the structs NCCL versions (first fields `size`, `magic`, `version`): each needs
    /// an initializer macro to be filled correctly.
    versioned: Vec<String>,
    /// bindgen's Rust name to the C typedef name, where they differ.
    c_names: HashMap<String, String>,
}

impl Tables {
    fn collect(items: &[Item], initializers: Vec<Initializer>, language: Language) -> Tables {
        // `pub type ncclConfig_t = ncclConfig_v22800;`: C knows the struct by the typedef name.
        let mut c_name: HashMap<String, String> = HashMap::new();
        // `pub use self::cudaError_enum as CUresult;`: likewise for a typedef'd enum.
        for item in items {
            let (target, alias) = match item {
                Item::Type(alias) => match &*alias.ty {
                    Type::Path(target) => (
                        target.path.segments.last().map(|s| s.ident.clone()),
                        alias.ident.clone(),
                    ),
                    _ => continue,
                },
                Item::Use(u) => match &u.tree {
                    syn::UseTree::Path(p) => match &*p.tree {
                        syn::UseTree::Rename(r) => (Some(r.ident.clone()), r.rename.clone()),
                        _ => continue,
                    },
                    _ => continue,
                },
                _ => continue,
            };
            if let Some(target) = target {
                c_name
                    .entry(target.to_string())
                    .or_insert_with(|| alias.to_string());
            }
        }
        let c_of = |rust: &str| {
            c_name
                .get(rust)
                .cloned()
                .unwrap_or_else(|| rust.to_string())
        };
        let mut t = Tables {
            language,
            types: Vec::new(),
            fields: Vec::new(),
            ints: Vec::new(),
            floats: Vec::new(),
            initializers,
            versioned: Vec::new(),
            c_names: HashMap::new(),
        };
        for item in items {
            match item {
                // bindgen's names for anonymous nested types have no C spelling; their parent's
                // size and the offsets of the fields holding them cover them.
                Item::Struct(s) if s.ident.to_string().contains("__bindgen_ty_") => {}
                Item::Struct(s) => {
                    let name = s.ident.to_string();
                    let Fields::Named(fields) = &s.fields else {
                        // A newtype enum: its size is the C enum's.
                        t.types.push((name.clone(), c_of(&name)));
                        continue;
                    };
                    let names: Vec<String> = fields
                        .named
                        .iter()
                        .filter_map(|f| f.ident.as_ref())
                        .map(|i| i.to_string())
                        .collect();
                    if names == ["_unused"] {
                        continue; // an opaque struct: C has no definition to measure
                    }
                    let c = c_of(&name);
                    t.types.push((name.clone(), c.clone()));
                    if names.starts_with(&["size".into(), "magic".into(), "version".into()]) {
                        t.versioned.push(c.clone());
                    }
                    // Bindgen's synthetic fields (`_bitfield_1`, `__bindgen_anon_1`) have no C name.
                    for f in names.into_iter().filter(|f| !f.starts_with('_')) {
                        t.fields.push((name.clone(), f.clone(), c.clone(), f));
                    }
                }
                Item::Impl(imp) => {
                    for (ty, k) in impl_consts(imp) {
                        t.ints.push((
                            format!("{ty}::{}.0 as i64", k.ident),
                            format!("(long long)({})", k.ident),
                        ));
                    }
                }
                Item::Const(k) => {
                    let name = k.ident.to_string();
                    match literal(&k.expr) {
                        Some(Lit::Int(_)) => t
                            .ints
                            .push((format!("{name} as i64"), format!("(long long)({name})"))),
                        Some(Lit::Float(_)) => t
                            .floats
                            .push((format!("{name} as f64"), format!("(double)({name})"))),
                        _ => {} // strings (NCCL_SUFFIX) have no integer view
                    }
                }
                _ => {}
            }
        }
        t.c_names = c_name;
        t
    }

    /// Writes the C (or C++) side into `out`; returns its path.
    fn write_source(&self, out: &std::path::Path) -> PathBuf {
        let path = out.join(self.language.file);
        std::fs::write(&path, self.c_source()).expect("write systest's C side");
        path
    }

    fn c_source(&self) -> String {
        let Language {
            headers,
            alignof,
            linkage,
            symbols,
            ..
        } = self.language;
        let mut c = format!("#include <stddef.h>\n{headers}\n");
        // An empty table is left out (C has no empty array): the Rust side has none to read either.
        let table = |c: &mut String, ty: &str, name: &str, rows: Vec<String>| {
            if !rows.is_empty() {
                let _ = writeln!(
                    c,
                    "{linkage}const {ty} {symbols}{name}[] = {{\n    {},\n}};",
                    rows.join(",\n    ")
                );
            }
        };
        table(
            &mut c,
            "size_t",
            "sizes",
            self.types
                .iter()
                .map(|(_, t)| format!("sizeof({t})"))
                .collect(),
        );
        table(
            &mut c,
            "size_t",
            "aligns",
            self.types
                .iter()
                .map(|(_, t)| format!("{alignof}({t})"))
                .collect(),
        );
        let offsets = self
            .fields
            .iter()
            .map(|(_, _, t, f)| format!("offsetof({t}, {f})"))
            .collect();
        table(&mut c, "size_t", "offsets", offsets);
        table(
            &mut c,
            "long long",
            "ints",
            self.ints.iter().map(|(_, e)| e.clone()).collect(),
        );
        table(
            &mut c,
            "double",
            "floats",
            self.floats.iter().map(|(_, e)| e.clone()).collect(),
        );
        for Initializer { c_type, name, .. } in &self.initializers {
            let _ = writeln!(
                c,
                "{linkage}const unsigned char *systest_{c_type}_bytes(size_t *len) {{\n    static const {c_type} v = {name};\n    *len = sizeof v;\n    return (const unsigned char *)&v;\n}}"
            );
        }
        c
    }

    fn rust_source(&self) -> String {
        let Language {
            symbols: c,
            rust: p,
            ..
        } = self.language;
        let tables = [
            ("sizes", "usize", self.types.len()),
            ("aligns", "usize", self.types.len()),
            ("offsets", "usize", self.fields.len()),
            ("ints", "i64", self.ints.len()),
            ("floats", "f64", self.floats.len()),
        ];
        let mut r = String::new();
        let _ = writeln!(
            r,
            "/// The C side's tables, in the order of the Rust side's.\n\
             fn {lower}c_tables() -> CTables {{\n    \
             // SAFETY: the C side defines each table with exactly the generated length.\n    \
             unsafe {{\n        CTables {{",
            lower = p.to_lowercase()
        );
        for (name, _, len) in tables {
            let value = match len {
                0 => "&[]".to_string(),
                _ => format!("&{c}{name}"),
            };
            let _ = writeln!(r, "            {name}: {value},");
        }
        r.push_str("        }\n    }\n}\n");
        r.push_str("extern \"C\" {\n");
        for (name, ty, len) in tables.into_iter().filter(|(_, _, len)| *len > 0) {
            let _ = writeln!(r, "    static {c}{name}: [{ty}; {len}];");
        }
        for Initializer { c_type, shim, .. } in &self.initializers {
            let _ = writeln!(
                r,
                "    fn systest_{c_type}_bytes(len: *mut usize) -> *const u8;\n    \
                 fn {shim}(out: *mut {c_type});"
            );
        }
        r.push_str("}\n");
        let rows = self.initializers.iter().map(|Initializer { c_type, shim, .. }| {
            format!(
                "(\"{c_type}\", (|| shim_value::<{c_type}>({shim})) as RustSide, systest_{c_type}_bytes as CSide),"
            )
        });
        let _ = writeln!(
            r,
            "const {p}INITIALIZERS: &[(&str, RustSide, CSide)] = &[\n    {}\n];",
            rows.collect::<Vec<_>>().join("\n    ")
        );
        let _ = writeln!(
            r,
            "const {p}VERSIONED_STRUCTS: &[&str] = &{:?};",
            self.versioned
        );
        let table = |r: &mut String, name: &str, ty: &str, rows: Vec<String>| {
            let _ = writeln!(
                r,
                "const {p}{name}: &[(&str, {ty})] = &[\n    {}\n];",
                rows.join("\n    ")
            );
        };
        table(
            &mut r,
            "RUST_SIZES",
            "usize",
            self.types
                .iter()
                .map(|(t, _)| format!("(\"{t}\", size_of::<{t}>()),"))
                .collect(),
        );
        table(
            &mut r,
            "RUST_ALIGNS",
            "usize",
            self.types
                .iter()
                .map(|(t, _)| format!("(\"{t}\", align_of::<{t}>()),"))
                .collect(),
        );
        let offsets = self
            .fields
            .iter()
            .map(|(t, f, _, _)| format!("(\"{t}::{f}\", std::mem::offset_of!({t}, {f})),"))
            .collect();
        table(&mut r, "RUST_OFFSETS", "usize", offsets);
        table(
            &mut r,
            "RUST_INTS",
            "i64",
            self.ints
                .iter()
                .map(|(e, _)| format!("(\"{e}\", {e}),"))
                .collect(),
        );
        table(
            &mut r,
            "RUST_FLOATS",
            "f64",
            self.floats
                .iter()
                .map(|(e, _)| format!("(\"{e}\", {e}),"))
                .collect(),
        );
        r
    }
}

/// The associated constants of an `impl Name { ... }` block (bindgen's newtype constants, e.g.
/// `ncclResult_t::ncclSuccess`), each with the type's name; none for other impls.
fn impl_consts(imp: &syn::ItemImpl) -> impl Iterator<Item = (&syn::Ident, &syn::ImplItemConst)> {
    let ty = match &*imp.self_ty {
        Type::Path(ty) => ty.path.get_ident(),
        _ => None,
    };
    imp.items.iter().filter_map(move |item| match item {
        syn::ImplItem::Const(k) => ty.map(|ty| (ty, k)),
        _ => None,
    })
}

/// The literal of `1`, `-1` or `T(1)`.
fn literal(expr: &Expr) -> Option<&Lit> {
    match expr {
        Expr::Lit(l) => Some(&l.lit),
        Expr::Unary(u) if matches!(u.op, UnOp::Neg(_)) => literal(&u.expr),
        _ => None,
    }
}
