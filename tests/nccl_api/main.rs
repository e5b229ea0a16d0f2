//! The NCCL calls that only 2.27–2.29 have, each proven on GPUs against values computed on the host:
//! `ncclCommInitRankScalable`, `ncclResetDebugInit` (where nccl.h declares it: 2.30+ makes it an empty
//! macro, and the test skips), `ncclCommRevoke` (2.28+),
//! `ncclCommSuspend` / `ncclCommResume` / `ncclCommMemStats`, the one-sided `ncclPutSignal` /
//! `ncclSignal` / `ncclWaitSignal` with `ncclWinGetUserPtr`, `ncclCommGetUniqueId` + `ncclCommGrow`
//! (2.29+), and the elastic example (recovery from SIGKILLs at 2 to 8 ranks, during a recovery, and of
//! the coordinator: `elastic.rs` says which runs and how to choose them).
//!
//! How they run: one process per rank, as in production (`metrale_gpu_testkit::ranks`): a test runs
//! itself once per rank, `METRALE_TEST_RANKS` ranks (default 2) over however many GPUs the host has (one
//! is enough): rank r on GPU r % G, ranks that share a GPU on simulated hosts of their own
//! (`NCCL_HOSTID`), connected by NCCL's socket transport over loopback
//! (`metrale_gpu_testkit::placement`). The one-sided test needs its ranks on one host (NCCL's copy-engine
//! path): across simulated hosts it prints the visible skip line. Every GPU test needs
//! `NCCL_NVLS_ENABLE=0`, so it is `#[ignore]`d: plain `cargo test` skips them. The GPU runner (`ci/gpu`,
//! then `.gpu-build/run.sh` on the GPU host) runs them with the GPU and fault suites, the elastic test on
//! the staged example (`METRALE_ELASTIC_BIN`); by hand:
//! `METRALE_TEST_RANKS=4 NCCL_NVLS_ENABLE=0 cargo test --release --test nccl_api -- --ignored
//! --test-threads=1`.
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
