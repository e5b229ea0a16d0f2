//! `ncclCommRevoke` stops an all-reduce that can never finish (rank 0 enters it, the other ranks never
//! do) and the communicator becomes quiescent: `ncclCommGetAsyncError` leaves `ncclInProgress` for
//! `ncclSuccess` and rank 0's stream drains, each within `QUIESCE_LIMIT`; then the other ranks abort
//! theirs and, as nccl.h allows, the revoked communicator is destroyed. Each rank is a process of its
//! own; they agree on the steps through the harness's barriers.

use std::time::{Duration, Instant};

use metrale_gpu_sys::nccl::*;
use metrale_gpu_watchdog::Watchdog;

use crate::support::*;

const COUNT: usize = 1 << 20;
/// The bound on quiescence: NCCL only has to stop its own kernel and proxy.
const QUIESCE_LIMIT: Duration = Duration::from_secs(10);

#[test]
#[ignore = "needs a GPU: run through ci/gpu-run.sh"]
fn revoke_stops_an_all_reduce_the_peer_never_joins() {
    ranks::test("revoke::revoke_stops_an_all_reduce_the_peer_never_joins").run_raw(|me| {
        assert!(
            me.nranks >= 2,
            "an all-reduce a peer never joins needs 2 ranks or more"
        );
        // Non-blocking, so that the revoke returns at once and its end is observed by polling.
        let mut world = init(me, false);
        all_reduce(&mut world, COUNT, 0)
            .expect("an all-reduce on every rank first (connects them)");
        me.barrier("connected");
        if me.rank == 0 {
            revoke_alone(&mut world);
        }
        me.barrier("revoked");
        // The other ranks never saw the collective: abort theirs. Rank 0's revoked one may be destroyed
        // (nccl.h), once they have.
        let comm = world.comms[0];
        world.forget_comms();
        if me.rank != 0 {
            // SAFETY: a live, idle communicator, aborted once and never used again.
            check_nccl(unsafe { ncclCommAbort(comm) }, "ncclCommAbort").expect("abort");
        }
        me.barrier("aborted");
        if me.rank == 0 {
            // SAFETY: the revoked, quiescent communicator, released once and never used again.
            check_nccl(
                unsafe { ncclCommDestroy(comm) },
                "ncclCommDestroy after ncclCommRevoke",
            )
            .expect("destroy");
        }
    });
}

/// Rank 0: an all-reduce the others never join, revoked; quiescent and drained within the bound.
fn revoke_alone(world: &mut World) {
    let lonely = world.comms[0];
    let stream = world.streams[0];
    let buf = DevBuf::cuda(world.devs[0], COUNT * 4);
    let res = enqueue_all_reduce(world, 0, &buf, COUNT, 1);
    // SAFETY: rank 0's live communicator, used by this thread alone.
    let enqueued = unsafe { WATCHDOG.check(res, lonely, "ncclAllReduce on rank 0 alone") };
    verdict(world, enqueued).expect("enqueued");
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: rank 0's own stream.
    let finished = unsafe { stream_ready(stream) }.expect("cuStreamQuery");
    assert!(
        !finished,
        "rank 0's all-reduce finished without the other ranks: nothing in flight to revoke"
    );

    let start = Instant::now();
    // SAFETY: a live communicator with a collective in flight; revoked once.
    let res = unsafe { ncclCommRevoke(lonely, NCCL_REVOKE_DEFAULT as i32) };
    println!(
        "ncclCommRevoke returned {} after {:?}",
        res.0,
        start.elapsed()
    );
    let quiesce = Watchdog::abort_after(QUIESCE_LIMIT);
    let start = Instant::now();
    // SAFETY: rank 0's revoked communicator, still a valid handle (nccl.h), used by this thread alone;
    // on ncclInProgress the check waits until it leaves it.
    let waited = unsafe { quiesce.check(res, lonely, "ncclCommRevoke") };
    verdict(world, waited)
        .expect("ncclCommGetAsyncError reaches ncclSuccess (quiescent) within the bound");
    let quiescent = start.elapsed();
    let start = Instant::now();
    // SAFETY: as above, and rank 0's own stream.
    let waited = unsafe { quiesce.wait_stream(lonely, stream) };
    verdict(world, waited).expect("the stuck all-reduce leaves the stream");
    let drained = start.elapsed();
    println!(
        "revoked: quiescent {:.1} ms after ncclCommRevoke returned, stream drained {:.1} ms later \
         (bound {QUIESCE_LIMIT:?} each)",
        quiescent.as_secs_f64() * 1e3,
        drained.as_secs_f64() * 1e3
    );
    drop(buf);
}
