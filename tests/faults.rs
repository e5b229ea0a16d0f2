//! The fault suite (issue 5): no hang, no crash, nothing lost.
//!
//! - A peer killed mid-collective, a peer that never arrives, an abort from another thread while a
//!   collective is stuck (`faults/peers.rs`): the watchdog (`metrale_gpu_sys::watchdog`) returns an error
//!   within a stated bound, measured and printed on a `FAULT-BOUND` line, and the process cleans up.
//! - Bad input (`faults/bad_input.rs`): NCCL's error code and text, never a crash, and the communicator
//!   still works afterwards.
//! - Nothing leaks, many threads (`faults/leaks.rs`).
//! - Version safety: what the dynamic loader does with a function missing from an older libnccl
//!   (`faults/loader.rs`).
//!
//! GPU tests need 2 GPUs and are `#[ignore]`d (CI has none); `ci/faults-run.sh` runs them on the GPU
//! machine. A GPU test that finds fewer than 2 GPUs fails and says so. The CPU tests run everywhere.
// Rank-indexed loops over parallel per-rank arrays; configs set field by field after
// `NcclConfig::default()`, as the README shows (never a struct literal).
#![allow(clippy::needless_range_loop, clippy::field_reassign_with_default)]

#[path = "faults/bad_input.rs"]
mod bad_input;
#[path = "faults/common.rs"]
mod common;
#[path = "faults/leaks.rs"]
mod leaks;
#[path = "faults/loader.rs"]
mod loader;
#[path = "faults/peers.rs"]
mod peers;

/// The libnccl this binary loaded, against its headers (ci/faults-run.sh prints it first).
#[test]
fn nccl_library_in_use() {
    use metrale_gpu_sys::version::{self, NcclVersion};
    let library = version::library_version().expect("ncclGetVersion");
    println!(
        "NCCL headers {}, library {library} from {}",
        NcclVersion::HEADERS,
        version::library_path().unwrap_or_else(|| "(path unknown)".into())
    );
    assert!(
        library >= NcclVersion::HEADERS,
        "libnccl {library} is older than the headers"
    );
}

/// Not a test: the entry point of the child processes the fault tests start (the test binary runs itself
/// with `METRALE_FAULT_CHILD` set to the role). Run by hand, it does nothing.
#[test]
#[ignore = "entry point of the fault tests' child processes; does nothing by itself"]
fn fault_child() {
    match std::env::var(common::CHILD).as_deref() {
        Ok("peer") => peers::peer_child(),
        Ok("bad-input") => bad_input::bad_input_child(),
        Ok(other) => panic!("unknown child role {other:?}"),
        Err(_) => println!(
            "not a child process ({} unset): nothing to do",
            common::CHILD
        ),
    }
}

/// Not a test: the child of `a_function_missing_from_an_older_library_stops_the_program_at_load`.
#[test]
#[ignore = "entry point of the missing-symbol child; does nothing by itself"]
fn missing_symbol_child() {
    if std::env::var_os(loader::MISSING_SYMBOL_VAR).is_some() {
        loader::call_a_2_29_function();
    }
}
