//! Waits with a deadline: the way NCCL programs die in production is a hang (a peer process dies, a host
//! drops off, and every surviving rank spins inside a collective). These waits poll the streams and
//! `ncclCommGetAsyncError`, and on an asynchronous error or a passed deadline give up on the
//! communicators (abort them, or revoke them: [`GiveUp`]), so the caller gets an error instead of a hang.
//!
//! This is what PyTorch's ProcessGroupNCCL watchdog does: a thread polls each work item's CUDA event and
//! `ncclCommGetAsyncError`; on an error or after `timeout` it calls `ncclCommAbort` and tears the process
//! group down. Here the thread that owns the communicator polls, and gives up on the communicator rather
//! than the process. Only that thread may use the handle: a wait running on another thread while the
//! owner issues collectives, or an `ncclCommAbort` from another thread during a wait, would use a freed
//! communicator. (Aborting from another thread is sound while the owner waits in a call that does not
//! touch the communicator, such as `sync_stream`: the fault suite does exactly that.)
//!
//! The deadline is fixed when a wait starts: `timeout` bounds the whole wait, however much progress the
//! work makes meanwhile. Polling backs off from a few microseconds to [`MAX_POLL_INTERVAL`], so a long wait
//! wakes up at most once per 2 ms: it does not hold a core.
//!
//! - [`wait_stream`] and [`wait_comm_ready`]: one communicator, aborted on failure.
//! - [`Watchdog`]: the same waits with a choice of [`GiveUp`] (revoke with NCCL 2.29+), a wait over several
//!   communicators that gives up on all of them ([`Watchdog::wait_all`]: a process driving several GPUs),
//!   and [`Watchdog::check`], which takes the status of a call on a non-blocking communicator and waits
//!   until the communicator accepts the next call.
//! - [`Watched`] and [`CommWork`]: what a wait polls, to compose with more (the elastic example also
//!   watches its rendezvous for dead ranks).

use std::time::{Duration, Instant};

use crate::bindings::{ncclCommAbort, ncclCommGetAsyncError, ncclComm_t, ncclResult_t, CUstream};
use crate::error::{check_nccl, GpuError};
pub use crate::error::{GiveUp, WaitError};

/// The longest sleep between two polls.
pub const MAX_POLL_INTERVAL: Duration = Duration::from_millis(2);

/// What one poll of the awaited work found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Poll {
    /// The work is done.
    Done,
    /// The work is still running.
    Running,
    /// The work failed (an asynchronous NCCL error, a CUDA error on the stream): give up on it.
    Failed(GpuError),
    /// NCCL refused the handle itself (`ncclInvalidArgument`: NULL, freed or foreign): never abort it.
    Refused(GpuError),
}

/// What a wait polls, and how it gives up: communicators and streams in production, fakes in tests.
pub trait Watched {
    /// Polls the awaited work once.
    fn poll(&mut self) -> Poll;
    /// Aborts the communicator (`ncclCommAbort`). Never called after `poll` returned `Refused`.
    fn abort(&mut self) -> Result<(), GpuError>;
    /// Revokes the communicator (`ncclCommRevoke`, NCCL 2.29+ headers). Never called after `poll`
    /// returned `Refused`. By default it cannot, which makes a revoking watchdog abort instead; the
    /// methods exist whatever the headers, so an implementation compiles against every NCCL.
    fn revoke(&mut self) -> Result<(), GpuError> {
        Err(crate::error::nccl_error(
            ncclResult_t::ncclInvalidUsage,
            "ncclCommRevoke (this Watched cannot revoke)",
        ))
    }
    /// After `revoke`: `Running` while the communicator is not yet quiescent (`ncclInProgress`).
    fn poll_revoked(&mut self) -> Poll {
        Poll::Done
    }
}

/// A deadline, and what to do to the communicators when it passes or one of them fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watchdog {
    /// How long a wait may last, from its start.
    pub timeout: Duration,
    /// What a wait does to its communicators when it gives up.
    pub give_up: GiveUp,
}

