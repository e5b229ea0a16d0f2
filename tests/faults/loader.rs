//! Version safety at run time: a function missing from an older libnccl.
//!
//! - A status code a newer library returns that these headers do not list (2.30's `ncclTimeout = 8`
//!   through 2.29.7 headers) is an error with its code, never success: tests/nccl_library.rs
//!   (`unknown_result_codes_are_errors_with_their_code`) checks it; not repeated here.
//! - Loaded at run time (the default): a library older than the headers is refused (every call fails with
//!   the version skew), unless `METRALE_NCCL_ALLOW_OLDER=1` accepts it; then the functions it has work and
//!   a call of one it lacks returns a status that `check_nccl` turns into an error naming the function,
//!   the library's version and file. The process never dies of it.
//! - Feature `link`: Rust links executables with `-z now` (BIND_NOW: every symbol is resolved at start-up),
//!   so a program calling a function the older library lacks never starts: the dynamic loader stops it
//!   before `main` with `<program>: symbol lookup error: <program>: undefined symbol: <function>` and
//!   exit status 127.
//!
//! The tests below show each: with NCCL 2.29+ headers this test binary calls `ncclCommGrow` (new in 2.29:
//! `nm -D` lists it in 2.29.7's libnccl.so.2 and not in 2.28.9's). They need such a library: they look in
//! `$METRALE_OLDER_NCCL_LIB` (the GPU runner sets it to the host's NCCL), in `.deps/nccl-*` (what
//! `ci/setup 2.28.9` installs; `.deps/<target>/nccl-*` when cross-testing), and in the system's library
//! cache (`ldconfig -p`). A candidate that turns out not to be older (the call reaches the library) is
//! passed over; when none is older, the test says so and where it looked, and passes without proving
//! anything.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use metrale_gpu_sys::version::NcclVersion;
use metrale_gpu_testkit::deps;
use metrale_gpu_testkit::skip::skip;

use crate::common::child;

/// The child role: call the 2.29 function.
pub const ROLE: &str = "missing-symbol";
/// A folder holding an older `libnccl.so.2`, looked at first.
pub const OLDER_NCCL_VAR: &str = "METRALE_OLDER_NCCL_LIB";
/// The function this binary calls that NCCL 2.28 lacks.
pub const NEW_FUNCTION: &str = "ncclCommGrow";

/// The child: calls `ncclCommGrow` (with arguments NCCL refuses), proving the process started, and prints
/// what `check_nccl` made of its status.
pub fn call_a_2_29_function() {
    #[cfg(nccl_2_29)]
    {
        use metrale_gpu_sys::nccl::*;
        let mut newcomm: NcclComm = std::ptr::null_mut();
        // SAFETY: a NULL parent and NULL unique id, which NCCL checks and refuses before using anything.
        let res = unsafe {
            ncclCommGrow(
                std::ptr::null_mut(),
                2,
                std::ptr::null(),
                0,
                &mut newcomm,
                std::ptr::null_mut(),
            )
        };
        match check_nccl(res, NEW_FUNCTION) {
            Ok(()) => println!("CHILD STARTED: {NEW_FUNCTION} returned Ok"),
            Err(e) => println!("CHILD STARTED: {NEW_FUNCTION} returned Err: {e}"),
        }
    }
}

/// Folders that may hold a libnccl older than the headers, in the order they are tried.
fn candidates() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os(OLDER_NCCL_VAR)
        .map(PathBuf::from)
        .into_iter()
        .collect();
    // The checkout the test runs in (cargo and nextest set CARGO_MANIFEST_DIR), then the one it was built in.
    let roots = [
        std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from),
        Some(PathBuf::from(env!("CARGO_MANIFEST_DIR"))),
    ];
    for root in roots.into_iter().flatten() {
        dirs.extend(deps::installed_nccl(&root).into_iter().map(|(_, lib)| lib));
    }
    for ldconfig in ["ldconfig", "/sbin/ldconfig"] {
        if let Ok(out) = Command::new(ldconfig).arg("-p").output() {
            dirs.extend(
                String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .filter(|l| l.contains("libnccl.so"))
                    .filter_map(|l| l.rsplit("=> ").next())
                    .filter_map(|p| Path::new(p.trim()).parent().map(Path::to_path_buf)),
            );
            break;
        }
    }
    let mut unique = Vec::new();
    for d in dirs {
        if d.join("libnccl.so.2").exists() && !unique.contains(&d) {
            unique.push(d);
        }
    }
    unique
}

