//! `ncclCommSuspend(NCCL_SUSPEND_MEM)` gives the communicator's releasable GPU memory back to the driver
//! (`cuMemGetInfo`'s free memory rises by about `ncclStatGpuMemSuspend` bytes; `ncclStatGpuMemSuspended`
//! turns 1), `ncclCommResume` takes it again, and an all-reduce after it is correct. NCCL keeps
//! `ncclStatGpuMemSuspend` as the size of what can be suspended, suspended or not: the bytes released
//! are the driver's figure. Suspend and resume synchronise the ranks inside NCCL, so each rank runs in
//! its own thread.

use std::sync::Barrier;

use metrale_gpu_sys::cuda;
use metrale_gpu_sys::nccl::*;

use metrale_gpu_testkit::gpu::api;

use crate::support::*;

const COUNT: usize = 1 << 22;

/// `ncclCommMemStats` and the device's free memory at one moment.
#[derive(Debug, Clone, Copy)]
struct Snapshot {
    suspendable: u64,
    suspended: u64,
    persistent: u64,
    total: u64,
    free: usize,
}

fn snapshot(comm: NcclComm) -> Result<Snapshot, String> {
    let stat = |which: ncclCommMemStat_t| -> Result<u64, String> {
        let mut value = 0;
        // SAFETY: a live communicator; writes one u64.
        let res = unsafe { ncclCommMemStats(comm, which, &mut value) };
        check_nccl(res, "ncclCommMemStats").map_err(|e| e.to_string())?;
        Ok(value)
    };
    let (mut free, mut total) = (0, 0);
    // SAFETY: writes two sizes; the communicator's device is current on this thread.
    let res = unsafe { api().cuMemGetInfo_v2(&mut free, &mut total) };
    check_cuda(res, "cuMemGetInfo").map_err(|e| e.to_string())?;
    Ok(Snapshot {
        suspendable: stat(ncclCommMemStat_t::ncclStatGpuMemSuspend)?,
        suspended: stat(ncclCommMemStat_t::ncclStatGpuMemSuspended)?,
        persistent: stat(ncclCommMemStat_t::ncclStatGpuMemPersist)?,
        total: stat(ncclCommMemStat_t::ncclStatGpuMemTotal)?,
        free,
    })
}

/// A rank's communicator and device, handed to the rank's own thread.
#[derive(Clone, Copy)]
struct Rank {
    comm: NcclComm,
    dev: i32,
}

// SAFETY: NCCL and the driver accept the handle from any thread; each rank's is used by its own thread
// alone while the main thread waits for them all.
unsafe impl Send for Rank {}

/// One rank's thread: snapshots before, while suspended and after resuming. Every rank passes the
/// same barriers, so each measures while every rank is in the same state.
fn suspend_and_resume(rank: Rank, barrier: &Barrier) -> Result<[Snapshot; 3], String> {
    cuda::use_device(rank.dev, "suspend test").map_err(|e| e.to_string())?;
    barrier.wait();
    let before = snapshot(rank.comm)?;
    barrier.wait();
    // SAFETY: a live, idle communicator (its all-reduce has completed).
    let suspended = unsafe { ncclCommSuspend(rank.comm, NCCL_SUSPEND_MEM as i32) };
    barrier.wait();
    check_nccl(suspended, "ncclCommSuspend(NCCL_SUSPEND_MEM)").map_err(|e| e.to_string())?;
    let during = snapshot(rank.comm)?;
    barrier.wait();
    // SAFETY: the communicator suspended above.
    let resumed = unsafe { ncclCommResume(rank.comm) };
    barrier.wait();
    check_nccl(resumed, "ncclCommResume").map_err(|e| e.to_string())?;
    Ok([before, during, snapshot(rank.comm)?])
}

#[test]
#[ignore = "needs 2 GPUs"]
fn suspend_releases_memory_and_resume_restores_it() {
    gpus();
    let mut world = init(true);
    // The first collective connects the ranks: NCCL's buffers exist from then on.
    all_reduce(&mut world, COUNT, 0).expect("all-reduce before suspending");
    let barrier = &Barrier::new(world.n());
    let ranks = world.comms.iter().zip(&world.devs);
    let ranks: Vec<Rank> = ranks.map(|(&comm, &dev)| Rank { comm, dev }).collect();
    let results: Vec<Result<[Snapshot; 3], String>> = std::thread::scope(|s| {
        let threads: Vec<_> = ranks
            .iter()
            .map(|&r| s.spawn(move || suspend_and_resume(r, barrier)))
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("rank thread"))
            .collect()
    });
    let mut failures = Vec::new();
    for (r, result) in results.into_iter().enumerate() {
        let [before, during, after] = match result {
            Ok(snapshots) => snapshots,
            Err(e) => {
                failures.push(format!("rank {r}: {e}"));
                continue;
            }
        };
        let released = during.free as i64 - before.free as i64;
        let retaken = during.free as i64 - after.free as i64;
        println!(
            "rank {r}: suspendable {} B, persistent {} B, total {} B; suspended flag {} -> {} -> {}; \
             cuMemGetInfo free {} -> {} -> {} B (released {released} B, taken again {retaken} B)",
            before.suspendable,
            before.persistent,
            before.total,
            before.suspended,
            during.suspended,
            after.suspended,
            before.free,
            during.free,
            after.free
        );
        let half = before.suspendable as i64 / 2;
        let checks = [
            (
                before.suspendable > 0,
                "NCCL tracks suspendable memory after an all-reduce (ncclStatGpuMemSuspend > 0)",
            ),
            (
                (before.suspended, during.suspended, after.suspended) == (0, 1, 0),
                "ncclStatGpuMemSuspended is 0, 1 while suspended, 0 again",
            ),
            (
                released >= half,
                "suspending frees at least half of ncclStatGpuMemSuspend on the device",
            ),
            (retaken >= half, "resuming takes at least half of it again"),
            (
                after.suspendable == before.suspendable,
                "ncclStatGpuMemSuspend is the same after resuming",
            ),
        ];
        for (ok, what) in checks {
            if !ok {
                failures.push(format!("rank {r}: expected: {what}"));
            }
        }
    }
    if failures.is_empty() {
        for round in 1..3 {
            if let Err(e) = all_reduce(&mut world, COUNT, round) {
                failures.push(format!("all-reduce after resuming: {e}"));
            }
        }
    }
    destroy(world);
    assert!(
        failures.is_empty(),
        "suspend/resume:\n{}",
        failures.join("\n")
    );
}
