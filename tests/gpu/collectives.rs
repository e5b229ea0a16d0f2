//! Collectives with one process driving every GPU: every data type and built-in op of the all-reduce,
//! every other collective, send/recv, pre-multiplied sums, and buffers of hundreds of MiB.

use crate::common::*;
use crate::data::{self, Op, ALL};

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
        Coll::AlltoAll,
        Coll::Gather(root),
        Coll::Scatter(root),
        Coll::SendRecv,
    ]
}

fn placements(coll: Coll) -> Vec<bool> {
    let mut p = Vec::new();
    if coll.has_out_of_place() {
        p.push(false);
    }
    if coll.has_in_place() {
        p.push(true);
    }
    p
}

#[test]
#[ignore = "needs 2 GPUs: run through ci/gpu"]
fn all_reduce_every_type_and_op() {
    let n = gpus();
    let world = World::init_all(n);
    let mut tally = Tally::new();
    let mut seed = 1;
    for dt in &ALL {
        for &op in dt.ops() {
            for in_place in [false, true] {
                for count in COUNTS {
                    seed += 1;
                    let coll = Coll::AllReduce(op);
                    tally.case(
                        &world,
                        coll,
                        dt,
                        count,
                        in_place,
                        seed,
                        Buffers::Fresh,
                        None,
                    );
                }
            }
        }
    }
    tally.finish("all_reduce_every_type_and_op");
}

/// Every collective but the all-reduce, on communicators from `ncclCommInitAll`.
#[test]
#[ignore = "needs 2 GPUs: run through ci/gpu"]
fn collectives_init_all() {
    let n = gpus();
    let world = World::init_all(n);
    let mut tally = Tally::new();
    let mut seed = 1000;
    for coll in every_collective(n) {
        for dt in &ALL {
            for in_place in placements(coll) {
                for count in COUNTS {
                    seed += 1;
                    tally.case(
                        &world,
                        coll,
                        dt,
                        count,
                        in_place,
                        seed,
                        Buffers::Fresh,
                        None,
                    );
                }
            }
        }
    }
    tally.finish("collectives_init_all");
}

/// Every collective, all-reduce included, on communicators from `ncclCommInitRank` per GPU inside
/// `ncclGroupStart/End`.
#[test]
#[ignore = "needs 2 GPUs: run through ci/gpu"]
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
            for in_place in placements(coll) {
                for count in COUNTS {
                    seed += 1;
                    tally.case(
                        &world,
                        coll,
                        dt,
                        count,
                        in_place,
                        seed,
                        Buffers::Fresh,
                        None,
                    );
                }
            }
        }
    }
    tally.finish("collectives_init_rank_in_group");
}

/// `ncclRedOpCreatePreMulSum` with a host scalar and a device scalar (different on every rank), used
/// in an all-reduce, then `ncclRedOpDestroy`.
#[test]
#[ignore = "needs 2 GPUs: run through ci/gpu"]
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
            for in_place in [false, true] {
                for count in [1, 1001, 65_539] {
                    seed += 1;
                    let what = format!(
                        "PreMulSum {} scalars {:?} on the {} count {count} {}",
                        dt.name,
                        premul.scalars,
                        if on_device { "device" } else { "host" },
                        if in_place { "in place" } else { "out of place" }
                    );
                    let result = run_case(
                        &world,
                        Coll::PreMulSum,
                        dt,
                        count,
                        in_place,
                        seed,
                        Buffers::Fresh,
                        Some(&premul),
                    );
                    tally.record(&what, result);
                }
            }
        }
    }
    tally.finish("premul_sum_host_and_device_scalars");
}

/// Buffers of hundreds of MiB, with counts that are not multiples of 16 bytes.
#[test]
#[ignore = "needs 2 GPUs: run through ci/gpu"]
fn collectives_large_buffers() {
    let n = gpus();
    let world = World::init_all(n);
    let mut tally = Tally::new();
    let cases: Vec<(Coll, &data::Dtype, usize, bool)> = vec![
        // 300 MiB + 12 bytes per rank.
        (
            Coll::AllReduce(Op::Sum),
            &data::FLOAT32,
            300 * MiB / 4 + 3,
            false,
        ),
        (
            Coll::AllReduce(Op::Sum),
            &data::FLOAT32,
            300 * MiB / 4 + 3,
            true,
        ),
        (
            Coll::AllReduce(Op::Max),
            &data::BFLOAT16,
            256 * MiB / 2 + 1,
            true,
        ),
        (
            Coll::AllReduce(Op::Sum),
            &data::INT64,
            128 * MiB / 8 + 1,
            false,
        ),
        (
            Coll::AllReduce(Op::Avg),
            &data::FLOAT8E4M3,
            200 * MiB + 5,
            false,
        ),
        (
            Coll::ReduceScatter(Op::Sum),
            &data::FLOAT32,
            128 * MiB / 4 + 1,
            false,
        ),
        (Coll::AllGather, &data::UINT8, 160 * MiB + 7, true),
        (
            Coll::Broadcast(n - 1),
            &data::FLOAT16,
            200 * MiB / 2 + 3,
            false,
        ),
        (
            Coll::Reduce(Op::Sum, 0),
            &data::FLOAT64,
            128 * MiB / 8 + 3,
            false,
        ),
        (Coll::AlltoAll, &data::INT32, 64 * MiB / 4 + 1, false),
        (Coll::SendRecv, &data::FLOAT32, 256 * MiB / 4 + 1, false),
    ];
    for (i, (coll, dt, count, in_place)) in cases.into_iter().enumerate() {
        tally.case(
            &world,
            coll,
            dt,
            count,
            in_place,
            4000 + i as u64,
            Buffers::Fresh,
            None,
        );
    }
    tally.finish("collectives_large_buffers");
}
