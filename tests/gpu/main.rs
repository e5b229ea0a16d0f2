//! The GPU suite: every binding exercised on real GPUs, every result compared with values computed on
//! the host. It needs 2 GPUs, so every GPU test is `#[ignore]`d: plain `cargo test` (CI, no GPU) skips
//! them, and `ci/gpu-run.sh` runs them on a GPU machine (`--run-ignored only`). A GPU test that finds
//! fewer than 2 GPUs fails and says so.
//!
//! The host-only parts (the data types and the checks) are ordinary tests and run anywhere.
// MiB, GiB as constants; rank-indexed loops over parallel per-rank vectors.
#![allow(non_upper_case_globals, clippy::needless_range_loop)]

mod collectives;
mod comm_life;
mod common;
mod config;
mod data;
mod graphs;
mod helpers;
mod memory;
mod multiprocess;
mod stale_copy;

use metrale_gpu_sys::version::{self, NcclVersion};
use metrale_gpu_testkit::child;

/// The loaded libnccl against the headers. With `METRALE_EXPECT_NCCL=<version>` (the GPU runner sets it
/// while it looks for the library on the GPU machine) the library must be exactly that version;
/// otherwise it must not be older than the headers. Needs no GPU.
#[test]
fn nccl_library_matches_headers() {
    let library = version::library_version().expect("ncclGetVersion");
    let path = version::library_path().unwrap_or_else(|| "(path unknown)".into());
    println!(
        "NCCL headers {}, library {library} from {path}",
        NcclVersion::HEADERS
    );
    match std::env::var("METRALE_EXPECT_NCCL") {
        Ok(want) => assert_eq!(
            library.to_string(),
            want,
            "libnccl {library} ({path}) is not the requested {want}"
        ),
        Err(_) => {
            version::check_library_version().expect("a libnccl not older than the headers");
        }
    }
}

/// Not a test: the entry point of the child processes that the multi-process and config tests start
/// (the test binary runs itself with the role in its environment). Run by hand, it does nothing.
#[test]
#[ignore = "entry point of the child processes the GPU tests start; does nothing by itself"]
fn child_entry() {
    match child::role().as_deref() {
        Some("mp") => multiprocess::mp_child(),
        Some("config") => config::config_child(),
        Some(other) => panic!("unknown child role {other:?}"),
        None => println!("not a child process ({} unset): nothing to do", child::ROLE),
    }
}
