//! The NCCL side of a rank: non-blocking communicators, every wait bounded by metrale-gpu-watchdog
//! and cancelled by the membership's news; a round's wait (it revokes on failure), the init, the
//! shrink and the grow (their waits abort on failure).

use std::sync::atomic::{AtomicPtr, Ordering};
use std::time::{Duration, Instant};

use metrale_gpu_sys::cuda::CUstream;
use metrale_gpu_sys::nccl::*;
use metrale_gpu_watchdog::{
    bounded, CommWork, Communicator, CudaContext, GiveUp, GiveUpBound, GiveUpCall, GiveUpError,
    Poll, WaitError, Watchdog, Watched,
};

use crate::fabric::{unix_us, Lost, Outcome};
use crate::membership::Membership;
use crate::protocol::Held;

/// Every communicator of a rank: non-blocking, so that no call can hang the rank.
pub fn config() -> NcclConfig {
    let mut config = NcclConfig {
        blocking: 0,
        ..NcclConfig::default()
    };
    // NCCL keeps this pointer (and hands it to shrunk and grown communicators): a `&'static CStr`.
    config.set_comm_name(c"elastic");
    config
}

/// A wait on generation `gen`'s work: the communicator and stream (the watchdog's [`CommWork`]), then
/// the rendezvous, whose news that `gen` is lost cancels the wait at once.
struct Watch<'a> {
    work: CommWork<'a>,
    who: &'a dyn Membership,
    gen: u64,
    /// An idle communicator: nothing to finish, so the news comes first.
    idle: bool,
    given_up_at: Option<Instant>,
}

impl<'a> Watch<'a> {
    fn new(work: CommWork<'a>, who: &'a dyn Membership, gen: u64) -> Self {
        Watch {
            work,
            who,
            gen,
            idle: false,
            given_up_at: None,
        }
    }

    /// What a failed wait means: the work is lost and the communicator held as `held`, or (NCCL
    /// refused the handle, CUDA failed) the rank cannot go on.
    fn lost(&self, error: WaitError, start: Instant) -> Result<Lost, String> {
        let how = match &error {
            WaitError::Timeout { .. } => "timeout",
            WaitError::Cancelled { .. } => "rendezvous",
            WaitError::Failed { error: e, .. } if matches!(**e, GpuError::Nccl { .. }) => "nccl",
            _ => return Err(error.to_string()),
        };
        let held = match error.gave_up() {
            Some(GiveUp::Revoke) => Held::Revoked,
            _ => Held::Aborted,
        };
        let given_up_at = self.given_up_at.unwrap_or(start);
        let revoked = given_up_at.elapsed();
        Ok(Lost {
            how,
            detail: error.to_string(),
            held,
            waited: given_up_at - start,
            at_unix_us: unix_us() - revoked.as_micros(),
            revoked,
        })
    }
}

impl Watched for Watch<'_> {
    fn poll(&mut self) -> Poll {
        if self.work.is_abandoned() {
            return Poll::Abandoned;
        }
        let news = |watch: &Self| watch.who.lost(watch.gen).map(Poll::Cancel);
        if self.idle {
            return news(self).unwrap_or_else(|| self.work.poll());
        }
        // Completion first: a rank that finished its last round may exit before this poll sees it.
        match self.work.poll() {
            Poll::Running => news(self).unwrap_or(Poll::Running),
            other => other,
        }
    }

    fn abort(&mut self) -> Result<(), GpuError> {
        self.given_up_at.get_or_insert_with(Instant::now);
        self.work.abort()
    }

    // The watchdog's give-up runs on a thread of its own, bounded by the wait's give-up bound: a grow's
    // abort joins an init job that may be stuck in NCCL's bootstrap with a dead peer.
    fn hand_over(&mut self, how: GiveUp) -> GiveUpCall {
        self.given_up_at.get_or_insert_with(Instant::now);
        self.work.hand_over(how)
    }

    fn forget(&mut self) {
        self.work.forget()
    }

    fn revoke(&mut self) -> Result<(), GiveUpError> {
        if self.work.is_abandoned() {
            return Err(GiveUpError::CannotRevoke);
        }
        self.given_up_at = Some(Instant::now());
        self.work.revoke()
    }

    fn poll_revoked(&mut self) -> Poll {
        self.work.poll_revoked()
    }
}

