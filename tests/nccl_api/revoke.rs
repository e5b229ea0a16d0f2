//! `ncclCommRevoke` stops an all-reduce that can never finish (rank 0 enters it, rank 1 never does)
//! and the communicator becomes quiescent: `ncclCommGetAsyncError` leaves `ncclInProgress` for
//! `ncclSuccess` and rank 0's stream drains, each within `QUIESCE_LIMIT`; then, as nccl.h allows, the
//! revoked communicator is destroyed.

use std::time::{Duration, Instant};

use metrale_gpu_sys::nccl::*;

use crate::support::*;

const COUNT: usize = 1 << 20;
/// The bound on quiescence: NCCL only has to stop its own kernel and proxy.
const QUIESCE_LIMIT: Duration = Duration::from_secs(10);

#[test]
#[ignore = "needs 2 GPUs"]
fn revoke_stops_an_all_reduce_the_peer_never_joins() {
    gpus();
    // Non-blocking, so that the revoke returns at once and its end is observed by polling.
    let ranks = init_ranks(MIN_GPUS, false);
    all_reduce_group(&ranks, COUNT, 0).expect("an all-reduce on both ranks first (connects them)");
    let (lonely, absent) = (&ranks[0], &ranks[1]);
    let buf = Buf::cuda(lonely.dev, COUNT * 4);
    accepted(
        lonely.enqueue_all_reduce(&buf, COUNT, 1),
        "ncclAllReduce on rank 0 alone",
    )
    .expect("enqueue");
    wait_ready(lonely.comm, "enqueueing rank 0's all-reduce", LIMIT).expect("enqueued");
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: rank 0's own stream.
    let finished = unsafe { stream_ready(lonely.stream) }.expect("cuStreamQuery");
    assert!(
        !finished,
        "rank 0's all-reduce finished without rank 1: nothing in flight to revoke"
    );

    let start = Instant::now();
    // SAFETY: a live communicator with a collective in flight; revoked once.
    let res = unsafe { ncclCommRevoke(lonely.comm, NCCL_REVOKE_DEFAULT as i32) };
    println!(
        "ncclCommRevoke returned {} after {:?}",
        res.0,
        start.elapsed()
    );
    accepted(res, "ncclCommRevoke").expect("ncclCommRevoke");
    let quiescent = wait_ready(lonely.comm, "the revoked communicator", QUIESCE_LIMIT)
        .expect("ncclCommGetAsyncError reaches ncclSuccess (quiescent) within the bound");
    let drained = wait_stream(
        lonely.stream,
        "rank 0's stream after the revoke",
        QUIESCE_LIMIT,
    )
    .expect("the stuck all-reduce leaves the stream");
    println!(
        "revoked: quiescent {:.1} ms after ncclCommRevoke returned, stream drained {:.1} ms later \
         (bound {QUIESCE_LIMIT:?} each)",
        quiescent.as_secs_f64() * 1e3,
        drained.as_secs_f64() * 1e3
    );

    // Rank 1 never saw the collective: abort it. The revoked one may be destroyed (nccl.h).
    // SAFETY: each communicator is released once and never used again.
    unsafe {
        check_nccl(ncclCommAbort(absent.comm), "ncclCommAbort (rank 1)").expect("abort rank 1");
        check_nccl(
            ncclCommDestroy(lonely.comm),
            "ncclCommDestroy after ncclCommRevoke",
        )
        .expect("destroy");
    }
    drop(buf);
    teardown(ranks, false);
}
