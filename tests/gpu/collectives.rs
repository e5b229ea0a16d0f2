//! Collectives, one process per rank ([`ranks`]): every data type and built-in op of the all-reduce,
//! every other collective (send/recv as a ring, all-to-all, gather, scatter), pre-multiplied sums, in
//! place and out of place, at `METRALE_TEST_RANKS` ranks on any GPUs; the same with one process driving
//! every GPU (`ncclCommInitAll`, a group of `ncclCommInitRank`) where the host has several. The
//! 300 MiB buffers are a 2-rank case in `fixed.rs`.

use crate::common::*;
use crate::data::{self, ALL};

/// Element counts of the small cases: 1 element, odd counts (never a multiple of 16 bytes for any
/// type), and a count past the sizes NCCL handles with its low-latency protocols; beyond 2 ranks (many
/// ranks on one GPU over loopback sockets) the last is tens of KiB.
fn counts(world: &World) -> [usize; 4] {
    [1, 7, 1001, sized(world, 65_539, 8_195)]
}

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

/// `coll` on `dt` at every count of [`counts`], out of place and in place where it has them.
fn every_count(tally: &mut Tally, world: &World, coll: Coll, dt: &data::Dtype, seed: &mut u64) {
    let placements = [
        (false, coll.has_out_of_place()),
        (true, coll.has_in_place()),
    ];
    for (in_place, _) in placements.into_iter().filter(|&(_, has)| has) {
        for count in counts(world) {
            *seed += 1;
            tally.case(world, Case::new(coll, dt, count, in_place, *seed));
        }
    }
}

#[test]
#[ignore = "needs a GPU: run through ci/gpu-run.sh"]
fn all_reduce_every_type_and_op() {
    ranks::test("collectives::all_reduce_every_type_and_op").run(|_, world| {
        let mut tally = Tally::new();
        let mut seed = 1;
        for dt in &ALL {
            for &op in dt.ops() {
                every_count(&mut tally, world, Coll::AllReduce(op), dt, &mut seed);
            }
        }
        tally.finish("all_reduce_every_type_and_op");
    });
}

/// Every collective but the all-reduce, on every type, one process per rank.
#[test]
#[ignore = "needs a GPU: run through ci/gpu-run.sh"]
fn every_collective_every_type() {
    ranks::test("collectives::every_collective_every_type").run(|_, world| {
        let mut tally = Tally::new();
        let mut seed = 1000;
        for coll in every_collective(world.size) {
            for dt in &ALL {
                every_count(&mut tally, world, coll, dt, &mut seed);
            }
        }
        tally.finish("every_collective_every_type");
    });
}

/// The collectives of a world that one process drives, on a few types.
fn one_process_cases(test: &str, world: &World, seed: u64) {
    let mut tally = Tally::new();
    let mut seed = seed;
    let mut colls = vec![Coll::AllReduce(Op::Sum), Coll::AllReduce(Op::Avg)];
    colls.extend(every_collective(world.size));
    for coll in colls {
        for dt in [&data::INT8, &data::FLOAT16, &data::FLOAT32, &data::BFLOAT16] {
            if coll == Coll::AllReduce(Op::Avg) && !dt.is_float() {
                continue; // avg is for floating types
            }
            every_count(&mut tally, world, coll, dt, &mut seed);
        }
    }
    tally.finish(test);
}

/// `ncclCommInitAll` over every GPU of this host, driven from one thread: needs 2 GPUs or more.
#[test]
#[ignore = "needs 2 GPUs: run through ci/gpu-run.sh"]
fn collectives_init_all() {
    let test = "collectives::collectives_init_all";
    if let Some(n) = gpus_in_one_process(test, 2) {
        one_process_cases(test, &World::init_all(n), 1500);
    }
}

/// `ncclCommInitRank` per GPU inside `ncclGroupStart/End`, every GPU from one thread: needs 2 GPUs or
/// more.
#[test]
#[ignore = "needs 2 GPUs: run through ci/gpu-run.sh"]
fn collectives_init_rank_in_group() {
    let test = "collectives::collectives_init_rank_in_group";
    if let Some(n) = gpus_in_one_process(test, 2) {
        one_process_cases(test, &World::init_rank_group(n), 2000);
    }
}

/// `ncclRedOpCreatePreMulSum` with a host scalar and a device scalar (different on every rank), used
/// in an all-reduce, then `ncclRedOpDestroy`.
#[test]
#[ignore = "needs a GPU: run through ci/gpu-run.sh"]
fn premul_sum_host_and_device_scalars() {
    ranks::test("collectives::premul_sum_host_and_device_scalars").run(|_, world| {
        let n = world.size;
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
                let scalars: Vec<f64> =
                    (0..n).map(|r| pool[(r + on_device as usize) % 4]).collect();
                let premul = PreMul { scalars, on_device };
                println!(
                    "PreMulSum {}: scalars {:?} on the {}",
                    dt.name,
                    premul.scalars,
                    if on_device { "device" } else { "host" }
                );
                for in_place in [false, true] {
                    for count in [1, 1001, sized(world, 65_539, 8_195)] {
                        seed += 1;
                        let case = Case::new(Coll::PreMulSum, dt, count, in_place, seed);
                        tally.run(world, case, Buffers::Fresh, Some(&premul));
                    }
                }
            }
        }
        tally.finish("premul_sum_host_and_device_scalars");
    });
}
