//! One-sided communication on symmetric windows (`ncclMemAlloc` + `ncclCommWindowRegister` with
//! `NCCL_WIN_COLL_SYMMETRIC`), around a ring of every rank, each a process of its own:
//! `ncclWinGetUserPtr` returns the registered pointer; every rank `ncclPutSignal`s a slice of its
//! window to an offset of the next rank's window, and `ncclWaitSignal`s for the previous rank's, then
//! finds exactly that slice there, every other byte its own; `ncclSignal` alone releases a waiting stream
//! that stays blocked until it comes.
//!
//! NCCL moves one-sided data between the GPUs of one host (its LSA peers) with copy engines, and across
//! hosts only through a GIN-capable network (InfiniBand, EFA), which simulated hosts on loopback
//! sockets are not: with ranks on more than one host the test prints the visible skip line.

use std::time::Duration;

use metrale_gpu_sys::nccl::*;
use metrale_gpu_testkit::skip::skip_named;

use crate::support::*;

/// Each rank's window, a multiple of `NCCL_WIN_REQUIRED_ALIGNMENT`.
const WINDOW: usize = 1 << 20;
/// The slice: `COUNT` floats from byte `SRC` of a rank's window to byte `DST` of the next one's.
const SRC: usize = 4096 + 256;
const DST: usize = 65536 + 12;
const COUNT: usize = 10_000;
/// How long a wait with no signal must stay blocked to count as waiting.
const BLOCKED_FOR: Duration = Duration::from_millis(300);

const NAME: &str = "one_sided::put_signal_wait_signal_and_signal_on_symmetric_windows";

/// Rank `rank`'s window contents (different on neighbouring ranks, so a put that did not land shows).
fn source(rank: usize) -> Vec<u8> {
    (0..WINDOW)
        .map(|i| (i * 131 + i / 4096 + rank * 17) as u8)
        .collect()
}

#[test]
#[ignore = "needs a GPU: run through ci/gpu-run.sh"]
fn put_signal_wait_signal_and_signal_on_symmetric_windows() {
    if Me::get(NAME).is_none() {
        let plan = ranks::test(NAME).plan();
        if plan.hosts() > 1 {
            return skip_named(
                NAME,
                format_args!(
                    "one-sided transfers across hosts need a GIN network (InfiniBand, EFA); {plan}: run \
                     it with as many ranks as GPUs, or METRALE_TEST_PLACEMENT=multi-rank-gpu (NCCL 2.30+)"
                ),
            );
        }
    }
    ranks::test(NAME).run_raw(ring_rank);
}

