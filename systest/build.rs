//! Generates the layout checks from the bindings the crate generated (`DEP_NCCL_BINDINGS`), in the style
//! of rust-lang/libc's ctest: a C file that records the C compiler's sizeof, _Alignof, offsetof and
//! constant values for every item, compiled with cc against the same headers (`DEP_NCCL_INCLUDE`,
//! `DEP_NCCL_CUDA_INCLUDE`), and a Rust file with the same tables from the Rust side.

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

    let source = std::fs::read_to_string(&bindings).expect("read the generated bindings");
    let file = syn::parse_file(&source).expect("parse the generated bindings");
    let tables = Tables::collect(&file.items);

    let c = out.join("systest.c");
    std::fs::write(&c, tables.c_source()).expect("write systest.c");
    std::fs::write(out.join("checks.rs"), tables.rust_source()).expect("write checks.rs");
    cc::Build::new()
        .file(&c)
        .include(manifest.join(".."))
        .includes(&includes)
        .compile("systest");
}

/// The initializer macros the shim turns into `Default`: (shim name, C type, macro).
const INITIALIZERS: &[(&str, &str, &str)] = &[
    ("nccl_config", "ncclConfig_t", "NCCL_CONFIG_INITIALIZER"),
    (
        "nccl_sim_info",
        "ncclSimInfo_t",
        "NCCL_SIM_INFO_INITIALIZER",
    ),
    (
        "nccl_coll_config",
        "ncclCollConfig_t",
        "NCCL_COLLCONFIG_INITIALIZER",
    ),
    (
        "nccl_encryption_config",
        "ncclEncryptionConfig_t",
        "NCCL_ENCRYPTION_CONFIG_INITIALIZER",
    ),
];

#[derive(Default)]
struct Tables {
    /// (Rust path, C type) for sizeof/_Alignof.
    types: Vec<(String, String)>,
    /// (Rust type, Rust field, C type, C field).
    fields: Vec<(String, String, String, String)>,
    /// (Rust expression, C expression) of integer constants.
    ints: Vec<(String, String)>,
    /// The same for floating-point constants.
    floats: Vec<(String, String)>,
    /// The entries of INITIALIZERS whose shim function the bindings declare.
    initializers: Vec<(&'static str, &'static str, &'static str)>,
}

impl Tables {
    fn collect(items: &[Item]) -> Tables {
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
        let mut t = Tables::default();
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
                    // Bindgen's synthetic fields (`_bitfield_1`, `__bindgen_anon_1`) have no C name.
                    for f in names.into_iter().filter(|f| !f.starts_with('_')) {
                        t.fields.push((name.clone(), f.clone(), c.clone(), f));
                    }
                }
                Item::Impl(imp) => {
                    let Type::Path(ty) = &*imp.self_ty else {
                        continue;
                    };
                    let Some(ty) = ty.path.get_ident() else {
                        continue;
                    };
                    for item in &imp.items {
                        if let syn::ImplItem::Const(k) = item {
                            t.ints.push((
                                format!("{ty}::{}.0 as i64", k.ident),
                                format!("(long long)({})", k.ident),
                            ));
                        }
                    }
                }
                Item::ForeignMod(block) => {
                    for item in &block.items {
                        let syn::ForeignItem::Fn(f) = item else {
                            continue;
                        };
                        let name = f.sig.ident.to_string();
                        t.initializers.extend(
                            INITIALIZERS.iter().filter(|(shim, _, _)| {
                                name == format!("metrale_{shim}_initializer")
                            }),
                        );
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
        t
    }

    fn c_source(&self) -> String {
        let mut c = String::from(
            "#include <stddef.h>\n#include \"wrapper.h\"\n#include \"shim/shim.h\"\n\n",
        );
        let table = |c: &mut String, ty: &str, name: &str, rows: Vec<String>| {
            let _ = writeln!(
                c,
                "const {ty} {name}[] = {{\n    {},\n}};",
                rows.join(",\n    ")
            );
        };
        table(
            &mut c,
            "size_t",
            "systest_sizes",
            self.types
                .iter()
                .map(|(_, t)| format!("sizeof({t})"))
                .collect(),
        );
        table(
            &mut c,
            "size_t",
            "systest_aligns",
            self.types
                .iter()
                .map(|(_, t)| format!("_Alignof({t})"))
                .collect(),
        );
        let offsets = self
            .fields
            .iter()
            .map(|(_, _, t, f)| format!("offsetof({t}, {f})"))
            .collect();
        table(&mut c, "size_t", "systest_offsets", offsets);
        table(
            &mut c,
            "long long",
            "systest_ints",
            self.ints.iter().map(|(_, e)| e.clone()).collect(),
        );
        table(
            &mut c,
            "double",
            "systest_floats",
            self.floats.iter().map(|(_, e)| e.clone()).collect(),
        );
        for (shim, ty, init) in &self.initializers {
            let _ = writeln!(
                c,
                "const unsigned char *systest_{shim}_bytes(size_t *len) {{\n    static const {ty} v = {init};\n    *len = sizeof v;\n    return (const unsigned char *)&v;\n}}"
            );
        }
        c
    }

    fn rust_source(&self) -> String {
        let mut r = String::new();
        let _ = writeln!(
            r,
            "extern \"C\" {{\n    static systest_sizes: [usize; {n}];\n    static systest_aligns: [usize; {n}];\n    \
             static systest_offsets: [usize; {}];\n    static systest_ints: [i64; {}];\n    static systest_floats: [f64; {}];",
            self.fields.len(),
            self.ints.len(),
            self.floats.len(),
            n = self.types.len(),
        );
        for (shim, _, _) in &self.initializers {
            let _ = writeln!(
                r,
                "    fn systest_{shim}_bytes(len: *mut usize) -> *const u8;"
            );
        }
        r.push_str("}\n");
        let rows = self.initializers.iter().map(|(shim, ty, _)| {
            format!(
                "(\"{ty}\", (|| shim_value::<{ty}>(metrale_{shim}_initializer)) as RustSide, systest_{shim}_bytes as CSide),"
            )
        });
        let _ = writeln!(
            r,
            "const INITIALIZERS: &[(&str, RustSide, CSide)] = &[\n    {}\n];",
            rows.collect::<Vec<_>>().join("\n    ")
        );
        let table = |r: &mut String, name: &str, ty: &str, rows: Vec<String>| {
            let _ = writeln!(
                r,
                "const {name}: &[(&str, {ty})] = &[\n    {}\n];",
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

/// The literal of `1`, `-1` or `T(1)`.
fn literal(expr: &Expr) -> Option<&Lit> {
    match expr {
        Expr::Lit(l) => Some(&l.lit),
        Expr::Unary(u) if matches!(u.op, UnOp::Neg(_)) => literal(&u.expr),
        _ => None,
    }
}
