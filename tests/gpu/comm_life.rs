//! A communicator's life, one process per rank: queries, split (colors `rank % 2` and `rank / 4`,
//! reversed keys, one rank with NCCL_SPLIT_NOCOLOR), shrink (excluding 2 ranks from 4 or more),
//! finalize then destroy, abort, and ncclGroupSimulateEnd. Every child communicator's size, device and
//! ranks are checked against the membership the host computes, then it runs collectives.

use metrale_gpu_sys::nccl::*;

use crate::common::*;
use crate::data;

fn query(comm: NcclComm) -> (i32, i32, i32) {
    let (mut count, mut dev, mut rank) = (-1, -1, -1);
    // SAFETY: a live communicator; each writes one int.
    unsafe {
        check_nccl(ncclCommCount(comm, &mut count), "ncclCommCount").expect("count");
        check_nccl(ncclCommCuDevice(comm, &mut dev), "ncclCommCuDevice").expect("device");
        check_nccl(ncclCommUserRank(comm, &mut rank), "ncclCommUserRank").expect("rank");
    }
    (count, dev, rank)
}

/// An all-reduce and an all-gather (whose output order shows the ranks' order) on `world`.
pub fn exercise(world: &World, tally: &mut Tally, label: &str, seed: u64) {
    for (i, count) in [1usize, sized(world, 65_539, 8_195)]
        .into_iter()
        .enumerate()
    {
        let s = seed + 10 * i as u64;
        let cases = [
            Case::new(Coll::AllReduce(Op::Sum), &data::FLOAT32, count, false, s),
            Case::new(Coll::AllGather, &data::INT32, count, false, s + 1),
        ];
        for case in cases {
            let result = run_case(world, case, Buffers::Fresh, None);
            tally.record(&format!("{label}: {}", case.name()), result);
        }
    }
}

/// Splits every communicator of `world` by `color(rank)` and `key(rank)` (ranks of the parent), checks
/// each child's size, device and rank against the membership the host computes (members of a color
/// ordered by key, then parent rank; NCCL_SPLIT_NOCOLOR gets no communicator), and exercises each child.
pub fn split_and_check(
    world: &World,
    tally: &mut Tally,
    label: &str,
    color: impl Fn(usize) -> i32,
    key: impl Fn(usize) -> i32,
    seed: u64,
) {
    let n = world.size;
    let mut split = vec![std::ptr::null_mut(); world.n()];
    world
        .group(&format!("ncclCommSplit ({label})"), |i| {
            let r = world.ranks[i];
            // SAFETY: a live parent; writes one handle; NULL config inherits the parent's.
            unsafe {
                ncclCommSplit(
                    world.comms[i],
                    color(r),
                    key(r),
                    &mut split[i],
                    std::ptr::null_mut(),
                )
            }
        })
        .unwrap_or_else(|e| panic!("ncclCommSplit ({label}): {e}"));
    let mut colors: Vec<i32> = Vec::new();
    for (i, &comm) in split.iter().enumerate() {
        let r = world.ranks[i];
        let c = color(r);
        if c == NCCL_SPLIT_NOCOLOR {
            let got = if comm.is_null() {
                Ok(())
            } else {
                Err(format!("got {comm:?}"))
            };
            tally.record(
                &format!("{label}: NOCOLOR rank {r} gets no communicator"),
                got,
            );
            continue;
        }
        let mut members: Vec<usize> = (0..n).filter(|&k| color(k) == c).collect();
        members.sort_by_key(|&k| (key(k), k));
        let pos = members
            .iter()
            .position(|&k| k == r)
            .expect("a member of its color");
        tally.check_eq(
            &format!("{label}: color {c}, parent rank {r}: count/device/rank"),
            query(comm),
            (members.len() as i32, world.devs[i], pos as i32),
        );
        if !colors.contains(&c) {
            colors.push(c);
        }
    }
    // One world per color this process holds communicators of; each runs collectives.
    for c in colors {
        let comms: Vec<NcclComm> = (0..world.n())
            .filter(|&i| color(world.ranks[i]) == c)
            .map(|i| split[i])
            .collect();
        let sub = World::from_comms(comms, true);
        exercise(
            &sub,
            tally,
            &format!("{label}: color {c}"),
            seed + 10 * c as u64,
        );
    }
}

