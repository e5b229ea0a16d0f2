//! Waits with a deadline over NCCL communicators, on `metrale-gpu-sys`: the way NCCL programs die in
//! production is a hang (a peer process dies, a host drops off, and every surviving rank spins inside a
//! collective). These waits poll the streams and `ncclCommGetAsyncError`, and on an asynchronous error or
//! a passed deadline give up on the communicators (abort them, or revoke them: [`GiveUp`]), so the caller
//! gets an error instead of a hang.
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
//! - [`Communicator`], [`Watched`] and [`CommWork`]: an owned communicator, and what a wait polls, to
//!   compose with more (the elastic example also watches its rendezvous for dead ranks, and cancels a
//!   wait with [`Poll::Cancel`] on its news).
//!
//! # Ownership
//! Making a [`Communicator`] of a raw handle is the one `unsafe` step: the value owns the handle from then
//! on. A [`CommWork`] borrows it mutably (two watches over one communicator cannot exist at once), and a
//! wait that gives up by an abort aborts it in place and forgets the handle, as does NCCL's refusal of
//! the handle: waiting on it again (through any later watch), aborting or revoking it again, reaches no
//! NCCL call ([`WaitError::Abandoned`]). [`Communicator::abort`] consumes it. The `unsafe` functions
//! over raw handles ([`wait_stream`], [`Watchdog::check`], …) are the same waits for a caller who keeps
//! the raw handle, under their own contracts.
//!
//! ```no_run
//! use metrale_gpu_sys::nccl::*;
//! use metrale_gpu_watchdog::{CommWork, Communicator, WaitError, Watchdog};
//! use std::time::Duration;
//!
//! /// A non-blocking init, waited for: 60 s, then the communicator is aborted.
//! fn init(id: NcclUniqueId, nranks: i32, rank: i32) -> Result<Communicator, Box<dyn std::error::Error>> {
//!     let mut config = NcclConfig { blocking: 0, ..NcclConfig::default() };
//!     config.set_comm_name(c"trainer"); // NCCL keeps this pointer: a &'static CStr
//!     let mut raw: NcclComm = std::ptr::null_mut();
//!     // SAFETY: raw and config are valid for the call.
//!     let status = unsafe { ncclCommInitRankConfig(&mut raw, nranks, id, rank, &mut config) };
//!     // SAFETY: the handle the init returned (or NULL, which NCCL refuses), owned from here on.
//!     let mut comm = unsafe { Communicator::from_raw(raw) };
//!     Watchdog::abort_after(Duration::from_secs(60)).check_on(status, &mut CommWork::new(&mut comm), "init")?;
//!     Ok(comm)
//! }
//!
//! /// All-reduce in place, then wait for it: an error, or 30 s after the wait starts, aborts `comm`.
//! fn all_reduce(comm: &mut Communicator, stream: CUstream, buf: *mut std::ffi::c_void, n: usize) -> Result<(), WaitError> {
//!     let dog = Watchdog::abort_after(Duration::from_secs(30));
//!     let Some(raw) = comm.as_raw() else {
//!         return dog.wait(&mut [&mut CommWork::new(comm)], "all-reduce"); // given up on before
//!     };
//!     // SAFETY: buf holds n floats on the communicator's device and stream belongs to it.
//!     let status = unsafe { ncclAllReduce(buf, buf, n, NcclDataType::ncclFloat32, NcclRedOp::ncclSum, raw, stream) };
//!     // SAFETY: the caller's stream is live and used by this thread alone.
//!     let mut work = unsafe { CommWork::on_stream(comm, stream) };
//!     dog.check_on(status, &mut work, "ncclAllReduce")?; // enqueued: the communicator accepts the next call
//!     dog.wait(&mut [&mut work], "the all-reduce") // done on the GPU
//! }
//! # fn main() { let _ = (init, all_reduce); }
//! ```
//!
//! # From a failed communicator to a smaller one (NCCL 2.29.7, from its source)
//! `ncclCommShrink`, `ncclCommSplit` and `ncclCommDestroy` begin with `ncclCommEnsureReady` on the
//! communicator (src/init.cc), which returns its `ncclCommGetAsyncError` state unless its abort flag is
//! up. What that means for each way a wait ends:
//! - **Timed out**, no error reported (over NVLink NCCL never notices a dead peer): the revoke stops the
//!   kernels and the proxy, the state returns to `ncclSuccess`, and the communicator shrinks with
//!   `NCCL_SHRINK_DEFAULT` ([`GiveUp::Revoke`]).
//! - **Revoked** on the caller's own news (a rendezvous that saw a death) before NCCL saw anything: the
//!   same. A revoke already disables resource sharing and drains the streams, which is all
//!   `NCCL_SHRINK_ABORT` adds (abort flags up, device stream drained, flags down, nothing shared): that
//!   flag is for a parent with work still running that was not revoked.
//! - **Failed**, NCCL in an error state (`ncclRemoteError` from its network proxy when a peer's sockets
//!   closed): the revoke resets the communicator's own state but not the proxy's, so the error stays;
//!   `NCCL_SHRINK_ABORT` lowers the abort flags again before `ncclCommEnsureReady` runs, so it does not
//!   help either. NCCL refuses to shrink, split or destroy that communicator: it can only be aborted,
//!   and the survivors make a new one from a new unique id. [`Watchdog::revoke_after`] checks the state
//!   once the revoke is done and aborts such a communicator ([`GiveUpError::FailedAfterRevoke`]).
//!
//! A revoke takes about half a second whatever the rank count: its job joins NCCL's proxy service
//! threads, which look at the abort flag only between calls to `poll()` with a 500 ms timeout
//! (src/proxy.cc: `ncclProxyService`, `ncclProxyServiceUDS`). With the flag up, the service thread sleeps
//! through one such poll before it closes its connections and exits (measured: 528–538 ms for revoke and
//! shrink together). `ncclCommAbort` ends the same threads the same way.
//!
//! # The give-up's bound
//! `ncclCommRevoke` and `ncclCommAbort` begin by joining the communicator's pending group job
//! (`ncclCommEnsureReady` → `ncclGroupJobAbort`), so a non-blocking call whose kernel launch is held in
//! the driver (`cuLaunchKernelEx`, seen on a GPU time-shared by 48 rank processes) holds the give-up as
//! long. So the watchdog makes them on a thread of its own, within a bound ([`GiveUpBound`]; by default
//! the wait's own timeout): a call that has not returned by then is left to its thread, its
//! communicator is never used again, and the wait returns an error that says so
//! ([`WaitError::is_stuck`]). The process should then end; [`GiveUpBound::EndProcess`] ends it at that
//! point, as PyTorch's heartbeat monitor does, and [`GiveUpBound::Unbounded`] waits for NCCL however
//! long it takes. A wait that gives up therefore returns within its timeout plus the bound (a revoking
//! one: plus the wait for quiescence and, where the revoke fails, a second bound for the aborts).
//! [`bounded::call`] is the same bound for any other call that may not return.

