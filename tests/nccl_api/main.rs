//! The NCCL calls that only 2.27–2.29 have, each proven on GPUs against values computed on the host:
//! `ncclCommInitRankScalable`, `ncclResetDebugInit` (every supported NCCL), `ncclCommRevoke` (2.28+),
//! `ncclCommSuspend` / `ncclCommResume` / `ncclCommMemStats`, the one-sided `ncclPutSignal` /
//! `ncclSignal` / `ncclWaitSignal` with `ncclWinGetUserPtr`, `ncclCommGetUniqueId` + `ncclCommGrow`
//! (2.29+), and the elastic example (revoke, shrink, grow after a SIGKILL) five times in a row.
//!
//! Every GPU test needs 2 GPUs and `NCCL_NVLS_ENABLE=0`, so it is `#[ignore]`d: plain `cargo test` skips
//! them; on the GPU host run `cargo test --release --test nccl_api -- --ignored --test-threads=1`.
// Built against older headers, the helpers only the 2.29 tests use are unused.
#![cfg_attr(not(nccl_2_29), allow(dead_code))]

mod children;
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

/// Not a test: the entry point of the child processes the tests start (the binary runs itself with
/// `METRALE_NCCL_API_CHILD` set). Run by hand, it does nothing.
#[test]
#[ignore = "entry point of the child processes the GPU tests start; does nothing by itself"]
fn child_process_entry() {
    match std::env::var(children::SCENARIO).as_deref() {
        Ok("debug-reset") => debug_reset::child(),
        #[cfg(nccl_2_29)]
        Ok("grow") => grow::child(),
        Ok(other) => panic!("unknown child scenario {other:?}"),
        Err(_) => println!(
            "not a child process ({} unset): nothing to do",
            children::SCENARIO
        ),
    }
}