#[test]
#[ignore = "needs a GPU: run through ci/gpu-run.sh"]
fn comm_queries_split_and_nocolor() {
    ranks::test("comm_life::comm_queries_split_and_nocolor").run(|me, world| {
        let n = world.size;
        let mut tally = Tally::new();
        tally.check_eq(
            &format!("rank {}: ncclCommCount/CuDevice/UserRank", me.rank),
            query(world.comms[0]),
            (n as i32, me.device, me.rank as i32),
        );
        let last = n - 1;
        let by_rank = |r: usize| r as i32;
        split_and_check(
            world,
            &mut tally,
            "rank % 2",
            |r| (r % 2) as i32,
            by_rank,
            6000,
        );
        split_and_check(
            world,
            &mut tally,
            "rank / 4",
            |r| (r / 4) as i32,
            by_rank,
            6100,
        );
        split_and_check(
            world,
            &mut tally,
            "reversed keys",
            |_| 0,
            |r| (last - r) as i32,
            6200,
        );
        let nocolor = |r: usize| if r == last { NCCL_SPLIT_NOCOLOR } else { 0 };
        split_and_check(
            world,
            &mut tally,
            "last rank NOCOLOR",
            nocolor,
            by_rank,
            6300,
        );
        tally.finish("comm_queries_split_and_nocolor");
    });
}

/// The ranks a shrink excludes: the last, and rank 1 from 4 ranks on (2 of 8).
fn excluded(n: usize) -> Vec<i32> {
    let mut out = vec![(n - 1) as i32];
    if n >= 4 {
        out.insert(0, 1);
    }
    out
}

#[test]
#[ignore = "needs a GPU: run through ci/gpu-run.sh"]
fn comm_shrink() {
    ranks::test("comm_life::comm_shrink").run(|me, world| {
        let n = world.size;
        let mut tally = Tally::new();
        exercise(world, &mut tally, "parent", 6500);
        let mut exclude = excluded(n);
        let survivors: Vec<usize> = (0..n).filter(|&r| !exclude.contains(&(r as i32))).collect();
        if let Some(pos) = survivors.iter().position(|&r| r == me.rank) {
            // Only the survivors call ncclCommShrink (NCCL_SHRINK_DEFAULT).
            let mut shrunk: NcclComm = std::ptr::null_mut();
            // SAFETY: a live, idle parent; the exclude list holds exclude.len() ranks; writes one
            // handle; NULL config.
            let res = unsafe {
                ncclCommShrink(
                    world.comms[0],
                    exclude.as_mut_ptr(),
                    exclude.len() as i32,
                    &mut shrunk,
                    std::ptr::null_mut(),
                    NCCL_SHRINK_DEFAULT as i32,
                )
            };
            check_nccl(res, "ncclCommShrink").expect("ncclCommShrink");
            tally.check_eq(
                &format!(
                    "excluding {exclude:?}: parent rank {} count/device/rank",
                    me.rank
                ),
                query(shrunk),
                (survivors.len() as i32, me.device, pos as i32),
            );
            let sub = World::from_comms(vec![shrunk], true);
            exercise(&sub, &mut tally, "shrunk", 6600);
        } else {
            println!("rank {}: excluded from the shrink ({exclude:?})", me.rank);
        }
        // The parent runs on once every survivor is done with the shrunk communicator.
        me.barrier("shrunk");
        exercise(world, &mut tally, "parent after shrink", 6700);
        tally.finish("comm_shrink");
    });
}

#[test]
#[ignore = "needs a GPU: run through ci/gpu-run.sh"]
fn comm_finalize_then_destroy() {
    ranks::test("comm_life::comm_finalize_then_destroy").run_raw(|me| {
        let mut world = me.join();
        let mut tally = Tally::new();
        exercise(&world, &mut tally, "before finalize", 6800);
        world.sync_all().expect("sync every stream");
        let comms = world.comms.clone();
        world
            .group("ncclCommFinalize", |i| {
                // SAFETY: a live, idle communicator, finalized once.
                unsafe { ncclCommFinalize(comms[i]) }
            })
            .expect("ncclCommFinalize");
        for &c in &comms {
            // SAFETY: finalized above; destroyed once (the world forgets it below).
            let res = check_nccl(unsafe { ncclCommDestroy(c) }, "ncclCommDestroy")
                .map_err(|e| e.to_string());
            tally.record(
                &format!("ncclCommDestroy rank {} after finalize", me.rank),
                res,
            );
        }
        world.forget_comms();
        tally.finish("comm_finalize_then_destroy");
    });
}