impl Watchdog {
    /// Waits that abort their communicators on failure or after `timeout`.
    pub const fn abort_after(timeout: Duration) -> Watchdog {
        Watchdog {
            timeout,
            give_up: GiveUp::Abort,
        }
    }

    /// Waits that revoke their communicators (`ncclCommRevoke`, NCCL 2.29+) on failure or after `timeout`,
    /// then wait up to `timeout` again for them to become quiescent, so that they can be shrunk or destroyed.
    /// A communicator that cannot be revoked, or does not become quiescent in time, is aborted with the
    /// others (the error says so: `gave_up` is then [`GiveUp::Abort`]).
    #[cfg(nccl_2_29)]
    pub const fn revoke_after(timeout: Duration) -> Watchdog {
        Watchdog {
            timeout,
            give_up: GiveUp::Revoke,
        }
    }

    /// Polls every item of `work` until all are done, one fails, or the timeout passes; on failure or
    /// timeout gives up on all of them. An item NCCL refused is left alone; the others are given up on.
    pub fn wait(&self, work: &mut [&mut dyn Watched], context: &str) -> Result<(), WaitError> {
        let start = Instant::now();
        let stop = poll_until(work, self.timeout, |_, item| item.poll());
        let count = work.len();
        // The items never to give up on: those NCCL refused.
        let mut skip = vec![false; count];
        let name = |index: usize| match count {
            1 => context.to_string(),
            _ => format!("{context} (communicator {index} of {count})"),
        };
        Err(match stop {
            Stop::Done => return Ok(()),
            Stop::Timeout => {
                let (gave_up, abort_error) = self.give_up(work, &mut skip);
                WaitError::Timeout {
                    context: context.to_string(),
                    // Until the communicators were given up on: the bound a caller sees.
                    waited: start.elapsed(),
                    gave_up,
                    abort_error,
                }
            }
            Stop::Failed(index, error) => {
                let (gave_up, abort_error) = self.give_up(work, &mut skip);
                WaitError::Failed {
                    context: name(index),
                    error: Box::new(error),
                    gave_up,
                    abort_error,
                }
            }
            Stop::Refused(index, error) => {
                skip[index] = true;
                let (gave_up, abort_error) = self.give_up(work, &mut skip);
                WaitError::Refused {
                    context: name(index),
                    error: Box::new(error),
                    others: (count > 1).then_some(gave_up),
                    abort_error,
                }
            }
        })
    }

    /// Gives up on every item not in `skip` (those NCCL refused; a revoke may add to them); returns what
    /// was done and the first error doing it.
    fn give_up(
        &self,
        work: &mut [&mut dyn Watched],
        skip: &mut [bool],
    ) -> (GiveUp, Option<Box<GpuError>>) {
        #[cfg(nccl_2_29)]
        if self.give_up == GiveUp::Revoke {
            match self.revoke(work, skip) {
                Ok(()) => return (GiveUp::Revoke, None),
                // Revoked or not, abort them all (but a handle NCCL refused): nothing may be left running.
                Err(error) => {
                    for_others(work, skip, |item| item.abort());
                    return (GiveUp::Abort, Some(Box::new(error)));
                }
            }
        }
        let error = for_others(work, skip, |item| item.abort());
        (GiveUp::Abort, error.map(Box::new))
    }

    /// Revokes every item not in `skip`, then waits up to the timeout until all are quiescent. An item
    /// NCCL refuses meanwhile joins `skip`, so that the abort that follows leaves it alone.
    #[cfg(nccl_2_29)]
    fn revoke(&self, work: &mut [&mut dyn Watched], skip: &mut [bool]) -> Result<(), GpuError> {
        if let Some(error) = for_others(work, skip, |item| item.revoke()) {
            return Err(error);
        }
        let start = Instant::now();
        let stop = poll_until(work, self.timeout, |index, item| match skip[index] {
            true => Poll::Done,
            false => item.poll_revoked(),
        });
        match stop {
            Stop::Done => Ok(()),
            Stop::Refused(index, error) => {
                skip[index] = true;
                Err(error)
            }
            Stop::Failed(_, error) => Err(error),
            Stop::Timeout => Err(crate::error::nccl_error(
                ncclResult_t::ncclInProgress,
                &format!(
                    "ncclCommRevoke (the communicator was not quiescent after {:.3} s)",
                    start.elapsed().as_secs_f64()
                ),
            )),
        }
    }

