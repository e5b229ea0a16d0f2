//! `ncclCommInitRankScalable` with two unique ids (one per rank: as many as NCCL accepts for two ranks)
//! gives communicators with the right ranks that all-reduce correctly.

use metrale_gpu_sys::cuda;
use metrale_gpu_sys::nccl::*;

use metrale_gpu_testkit::world::group;

use crate::support::*;

#[test]
#[ignore = "needs 2 GPUs"]
fn init_rank_scalable_with_two_ids_all_reduces() {
    gpus();
    let n = MIN_GPUS;
    let mut ids = [
        NcclUniqueId::new().expect("id 0"),
        NcclUniqueId::new().expect("id 1"),
    ];
    let mut comms: Vec<NcclComm> = vec![std::ptr::null_mut(); n];
    let mut configs = vec![NcclConfig::default(); n];
    group("ncclCommInitRankScalable", n, |r| {
        cuda::use_device(r as i32, "init").expect("use_device");
        // SAFETY: writes one handle; rank r of n on the current device r; both ranks pass the same
        // ids in the same order; ids and config outlive the group.
        unsafe {
            ncclCommInitRankScalable(
                &mut comms[r],
                n as i32,
                r as i32,
                ids.len() as i32,
                ids.as_mut_ptr(),
                &mut configs[r],
            )
        }
    })
    .expect("ncclCommInitRankScalable with 2 unique ids on 2 GPUs");
    let mut world = World::from_comms(comms, true);
    for r in 0..n {
        assert_eq!(
            rank_and_size(world.comms[r]),
            (r, n),
            "ncclCommUserRank / ncclCommCount"
        );
    }
    for (round, count) in [1, 1001, 1 << 22].into_iter().enumerate() {
        all_reduce(&mut world, count, round)
            .unwrap_or_else(|e| panic!("all-reduce of {count} floats: {e}"));
        println!("ok    all-reduce of {count} floats on the scalable-init communicator");
    }
    destroy(world);
}