#![warn(missing_docs)]

pub mod bounded;
mod comm_work;
mod communicator;
mod context;
mod error;
mod give_up;
mod watched;

use std::time::{Duration, Instant};

use metrale_gpu_sys::nccl::{check_nccl, ncclComm_t, ncclResult_t, CUstream};

pub use comm_work::CommWork;
pub use communicator::Communicator;
pub use context::CudaContext;
pub use error::{GiveUp, GiveUpError, WaitError};
use give_up::Outcome;
pub use give_up::{GiveUpBound, GiveUpCall};
use watched::{poll_until, Stop};
pub use watched::{Poll, Watched};

/// The longest sleep between two polls.
pub const MAX_POLL_INTERVAL: Duration = Duration::from_millis(2);

/// A deadline, and what to do to the communicators when it passes or one of them fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watchdog {
    /// How long a wait may last, from its start.
    pub timeout: Duration,
    /// What a wait does to its communicators when it gives up.
    pub give_up: GiveUp,
    /// How long giving up may take, and what follows when NCCL has not returned by then.
    pub give_up_bound: GiveUpBound,
}

impl Watchdog {
    /// Waits that abort their communicators on failure or after `timeout`; the aborts are bounded by
    /// `timeout` too ([`GiveUpBound::Return`]).
    pub const fn abort_after(timeout: Duration) -> Watchdog {
        Watchdog {
            timeout,
            give_up: GiveUp::Abort,
            give_up_bound: GiveUpBound::Return(timeout),
        }
    }

    /// The same waits, with `bound` for their give-up.
    pub const fn with_give_up_bound(self, bound: GiveUpBound) -> Watchdog {
        Watchdog {
            give_up_bound: bound,
            ..self
        }
    }

    /// Waits that revoke their communicators (`ncclCommRevoke`, NCCL 2.29+) on failure or after `timeout`,
    /// then wait up to `timeout` again until they are quiescent with no error, ready to be shrunk, split
    /// or destroyed. A communicator that cannot be revoked, does not become quiescent in time, or that
    /// NCCL still reports an error on once quiescent (a peer's closed sockets, seen by NCCL's proxy before
    /// the revoke stopped it: NCCL then refuses to shrink it) is aborted with the others; the error says
    /// so (`gave_up` is then [`GiveUp::Abort`], and the [`GiveUpError`] says why). The revokes, and the
    /// aborts where they come, are bounded by `timeout` too ([`GiveUpBound::Return`]).
    #[cfg(nccl_2_29)]
    pub const fn revoke_after(timeout: Duration) -> Watchdog {
        Watchdog {
            timeout,
            give_up: GiveUp::Revoke,
            give_up_bound: GiveUpBound::Return(timeout),
        }
    }