    /// [`wait_stream`], giving up as this watchdog says.
    ///
    /// # Safety
    /// As for [`wait_stream`]; after an `Err` with [`GiveUp::Revoke`] the handle stays valid.
    pub unsafe fn wait_stream(&self, comm: ncclComm_t, stream: CUstream) -> Result<(), WaitError> {
        // SAFETY: the caller promises live handles.
        unsafe { self.wait_all(&[(comm, stream)]) }
    }

    /// [`wait_comm_ready`], giving up as this watchdog says.
    ///
    /// # Safety
    /// As for [`wait_comm_ready`]; after an `Err` with [`GiveUp::Revoke`] the handle stays valid.
    pub unsafe fn wait_comm_ready(&self, comm: ncclComm_t) -> Result<(), WaitError> {
        let mut work = CommWork { comm, stream: None };
        self.wait(&mut [&mut work], "waiting for the communicator")
    }

    /// Waits for the work queued on each stream (collectives on its communicator), polling every
    /// communicator's `ncclCommGetAsyncError` as well; when one fails or the timeout passes, gives up on
    /// all of them. This is the wait for a process that drives several GPUs with one communicator each:
    /// NCCL frees a process's resources only once all of them are aborted or destroyed, and destroying a
    /// sibling of an aborted communicator waits on its stuck kernel, so none may be left running.
    ///
    /// # Safety
    /// Every communicator and stream is live and used by no other thread during the wait. After an `Err`
    /// the communicators were given up on as [`WaitError`] says (aborted ones must not be used again);
    /// buffers the abandoned work used may hold anything.
    pub unsafe fn wait_all(&self, work: &[(ncclComm_t, CUstream)]) -> Result<(), WaitError> {
        let mut work: Vec<CommWork> = work
            .iter()
            .map(|&(comm, stream)| CommWork {
                comm,
                stream: Some(stream),
            })
            .collect();
        let mut items: Vec<&mut dyn Watched> =
            work.iter_mut().map(|w| w as &mut dyn Watched).collect();
        self.wait(&mut items, "waiting for the stream")
    }

    /// Checks the status a call on a non-blocking communicator (`config.blocking = 0`) returned:
    /// `ncclSuccess` and `ncclInProgress` wait, within the timeout, until `ncclCommGetAsyncError` stops
    /// reporting `ncclInProgress`, so that `comm` accepts the next call (NCCL refuses calls until then). A
    /// ready communicator costs one `ncclCommGetAsyncError`. `ncclSuccess` is polled too because it does
    /// not always mean ready: NCCL 2.29.7's `ncclCommGrow` returns it to the existing ranks of a
    /// non-blocking parent while the grown communicator is still initialising (seen on the GPU host: the
    /// next call was refused).
    ///
    /// Any other status is the call's failure, and gives up on `comm` as a failed wait does (unless NCCL
    /// refuses the handle itself) — argument errors too, which would leave a blocking communicator
    /// usable: a non-blocking call that failed may have left a group partly enqueued, and this check errs
    /// on the side of never reusing it. Check arguments before the call to keep the communicator.
    ///
    /// # Safety
    /// `comm` is the communicator the call was made on (or the handle a non-blocking init returned), used
    /// by no other thread during the check. After an `Err` it was given up on as [`WaitError`] says.
    pub unsafe fn check(
        &self,
        status: ncclResult_t,
        comm: ncclComm_t,
        context: &str,
    ) -> Result<(), WaitError> {
        self.check_on(status, &mut CommWork { comm, stream: None }, context)
    }

