//! The GPU suite: every binding exercised on real GPUs, every result compared with values computed on
//! the host. It needs 2 GPUs, so every GPU test is `#[ignore]`d: plain `cargo test` (CI, no GPU) skips
//! them, and `ci/gpu` builds them and prints how to run them all on the GPU machine
//! (`--ignored`). A GPU test that finds fewer than 2 GPUs fails and says so.
//!
//! The host-only parts (the fp16/bf16/fp8 decoders and the checks) are ordinary tests and run anywhere.
// MiB, GiB as constants; rank-indexed loops over parallel per-rank vectors.
#![allow(non_upper_case_globals, clippy::needless_range_loop)]

#[path = "gpu/children.rs"]
mod children;
#[path = "gpu/collectives.rs"]
mod collectives;
#[path = "gpu/comm_life.rs"]
mod comm_life;
#[path = "gpu/common.rs"]
mod common;
#[path = "gpu/config.rs"]
mod config;
#[path = "gpu/data.rs"]
mod data;
#[path = "gpu/graphs.rs"]
mod graphs;
#[path = "gpu/helpers.rs"]
mod helpers;
#[path = "gpu/memory.rs"]
mod memory;
#[path = "gpu/multiprocess.rs"]
mod multiprocess;

use metrale_gpu_sys::version::{self, NcclVersion};

/// The loaded libnccl against the headers. With `METRALE_EXPECT_NCCL=<version>` (ci/gpu-run.sh sets it
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
/// (the test binary runs itself with `METRALE_GPU_CHILD` set). Run by hand, it does nothing.
#[test]
#[ignore = "entry point of the child processes the GPU tests start; does nothing by itself"]
fn child_process_entry() {
    match std::env::var(children::SCENARIO).as_deref() {
        Ok("mp") => multiprocess::mp_child(),
        Ok("config") => config::config_child(),
        Ok(other) => panic!("unknown child scenario {other:?}"),
        Err(_) => println!(
            "not a child process ({} unset): nothing to do",
            children::SCENARIO
        ),
    }
}