    /// Polls every item of `work` until all are done, one fails, or the timeout passes; on failure or
    /// timeout gives up on all of them. An item NCCL refused, or one given up on before, is left alone;
    /// the others are given up on.
    pub fn wait(&self, work: &mut [&mut dyn Watched], context: &str) -> Result<(), WaitError> {
        let start = Instant::now();
        let count = work.len();
        // The items never to give up on: those NCCL refused or an earlier wait gave up on.
        let mut skip = vec![false; count];
        let Err(stop) = poll_until(work, &mut skip, self.timeout, |item| item.poll()) else {
            return Ok(());
        };
        let name = |index: usize| match count {
            1 => context.to_string(),
            _ => format!("{context} (communicator {index} of {count})"),
        };
        let (gave_up, give_up_error) = self.give_up(work, &mut skip);
        let others = (count > 1).then_some(gave_up);
        Err(match stop {
            Stop::Timeout => WaitError::Timeout {
                context: context.to_string(),
                // Until the communicators were given up on: the bound a caller sees.
                waited: start.elapsed(),
                gave_up,
                give_up_error,
            },
            Stop::Failed(index, error) => WaitError::Failed {
                context: name(index),
                error: Box::new(error),
                gave_up,
                give_up_error,
            },
            Stop::Cancelled(index, reason) => WaitError::Cancelled {
                context: name(index),
                reason,
                gave_up,
                give_up_error,
            },
            Stop::Refused(index, error) => WaitError::Refused {
                context: name(index),
                error: Box::new(error),
                others,
                give_up_error,
            },
            Stop::Abandoned(index) => WaitError::Abandoned {
                context: name(index),
                others,
                give_up_error,
            },
        })
    }

    /// Gives up on every item not in `skip` (those NCCL refused or given up on before; a revoke, or a
    /// call left to its thread, adds to them); returns what was done and what that met.
    fn give_up(
        &self,
        work: &mut [&mut dyn Watched],
        skip: &mut [bool],
    ) -> (GiveUp, Option<Box<GiveUpError>>) {
        #[cfg(nccl_2_29)]
        if self.give_up == GiveUp::Revoke {
            match self.revoke(work, skip) {
                Ok(()) => return (GiveUp::Revoke, None),
                // Revoked or not, abort them all (but the skipped): nothing may be left running, and a
                // revoked communicator NCCL still reports an error on is good for nothing else. A stuck
                // abort is what the caller must hear first.
                Err(error) => {
                    let error = match self.give_up_each(work, skip, GiveUp::Abort) {
                        Some(stuck @ GiveUpError::Stuck { .. })
                            if !matches!(error, GiveUpError::Stuck { .. }) =>
                        {
                            stuck
                        }
                        _ => error,
                    };
                    return (GiveUp::Abort, Some(Box::new(error)));
                }
            }
        }
        let error = self.give_up_each(work, skip, GiveUp::Abort);
        (GiveUp::Abort, error.map(Box::new))
    }

    /// Hands `how` over for every item not in `skip` and makes the calls within the bound; an item whose
    /// call is left to its thread is forgotten and joins `skip`. Returns a stuck call's error, else the
    /// first error a call returned.
    fn give_up_each(
        &self,
        work: &mut [&mut dyn Watched],
        skip: &mut [bool],
        how: GiveUp,
    ) -> Option<GiveUpError> {
        let chosen: Vec<usize> = (0..work.len()).filter(|&i| !skip[i]).collect();
        let calls = chosen.iter().map(|&i| work[i].hand_over(how)).collect();
        let (outcomes, stuck) = give_up::make(calls, self.give_up_bound);
        let mut first = None;
        for (&i, outcome) in chosen.iter().zip(outcomes) {
            match outcome {
                Outcome::Returned(Ok(())) => {}
                Outcome::Returned(Err(e)) => {
                    first.get_or_insert(e);
                }
                Outcome::Stuck => {
                    work[i].forget();
                    skip[i] = true;
                }
            }
        }
        stuck.or(first)
    }

