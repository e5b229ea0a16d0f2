//! Version safety at run time, as the dynamic loader enforces it.
//!
//! - A status code a newer library returns that these headers do not list (2.30's `ncclTimeout = 8`
//!   through 2.29.7 headers) is an error with its code, never success: tests/nccl_library.rs
//!   (`unknown_result_codes_are_errors_with_their_code`) checks it; not repeated here.
//! - A library older than the headers may lack a function the program calls. Rust links executables
//!   with `-z now` (BIND_NOW: every symbol is resolved at start-up, not at the first call), so such a
//!   program never starts: the dynamic loader stops it before `main` with
//!   `<program>: symbol lookup error: <program>: undefined symbol: <function>` and exit status 127.
//!   Nothing of the program runs, so no Rust code can report it more kindly; what a user sees is that
//!   line. A program that calls only functions the older library has starts, and
//!   `version::check_library_version()` then reports the skew (tests/version_skew.rs).
//!
//! The test below shows it: with NCCL 2.29+ headers this test binary calls `ncclCommGrow` (new in 2.29:
//! `nm -D` lists it in 2.29.7's libnccl.so.2 and not in 2.28.9's), so the same binary with
//! LD_LIBRARY_PATH pointing at an older libnccl cannot start at all. It needs such a library: it looks in
//! `$METRALE_OLDER_NCCL_LIB` (the GPU runner sets it to the host's NCCL), in `.deps/nccl-*` (what
//! `ci/setup 2.28.9` installs; `.deps/<target>/nccl-*` when cross-testing), and in the system's library cache (`ldconfig -p`). A candidate that turns
//! out not to be older (the child starts) is passed over; when none is older, the test says so and where
//! it looked, and passes without proving anything.

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

/// The child: calls `ncclCommGrow` (with arguments NCCL refuses), proving the process started.
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
        println!(
            "CHILD STARTED: {NEW_FUNCTION} returned {:?}",
            check_nccl(res, NEW_FUNCTION)
        );
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

/// This binary as the child, with `lib_dir` alone on LD_LIBRARY_PATH (`None`: as the parent runs):
/// its exit code and everything it wrote.
fn run_child(lib_dir: Option<&Path>) -> (Option<i32>, String) {
    let env: Vec<(&str, String)> = lib_dir
        .map(|d| ("LD_LIBRARY_PATH", d.display().to_string()))
        .into_iter()
        .collect();
    let mut c = child::spawn(&format!("{ROLE} child"), ROLE, &env);
    let status = c.wait_exit(Duration::from_secs(60));
    (status.and_then(|s| s.code()), c.output())
}

#[test]
fn a_function_missing_from_an_older_library_stops_the_program_at_load() {
    if !cfg!(nccl_2_29)
        || NcclVersion::HEADERS
            < (NcclVersion {
                major: 2,
                minor: 29,
                patch: 0,
            })
    {
        return skip(format_args!(
            "built against NCCL {} headers, which lack {NEW_FUNCTION} (2.29+); nothing in this binary \
             needs a newer library",
            NcclVersion::HEADERS
        ));
    }

    // With the library the parent loaded, the child starts and calls the function.
    let (code, output) = run_child(None);
    assert!(
        code == Some(0) && output.contains(&format!("CHILD STARTED: {NEW_FUNCTION} returned Err")),
        "the child failed with the parent's own library (exit {code:?}):\n{output}"
    );

    let tried = candidates();
    for dir in &tried {
        let (code, output) = run_child(Some(dir));
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
    skip(format_args!(
        "no libnccl older than the headers ({}) found, so nothing shows the loader's refusal; looked in \
         ${OLDER_NCCL_VAR}, .deps/nccl-*/nvidia/nccl/lib and ldconfig's cache: {tried:?}. Set {OLDER_NCCL_VAR}=<folder \
         of a libnccl.so.2 before 2.29>, or install one with `ci/setup 2.28.9`",
        NcclVersion::HEADERS
    ));
}