/// A non-blocking call's status on `watch`'s communicator, then (`ncclInProgress`) its end within
/// `limit`: the watchdog's check, which aborts the communicator if the call fails or the rendezvous
/// says its generation is lost.
fn settle(
    res: NcclResult,
    watch: &mut Watch,
    what: &str,
    watchdog: Watchdog,
) -> Result<(), String> {
    watchdog
        .check_on(res, watch, what)
        .map_err(|e| e.to_string())
}

/// `ncclCommInitRankConfig` of generation `gen`, waited for.
pub fn init(
    size: usize,
    id: NcclUniqueId,
    rank: usize,
    limit: Duration,
    who: &dyn Membership,
    gen: u64,
) -> Result<NcclComm, String> {
    let mut comm: NcclComm = std::ptr::null_mut();
    // SAFETY: writes one handle before it returns (a non-blocking init hands it back at once); the
    // config is read during the call.
    let res =
        unsafe { ncclCommInitRankConfig(&mut comm, size as i32, id, rank as i32, &mut config()) };
    if comm.is_null() {
        check_nccl(res, "ncclCommInitRankConfig").map_err(|e| e.to_string())?;
        return Err("ncclCommInitRankConfig returned no communicator".into());
    }
    // SAFETY: the handle the init returned, owned here until the wait returns; used by this thread
    // alone.
    let mut owned = unsafe { Communicator::from_raw(comm) };
    settle(
        res,
        &mut Watch::new(CommWork::new(&mut owned), who, gen),
        "ncclCommInitRankConfig",
        Watchdog::abort_after(limit),
    )?;
    owned
        .into_raw()
        .ok_or_else(|| "ncclCommInitRankConfig: the communicator was given up on".into())
}

/// Where NCCL writes a new communicator's handle: its init job may write it from its own thread after
/// the call returned (`ncclCommShrink` always does), and a job given up on may write it later still,
/// so the cell is never freed (one pointer per shrink or grow) and read atomically, as NCCL writes it.
fn new_handle_cell() -> &'static AtomicPtr<ncclComm> {
    Box::leak(Box::new(AtomicPtr::new(std::ptr::null_mut())))
}

/// Aborts `comm` unless a wait already gave up on it (then nothing is called): where a recovery step
/// failed. A failure to abort is said, not returned (the step's own error is the one that counts).
fn abort_owned(comm: Communicator) {
    if let Err(e) = comm.abort() {
        eprintln!("warning: {e}");
    }
}

/// `ncclCommAbort` of `comm` on a thread of its own, waited for at most `bound`
/// ([`Communicator::abort_within`]). NCCL 2.29.7's abort first joins the communicator's init job
/// (`ncclCommEnsureReady`, src/init.cc), and a grow's job may be stuck in the bootstrap with a dead
/// peer: given up on, the abort keeps its thread and the handle, and the rank holds the generation as
/// aborted (it never touches `comm` again either way).
fn abort_bounded(comm: NcclComm, bound: Duration) {
    // SAFETY: a communicator of the rank's, owned here from now on and never used again.
    let comm = unsafe { Communicator::from_raw(comm) };
    if let Err(e) = comm.abort_within(bound) {
        eprintln!("warning: {e}");
    }
}

/// How long each abort on a failed grow may take: an eighth of the grow's bound (D/2 with the
/// recovery's 4D), so that both (the grown communicator's, the parent's) end well within rank 0's
/// report window (2D + 1 s) after the news.
fn grow_abort_bound(limit: Duration) -> Duration {
    limit / 8
}

