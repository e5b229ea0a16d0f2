//! Communicators made in the ways a large job makes them, one process per rank:
//! `ncclCommInitRankScalable` with several unique ids (4 from 8 ranks on), and `ncclCommGrow` adding two
//! ranks from processes that were in no communicator before (6 -> 8 at 8 ranks). Each result's ranks
//! and size are checked, then it runs collectives checked against the host.

use metrale_gpu_sys::cuda;
use metrale_gpu_sys::nccl::*;

use crate::comm_life::exercise;
use crate::common::*;

/// `ncclCommUserRank` and `ncclCommCount` of a world's one communicator.
fn rank_and_size(world: &World) -> (usize, usize) {
    (world.ranks[0], world.size)
}

#[test]
#[ignore = "needs a GPU: run through ci/gpu-run.sh"]
fn init_rank_scalable_with_several_ids() {
    ranks::test("comm_make::init_rank_scalable_with_several_ids").run_raw(|me| {
        let n = me.nranks;
        let ids_count = n.min(4);
        // Id i comes from rank i * n / ids_count, so the bootstrap roots are spread over the job.
        let mut ids: Vec<NcclUniqueId> = (0..ids_count)
            .map(|i| me.share_id(&format!("scalable-id-{i}"), i * n / ids_count))
            .collect();
        cuda::use_device(me.device, "scalable init").expect("use_device");
        let mut comm: NcclComm = std::ptr::null_mut();
        let mut config = NcclConfig::default();
        // SAFETY: writes one handle; every rank passes the same ids in the same order; ids and config
        // live across the call.
        let res = unsafe {
            ncclCommInitRankScalable(
                &mut comm,
                n as i32,
                me.rank as i32,
                ids_count as i32,
                ids.as_mut_ptr(),
                &mut config,
            )
        };
        check_nccl(res, "ncclCommInitRankScalable")
            .unwrap_or_else(|e| panic!("{ids_count} unique ids over {n} ranks: {e}"));
        let world = World::from_comms(vec![comm], true);
        let mut tally = Tally::new();
        tally.check_eq(
            &format!("{ids_count} ids: rank and size"),
            rank_and_size(&world),
            (me.rank, n),
        );
        exercise(
            &world,
            &mut tally,
            &format!("scalable init, {ids_count} ids"),
            9300,
        );
        tally.finish("init_rank_scalable_with_several_ids");
    });
}

/// Ranks 0..m form a communicator (m = n - 2, at least 1); ranks m..n are new processes that join it by
/// `ncclCommGrow`, with the id rank 0 gets from `ncclCommGetUniqueId`.
#[cfg(nccl_2_29)]
#[test]
#[ignore = "needs a GPU: run through ci/gpu-run.sh"]
fn comm_grow_adds_two_new_processes() {
    ranks::test("comm_make::comm_grow_adds_two_new_processes").run_raw(|me| {
        let n = me.nranks;
        let m = n.saturating_sub(2).max(1);
        let mut tally = Tally::new();
        cuda::use_device(me.device, "grow").expect("use_device");
        let mut grown: NcclComm = std::ptr::null_mut();
        let small = if me.rank < m {
            let id = me.share_id("small-id", 0);
            let mut comm: NcclComm = std::ptr::null_mut();
            // SAFETY: writes one handle; rank `rank` of m on the current device.
            let res = unsafe { ncclCommInitRank(&mut comm, m as i32, id, me.rank as i32) };
            check_nccl(res, "ncclCommInitRank").expect("the communicator before the grow");
            let small = World::from_comms(vec![comm], true);
            tally.check_eq(
                "before the grow: rank and size",
                rank_and_size(&small),
                (me.rank, m),
            );
            exercise(
                &small,
                &mut tally,
                &format!("{m} ranks before the grow"),
                9400,
            );
            let res = if me.rank == 0 {
                let mut grow_id = NcclUniqueId::from_bytes([0; NcclUniqueId::BYTES]);
                // SAFETY: a live, idle communicator; writes one id.
                let res = unsafe { ncclCommGetUniqueId(comm, &mut grow_id) };
                check_nccl(res, "ncclCommGetUniqueId").expect("a grow id");
                me.publish("grow-id", &grow_id.to_bytes());
                // SAFETY: the existing root passes its communicator, the id it made and rank -1
                // (nccl.h); a NULL config inherits the parent's.
                unsafe {
                    ncclCommGrow(
                        comm,
                        n as i32,
                        &grow_id,
                        -1,
                        &mut grown,
                        std::ptr::null_mut(),
                    )
                }
            } else {
                // SAFETY: an existing non-root passes its communicator, no id and rank -1 (nccl.h).
                unsafe {
                    ncclCommGrow(
                        comm,
                        n as i32,
                        std::ptr::null(),
                        -1,
                        &mut grown,
                        std::ptr::null_mut(),
                    )
                }
            };
            check_nccl(res, "ncclCommGrow (an existing rank)").expect("grow");
            Some(small)
        } else {
            let bytes: [u8; NcclUniqueId::BYTES] =
                me.fetch("grow-id").try_into().expect("a unique id's bytes");
            let grow_id = NcclUniqueId::from_bytes(bytes);
            let mut config = NcclConfig::default();
            // SAFETY: a new rank passes no communicator, the id and its rank (nccl.h); writes one
            // handle; the config lives across the call.
            let res = unsafe {
                ncclCommGrow(
                    std::ptr::null_mut(),
                    n as i32,
                    &grow_id,
                    me.rank as i32,
                    &mut grown,
                    &mut config,
                )
            };
            check_nccl(res, "ncclCommGrow (a new rank)").expect("grow");
            None
        };
        let big = World::from_comms(vec![grown], true);
        tally.check_eq(
            &format!("after the grow from {m}: rank and size"),
            rank_and_size(&big),
            (me.rank, n),
        );
        exercise(&big, &mut tally, &format!("{n} ranks after the grow"), 9500);
        drop(big);
        drop(small);
        tally.finish("comm_grow_adds_two_new_processes");
    });
}
