//! Tests of a fixed rank count, whatever `METRALE_TEST_RANKS` says (the GPU runner runs them once per
//! NCCL version): buffers of hundreds of MiB at 2 ranks, and the smoke test of scale at 16 ranks (an
//! all-reduce and a split).

use crate::comm_life::split_and_check;
use crate::common::*;
use crate::data;

const MiB: usize = 1 << 20;

/// Buffers of hundreds of MiB, with counts that are not multiples of 16 bytes, at 2 ranks.
#[test]
#[ignore = "needs a GPU: run through ci/gpu-run.sh"]
fn collectives_large_buffers_two_ranks() {
    ranks::test("fixed::collectives_large_buffers_two_ranks")
        .ranks(2)
        .run(|_, world| {
            let mut tally = Tally::new();
            use data::{BFLOAT16, FLOAT16, FLOAT32, FLOAT64, FLOAT8E4M3, INT64, UINT8};
            // (collective, type, MiB per rank, elements past them: never a multiple of 16 bytes, in place)
            let cases = [
                (Coll::AllReduce(Op::Sum), &FLOAT32, 300, 3, false),
                (Coll::AllReduce(Op::Sum), &FLOAT32, 300, 3, true),
                (Coll::AllReduce(Op::Max), &BFLOAT16, 256, 1, true),
                (Coll::AllReduce(Op::Sum), &INT64, 128, 1, false),
                (Coll::AllReduce(Op::Avg), &FLOAT8E4M3, 200, 5, false),
                (Coll::ReduceScatter(Op::Sum), &FLOAT32, 128, 1, false),
                (Coll::AllGather, &UINT8, 160, 7, true),
                (Coll::Broadcast(1), &FLOAT16, 200, 3, false),
                (Coll::Reduce(Op::Sum, 0), &FLOAT64, 128, 3, false),
                #[cfg(nccl_2_28)]
                (Coll::AlltoAll, &data::INT32, 64, 1, false),
                (Coll::SendRecv, &FLOAT32, 256, 1, false),
            ];
            for (i, (coll, dt, mib, past, in_place)) in cases.into_iter().enumerate() {
                let count = mib * MiB / dt.size + past;
                tally.case(world, Case::new(coll, dt, count, in_place, 4000 + i as u64));
            }
            tally.finish("collectives_large_buffers_two_ranks");
        });
}

/// 16 ranks: an all-reduce checked against the host, and a split into 4 colors, each child checked.
#[test]
#[ignore = "needs a GPU: run through ci/gpu-run.sh"]
fn sixteen_ranks_all_reduce_and_split() {
    ranks::test("fixed::sixteen_ranks_all_reduce_and_split")
        .ranks(16)
        .run(|_, world| {
            let mut tally = Tally::new();
            let f32 = &data::FLOAT32;
            for (i, count) in [1, 4099].into_iter().enumerate() {
                let case = Case::new(Coll::AllReduce(Op::Sum), f32, count, false, 9100 + i as u64);
                tally.case(world, case);
            }
            split_and_check(
                world,
                &mut tally,
                "rank % 4",
                |r| (r % 4) as i32,
                |r| r as i32,
                9200,
            );
            tally.finish("sixteen_ranks_all_reduce_and_split");
        });
}
