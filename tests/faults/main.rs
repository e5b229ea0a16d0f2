//! The fault suite: no hang, no crash, nothing lost.
//!
//! - A peer killed mid-collective, a peer that never arrives, an abort from another thread while a
//!   collective is stuck (`peers.rs`): the watchdog (`metrale_gpu_sys::watchdog`) returns an error
//!   within a stated bound, measured and printed on a `MEASURED` line, and the process cleans up.
//! - Bad input (`bad_input.rs`): NCCL's error code and text, never a crash, and the communicator still
//!   works afterwards.
//! - Nothing leaks, many threads (`leaks.rs`).
//! - Version safety: what the dynamic loader does with a function missing from an older libnccl
//!   (`loader.rs`).
//!
//! GPU tests need 2 GPUs and are `#[ignore]`d (CI has none); `ci/gpu-run.sh` runs them on a GPU machine.
//! A GPU test that finds fewer than 2 GPUs fails and says so. The CPU tests run everywhere.
// Rank-indexed loops over parallel per-rank arrays; configs set field by field after
// `NcclConfig::default()`, as the README shows (never a struct literal).
#![allow(clippy::needless_range_loop, clippy::field_reassign_with_default)]

mod bad_input;
mod common;
mod leaks;
mod loader;
mod peers;

use metrale_gpu_testkit::child;

/// The libnccl this binary loaded, against its headers (the GPU runner's log shows it first).
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
/// with the role in its environment). Run by hand, it does nothing.
#[test]
#[ignore = "entry point of the fault tests' child processes; does nothing by itself"]
fn child_entry() {
    match child::role().as_deref() {
        Some("peer") => peers::peer_child(),
        Some("bad-input") => bad_input::bad_input_child(),
        Some(loader::ROLE) => loader::call_a_2_29_function(),
        Some(other) => panic!("unknown child role {other:?}"),
        None => println!("not a child process ({} unset): nothing to do", child::ROLE),
    }
}
