//! `ncclCommGetUniqueId` + `ncclCommGrow` add a rank from a new process: this process holds a one-rank
//! communicator on GPU 0 and makes the grow id; a child process (this binary again) joins as rank 1
//! on GPU 1; both check ranks and sizes and all-reduce correctly on the grown communicator.

use metrale_gpu_sys::cuda;
use metrale_gpu_sys::nccl::*;

use metrale_gpu_testkit::child;

use crate::support::*;

/// The child's environment: the grow id, as hex.
const GROW_ID: &str = "METRALE_NCCL_API_GROW_ID";
const COUNT: usize = 1 << 20;
const ROUNDS: usize = 3;

/// A non-blocking config, so that every wait is bounded (the watchdog's).
fn non_blocking() -> NcclConfig {
    NcclConfig {
        blocking: 0,
        ..NcclConfig::default()
    }
}

#[test]
#[ignore = "needs 2 GPUs"]
fn grow_adds_a_rank_from_a_new_process() {
    gpus();
    cuda::use_device(0, "grow test").expect("use_device");
    let id = NcclUniqueId::new().expect("ncclGetUniqueId");
    let mut one: NcclComm = std::ptr::null_mut();
    // SAFETY: writes one handle; the only rank, on the current device 0.
    let res = unsafe { ncclCommInitRankConfig(&mut one, 1, id, 0, &mut non_blocking()) };
    // SAFETY: the handle the non-blocking init returned, used by this thread alone.
    unsafe { WATCHDOG.check(res, one, "ncclCommInitRankConfig (1 rank)") }
        .expect("one-rank communicator");
    let mut small = World::from_comms(vec![one], false);
    all_reduce(&mut small, COUNT, 0).expect("all-reduce on the one-rank communicator");

    let mut grow_id = NcclUniqueId::from_bytes([0; NcclUniqueId::BYTES]);
    // SAFETY: a live, idle communicator; writes one id.
    let res = unsafe { ncclCommGetUniqueId(one, &mut grow_id) };
    check_nccl(res, "ncclCommGetUniqueId").expect("a grow id");
    let joiner = child::spawn(
        "grow child (new rank 1 on GPU 1)",
        "grow",
        &[(
            GROW_ID,
            metrale_gpu_testkit::hex::encode(&grow_id.to_bytes()),
        )],
    );
    let mut grown: NcclComm = std::ptr::null_mut();
    // SAFETY: the existing root passes its communicator, the id it made and rank -1 (nccl.h); a NULL
    // config inherits the parent's (non-blocking).
    let res = unsafe { ncclCommGrow(one, 2, &grow_id, -1, &mut grown, std::ptr::null_mut()) };
    // SAFETY: the handle the non-blocking grow returned, used by this thread alone.
    let joined = unsafe { WATCHDOG.check(res, grown, "ncclCommGrow (existing rank 0)") };
    if let Err(e) = joined {
        joiner.dump();
        panic!("{e}");
    }
    let mut big = World::from_comms(vec![grown], false);
    assert_eq!(
        rank_and_size(grown),
        (0, 2),
        "rank 0's rank and size after the grow"
    );
    for round in 1..=ROUNDS {
        all_reduce(&mut big, COUNT, round).expect("all-reduce on the grown communicator");
    }
    println!("ok    rank 0: {ROUNDS} all-reduces of {COUNT} floats on the grown communicator");
    destroy(big);
    destroy(small);
    child::expect_success("ncclCommGrow", &child::wait_all(vec![joiner], LIMIT));
}

/// The child: rank 1 of the grown communicator, on GPU 1.
pub fn child() {
    let id = id_from_hex(&child::var(GROW_ID));
    cuda::use_device(1, "grow child").expect("use_device");
    let mut comm: NcclComm = std::ptr::null_mut();
    // SAFETY: a new rank passes no communicator, the id and its rank (nccl.h); writes one handle.
    let res = unsafe {
        ncclCommGrow(
            std::ptr::null_mut(),
            2,
            &id,
            1,
            &mut comm,
            &mut non_blocking(),
        )
    };
    // SAFETY: the handle the non-blocking grow returned, used by this thread alone.
    unsafe { WATCHDOG.check(res, comm, "ncclCommGrow (new rank 1)") }.expect("grown communicator");
    let mut rank = World::from_comms(vec![comm], false);
    assert_eq!(rank_and_size(comm), (1, 2), "the new rank's rank and size");
    for round in 1..=ROUNDS {
        all_reduce(&mut rank, COUNT, round).expect("all-reduce on the grown communicator");
    }
    destroy(rank);
    println!("GROW CHILD OK");
}
