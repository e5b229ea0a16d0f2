//! The fault suite: no hang, no crash, nothing lost.
//!
//! - A peer SIGKILLed mid-collective (10 times, `METRALE_FAULT_KILL_REPS`), a peer that never arrives,
//!   an abort from another thread while a collective is stuck (`peers.rs`): the watchdog
//!   (`metrale_gpu_watchdog`) returns an error on every surviving rank within a stated bound,
//!   measured and printed on a `MEASURED` line, and each process cleans up.
//! - Bad input (`bad_input.rs`): NCCL's error code and text, never a crash, and the communicator still
//!   works afterwards.
//! - Nothing leaks, many threads (`leaks.rs`).
//! - Version safety: what a call of a function missing from an older libnccl does (`loader.rs`).
//!
//! How the GPU tests run: one process per rank, as in production (`metrale_gpu_testkit::ranks`). A
//! test runs itself once per rank, `METRALE_TEST_RANKS` ranks (default 2) over however many GPUs the
//! host has (one is enough): rank r on GPU r % G, and ranks that share a GPU on simulated hosts of their
//! own (`NCCL_HOSTID`), which NCCL connects with its socket transport over loopback, as it connects the
//! hosts of a cluster (`metrale_gpu_testkit::placement`; `METRALE_TEST_PLACEMENT=multi-rank-gpu` for
//! NCCL 2.30+'s one-host mode). The tests of helpers and threads run in one process, over every GPU. The
//! GPU tests are `#[ignore]`d (CI has none); `ci/gpu-run.sh` runs them on a GPU machine, or by hand:
//! `METRALE_TEST_RANKS=8 NCCL_NVLS_ENABLE=0 cargo test --release --test faults -- --ignored
//! --test-threads=1`. The CPU tests run everywhere.
//!
//! Variables: `METRALE_FAULT_WATCHDOG_S` (the peer-kill watchdog, 30 s), `METRALE_FAULT_KILL_REPS`
//! (kills, 10), `METRALE_FAULT_INIT_TIMEOUT_S` (the never-arriving peer's deadline, 10 s),
//! `METRALE_FAULT_LEAK_CYCLES` (communicator cycles, 24), `METRALE_TEST_LIMIT_S` (a test's ranks
//! together, 200 s).
// Rank-indexed loops over parallel per-rank arrays; configs set field by field after
// `NcclConfig::default()`, as the README shows (never a struct literal).
#![allow(clippy::needless_range_loop, clippy::field_reassign_with_default)]

mod bad_input;
mod common;
mod leaks;
mod loader;
mod peers;
mod process;

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
        Some(loader::ROLE) => loader::call_a_2_29_function(),
        Some(other) => panic!("unknown child role {other:?}"),
        None => println!("not a child process ({} unset): nothing to do", child::ROLE),
    }
}
