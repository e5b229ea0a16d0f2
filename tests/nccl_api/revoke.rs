//! `ncclCommRevoke` stops an all-reduce that can never finish (rank 0 enters it, rank 1 never does)
//! and the communicator becomes quiescent: `ncclCommGetAsyncError` leaves `ncclInProgress` for
//! `ncclSuccess` and rank 0's stream drains, each within `QUIESCE_LIMIT`; then, as nccl.h allows, the
//! revoked communicator is destroyed.

use std::time::{Duration, Instant};

use metrale_gpu_sys::nccl::*;
use metrale_gpu_sys::watchdog::Watchdog;

use crate::support::*;

const COUNT: usize = 1 << 20;
/// The bound on quiescence: NCCL only has to stop its own kernel and proxy.
const QUIESCE_LIMIT: Duration = Duration::from_secs(10);

#[test]
#[ignore = "needs 2 GPUs"]
fn revoke_stops_an_all_reduce_the_peer_never_joins() {
    gpus();
    // Non-blocking, so that the revoke returns at once and its end is observed by polling.
    let mut world = init(false);
    all_reduce(&mut world, COUNT, 0).expect("an all-reduce on both ranks first (connects them)");
    let (lonely, absent) = (world.comms[0], world.comms[1]);
    let stream = world.streams[0];
    let buf = DevBuf::cuda(world.devs[0], COUNT * 4);
    let res = enqueue_all_reduce(&world, 0, &buf, COUNT, 1);
    // SAFETY: rank 0's live communicator, used by this thread alone.
    let enqueued = unsafe { WATCHDOG.check(res, lonely, "ncclAllReduce on rank 0 alone") };
    verdict(&mut world, enqueued).expect("enqueued");
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: rank 0's own stream.
    let finished = unsafe { stream_ready(stream) }.expect("cuStreamQuery");
    assert!(
        !finished,
        "rank 0's all-reduce finished without rank 1: nothing in flight to revoke"
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
    verdict(&mut world, waited)
        .expect("ncclCommGetAsyncError reaches ncclSuccess (quiescent) within the bound");
    let quiescent = start.elapsed();
    let start = Instant::now();
    // SAFETY: as above, and rank 0's own stream.
    let waited = unsafe { quiesce.wait_stream(lonely, stream) };
    verdict(&mut world, waited).expect("the stuck all-reduce leaves the stream");
    let drained = start.elapsed();
    println!(
        "revoked: quiescent {:.1} ms after ncclCommRevoke returned, stream drained {:.1} ms later \
         (bound {QUIESCE_LIMIT:?} each)",
        quiescent.as_secs_f64() * 1e3,
        drained.as_secs_f64() * 1e3
    );

    // Rank 1 never saw the collective: abort it. The revoked one may be destroyed (nccl.h).
    world.forget_comms();
    // SAFETY: each communicator is released once and never used again.
    unsafe {
        check_nccl(ncclCommAbort(absent), "ncclCommAbort (rank 1)").expect("abort rank 1");
        check_nccl(
            ncclCommDestroy(lonely),
            "ncclCommDestroy after ncclCommRevoke",
        )
        .expect("destroy");
    }
    drop(buf);
}
