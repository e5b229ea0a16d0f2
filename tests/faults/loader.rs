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
//! LD_LIBRARY_PATH pointing at ci/setup's 2.28.9 cannot start at all. Run normally, it loads the pinned
//! library through its RUNPATH and every test runs.

use std::path::PathBuf;
use std::process::Command;

use metrale_gpu_sys::version::NcclVersion;

pub const MISSING_SYMBOL_CHILD: &str = "missing_symbol_child";
pub const MISSING_SYMBOL_VAR: &str = "METRALE_FAULT_MISSING_SYMBOL";
/// The function this binary calls that NCCL 2.28.9 lacks.
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

fn run_child(lib_dir: Option<&PathBuf>) -> std::process::Output {
    let mut cmd = Command::new(std::env::current_exe().expect("own path"));
    cmd.args([
        "--ignored",
        "--exact",
        MISSING_SYMBOL_CHILD,
        "--nocapture",
        "--test-threads=1",
    ])
    .env(MISSING_SYMBOL_VAR, "1");
    if let Some(dir) = lib_dir {
        cmd.env("LD_LIBRARY_PATH", dir);
    }
    cmd.output().expect("run the test binary again")
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
        println!(
            "skipped: built against NCCL {} headers, which lack {NEW_FUNCTION} (2.29+); nothing in this binary \
             needs a newer library",
            NcclVersion::HEADERS
        );
        return;
    }
    let old = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".deps/nccl-2.28.9/nvidia/nccl/lib");
    assert!(
        old.join("libnccl.so.2").exists(),
        "libnccl 2.28.9 missing at {}: install it with `ci/setup 2.28.9` (ci/test does)",
        old.display()
    );

    // With the library it was built against (RUNPATH), the child starts and calls the function.
    let ok = run_child(None);
    let stdout = String::from_utf8_lossy(&ok.stdout);
    assert!(
        ok.status.success(),
        "the child failed with its own library: {stdout}\n{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(
        stdout.contains(&format!("CHILD STARTED: {NEW_FUNCTION} returned Err")),
        "{stdout}"
    );

    // With 2.28.9 first on LD_LIBRARY_PATH, the loader refuses to start it.
    let out = run_child(Some(&old));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    println!(
        "exit status {:?}\nstderr: {stderr}stdout: {stdout}",
        out.status.code()
    );
    assert_eq!(
        out.status.code(),
        Some(127),
        "the loader's exit status for a missing symbol"
    );
    assert!(
        stderr.contains("symbol lookup error")
            && stderr.contains(&format!("undefined symbol: {NEW_FUNCTION}")),
        "expected the dynamic loader's message, got: {stderr}"
    );
    assert!(
        !stdout.contains("running") && !stdout.contains("CHILD STARTED"),
        "the harness must not have started: {stdout}"
    );
}