/// `ncclCommShrink` of the revoked `parent` without `exclude`: generation `gen`, the survivors'
/// communicator. The parent is released either way (aborted: it is revoked and its excluded ranks are
/// gone); on failure the shrunk communicator too, if it was made.
pub fn shrink(
    parent: NcclComm,
    exclude: &[usize],
    limit: Duration,
    who: &dyn Membership,
    gen: u64,
) -> Result<NcclComm, String> {
    let mut exclude: Vec<i32> = exclude.iter().map(|&r| r as i32).collect();
    let cell = new_handle_cell();
    // SAFETY: a quiescent revoked communicator with no error (the watchdog checked: nccl.h allows
    // shrinking it); the list and config are read during the call; the cell outlives every write.
    let res = unsafe {
        ncclCommShrink(
            parent,
            exclude.as_mut_ptr(),
            exclude.len() as i32,
            cell.as_ptr(),
            &mut config(),
            NCCL_SHRINK_DEFAULT as i32,
        )
    };
    // Non-blocking: the parent reports the shrink's progress; the new handle is set once it is done.
    // SAFETY: the rank's parent communicator, owned here from now on (released below); used by this
    // thread alone.
    let mut parent = unsafe { Communicator::from_raw(parent) };
    let on_parent = &mut Watch::new(CommWork::new(&mut parent), who, gen);
    let parent_done = settle(
        res,
        on_parent,
        "ncclCommShrink",
        Watchdog::abort_after(limit),
    );
    // Settled, or aborted (which ends the shrink's job): the job has written the handle if it made one.
    let shrunk = cell.load(Ordering::Acquire);
    let result = match (parent_done, shrunk.is_null()) {
        (Err(e), true) => Err(e),
        (Ok(()), true) => Err("ncclCommShrink made no communicator".to_string()),
        (parent_done, false) => {
            // SAFETY: the handle the shrink made, owned here until it is returned or released; used
            // by this thread alone.
            let mut child = unsafe { Communicator::from_raw(shrunk) };
            let ready = parent_done.and_then(|()| {
                let on_child = &mut Watch::new(CommWork::new(&mut child), who, gen);
                settle(
                    NcclResult::ncclInProgress,
                    on_child,
                    "the shrunk communicator",
                    Watchdog::abort_after(limit),
                )
            });
            match ready {
                Ok(()) => Ok(child),
                Err(e) => {
                    abort_owned(child);
                    Err(e)
                }
            }
        }
    };
    abort_owned(parent);
    result.and_then(|child| {
        child
            .into_raw()
            .ok_or_else(|| "the shrunk communicator was given up on".into())
    })
}

/// A communicator handed to the thread of a bounded call (`metrale_gpu_watchdog::bounded`).
struct Handed(NcclComm);

// SAFETY: NCCL takes a communicator from any thread, one thread at a time: the rank hands one over
// and uses it again only if the call returned in time (the call's thread is then done with it).
unsafe impl Send for Handed {}

impl Handed {
    /// The handle (a method, so that a closure captures the `Send` wrapper, not the bare handle).
    fn get(&self) -> NcclComm {
        self.0
    }
}