#[test]
#[ignore = "needs a GPU: run through ci/gpu-run.sh"]
fn comm_abort() {
    ranks::test("comm_life::comm_abort").run_raw(|me| {
        let mut world = me.join();
        let mut tally = Tally::new();
        exercise(&world, &mut tally, "before abort", 6900);
        world.sync_all().expect("sync every stream");
        // Every rank's stream done before any rank aborts: a rank's kernel returns with its last sends
        // still queued in its proxy (over the network transport; NCCL 2.29.7 prims_simple.h waits for
        // them only for registered buffers), and ncclCommAbort stops the proxy at once, queued sends
        // or not (proxy.cc: the progress loop ends on the abort flag; a destroy drains it first). A peer
        // still receiving would then wait forever in its sync. Once every stream is done, everything
        // sent has been received.
        me.barrier("before-abort");
        for &c in &world.comms {
            // SAFETY: a live communicator, aborted once (the world forgets it below).
            let res =
                check_nccl(unsafe { ncclCommAbort(c) }, "ncclCommAbort").map_err(|e| e.to_string());
            tally.record(&format!("ncclCommAbort rank {}", me.rank), res);
        }
        world.forget_comms();
        // The process can still make and use a new communicator.
        let again = me.join_id("after-abort-id");
        exercise(&again, &mut tally, "a new communicator after abort", 6950);
        tally.finish("comm_abort");
    });
}

/// `ncclGroupSimulateEnd` with NCCL_SIM_INFO_INITIALIZER: an estimate, and nothing runs.
#[test]
#[ignore = "needs a GPU: run through ci/gpu-run.sh"]
fn group_simulate_end() {
    ranks::test("comm_life::group_simulate_end").run(|_, world| {
        const COUNT: usize = (64 << 20) / 4 + 3;
        let bufs: Vec<DevBuf> = world.devs.iter().map(|&d| DevBuf::cuda(d, COUNT * 4)).collect();
        for (i, b) in bufs.iter().enumerate() {
            b.fill(0, b.bytes, POISON, world.streams[i]);
        }
        world.sync_all().expect("sync every stream");
        let mut sim = ncclSimInfo_t::default();
        let initial = sim.estimatedTime;
        // SAFETY: no arguments.
        check_nccl(unsafe { ncclGroupStart() }, "ncclGroupStart").expect("group start");
        for (i, b) in bufs.iter().enumerate() {
            // SAFETY: the buffer holds COUNT floats on the communicator's device.
            let res = unsafe {
                ncclAllReduce(
                    b.at(0),
                    b.at(0),
                    COUNT,
                    data::FLOAT32.nccl,
                    Op::Sum.nccl(),
                    world.comms[i],
                    world.streams[i],
                )
            };
            check_nccl(res, "ncclAllReduce in a simulated group").expect("enqueue");
        }
        // SAFETY: closes the group with a sim info from NCCL_SIM_INFO_INITIALIZER.
        check_nccl(
            unsafe { ncclGroupSimulateEnd(&mut sim) },
            "ncclGroupSimulateEnd",
        )
        .expect("simulate");
        world.sync_all().expect("sync every stream");
        println!(
            "ncclGroupSimulateEnd: estimatedTime {} (initially {initial}) for a {} MiB all-reduce over {} ranks",
            sim.estimatedTime,
            (COUNT * 4) >> 20,
            world.size
        );
        assert!(
            sim.estimatedTime > 0.0,
            "estimatedTime {}",
            sim.estimatedTime
        );
        for (i, b) in bufs.iter().enumerate() {
            let got = b.download(0, b.bytes, world.streams[i]);
            assert!(
                got.iter().all(|&x| x == POISON),
                "rank {}: a simulated group changed the buffer",
                world.ranks[i]
            );
        }
        drop(bufs);
        let mut tally = Tally::new();
        exercise(world, &mut tally, "after a simulated group", 7000);
        tally.finish("group_simulate_end");
    });
}
