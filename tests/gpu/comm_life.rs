//! A communicator's life: queries, split (two colors, a reversed key, NCCL_SPLIT_NOCOLOR), shrink,
//! finalize then destroy, abort, and ncclGroupSimulateEnd.

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
fn exercise(world: &World, tally: &mut Tally, label: &str, seed: u64) {
    for (i, count) in [1usize, 65_539].into_iter().enumerate() {
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

#[test]
#[ignore = "needs 2 GPUs: run through ci/gpu-run.sh"]
fn comm_queries_split_and_nocolor() {
    let n = gpus();
    let world = World::init_all(n);
    let mut tally = Tally::new();
    for r in 0..n {
        let got = query(world.comms[r]);
        let want = (n as i32, r as i32, r as i32);
        tally.check_eq(
            &format!("rank {r}: ncclCommCount/CuDevice/UserRank"),
            got,
            want,
        );
    }

    // Two colors: even and odd ranks.
    let mut split = vec![std::ptr::null_mut(); n];
    group("ncclCommSplit (2 colors)", n, |r| {
        // SAFETY: a live parent; writes one handle; NULL config inherits the parent's.
        unsafe {
            ncclCommSplit(
                world.comms[r],
                (r % 2) as i32,
                r as i32,
                &mut split[r],
                std::ptr::null_mut(),
            )
        }
    })
    .expect("ncclCommSplit with 2 colors");
    for color in 0..2 {
        let members: Vec<usize> = (0..n).filter(|r| r % 2 == color).collect();
        for (pos, &r) in members.iter().enumerate() {
            let got = query(split[r]);
            let want = (members.len() as i32, r as i32, pos as i32);
            tally.check_eq(
                &format!("color {color}, parent rank {r}: count/device/rank"),
                got,
                want,
            );
        }
        let sub = World::from_comms(members.iter().map(|&r| split[r]).collect(), true);
        exercise(
            &sub,
            &mut tally,
            &format!("color {color}"),
            6000 + color as u64 * 100,
        );
    }

    // One color, keys reversed: the new ranks run backwards.
    let mut reversed = vec![std::ptr::null_mut(); n];
    group("ncclCommSplit (reversed keys)", n, |r| {
        // SAFETY: as above.
        unsafe {
            ncclCommSplit(
                world.comms[r],
                0,
                (n - 1 - r) as i32,
                &mut reversed[r],
                std::ptr::null_mut(),
            )
        }
    })
    .expect("ncclCommSplit with reversed keys");
    let mut by_new_rank = vec![std::ptr::null_mut(); n];
    for r in 0..n {
        let got = query(reversed[r]);
        let want = (n as i32, r as i32, (n - 1 - r) as i32);
        tally.check_eq(
            &format!("reversed keys, parent rank {r}: count/device/rank"),
            got,
            want,
        );
        by_new_rank[n - 1 - r] = reversed[r];
    }
    let sub = World::from_comms(by_new_rank, true);
    exercise(&sub, &mut tally, "reversed keys", 6300);
    drop(sub);

    // NCCL_SPLIT_NOCOLOR: only rank 0 joins.
    let mut nocolor = vec![std::ptr::null_mut(); n];
    group("ncclCommSplit (NOCOLOR)", n, |r| {
        let color = if r == 0 { 0 } else { NCCL_SPLIT_NOCOLOR };
        // SAFETY: as above.
        unsafe {
            ncclCommSplit(
                world.comms[r],
                color,
                0,
                &mut nocolor[r],
                std::ptr::null_mut(),
            )
        }
    })
    .expect("ncclCommSplit with NCCL_SPLIT_NOCOLOR");
    for (r, comm) in nocolor.iter().enumerate().skip(1) {
        tally.record(
            &format!("NOCOLOR rank {r} gets no communicator"),
            if comm.is_null() {
                Ok(())
            } else {
                Err(format!("got {comm:?}"))
            },
        );
    }
    tally.check_eq(
        "NOCOLOR: rank 0 alone, count/device/rank",
        query(nocolor[0]),
        (1, 0, 0),
    );
    let alone = World::from_comms(vec![nocolor[0]], true);
    exercise(&alone, &mut tally, "NOCOLOR rank 0", 6400);
    tally.finish("comm_queries_split_and_nocolor");
}

#[test]
#[ignore = "needs 2 GPUs: run through ci/gpu-run.sh"]
fn comm_shrink() {
    let n = gpus();
    let world = World::init_all(n);
    let mut tally = Tally::new();
    exercise(&world, &mut tally, "parent", 6500);
    // Exclude the last rank; the others call ncclCommShrink.
    let mut exclude = vec![(n - 1) as i32];
    let mut shrunk = vec![std::ptr::null_mut(); n - 1];
    group("ncclCommShrink", n - 1, |r| {
        // SAFETY: a live, idle parent; the exclude list holds 1 rank; writes one handle; NULL config.
        unsafe {
            ncclCommShrink(
                world.comms[r],
                exclude.as_mut_ptr(),
                1,
                &mut shrunk[r],
                std::ptr::null_mut(),
                NCCL_SHRINK_DEFAULT as i32,
            )
        }
    })
    .expect("ncclCommShrink");
    for (r, &comm) in shrunk.iter().enumerate() {
        let got = query(comm);
        let want = ((n - 1) as i32, r as i32, r as i32);
        tally.check_eq(&format!("shrunk rank {r}: count/device/rank"), got, want);
    }
    let sub = World::from_comms(shrunk, true);
    exercise(&sub, &mut tally, "shrunk", 6600);
    drop(sub);
    exercise(&world, &mut tally, "parent after shrink", 6700);
    tally.finish("comm_shrink");
}

#[test]
#[ignore = "needs 2 GPUs: run through ci/gpu-run.sh"]
fn comm_finalize_then_destroy() {
    let n = gpus();
    let mut world = World::init_all(n);
    let mut tally = Tally::new();
    exercise(&world, &mut tally, "before finalize", 6800);
    world.sync_all().expect("sync every stream");
    let comms = world.comms.clone();
    group("ncclCommFinalize", n, |r| {
        // SAFETY: a live, idle communicator, finalized once.
        unsafe { ncclCommFinalize(comms[r]) }
    })
    .expect("ncclCommFinalize of every rank in a group");
    for (r, &c) in comms.iter().enumerate() {
        // SAFETY: finalized above; destroyed once (the world forgets it below).
        let res =
            check_nccl(unsafe { ncclCommDestroy(c) }, "ncclCommDestroy").map_err(|e| e.to_string());
        tally.record(&format!("ncclCommDestroy rank {r} after finalize"), res);
    }
    world.forget_comms();
    tally.finish("comm_finalize_then_destroy");
}

#[test]
#[ignore = "needs 2 GPUs: run through ci/gpu-run.sh"]
fn comm_abort() {
    let n = gpus();
    let mut world = World::init_all(n);
    let mut tally = Tally::new();
    exercise(&world, &mut tally, "before abort", 6900);
    world.sync_all().expect("sync every stream");
    for (r, &c) in world.comms.iter().enumerate() {
        // SAFETY: a live communicator, aborted once (the world forgets it below).
        let res =
            check_nccl(unsafe { ncclCommAbort(c) }, "ncclCommAbort").map_err(|e| e.to_string());
        tally.record(&format!("ncclCommAbort rank {r}"), res);
    }
    world.forget_comms();
    // The process can still make and use new communicators.
    let again = World::init_all(n);
    exercise(&again, &mut tally, "new communicators after abort", 6950);
    tally.finish("comm_abort");
}

/// `ncclGroupSimulateEnd` with NCCL_SIM_INFO_INITIALIZER: an estimate, and nothing runs.
#[test]
#[ignore = "needs 2 GPUs: run through ci/gpu-run.sh"]
fn group_simulate_end() {
    let n = gpus();
    let world = World::init_all(n);
    const COUNT: usize = (64 << 20) / 4 + 3;
    let bufs: Vec<DevBuf> = (0..n)
        .map(|r| DevBuf::cuda(world.devs[r], COUNT * 4))
        .collect();
    for (r, b) in bufs.iter().enumerate() {
        b.fill(0, b.bytes, POISON, world.streams[r]);
    }
    world.sync_all().expect("sync every stream");
    let mut sim = ncclSimInfo_t::default();
    let initial = sim.estimatedTime;
    // SAFETY: no arguments.
    check_nccl(unsafe { ncclGroupStart() }, "ncclGroupStart").expect("group start");
    for r in 0..n {
        // SAFETY: the buffer holds COUNT floats on the communicator's device.
        let res = unsafe {
            ncclAllReduce(
                bufs[r].at(0),
                bufs[r].at(0),
                COUNT,
                data::FLOAT32.nccl,
                Op::Sum.nccl(),
                world.comms[r],
                world.streams[r],
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
        "ncclGroupSimulateEnd: estimatedTime {} (initially {initial}) for a {} MiB all-reduce",
        sim.estimatedTime,
        (COUNT * 4) >> 20
    );
    assert!(
        sim.estimatedTime > 0.0,
        "estimatedTime {}",
        sim.estimatedTime
    );
    for (r, b) in bufs.iter().enumerate() {
        let got = b.download(0, b.bytes, world.streams[r]);
        assert!(
            got.iter().all(|&x| x == POISON),
            "rank {r}: a simulated group changed the buffer"
        );
    }
    drop(bufs);
    let mut tally = Tally::new();
    exercise(&world, &mut tally, "after a simulated group", 7000);
    tally.finish("group_simulate_end");
}