/// This binary as the child, with `lib_dir` as its libnccl (`None`: as the parent runs; otherwise the
/// loader's variable names it, and it is alone on LD_LIBRARY_PATH for the linked build), and `extra`
/// set: its exit code and everything it wrote.
fn run_child(lib_dir: Option<&Path>, extra: &[(&str, String)]) -> (Option<i32>, String) {
    let mut env: Vec<(&str, String)> = extra.to_vec();
    if let Some(d) = lib_dir {
        env.push(("LD_LIBRARY_PATH", d.display().to_string()));
        env.push(("METRALE_NCCL_LIBRARY", d.display().to_string()));
    }
    let mut c = child::spawn(&format!("{ROLE} child"), ROLE, &env);
    let status = c.wait_exit(Duration::from_secs(60));
    (status.and_then(|s| s.code()), c.output())
}

/// `Some(why)` where these headers lack the function, so that nothing here needs a newer library.
fn headers_lack_the_function() -> Option<String> {
    let since = NcclVersion {
        major: 2,
        minor: 29,
        patch: 0,
    };
    (!cfg!(nccl_2_29) || NcclVersion::HEADERS < since).then(|| {
        format!(
            "built against NCCL {} headers, which lack {NEW_FUNCTION} (2.29+); nothing in this binary \
             needs a newer library",
            NcclVersion::HEADERS
        )
    })
}

/// The child with the parent's own library: it starts and calls the function.
fn the_parents_library_has_it() {
    let (code, output) = run_child(None, &[]);
    assert!(
        code == Some(0) && output.contains(&format!("CHILD STARTED: {NEW_FUNCTION} returned Err")),
        "the child failed with the parent's own library (exit {code:?}):\n{output}"
    );
    assert!(
        !output.contains("lacks"),
        "the parent's library lacks {NEW_FUNCTION}?\n{output}"
    );
}

/// The skip when no candidate is older than the headers.
fn no_older_library(tried: &[PathBuf]) {
    skip(format_args!(
        "no libnccl older than the headers ({}) found, so nothing shows what a missing function does; \
         looked in ${OLDER_NCCL_VAR}, .deps/nccl-*/nvidia/nccl/lib and ldconfig's cache: {tried:?}. Set \
         {OLDER_NCCL_VAR}=<folder of a libnccl.so.2 before 2.29>, or install one with `ci/setup 2.28.9`",
        NcclVersion::HEADERS
    ));
}

#[cfg(not(feature = "link"))]
#[test]
fn a_function_missing_from_an_older_library_fails_its_call_naming_it() {
    if let Some(why) = headers_lack_the_function() {
        return skip(format_args!("{why}"));
    }
    the_parents_library_has_it();
    let allow = [("METRALE_NCCL_ALLOW_OLDER", "1".to_string())];
    let tried = candidates();
    for dir in &tried {
        let (code, output) = run_child(Some(dir), &allow);
        if !output.contains(&format!("lacks {NEW_FUNCTION}")) {
            println!(
                "{}: not older than the headers (exit {code:?}); next\n{output}",
                dir.display()
            );
            continue;
        }
        println!("with {}: exit status {code:?}\n{output}", dir.display());
        assert_eq!(code, Some(0), "the child ends normally: {output}");
        let library = dir.join("libnccl.so.2").display().to_string();
        for text in [
            "CHILD STARTED: ncclCommGrow returned Err: ncclCommGrow failed: the loaded libnccl ",
            &library,
            &format!(
                "which the nccl.h {} this crate was built with declares",
                NcclVersion::HEADERS
            ),
        ] {
            assert!(output.contains(text), "expected {text:?} in:\n{output}");
        }
        // Without the opt-in, the older library is refused: the same call says so.
        let (code, output) = run_child(Some(dir), &[]);
        assert_eq!(code, Some(0), "the child ends normally: {output}");
        for text in [
            "CHILD STARTED: ncclCommGrow returned Err: NCCL version skew: the loaded libnccl is ",
            "METRALE_NCCL_ALLOW_OLDER=1",
        ] {
            assert!(output.contains(text), "expected {text:?} in:\n{output}");
        }
        return;
    }
    no_older_library(&tried);
}

#[cfg(feature = "link")]
#[test]
fn a_function_missing_from_an_older_library_stops_the_linked_program_at_load() {
    if let Some(why) = headers_lack_the_function() {
        return skip(format_args!("{why}"));
    }
    the_parents_library_has_it();
    let tried = candidates();
    for dir in &tried {
        let (code, output) = run_child(Some(dir), &[]);
        if output.contains("CHILD STARTED") {
            println!(
                "{}: not older than the headers (the child started); next",
                dir.display()
            );
            continue;
        }
        println!(
            "with {} first: exit status {code:?}\n{output}",
            dir.display()
        );
        assert_eq!(
            code,
            Some(127),
            "the loader's exit status for a missing symbol"
        );
        assert!(
            output.contains("symbol lookup error") && output.contains("undefined symbol: nccl"),
            "expected the dynamic loader's message, got: {output}"
        );
        assert!(
            !output.contains("running"),
            "the harness must not have started: {output}"
        );
        return;
    }
    no_older_library(&tried);
}
