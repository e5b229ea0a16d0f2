//! The GPU suite: every binding exercised on real GPUs, every result compared with values computed on
//! the host. Most tests run one process per rank (the testkit's `ranks`): `METRALE_TEST_RANKS` ranks
//! (default 2) on whatever GPUs the host has, ranks that share a GPU on simulated hosts
//! (`METRALE_TEST_PLACEMENT`; see the testkit's `placement`). `fixed.rs` holds the tests of a fixed rank
//! count. A test that needs several GPUs in one process prints `SKIP <test>: ...` and passes where the
//! host has fewer; a GPU test that finds no GPU fails and says so. Every GPU test is `#[ignore]`d:
//! plain `cargo test` (CI, no GPU) skips them, and `ci/gpu-run.sh` runs them on a GPU machine.
//!
//! The host-only parts (the data types and the checks) are ordinary tests and run anywhere.
// MiB, GiB as constants; rank-indexed loops over parallel per-rank vectors.
#![allow(non_upper_case_globals, clippy::needless_range_loop)]

mod collectives;
mod comm_life;
mod comm_make;
mod common;
mod config;
mod data;
mod fixed;
mod graphs;
mod helpers;
mod memory;
mod multiprocess;
mod stale_copy;

use metrale_gpu_sys::version::{self, NcclVersion};

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