    /// [`Watchdog::check`] against any [`Watched`].
    pub fn check_on(
        &self,
        status: ncclResult_t,
        work: &mut dyn Watched,
        context: &str,
    ) -> Result<(), WaitError> {
        if status == ncclResult_t::ncclSuccess || status == ncclResult_t::ncclInProgress {
            return self.wait(&mut [work], context);
        }
        let error = crate::error::nccl_error(status, context);
        if let Poll::Refused(error) = work.poll() {
            return Err(WaitError::Refused {
                context: context.to_string(),
                error: Box::new(error),
                others: None,
                abort_error: None,
            });
        }
        let (gave_up, abort_error) = self.give_up(&mut [work], &mut [false]);
        Err(WaitError::Failed {
            context: context.to_string(),
            error: Box::new(error),
            gave_up,
            abort_error,
        })
    }
}

/// How a poll loop ended.
enum Stop {
    Done,
    Timeout,
    Failed(usize, GpuError),
    Refused(usize, GpuError),
}

/// Polls every item with `poll` (given its index) until all are done, one fails, or `timeout` passes, backing off between
/// rounds.
fn poll_until(
    work: &mut [&mut dyn Watched],
    timeout: Duration,
    mut poll: impl FnMut(usize, &mut dyn Watched) -> Poll,
) -> Stop {
    let start = Instant::now();
    let mut pause = Duration::from_micros(5);
    loop {
        let mut running = false;
        for (index, item) in work.iter_mut().enumerate() {
            match poll(index, &mut **item) {
                Poll::Done => {}
                Poll::Running => running = true,
                Poll::Failed(error) => return Stop::Failed(index, error),
                Poll::Refused(error) => return Stop::Refused(index, error),
            }
        }
        if !running {
            return Stop::Done;
        }
        let waited = start.elapsed();
        if waited >= timeout {
            return Stop::Timeout;
        }
        std::thread::sleep(pause.min(timeout - waited));
        pause = (pause * 2).min(MAX_POLL_INTERVAL);
    }
}

/// Calls `give_up` on every item not in `skip`; the first error.
fn for_others(
    work: &mut [&mut dyn Watched],
    skip: &[bool],
    mut give_up: impl FnMut(&mut dyn Watched) -> Result<(), GpuError>,
) -> Option<GpuError> {
    let mut first = None;
    for (index, item) in work.iter_mut().enumerate() {
        if !skip[index] {
            if let Err(e) = give_up(&mut **item) {
                first.get_or_insert(e);
            }
        }
    }
    first
}

/// A communicator and, optionally, a stream whose queued work on it is awaited: what the waits above
/// poll, for a [`Watched`] of one's own that watches more (another source of failure, say) and hands
/// the rest to it.
pub struct CommWork {
    comm: ncclComm_t,
    stream: Option<CUstream>,
}

impl CommWork {
    /// `comm`, and the work queued on `stream` when given.
    ///
    /// # Safety
    /// As for [`Watchdog::wait_all`], for as long as it is polled or given up on: the handles are live
    /// and used by no other thread meanwhile.
    pub unsafe fn new(comm: ncclComm_t, stream: Option<CUstream>) -> CommWork {
        CommWork { comm, stream }
    }

    /// `ncclCommGetAsyncError`'s state, or the poll that the call's own failure means.
    fn state(&self) -> Result<ncclResult_t, Poll> {
        let mut state = ncclResult_t::ncclSuccess;
        // SAFETY: the caller of the public waits promises a live communicator (NCCL checks the handle's
        // magic and refuses NULL and most stale handles); state is valid for writes.
        let result = unsafe { ncclCommGetAsyncError(self.comm, &mut state) };
        match check_nccl(result, "ncclCommGetAsyncError") {
            Ok(()) => Ok(state),
            // NCCL's answer for NULL, a freed or a foreign handle: nothing there to abort.
            Err(e) if result == ncclResult_t::ncclInvalidArgument => Err(Poll::Refused(e)),
            Err(e) => Err(Poll::Failed(e)),
        }
    }
}

