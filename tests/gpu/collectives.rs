//! Collectives with one process driving every GPU: every data type and built-in op of the all-reduce,
//! every other collective, send/recv, pre-multiplied sums, and buffers of hundreds of MiB.

use crate::common::*;
use crate::data::{self, ALL};

/// Element counts of the small cases: 1 element, odd counts (never a multiple of 16 bytes for any type),
/// and a count past the sizes NCCL handles with its low-latency protocols.
const COUNTS: [usize; 4] = [1, 7, 1001, 65_539];

const MiB: usize = 1 << 20;

fn every_collective(n: usize) -> Vec<Coll> {
    let root = n - 1; // not rank 0, so a root argument that is ignored shows
    vec![
        Coll::ReduceScatter(Op::Sum),
        Coll::ReduceScatter(Op::Max),
        Coll::Reduce(Op::Sum, root),
        Coll::Reduce(Op::Min, 0),
        Coll::AllGather,
        Coll::Broadcast(root),
        Coll::Bcast(root),
        #[cfg(nccl_2_28)]
        Coll::AlltoAll,
        #[cfg(nccl_2_28)]
        Coll::Gather(root),
        #[cfg(nccl_2_28)]
        Coll::Scatter(root),
        Coll::SendRecv,
    ]
}

/// `coll` on `dt` at every count of [`COUNTS`], out of place and in place where it has them.
fn every_count(tally: &mut Tally, world: &World, coll: Coll, dt: &data::Dtype, seed: &mut u64) {
    let placements = [
        (false, coll.has_out_of_place()),
        (true, coll.has_in_place()),
    ];
    for (in_place, _) in placements.into_iter().filter(|&(_, has)| has) {
        for count in COUNTS {
            *seed += 1;
            tally.case(world, Case::new(coll, dt, count, in_place, *seed));
        }
    }
}

#[test]
#[ignore = "needs 2 GPUs: run through ci/gpu-run.sh"]
fn all_reduce_every_type_and_op() {
    let n = gpus();
    let world = World::init_all(n);
    let mut tally = Tally::new();
    let mut seed = 1;
    for dt in &ALL {
        for &op in dt.ops() {
            every_count(&mut tally, &world, Coll::AllReduce(op), dt, &mut seed);
        }
    }
    tally.finish("all_reduce_every_type_and_op");
}

/// Every collective but the all-reduce, on communicators from `ncclCommInitAll`.
#[test]
#[ignore = "needs 2 GPUs: run through ci/gpu-run.sh"]
fn collectives_init_all() {
    let n = gpus();
    let world = World::init_all(n);
    let mut tally = Tally::new();
    let mut seed = 1000;
    for coll in every_collective(n) {
        for dt in &ALL {
            every_count(&mut tally, &world, coll, dt, &mut seed);
        }
    }
    tally.finish("collectives_init_all");
}

/// Every collective, all-reduce included, on communicators from `ncclCommInitRank` per GPU inside
/// `ncclGroupStart/End`.
#[test]
#[ignore = "needs 2 GPUs: run through ci/gpu-run.sh"]
fn collectives_init_rank_in_group() {
    let n = gpus();
    let world = World::init_rank_group(n);
    let mut tally = Tally::new();
    let mut seed = 2000;
    let mut colls = vec![Coll::AllReduce(Op::Sum), Coll::AllReduce(Op::Avg)];
    colls.extend(every_collective(n));
    for coll in colls {
        for dt in [&data::INT8, &data::FLOAT16, &data::FLOAT32, &data::BFLOAT16] {
            if coll == Coll::AllReduce(Op::Avg) && !dt.is_float() {
                continue; // avg is for floating types
            }
            every_count(&mut tally, &world, coll, dt, &mut seed);
        }
    }
    tally.finish("collectives_init_rank_in_group");
}

/// `ncclRedOpCreatePreMulSum` with a host scalar and a device scalar (different on every rank), used
/// in an all-reduce, then `ncclRedOpDestroy`.
#[test]
#[ignore = "needs 2 GPUs: run through ci/gpu-run.sh"]
fn premul_sum_host_and_device_scalars() {
    let n = gpus();
    let world = World::init_all(n);
    let mut tally = Tally::new();
    let mut seed = 3000;
    let pool = [1.5, -0.75, 2.0, 0.25];
    for dt in [
        &data::FLOAT32,
        &data::FLOAT64,
        &data::FLOAT16,
        &data::BFLOAT16,
    ] {
        for on_device in [false, true] {
            let scalars: Vec<f64> = (0..n).map(|r| pool[(r + on_device as usize) % 4]).collect();
            let premul = PreMul { scalars, on_device };
            println!(
                "PreMulSum {}: scalars {:?} on the {}",
                dt.name,
                premul.scalars,
                if on_device { "device" } else { "host" }
            );
            for in_place in [false, true] {
                for count in [1, 1001, 65_539] {
                    seed += 1;
                    let case = Case::new(Coll::PreMulSum, dt, count, in_place, seed);
                    tally.run(&world, case, Buffers::Fresh, Some(&premul));
                }
            }
        }
    }
    tally.finish("premul_sum_host_and_device_scalars");
}

/// Buffers of hundreds of MiB, with counts that are not multiples of 16 bytes.
#[test]
#[ignore = "needs 2 GPUs: run through ci/gpu-run.sh"]
fn collectives_large_buffers() {
    let n = gpus();
    let world = World::init_all(n);
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
        (Coll::Broadcast(n - 1), &FLOAT16, 200, 3, false),
        (Coll::Reduce(Op::Sum, 0), &FLOAT64, 128, 3, false),
        #[cfg(nccl_2_28)]
        (Coll::AlltoAll, &data::INT32, 64, 1, false),
        (Coll::SendRecv, &FLOAT32, 256, 1, false),
    ];
    for (i, (coll, dt, mib, past, in_place)) in cases.into_iter().enumerate() {
        let count = mib * MiB / dt.size + past;
        tally.case(
            &world,
            Case::new(coll, dt, count, in_place, 4000 + i as u64),
        );
    }
    tally.finish("collectives_large_buffers");
}
