//! `ncclCommInitRankScalable` with two unique ids over every rank (at 2 ranks, one per rank: as many as
//! NCCL accepts) gives communicators with the right ranks that all-reduce correctly. Each id is made by
//! the first rank it serves, in that rank's process, and handed to every rank in the same order.

use metrale_gpu_sys::cuda;
use metrale_gpu_sys::nccl::*;

use crate::support::*;

const IDS: usize = 2;

#[test]
#[ignore = "needs a GPU: run through ci/gpu-run.sh"]
fn init_rank_scalable_with_two_ids_all_reduces() {
    ranks::test("scalable::init_rank_scalable_with_two_ids_all_reduces").run_raw(|me| {
        let n = me.nranks;
        assert!(n >= IDS, "{IDS} unique ids need {IDS} ranks or more");
        let mut ids: Vec<NcclUniqueId> = (0..IDS)
            .map(|k| me.share_id(&format!("scalable-id-{k}"), k * n / IDS))
            .collect();
        let mut comm: NcclComm = std::ptr::null_mut();
        let mut config = NcclConfig::default();
        cuda::use_device(me.device, "init").expect("use_device");
        // SAFETY: writes one handle; rank `rank` of n on the current device; every rank passes the same
        // ids in the same order; ids and config outlive the call.
        let res = unsafe {
            ncclCommInitRankScalable(
                &mut comm,
                n as i32,
                me.rank as i32,
                IDS as i32,
                ids.as_mut_ptr(),
                &mut config,
            )
        };
        check_nccl(res, "ncclCommInitRankScalable").unwrap_or_else(|e| {
            panic!(
                "ncclCommInitRankScalable with {IDS} unique ids, rank {} of {n}: {e}",
                me.rank
            )
        });
        let mut world = World::from_comms(vec![comm], true);
        assert_eq!(
            rank_and_size(comm),
            (me.rank, n),
            "ncclCommUserRank / ncclCommCount"
        );
        for (round, count) in [1, 1001, 1 << 18].into_iter().enumerate() {
            all_reduce(&mut world, count, round)
                .unwrap_or_else(|e| panic!("all-reduce of {count} floats: {e}"));
            println!("ok    all-reduce of {count} floats on the scalable-init communicator");
        }
        destroy(world);
    });
}
