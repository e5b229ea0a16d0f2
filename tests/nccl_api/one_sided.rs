//! One-sided communication on symmetric windows (`ncclMemAlloc` + `ncclCommWindowRegister` with
//! `NCCL_WIN_COLL_SYMMETRIC`): `ncclWinGetUserPtr` returns the registered pointer; `ncclPutSignal` of a
//! slice of rank 0's window lands at an offset of rank 1's window, which `ncclWaitSignal`s and then
//! reads exactly that slice, every other byte untouched; `ncclSignal` alone releases a waiting stream
//! that stays blocked until it comes.

use std::time::Duration;

use metrale_gpu_sys::nccl::*;

use crate::support::*;

/// Each rank's window, a multiple of `NCCL_WIN_REQUIRED_ALIGNMENT`.
const WINDOW: usize = 1 << 20;
/// The slice: `COUNT` floats from byte `SRC` of rank 0's window to byte `DST` of rank 1's.
const SRC: usize = 4096 + 256;
const DST: usize = 65536 + 12;
const COUNT: usize = 10_000;
/// What rank 1's window holds where nothing was put.
const UNTOUCHED: u8 = 0x5a;
/// How long a wait with no signal must stay blocked to count as waiting.
const BLOCKED_FOR: Duration = Duration::from_millis(300);

#[test]
#[ignore = "needs 2 GPUs"]
fn put_signal_wait_signal_and_signal_on_symmetric_windows() {
    gpus();
    let mut world = init(true);
    let bufs: Vec<DevBuf> = world
        .devs
        .iter()
        .map(|&d| DevBuf::nccl(d, WINDOW))
        .collect();
    let mut wins: Vec<ncclWindow_t> = vec![std::ptr::null_mut(); world.n()];
    world
        .group("ncclCommWindowRegister(NCCL_WIN_COLL_SYMMETRIC)", |r| {
            // SAFETY: a live communicator; the ncclMemAlloc buffer holds WINDOW bytes; writes one handle.
            unsafe {
                ncclCommWindowRegister(
                    world.comms[r],
                    bufs[r].at(0),
                    WINDOW,
                    &mut wins[r],
                    NCCL_WIN_COLL_SYMMETRIC as i32,
                )
            }
        })
        .expect("a symmetric window on every rank");
    for r in 0..world.n() {
        let mut user: *mut std::os::raw::c_void = std::ptr::null_mut();
        // SAFETY: a window of this communicator; writes one pointer.
        let res = unsafe { ncclWinGetUserPtr(world.comms[r], wins[r], &mut user) };
        check_nccl(res, "ncclWinGetUserPtr").expect("ncclWinGetUserPtr");
        assert_eq!(
            user,
            bufs[r].at(0),
            "rank {r}: ncclWinGetUserPtr is not the registered buffer"
        );
    }
    println!("ok    ncclWinGetUserPtr returns the registered pointer on every rank");

    let source: Vec<u8> = (0..WINDOW).map(|i| (i * 131 + i / 4096) as u8).collect();
    bufs[0].upload(0, &source, world.streams[0]);
    bufs[1].fill(0, WINDOW, UNTOUCHED, world.streams[1]);
    let mut from_rank0 = ncclWaitSignalDesc_t {
        opCnt: 1,
        peer: 0,
        sigIdx: 0,
        ctx: 0,
    };
    // Together: the first one-sided call sets NCCL's signal windows up, collectively.
    world
        .group("ncclPutSignal / ncclWaitSignal", |r| {
            let (comm, stream) = (world.comms[r], world.streams[r]);
            // SAFETY: the source slice lies in rank 0's symmetric window and its destination inside rank
            // 1's (SRC/DST + COUNT floats < WINDOW); the descriptor outlives the call.
            unsafe {
                if r == 0 {
                    ncclPutSignal(
                        bufs[0].at(SRC),
                        COUNT,
                        NcclDataType::ncclFloat32,
                        1,
                        wins[0],
                        DST,
                        0,
                        0,
                        0,
                        comm,
                        stream,
                    )
                } else {
                    ncclWaitSignal(1, &mut from_rank0, comm, stream)
                }
            }
        })
        .expect("ncclPutSignal from rank 0, ncclWaitSignal on rank 1");
    settle(&mut world, "put and wait").unwrap_or_else(|e| panic!("{e}"));
    // Read on rank 1's stream, after its wait: exactly the slice has arrived.
    let got = bufs[1].download(0, WINDOW, world.streams[1]);
    let len = COUNT * 4;
    let wrong: Vec<usize> = (0..WINDOW)
        .filter(|&i| {
            let want = if (DST..DST + len).contains(&i) {
                source[SRC + i - DST]
            } else {
                UNTOUCHED
            };
            got[i] != want
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "rank 1's window: {} wrong bytes, the first at {} (the slice is bytes {DST}..{})",
        wrong.len(),
        wrong[0],
        DST + len
    );
    assert!(
        bufs[0].download(0, WINDOW, world.streams[0]) == source,
        "rank 0's own window changed"
    );
    println!("ok    ncclPutSignal: bytes {DST}..{} of rank 1's window are rank 0's {SRC}..{}, the rest untouched", DST + len, SRC + len);

    // ncclSignal alone: rank 1's stream waits until rank 0 signals.
    // SAFETY: the descriptor outlives the call; a live communicator and stream.
    let res = unsafe { ncclWaitSignal(1, &mut from_rank0, world.comms[1], world.streams[1]) };
    check_nccl(res, "ncclWaitSignal").expect("ncclWaitSignal");
    std::thread::sleep(BLOCKED_FOR);
    // SAFETY: rank 1's own stream.
    let early = unsafe { stream_ready(world.streams[1]) }.expect("cuStreamQuery");
    // SAFETY: a live communicator and stream; no data.
    let res = unsafe { ncclSignal(1, 0, 0, 0, world.comms[0], world.streams[0]) };
    check_nccl(res, "ncclSignal").expect("ncclSignal");
    let released =
        settle(&mut world, "the wait after ncclSignal").unwrap_or_else(|e| panic!("{e}"));
    assert!(
        !early,
        "rank 1's ncclWaitSignal finished before any signal was sent"
    );
    println!("ok    ncclSignal: rank 1's stream waited {BLOCKED_FOR:?} with no signal, then {:.2} ms after it", released.as_secs_f64() * 1e3);

    world
        .group("ncclCommWindowDeregister", |r| {
            // SAFETY: this communicator's window, deregistered once, its users synchronised.
            unsafe { ncclCommWindowDeregister(world.comms[r], wins[r]) }
        })
        .expect("ncclCommWindowDeregister");
    destroy(world);
    drop(bufs);
}
