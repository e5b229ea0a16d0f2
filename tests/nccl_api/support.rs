//! What the tests of this binary share beyond the testkit (re-exported here): a rank's communicator,
//! all-reduce data checked on the host, and waits bounded by metrale-gpu-watchdog.

use std::time::{Duration, Instant};

use metrale_gpu_sys::nccl::*;
pub use metrale_gpu_testkit::devbuf::DevBuf;
pub use metrale_gpu_testkit::ranks::{self, Me};
pub use metrale_gpu_testkit::world::World;
use metrale_gpu_watchdog::{WaitError, Watchdog};

/// The longest any init, grow or collective may take in these tests before they call it a hang.
pub const LIMIT: Duration = Duration::from_secs(60);

/// The watchdog of every wait here: abort after [`LIMIT`].
pub const WATCHDOG: Watchdog = Watchdog::abort_after(LIMIT);

/// Rank `rank`'s share of element `i` of all-reduce number `round`: small integers, so that every sum
/// is exact in f32 and a wrong or missing contribution shows.
pub fn contribution(rank: usize, round: usize, i: usize) -> f32 {
    ((rank + 1) * (1 + (i * 7 + round) % 97)) as f32
}

/// Element `i` of the sum over `nranks` ranks of round `round`.
pub fn expected_sum(nranks: usize, round: usize, i: usize) -> f32 {
    (nranks * (nranks + 1) / 2 * (1 + (i * 7 + round) % 97)) as f32
}

/// `ncclCommUserRank` and `ncclCommCount`.
pub fn rank_and_size(comm: NcclComm) -> (usize, usize) {
    let (mut rank, mut size) = (-1, -1);
    // SAFETY: a live communicator; each call writes one int.
    unsafe {
        check_nccl(ncclCommUserRank(comm, &mut rank), "ncclCommUserRank").expect("rank");
        check_nccl(ncclCommCount(comm, &mut size), "ncclCommCount").expect("count");
    }
    (rank as usize, size as usize)
}

/// The watchdog's verdict on a wait over `w`'s communicators. After an error it has aborted them, and
/// an aborted handle must not be destroyed: the world forgets them all.
pub fn verdict<T>(w: &mut World, result: Result<T, WaitError>) -> Result<T, String> {
    result.map_err(|e| {
        w.forget_comms();
        e.to_string()
    })
}

/// Waits, within [`LIMIT`], until every rank's stream has run its queued work and no communicator is
/// in progress or failed: how long that took.
pub fn settle(w: &mut World, what: &str) -> Result<Duration, String> {
    let start = Instant::now();
    // SAFETY: the world's live communicators and streams, used by this thread alone.
    let waited = unsafe { WATCHDOG.wait_all(&w.work()) };
    verdict(w, waited)
        .map(|()| start.elapsed())
        .map_err(|e| format!("{what}: {e}"))
}

/// This rank's communicator over every rank (`ncclCommInitRankConfig`, blocking or not), ready, with a
/// stream.
pub fn init(me: &Me, blocking: bool) -> World {
    let config = NcclConfig {
        blocking: blocking.into(),
        ..NcclConfig::default()
    };
    let (world, _) = me.join_config(config).unwrap_or_else(|e| {
        panic!(
            "rank {} of {}: ncclCommInitRankConfig: {e}",
            me.rank, me.nranks
        )
    });
    world
}

/// Uploads rank `r`'s share of round `round` into `buf` and queues an in-place all-reduce of `count`
/// floats on its stream; NCCL's status.
pub fn enqueue_all_reduce(
    w: &World,
    r: usize,
    buf: &DevBuf,
    count: usize,
    round: usize,
) -> NcclResult {
    let (rank, _) = rank_and_size(w.comms[r]);
    let mine: Vec<f32> = (0..count).map(|i| contribution(rank, round, i)).collect();
    buf.upload_f32(&mine, w.streams[r]);
    // SAFETY: buf holds `count` floats on this communicator's device; the stream is that device's.
    unsafe {
        ncclAllReduce(
            buf.at(0),
            buf.at(0),
            count,
            NcclDataType::ncclFloat32,
            NcclRedOp::ncclSum,
            w.comms[r],
            w.streams[r],
        )
    }
}

/// After rank `r`'s all-reduce: `buf` holds the sum over its communicator's ranks.
pub fn check_all_reduce(
    w: &World,
    r: usize,
    buf: &DevBuf,
    count: usize,
    round: usize,
) -> Result<(), String> {
    let (rank, size) = rank_and_size(w.comms[r]);
    let got = buf.download_f32(w.streams[r]);
    let wrong = |i: &usize| got[*i] != expected_sum(size, round, *i);
    match (0..count).find(wrong) {
        None => Ok(()),
        Some(i) => Err(format!(
            "rank {rank} of {size}: all-reduce round {round}: element {i} is {}, expected {} \
             ({} of {count} elements wrong)",
            got[i],
            expected_sum(size, round, i),
            (0..count).filter(wrong).count()
        )),
    }
}

/// One all-reduce of `count` floats on every rank of the world in one group (the other ranks of its
/// communicators, if any, run in other processes), waited for within [`LIMIT`], checked on every rank.
pub fn all_reduce(w: &mut World, count: usize, round: usize) -> Result<(), String> {
    let bufs: Vec<DevBuf> = w.devs.iter().map(|&d| DevBuf::cuda(d, count * 4)).collect();
    w.group("ncclAllReduce", |r| {
        enqueue_all_reduce(w, r, &bufs[r], count, round)
    })
    .map_err(|e| e.to_string())?;
    settle(w, "the all-reduce")?;
    (0..w.n()).try_for_each(|r| check_all_reduce(w, r, &bufs[r], count, round))
}

/// Destroys every communicator, each checked (a world's drop only warns), then the streams.
pub fn destroy(mut w: World) {
    for comm in std::mem::take(&mut w.comms) {
        // SAFETY: an idle communicator the world no longer holds, destroyed once.
        check_nccl(unsafe { ncclCommDestroy(comm) }, "ncclCommDestroy").expect("destroy");
    }
}