/// The rank's CUDA context, for a bounded call's thread: NCCL allocates on the current device
/// (`ncclCommGrow`'s pinned abort flag, a new rank's communicator).
fn current_context() -> Result<CudaContext, String> {
    match CudaContext::current() {
        Ok(Some(ctx)) => Ok(ctx),
        Ok(None) => Err("no CUDA context is current on the rank's thread".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// Aborts each of `comms` that is there, where a step failed: a failure to abort is said, not returned
/// (the step's own error is the one that counts). A bounded call's thread does this for what it holds
/// when it returns after the rank gave it up.
fn abort_all(comms: &[NcclComm]) {
    for &comm in comms.iter().filter(|c| !c.is_null()) {
        if let Err(e) = release(comm, true) {
            eprintln!("warning: {e}");
        }
    }
}

/// The grow root's `ncclCommGetUniqueId` on idle generation `gen` (the rank that offers the grow: rank
/// 0, or the etcd membership's coordinator; any rank of the parent may): on a thread of its own,
/// given up on when the rendezvous says `gen` is lost or after `limit` (see `metrale_gpu_watchdog::bounded`: it sends to
/// ranks 0 and N-1 before it returns, and retries a dead one for about a minute). An error means the
/// communicator is gone: aborted after NCCL's error, or left to the call's thread, which aborts it.
pub fn grow_id(
    comm: NcclComm,
    who: &dyn Membership,
    gen: u64,
    limit: Duration,
) -> Result<NcclUniqueId, String> {
    let handed = Handed(comm);
    let (res, id) = bounded::call(
        "ncclCommGetUniqueId",
        limit,
        &|| who.lost(gen),
        move || {
            let mut id = NcclUniqueId::from_bytes([0; NcclUniqueId::BYTES]);
            // SAFETY: a live, idle communicator, used by this thread alone until the call returns;
            // writes one id.
            let res = unsafe { ncclCommGetUniqueId(handed.get(), &mut id) };
            (handed, res, id)
        },
        |(handed, _, _)| abort_all(&[handed.get()]),
    )
    .map(|(_, res, id)| (res, id))
    .map_err(|e| e.to_string())?;
    if let Err(e) = check_nccl(res, "ncclCommGetUniqueId") {
        abort_all(&[comm]);
        return Err(e.to_string());
    }
    Ok(id)
}

/// `ncclCommGrow` to `size` ranks, generation `gen`: a member passes its communicator and rank -1 (the
/// root, the one that called `ncclCommGetUniqueId`, also the id); a replacement no communicator, the id
/// and its rank. The call is bounded as `grow_id` is (ranks 0 and N-1 receive the id before it
/// returns), its end within what is left of `limit`. On success the parent is destroyed, as nccl.h
/// asks; on failure both are aborted (by the call's thread, if it was given up on).
pub fn grow(
    parent: NcclComm,
    size: usize,
    id: Option<&NcclUniqueId>,
    rank: i32,
    limit: Duration,
    who: &dyn Membership,
    gen: u64,
) -> Result<NcclComm, String> {
    let start = Instant::now();
    let cell = new_handle_cell();
    let ctx = current_context().inspect_err(|_| abort_all(&[parent]))?;
    let (id, handed) = (id.copied(), Handed(parent));
    let called = bounded::call(
        "ncclCommGrow",
        limit,
        &|| who.lost(gen),
        move || {
            // SAFETY: the rank's primary context (made current by `Gpu::new`), retained for the
            // process's life.
            let res = unsafe { ctx.make_current() }
                .map_err(|e| e.to_string())
                .map(|()| {
                    let id = id
                        .as_ref()
                        .map_or(std::ptr::null(), |id| id as *const NcclUniqueId);
                    // SAFETY: the arguments nccl.h prescribes for this caller; the parent is used by this
                    // thread alone until the call returns; id and config are read during the call; the
                    // cell outlives every write.
                    unsafe {
                        ncclCommGrow(
                            handed.get(),
                            size as i32,
                            id,
                            rank,
                            cell.as_ptr(),
                            &mut config(),
                        )
                    }
                });
            (handed, res)
        },
        move |(handed, _)| abort_all(&[cell.load(Ordering::Acquire), handed.get()]),
    );
    let res = match called {
        Ok((_, Ok(res))) => res,
        Ok((_, Err(e))) => {
            abort_all(&[parent]);
            return Err(e);
        }
        // The call's thread holds both.
        Err(e) => return Err(e.to_string()),
    };
    let grown = cell.load(Ordering::Acquire);
    let result = match grown.is_null() {
        true => Err(match check_nccl(res, "ncclCommGrow") {
            Err(e) => e.to_string(),
            Ok(()) => "ncclCommGrow returned no communicator".to_string(),
        }),
        false => {
            // SAFETY: the handle the grow made, owned here until the wait returns; used by this
            // thread alone.
            let mut owned = unsafe { Communicator::from_raw(grown) };
            let mut watch = Watch::new(CommWork::new(&mut owned), who, gen);
            let left = limit.saturating_sub(start.elapsed());
            let bound = GiveUpBound::Return(grow_abort_bound(limit));
            let watchdog = Watchdog::abort_after(left).with_give_up_bound(bound);
            let ready = settle(res, &mut watch, "ncclCommGrow", watchdog);
            // Not given up on (a wait's abort takes the handle): aborted here, within the same bound.
            if let (Err(_), Some(grown)) = (&ready, owned.take_raw()) {
                abort_bounded(grown, grow_abort_bound(limit));
            }
            ready
        }
    };
    match (parent.is_null(), result.is_err()) {
        (true, _) => {}
        (false, true) => abort_bounded(parent, grow_abort_bound(limit)),
        (false, false) => release(parent, false)?,
    }
    result.map(|()| grown)
}

/// `ncclCommDestroy` (a healthy, idle communicator) or `ncclCommAbort` (a revoked or failed one whose
/// peers may be gone: nothing of it is needed, and abort touches no peer).
pub fn release(comm: NcclComm, abort: bool) -> Result<(), String> {
    // SAFETY: the caller's communicator, released once and never used again.
    let (res, what) = unsafe {
        if abort {
            (ncclCommAbort(comm), "ncclCommAbort")
        } else {
            (ncclCommDestroy(comm), "ncclCommDestroy")
        }
    };
    check_nccl(res, what).map_err(|e| e.to_string())
}

/// Gives up on idle generation `gen` (the rendezvous said it is lost while the rank waited for a
/// grow), as a collective's wait would: revoked, or aborted where that fails.
pub fn give_up_idle(
    comm: NcclComm,
    who: &dyn Membership,
    gen: u64,
    deadline: Duration,
) -> Result<Lost, String> {
    let start = Instant::now();
    // SAFETY: the rank's idle communicator, owned here until the wait returns; used by this thread
    // alone.
    let mut comm = unsafe { Communicator::from_raw(comm) };
    let mut watch = Watch::new(CommWork::new(&mut comm), who, gen);
    watch.idle = true;
    match Watchdog::revoke_after(deadline).wait(&mut [&mut watch], "the idle communicator") {
        Ok(()) => Err(format!(
            "generation {gen} was declared lost, but its idle communicator had nothing to give up"
        )),
        Err(e) => watch.lost(e, start),
    }
}

/// Waits, at most `deadline`, for the work round `gen`'s caller queued on `stream` with `comm` (`res`:
/// the status of its last NCCL call), then for the stream. Gives up (`Outcome::Lost`) when the
/// membership says `gen` is lost, NCCL reports an error, or the deadline passes: the watchdog revokes
/// the communicator, and aborts it where NCCL would refuse to shrink it. `start`: when the round began.
pub fn wait_round(
    (comm, stream): (NcclComm, CUstream),
    res: NcclResult,
    who: &dyn Membership,
    gen: u64,
    deadline: Duration,
    start: Instant,
) -> Result<Outcome, String> {
    // SAFETY: the rank's live communicator, owned here until the wait returns; used by this thread
    // alone.
    let mut comm = unsafe { Communicator::from_raw(comm) };
    // SAFETY: the rank's own live stream, used by this thread alone.
    let work = unsafe { CommWork::on_stream(&mut comm, stream) };
    let mut watch = Watch::new(work, who, gen);
    let dog = Watchdog::revoke_after(deadline);
    let waited = dog
        .check_on(res, &mut watch, "the round's work")
        .and_then(|()| dog.wait(&mut [&mut watch], "the round's work"));
    if let Err(e) = waited {
        return watch.lost(e, start).map(Outcome::Lost);
    }
    // SAFETY: the rank's own live stream.
    unsafe { sync_stream(stream) }.map_err(|e| e.to_string())?;
    Ok(Outcome::Done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::membership::Bounds;

    #[test]
    fn a_failed_grows_two_aborts_fit_in_rank_0s_report_window() {
        for secs in [1, 5, 30] {
            let bounds = Bounds::new(Duration::from_secs(secs));
            let aborts = 2 * grow_abort_bound(bounds.setup);
            assert!(
                aborts <= bounds.report / 2,
                "--deadline {secs}: the aborts may take {aborts:?} of a {:?} window",
                bounds.report
            );
        }
    }
}
