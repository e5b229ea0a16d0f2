//! `ncclCommGetUniqueId` + `ncclCommGrow` add a rank from a new process: this process holds a one-rank
//! communicator on GPU 0 and makes the grow id; a child process (this binary again) joins as rank 1
//! on GPU 1; both check ranks and sizes and all-reduce correctly on the grown communicator.

use metrale_gpu_sys::cuda;
use metrale_gpu_sys::nccl::*;

use crate::children::{self, spawn_child};
use crate::support::*;

/// The child's environment: the grow id, as hex.
const GROW_ID: &str = "METRALE_NCCL_API_GROW_ID";
const COUNT: usize = 1 << 20;
const ROUNDS: usize = 3;

/// A non-blocking config, so that every wait is bounded (`wait_ready`).
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
    accepted(res, "ncclCommInitRankConfig (1 rank)").expect("init");
    wait_ready(one, "ncclCommInitRankConfig (1 rank)", LIMIT).expect("one-rank communicator");
    let small = Rank::new(one);
    small
        .all_reduce(COUNT, 0)
        .expect("all-reduce on the one-rank communicator");

    let mut grow_id = NcclUniqueId::from_bytes([0; NcclUniqueId::BYTES]);
    // SAFETY: a live, idle communicator; writes one id.
    let res = unsafe { ncclCommGetUniqueId(one, &mut grow_id) };
    check_nccl(res, "ncclCommGetUniqueId").expect("a grow id");
    let mut child = spawn_child(
        "grow child (new rank 1 on GPU 1)",
        "grow",
        &[(GROW_ID, to_hex(&grow_id.to_bytes()))],
        &[],
    );
    let mut grown: NcclComm = std::ptr::null_mut();
    // SAFETY: the existing root passes its communicator, the id it made and rank -1 (nccl.h); a NULL
    // config inherits the parent's (non-blocking).
    let res = unsafe { ncclCommGrow(one, 2, &grow_id, -1, &mut grown, std::ptr::null_mut()) };
    let joined = accepted(res, "ncclCommGrow (existing rank 0)")
        .and_then(|()| wait_ready(grown, "ncclCommGrow (existing rank 0)", LIMIT));
    if let Err(e) = joined {
        child.dump();
        panic!("{e}");
    }
    let big = Rank::new(grown);
    assert_eq!(
        big.rank_and_size(),
        (0, 2),
        "rank 0's rank and size after the grow"
    );
    for round in 1..=ROUNDS {
        big.all_reduce(COUNT, round)
            .expect("all-reduce on the grown communicator");
    }
    println!("ok    rank 0: {ROUNDS} all-reduces of {COUNT} floats on the grown communicator");
    teardown(vec![big, small], true);
    child.expect_success(LIMIT);
}

/// The child: rank 1 of the grown communicator, on GPU 1.
pub fn child() {
    let id = id_from_hex(&children::var(GROW_ID));
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
    accepted(res, "ncclCommGrow (new rank 1)").expect("grow");
    wait_ready(comm, "ncclCommGrow (new rank 1)", LIMIT).expect("grown communicator");
    let rank = Rank::new(comm);
    assert_eq!(rank.rank_and_size(), (1, 2), "the new rank's rank and size");
    for round in 1..=ROUNDS {
        rank.all_reduce(COUNT, round)
            .expect("all-reduce on the grown communicator");
    }
    teardown(vec![rank], true);
    println!("GROW CHILD OK");
}