fn ring_rank(me: &Me) {
    let (rank, n) = (me.rank, me.nranks);
    assert!(
        n >= 2,
        "a ring of one-sided transfers needs 2 ranks or more"
    );
    let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
    let mut world = init(me, true);
    let (comm, stream) = (world.comms[0], world.streams[0]);
    let buf = DevBuf::nccl(me.device, WINDOW);
    let mut win: ncclWindow_t = std::ptr::null_mut();
    // SAFETY: a live communicator; the ncclMemAlloc buffer holds WINDOW bytes; writes one handle. Every
    // rank registers its window (collective).
    let res = unsafe {
        ncclCommWindowRegister(
            comm,
            buf.at(0),
            WINDOW,
            &mut win,
            NCCL_WIN_COLL_SYMMETRIC as i32,
        )
    };
    check_nccl(res, "ncclCommWindowRegister(NCCL_WIN_COLL_SYMMETRIC)").expect("a symmetric window");
    let mut user: *mut std::os::raw::c_void = std::ptr::null_mut();
    // SAFETY: a window of this communicator; writes one pointer.
    let res = unsafe { ncclWinGetUserPtr(comm, win, &mut user) };
    check_nccl(res, "ncclWinGetUserPtr").expect("ncclWinGetUserPtr");
    assert_eq!(
        user,
        buf.at(0),
        "rank {rank}: ncclWinGetUserPtr is not the registered buffer"
    );
    println!("ok    rank {rank}: ncclWinGetUserPtr returns the registered pointer");

    let mine = source(rank);
    buf.upload(0, &mine, stream);
    // SAFETY: rank `rank`'s own stream.
    unsafe { sync_stream(stream) }.expect("the window written");
    // No rank puts into a window its owner is still writing.
    me.barrier("windows-ready");
    let mut from_prev = ncclWaitSignalDesc_t {
        opCnt: 1,
        peer: prev as i32,
        sigIdx: 0,
        ctx: 0,
    };
    // The put first, then the wait, each its own call on one stream: the put needs nothing of the peer,
    // so no rank waits before it has put. The first one-sided call of every rank sets NCCL's signal
    // windows up, collectively.
    // SAFETY: the source slice lies in this rank's symmetric window and its destination inside the next
    // one's (SRC/DST + COUNT floats < WINDOW).
    let res = unsafe {
        ncclPutSignal(
            buf.at(SRC),
            COUNT,
            NcclDataType::ncclFloat32,
            next as i32,
            win,
            DST,
            0,
            0,
            0,
            comm,
            stream,
        )
    };
    check_nccl(res, "ncclPutSignal").expect("ncclPutSignal to the next rank");
    // SAFETY: the descriptor outlives the call; a live communicator and stream.
    let res = unsafe { ncclWaitSignal(1, &mut from_prev, comm, stream) };
    check_nccl(res, "ncclWaitSignal").expect("ncclWaitSignal for the previous rank");
    settle(&mut world, "put and wait").unwrap_or_else(|e| panic!("{e}"));
    // Read on this rank's stream, after its wait: exactly the previous rank's slice has arrived.
    let got = buf.download(0, WINDOW, stream);
    let theirs = source(prev);
    let len = COUNT * 4;
    let wrong: Vec<usize> = (0..WINDOW)
        .filter(|&i| {
            let want = if (DST..DST + len).contains(&i) {
                theirs[SRC + i - DST]
            } else {
                mine[i]
            };
            got[i] != want
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "rank {rank}'s window: {} wrong bytes, the first at {} (bytes {DST}..{} are rank {prev}'s \
         {SRC}..{}, the rest this rank's own)",
        wrong.len(),
        wrong[0],
        DST + len,
        SRC + len
    );
    println!("ok    ncclPutSignal: bytes {DST}..{} of rank {rank}'s window are rank {prev}'s {SRC}..{}, the rest its own", DST + len, SRC + len);

    // ncclSignal alone: every rank's stream waits until the previous rank signals, from a second
    // stream (the first is blocked in the wait).
    // SAFETY: the descriptor outlives the call; a live communicator and stream.
    let res = unsafe { ncclWaitSignal(1, &mut from_prev, comm, stream) };
    check_nccl(res, "ncclWaitSignal").expect("ncclWaitSignal");
    me.barrier("waiting");
    std::thread::sleep(BLOCKED_FOR);
    // SAFETY: this rank's own stream.
    let early = unsafe { stream_ready(stream) }.expect("cuStreamQuery");
    me.barrier("checked-waiting");
    let signaller = create_stream(me.device).expect("create_stream");
    // SAFETY: a live communicator and stream; no data.
    let res = unsafe { ncclSignal(next as i32, 0, 0, 0, comm, signaller) };
    check_nccl(res, "ncclSignal").expect("ncclSignal");
    let released =
        settle(&mut world, "the wait after ncclSignal").unwrap_or_else(|e| panic!("{e}"));
    // SAFETY: the stream that signalled; its work is done once the peer's wait is (the signal is
    // what released it), so it is synchronised and destroyed once.
    unsafe {
        sync_stream(signaller).expect("the signal sent");
        destroy_stream(signaller).expect("destroy_stream");
    }
    assert!(
        !early,
        "rank {rank}'s ncclWaitSignal finished before any signal was sent"
    );
    println!("ok    ncclSignal: rank {rank}'s stream waited {BLOCKED_FOR:?} with no signal, then {:.2} ms after it", released.as_secs_f64() * 1e3);

    // SAFETY: this communicator's window, deregistered once (collective), its users synchronised.
    let res = unsafe { ncclCommWindowDeregister(comm, win) };
    check_nccl(res, "ncclCommWindowDeregister").expect("ncclCommWindowDeregister");
    destroy(world);
    drop(buf);
}