    /// Revokes every item not in `skip`, then waits up to the timeout until all are quiescent with no
    /// error.
    #[cfg(nccl_2_29)]
    fn revoke(&self, work: &mut [&mut dyn Watched], skip: &mut [bool]) -> Result<(), GiveUpError> {
        if let Some(error) = self.give_up_each(work, skip, GiveUp::Revoke) {
            return Err(error);
        }
        let start = Instant::now();
        let Err(stop) = poll_until(work, skip, self.timeout, |item| item.poll_revoked()) else {
            return Ok(());
        };
        Err(match stop {
            Stop::Timeout => GiveUpError::NotQuiescent {
                waited: start.elapsed(),
            },
            Stop::Failed(_, error) | Stop::Refused(_, error) => {
                GiveUpError::FailedAfterRevoke(error)
            }
            // Given up on meanwhile (a Watched of the caller's).
            Stop::Cancelled(..) | Stop::Abandoned(_) => GiveUpError::CannotRevoke,
        })
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
        // SAFETY: the caller promises a live handle, used by this thread alone during the wait; the
        // value is dropped (no NCCL call) when the wait returns, leaving the handle to the caller.
        let mut comm = unsafe { Communicator::from_raw(comm) };
        self.wait(
            &mut [&mut CommWork::new(&mut comm)],
            "waiting for the communicator",
        )
    }

    /// Waits for the work queued on each stream (collectives on its communicator), polling every
    /// communicator's `ncclCommGetAsyncError` as well; when one fails or the timeout passes, gives up on
    /// all of them. This is the wait for a process that drives several GPUs with one communicator each:
    /// NCCL frees a process's resources only once all of them are aborted or destroyed, and destroying a
    /// sibling of an aborted communicator waits on its stuck kernel, so none may be left running. A
    /// communicator listed more than once (with several streams) is one communicator of the wait, whose
    /// streams are all awaited: it is given up on once.
    ///
    /// # Safety
    /// Every communicator and stream is live and used by no other thread during the wait. After an `Err`
    /// the communicators were given up on as [`WaitError`] says (aborted or stuck ones must not be used
    /// again); buffers the abandoned work used may hold anything.
    pub unsafe fn wait_all(&self, work: &[(ncclComm_t, CUstream)]) -> Result<(), WaitError> {
        // One entry per communicator, in the order of first appearance, with all its streams.
        let mut merged: Vec<(ncclComm_t, Vec<CUstream>)> = Vec::new();
        for &(comm, stream) in work {
            match merged.iter_mut().find(|(c, _)| *c == comm) {
                Some((_, streams)) => streams.push(stream),
                None => merged.push((comm, vec![stream])),
            }
        }
        let mut comms: Vec<Communicator> = merged
            .iter()
            // SAFETY: the caller promises live handles, used by this thread alone during the wait, and
            // each is made into one value (the list is merged); the values are dropped (no NCCL call)
            // when the wait returns, leaving the handles to the caller.
            .map(|&(comm, _)| unsafe { Communicator::from_raw(comm) })
            .collect();
        let mut work: Vec<CommWork> = comms
            .iter_mut()
            .zip(merged)
            // SAFETY: the caller promises live streams, used by this thread alone.
            .map(|(comm, (_, streams))| unsafe { CommWork::on_streams(comm, streams) })
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
        // SAFETY: the caller promises the call's communicator, used by this thread alone during the
        // check; the value is dropped (no NCCL call) when it returns, leaving the handle to the caller.
        let mut comm = unsafe { Communicator::from_raw(comm) };
        self.check_on(status, &mut CommWork::new(&mut comm), context)
    }

    /// [`Watchdog::check`] against any [`Watched`].
    pub fn check_on(
        &self,
        status: ncclResult_t,
        work: &mut dyn Watched,
        context: &str,
    ) -> Result<(), WaitError> {
        if status == ncclResult_t::ncclInProgress {
            return self.wait(&mut [work], context);
        }
        // ncclSuccess is polled too (above: it does not always mean ready).
        let Err(error) = check_nccl(status, context) else {
            return self.wait(&mut [work], context);
        };
        // The handle itself first: one NCCL refuses, or one given up on before, is left alone.
        let untouchable = match work.poll() {
            Poll::Refused(error) => Some(WaitError::Refused {
                context: context.to_string(),
                error: Box::new(error),
                others: None,
                give_up_error: None,
            }),
            Poll::Abandoned => Some(WaitError::Abandoned {
                context: context.to_string(),
                others: None,
                give_up_error: None,
            }),
            _ => None,
        };
        if let Some(error) = untouchable {
            return Err(error);
        }
        let (gave_up, give_up_error) = self.give_up(&mut [work], &mut [false]);
        Err(WaitError::Failed {
            context: context.to_string(),
            error: Box::new(error),
            gave_up,
            give_up_error,
        })
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
