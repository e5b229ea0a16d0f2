//! `ncclCommGetUniqueId` + `ncclCommGrow` add a rank from a new process: the first R - 1 ranks' processes
//! hold a communicator of R - 1 ranks (one at 2 ranks); rank 0 makes the grow id; the last rank's
//! process, which held no communicator, joins as rank R - 1; every rank checks its rank and size and
//! all-reduces correctly on the grown communicator.

use metrale_gpu_sys::cuda;
use metrale_gpu_sys::nccl::*;

use crate::support::*;

const COUNT: usize = 1 << 18;
const ROUNDS: usize = 3;

/// A non-blocking config, so that every wait is bounded (the watchdog's).
fn non_blocking() -> NcclConfig {
    NcclConfig {
        blocking: 0,
        ..NcclConfig::default()
    }
}

#[test]
#[ignore = "needs a GPU: run through ci/gpu-run.sh"]
fn grow_adds_a_rank_from_a_new_process() {
    ranks::test("grow::grow_adds_a_rank_from_a_new_process").run_raw(|me| {
        let n = me.nranks;
        assert!(n >= 2, "a grow needs 2 ranks or more: one to add");
        let newcomer = n - 1;
        cuda::use_device(me.device, "grow test").expect("use_device");
        let (small, grown) = if me.rank == newcomer {
            (None, join_by_growing(me))
        } else {
            let (small, grown) = grow_existing(me);
            (Some(small), grown)
        };
        let mut big = World::from_comms(vec![grown], false);
        assert_eq!(
            rank_and_size(grown),
            (me.rank, n),
            "rank {}'s rank and size after the grow",
            me.rank
        );
        for round in 1..=ROUNDS {
            all_reduce(&mut big, COUNT, round).expect("all-reduce on the grown communicator");
        }
        println!(
            "ok    rank {} of {n}: {ROUNDS} all-reduces of {COUNT} floats on the grown communicator",
            me.rank
        );
        destroy(big);
        if let Some(small) = small {
            destroy(small);
        }
    });
}

/// An existing rank: its communicator of R - 1 ranks, all-reduced once, then grown; rank 0 (the root)
/// makes the grow id and hands it over. Returns the small world and the grown communicator.
fn grow_existing(me: &Me) -> (World, NcclComm) {
    let n = me.nranks;
    let id = me.share_id("small-id", 0);
    let mut one: NcclComm = std::ptr::null_mut();
    // SAFETY: writes one handle; rank `rank` of n - 1 on the current device.
    let res = unsafe {
        ncclCommInitRankConfig(
            &mut one,
            n as i32 - 1,
            id,
            me.rank as i32,
            &mut non_blocking(),
        )
    };
    // SAFETY: the handle the non-blocking init returned, used by this thread alone.
    unsafe { WATCHDOG.check(res, one, "ncclCommInitRankConfig (the existing ranks)") }
        .expect("the communicator of the existing ranks");
    let mut small = World::from_comms(vec![one], false);
    all_reduce(&mut small, COUNT, 0).expect("all-reduce on the existing ranks' communicator");

    let mut grow_id = NcclUniqueId::from_bytes([0; NcclUniqueId::BYTES]);
    let root = me.rank == 0;
    if root {
        // SAFETY: a live, idle communicator; writes one id.
        let res = unsafe { ncclCommGetUniqueId(one, &mut grow_id) };
        check_nccl(res, "ncclCommGetUniqueId").expect("a grow id");
        me.publish("grow-id", &grow_id.to_bytes());
    }
    let mut grown: NcclComm = std::ptr::null_mut();
    // SAFETY: an existing rank passes its communicator and rank -1, the root the id it made, the others
    // NULL (nccl.h); a NULL config inherits the parent's (non-blocking).
    let res = unsafe {
        ncclCommGrow(
            one,
            n as i32,
            if root { &grow_id } else { std::ptr::null() },
            -1,
            &mut grown,
            std::ptr::null_mut(),
        )
    };
    // SAFETY: the handle the non-blocking grow returned, used by this thread alone.
    unsafe { WATCHDOG.check(res, grown, "ncclCommGrow (an existing rank)") }
        .unwrap_or_else(|e| panic!("rank {}: {e}", me.rank));
    (small, grown)
}

/// The new rank: no communicator before; joins with the root's grow id as the last rank.
fn join_by_growing(me: &Me) -> NcclComm {
    let id = me.fetch_id("grow-id");
    let mut comm: NcclComm = std::ptr::null_mut();
    // SAFETY: a new rank passes no communicator, the id and its rank (nccl.h); writes one handle.
    let res = unsafe {
        ncclCommGrow(
            std::ptr::null_mut(),
            me.nranks as i32,
            &id,
            me.rank as i32,
            &mut comm,
            &mut non_blocking(),
        )
    };
    // SAFETY: the handle the non-blocking grow returned, used by this thread alone.
    unsafe { WATCHDOG.check(res, comm, "ncclCommGrow (the new rank)") }
        .expect("grown communicator");
    comm
}
