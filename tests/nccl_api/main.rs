//! The NCCL calls that only 2.27–2.29 have, each proven on GPUs against values computed on the host:
//! `ncclCommInitRankScalable`, `ncclResetDebugInit` (where nccl.h declares it: 2.30+ makes it an empty
//! macro, and the test skips), `ncclCommRevoke` (2.28+),
//! `ncclCommSuspend` / `ncclCommResume` / `ncclCommMemStats`, the one-sided `ncclPutSignal` /
//! `ncclSignal` / `ncclWaitSignal` with `ncclWinGetUserPtr`, `ncclCommGetUniqueId` + `ncclCommGrow`
//! (2.29+), and the elastic example (revoke, shrink, grow after a SIGKILL) five times in a row.
//!
//! Every GPU test needs 2 GPUs and `NCCL_NVLS_ENABLE=0`, so it is `#[ignore]`d: plain `cargo test` skips
//! them. The GPU runner (`ci/gpu`, then `.gpu-build/run.sh` on the GPU host) runs them with the GPU and
//! fault suites, the elastic test on the staged example (`METRALE_ELASTIC_BIN`); by hand:
//! `cargo test --release --test nccl_api -- --ignored --test-threads=1`.
// Built against older headers, the helpers only the 2.29 tests use are unused.
#![cfg_attr(not(nccl_2_29), allow(dead_code))]

mod debug_reset;
mod scalable;
mod support;

#[cfg(nccl_2_29)]
mod elastic;
#[cfg(nccl_2_29)]
mod grow;
#[cfg(nccl_2_29)]
mod one_sided;
#[cfg(nccl_2_28)]
mod revoke;
#[cfg(nccl_2_29)]
mod suspend;

use metrale_gpu_testkit::child;

/// Not a test: the entry point of the child processes the tests start (the test binary runs itself
/// with the role in its environment). Run by hand, it does nothing.
#[test]
#[ignore = "entry point of the child processes the GPU tests start; does nothing by itself"]
fn child_entry() {
    match child::role().as_deref() {
        Some("debug-reset") => debug_reset::child(),
        #[cfg(nccl_2_29)]
        Some("grow") => grow::child(),
        Some(other) => panic!("unknown child role {other:?}"),
        None => println!("not a child process ({} unset): nothing to do", child::ROLE),
    }
}
