//! Every function nccl.h declares is called somewhere in the workspace: by a helper (`src/`), the
//! watchdog crate (`crates/watchdog/`), a test, an example or a benchmark. The functions are the `nccl*` ones bindgen generated from the header the build
//! used, so the list follows the installed NCCL. A call is what syn parses as a call expression of that
//! name (also inside a macro's arguments): never a mention in a string or a comment. The generated
//! snapshot (`src/snapshot/`) declares every function and does not count. Needs no GPU: it reads files.
//! Against headers newer than the pin it skips: their new functions get tests when the pin moves there.

use std::path::{Path, PathBuf};

use metrale_gpu_sys::version::{build_info, NcclVersion};
use metrale_gpu_testkit::skip::skip;
use syn::visit::Visit;

/// Where calls are looked for, under the crate's root.
const SEARCHED: &[&str] = &["src", "watchdog", "tests", "examples", "benches", "bench"];
/// bindgen's output, committed: it names everything and calls nothing.
const GENERATED: &str = "src/snapshot";

/// The `nccl*` functions of bindgen's `extern "C"` blocks (not the shim's `metrale_*`).
fn declared(bindings: &syn::File) -> Vec<String> {
    let mut names: Vec<String> = bindings
        .items
        .iter()
        .filter_map(|item| match item {
            syn::Item::ForeignMod(block) => Some(&block.items),
            _ => None,
        })
        .flatten()
        .filter_map(|item| match item {
            syn::ForeignItem::Fn(f) => Some(f.sig.ident.to_string()),
            _ => None,
        })
        .filter(|name| name.starts_with("nccl"))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The names of the functions a file calls: `f(…)` and `path::f(…)`, in code and in macro arguments
/// that parse as expressions or statements.
#[derive(Default)]
struct Calls(Vec<String>);

impl<'ast> Visit<'ast> for Calls {
    fn visit_expr_call(&mut self, call: &'ast syn::ExprCall) {
        if let syn::Expr::Path(path) = &*call.func {
            if let Some(last) = path.path.segments.last() {
                self.0.push(last.ident.to_string());
            }
        }
        syn::visit::visit_expr_call(self, call);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        use syn::parse::Parser;
        let exprs = syn::punctuated::Punctuated::<syn::Expr, syn::Token![,]>::parse_terminated;
        if let Ok(args) = exprs.parse2(mac.tokens.clone()) {
            args.iter().for_each(|e| self.visit_expr(e));
        } else if let Ok(body) = syn::Block::parse_within.parse2(mac.tokens.clone()) {
            body.iter().for_each(|s| self.visit_stmt(s));
        }
    }
}

/// What `source` calls; `Err` when syn cannot parse it.
fn calls(source: &str) -> Result<Vec<String>, syn::Error> {
    let mut calls = Calls::default();
    calls.visit_file(&syn::parse_file(source)?);
    Ok(calls.0)
}

fn rust_files(dir: &Path, root: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for path in entries.filter_map(|e| e.ok().map(|e| e.path())) {
        if path
            .strip_prefix(root)
            .is_ok_and(|p| p == Path::new(GENERATED))
        {
            continue;
        }
        if path.is_dir() {
            rust_files(&path, root, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_function_of_nccl_h_is_called() {
    // A newer header declares functions the pinned one lacks: tests call them once the pin moves there.
    let h = NcclVersion::HEADERS;
    let pinned: Vec<u32> = build_info::PINNED_NCCL
        .split('.')
        .filter_map(|p| p.parse().ok())
        .collect();
    if vec![h.major, h.minor, h.patch] > pinned {
        return skip(format_args!(
            "built against NCCL {h} headers, newer than the pinned {}: their new functions are called once \
             the pin moves (ci/upgrade {h} lists them)",
            build_info::PINNED_NCCL
        ));
    }
    let bindings = include_str!(concat!(env!("OUT_DIR"), "/bindings.rs"));
    let functions = declared(&syn::parse_file(bindings).expect("bindgen's output parses"));
    assert!(
        functions.iter().any(|f| f == "ncclAllReduce")
            && functions.iter().any(|f| f == "ncclGetErrorString"),
        "the generated declarations were not understood (found {functions:?})"
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in SEARCHED {
        rust_files(&root.join(dir), root, &mut files);
    }
    let mut called = Vec::new();
    for file in &files {
        let source = std::fs::read_to_string(file)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
        called.extend(
            calls(&source).unwrap_or_else(|e| panic!("syn cannot parse {}: {e}", file.display())),
        );
    }
    let uncalled: Vec<&String> = functions.iter().filter(|f| !called.contains(f)).collect();
    println!(
        "{} functions declared by nccl.h ({}), {} called in {} files under {SEARCHED:?}",
        functions.len(),
        build_info::NCCL_INCLUDE,
        functions.len() - uncalled.len(),
        files.len()
    );
    assert!(
        uncalled.is_empty(),
        "{} of the {} functions nccl.h declares are called by no helper, the watchdog, test, example or benchmark: {}",
        uncalled.len(),
        functions.len(),
        uncalled.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
    );
}

/// The declarations bindgen writes, and what counts as a call: never a name in a string or a comment.
#[test]
fn declarations_and_calls_are_recognised() {
    let bindings = "unsafe extern \"C\" { pub fn ncclFoo(x: i32) -> ncclResult_t; \
                    pub fn metrale_shim(out: *mut i32); }\npub type ncclBar = i32;";
    assert_eq!(
        declared(&syn::parse_file(bindings).expect("parses")),
        ["ncclFoo"]
    );
    let source = r#"
        // ncclInComment(1)
        /// ncclInDoc(1)
        fn f() {
            let r = unsafe { ncclFoo (1) };
            let path = metrale_gpu_sys::ncclPath(2);
            assert_eq!(unsafe { ncclInMacro(3) }, r, "ncclInString({})", 4);
            let s = "ncclInString(5)";
            let g = ncclNotCalled;
            vec![ncclInVec(6); 2];
        }
    "#;
    let mut found = calls(source).expect("parses");
    found.retain(|c| c.starts_with("nccl"));
    found.sort();
    assert_eq!(found, ["ncclFoo", "ncclInMacro", "ncclInVec", "ncclPath"]);
}