impl Watched for CommWork {
    fn poll(&mut self) -> Poll {
        // An asynchronous error first: a dead peer leaves the stream spinning forever. And a non-blocking
        // communicator may still be enqueueing (ncclInProgress) while the stream looks idle.
        let state = match self.state() {
            Ok(state) => state,
            Err(poll) => return poll,
        };
        if state == ncclResult_t::ncclInProgress {
            return Poll::Running;
        }
        if let Err(e) = check_nccl(state, "the communicator (ncclCommGetAsyncError)") {
            return Poll::Failed(e);
        }
        let Some(stream) = self.stream else {
            return Poll::Done;
        };
        // SAFETY: the caller of the public waits promises a live stream.
        match unsafe { crate::stream::stream_ready(stream) } {
            Ok(true) => Poll::Done,
            Ok(false) => Poll::Running,
            Err(e) => Poll::Failed(e),
        }
    }

    fn abort(&mut self) -> Result<(), GpuError> {
        // SAFETY: the communicator is live (NCCL did not refuse it) and never used again by the wait.
        check_nccl(unsafe { ncclCommAbort(self.comm) }, "ncclCommAbort")
    }

    #[cfg(nccl_2_29)]
    fn revoke(&mut self) -> Result<(), GpuError> {
        use crate::bindings::{ncclCommRevoke, NCCL_REVOKE_DEFAULT};
        // SAFETY: the communicator is live (NCCL did not refuse it); the flags are nccl.h's only value.
        let result = unsafe { ncclCommRevoke(self.comm, NCCL_REVOKE_DEFAULT as i32) };
        // A non-blocking communicator answers ncclInProgress (seen on the GPU host): the revoke has
        // begun, and `poll_revoked` waits for quiescence.
        if result == ncclResult_t::ncclInProgress {
            return Ok(());
        }
        check_nccl(result, "ncclCommRevoke")
    }

    #[cfg(nccl_2_29)]
    fn poll_revoked(&mut self) -> Poll {
        match self.state() {
            Ok(ncclResult_t::ncclInProgress) => Poll::Running,
            Ok(_) => Poll::Done,
            Err(poll) => poll,
        }
    }
}

/// Waits for the work queued on `stream` (collectives on `comm`, or anything else) to finish, polling
/// `ncclCommGetAsyncError` as well. On an asynchronous NCCL error (e.g. `ncclRemoteError` when a peer died),
/// a CUDA error on the stream, or when `timeout` (counted from the start) passes, aborts `comm` and
/// returns why. [`Watchdog`] offers revoking instead, and waits over several communicators.
///
/// # Safety
/// `comm` and `stream` are live. After an `Err` other than [`WaitError::Refused`], `comm` has been
/// aborted: its handle must not be used again (not even destroyed), and buffers the aborted work used may
/// hold anything.
pub unsafe fn wait_stream(
    comm: ncclComm_t,
    stream: CUstream,
    timeout: Duration,
) -> Result<(), WaitError> {
    // SAFETY: the caller's promises, passed on.
    unsafe { Watchdog::abort_after(timeout).wait_stream(comm, stream) }
}

/// Waits until a communicator leaves `ncclInProgress`: after a non-blocking `ncclCommInitRankConfig`
/// (`config.blocking = 0`), `ncclCommSplit`, `ncclCommFinalize` or a non-blocking group. On an error or
/// when `timeout` passes (a peer that never arrives) aborts it and returns why.
///
/// # Safety
/// `comm` is a handle the non-blocking call returned. After an `Err` other than [`WaitError::Refused`] it
/// has been aborted and must not be used again.
pub unsafe fn wait_comm_ready(comm: ncclComm_t, timeout: Duration) -> Result<(), WaitError> {
    // SAFETY: the caller's promises, passed on.
    unsafe { Watchdog::abort_after(timeout).wait_comm_ready(comm) }
}
