//! Every function nccl.h declares is called somewhere in the crate: by a helper (`src/`), a test, an
//! example or a benchmark. The header is the one the build used (`build_info::NCCL_INCLUDE`), so the
//! list follows the installed NCCL. A call is the name followed by `(` in a `.rs` file, outside `//`
//! comments; the generated snapshot (`src/snapshot/`) declares every function and does not count.
//! Needs no GPU: it reads files.

use std::path::{Path, PathBuf};

use metrale_gpu_sys::version::{build_info, NcclVersion};
use metrale_gpu_testkit::skip::skip;

/// Where calls are looked for, under the crate's root.
const SEARCHED: &[&str] = &["src", "tests", "examples", "benches", "bench"];
/// bindgen's output, committed: it names everything and calls nothing.
const GENERATED: &str = "src/snapshot";
/// The return types of nccl.h's functions.
const RETURNS: &[&str] = &["ncclResult_t", "void", "const char*"];

/// The functions a header declares: `<return type> nccl…(` at the start of a line, without the
/// `pnccl…` profiling twins.
fn declared(header: &str) -> Vec<String> {
    let mut names: Vec<String> = header
        .lines()
        .filter_map(|line| {
            let line = line.trim_start();
            let rest = RETURNS.iter().find_map(|r| line.strip_prefix(r))?;
            if !rest.starts_with(char::is_whitespace) {
                return None;
            }
            let rest = rest.trim_start();
            let name: String = rest
                .chars()
                .take_while(|&c| c.is_ascii_alphanumeric() || c == '_')
                .collect();
            let call = rest[name.len()..].trim_start().starts_with('(');
            (call && name.starts_with("nccl")).then_some(name)
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Whether `source` calls `name`: the whole identifier, then `(`, outside a `//` comment.
fn calls(source: &str, name: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    source.lines().any(|line| {
        let code = line.split("//").next().unwrap_or("");
        code.match_indices(name).any(|(at, _)| {
            let before = code[..at].chars().next_back();
            let after = code[at + name.len()..].trim_start();
            !before.is_some_and(ident) && after.starts_with('(')
        })
    })
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
    let header_path = Path::new(build_info::NCCL_INCLUDE).join("nccl.h");
    let header = std::fs::read_to_string(&header_path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", header_path.display()));
    let functions = declared(&header);
    assert!(
        functions.iter().any(|f| f == "ncclAllReduce")
            && functions.iter().any(|f| f == "ncclGetErrorString"),
        "the declarations of {} were not understood (found {functions:?})",
        header_path.display()
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in SEARCHED {
        rust_files(&root.join(dir), root, &mut files);
    }
    let sources: Vec<String> = files
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .collect();
    let uncalled: Vec<&String> = functions
        .iter()
        .filter(|f| !sources.iter().any(|s| calls(s, f)))
        .collect();
    println!(
        "{} functions declared by {}, {} called in {} files under {SEARCHED:?}",
        functions.len(),
        header_path.display(),
        functions.len() - uncalled.len(),
        files.len()
    );
    assert!(
        uncalled.is_empty(),
        "{} of the {} functions nccl.h declares are called by no helper, test, example or benchmark: {}",
        uncalled.len(),
        functions.len(),
        uncalled.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
    );
}

/// The parser and the call finder on the shapes nccl.h and Rust code take.
#[test]
fn declarations_and_calls_are_recognised() {
    let header = "ncclResult_t  ncclFoo(int x);\nncclResult_t pncclFoo(int x);\n\
                  const char*  ncclBar(ncclResult_t r);\nvoid  ncclBaz();\ntypedef struct { int opCnt; } ncclDesc_t;\n\
                  ncclResult_t ncclLong(const void* a,\n    int b);\n * ncclResult_t ncclInComment(";
    assert_eq!(
        declared(header),
        ["ncclBar", "ncclBaz", "ncclFoo", "ncclLong"]
    );
    assert!(calls("let r = unsafe { ncclFoo (1) };", "ncclFoo"));
    assert!(!calls("// ncclFoo(1)", "ncclFoo"));
    assert!(!calls("pncclFoo(1); ncclFooBar(2); \"ncclFoo\"", "ncclFoo"));
}
