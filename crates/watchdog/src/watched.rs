//! What a wait polls ([`Watched`], answering a [`Poll`]), and the poll loop every wait runs.

use std::time::{Duration, Instant};

use metrale_gpu_sys::nccl::GpuError;

use crate::{GiveUp, GiveUpCall, GiveUpError, MAX_POLL_INTERVAL};

/// What one poll of the awaited work found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Poll {
    /// The work is done.
    Done,
    /// The work is still running.
    Running,
    /// The work failed (an asynchronous NCCL error, a CUDA error on the stream): give up on it.
    Failed(GpuError),
    /// The caller's own reason to give up, from outside NCCL and CUDA (a rendezvous that saw a peer die,
    /// say): give up on it.
    Cancel(String),
    /// NCCL refused the handle itself (`ncclInvalidArgument`: NULL, or not a communicator NCCL
    /// recognises): never abort it, never touch it again.
    Refused(GpuError),
    /// The work was given up on before (its communicator aborted, its handle refused or taken back):
    /// nothing was called, and nothing may be.
    Abandoned,
}

/// What a wait polls, and how it gives up: communicators and streams in production, fakes in tests.
pub trait Watched {
    /// Polls the awaited work once.
    fn poll(&mut self) -> Poll;
    /// Aborts the communicator (`ncclCommAbort`) here, on the calling thread: the give-up of the default
    /// [`hand_over`](Self::hand_over). Never called after `poll` returned `Refused` or `Abandoned` in the
    /// same wait; after it, the handle must never be touched again: later polls should
    /// answer `Abandoned` and later aborts do nothing ([`CommWork`](crate::CommWork) does both).
    fn abort(&mut self) -> Result<(), GpuError>;
    /// Revokes the communicator (`ncclCommRevoke`, NCCL 2.29+ headers). Never called after `poll`
    /// returned `Refused` or `Abandoned`. By default it cannot, which makes a revoking watchdog abort
    /// instead; the methods exist whatever the headers, so an implementation compiles against every NCCL.
    fn revoke(&mut self) -> Result<(), GiveUpError> {
        Err(GiveUpError::CannotRevoke)
    }
    /// After `revoke`: `Done` once the communicator is quiescent with no error (ready to be shrunk),
    /// `Running` while not yet; `Failed` or `Refused` when the revoke left it failed, `Abandoned` (or
    /// `Cancel`) when it was given up on meanwhile. On any of those the watchdog aborts every
    /// communicator of the wait, this one too: where NCCL refused the handle, make that abort touch
    /// nothing. By default it is quiescent at once.
    fn poll_revoked(&mut self) -> Poll {
        Poll::Done
    }
    /// The give-up `how` ([`GiveUp::Abort`] or [`GiveUp::Revoke`]) as a call the watchdog makes on a
    /// thread of its own, within its [`GiveUpBound`](crate::GiveUpBound); never asked after `poll`
    /// returned `Refused` or `Abandoned`. [`CommWork`](crate::CommWork) hands over its NCCL call, and a
    /// `Watched` that wraps one should hand over the wrapped one's (and pass [`forget`](Self::forget) on)
    /// so that the bound holds for it. By default the give-up is made here, on the waiting thread, by
    /// [`abort`](Self::abort) or [`revoke`](Self::revoke): a give-up of one's own, which the watchdog
    /// cannot bound.
    fn hand_over(&mut self, how: GiveUp) -> GiveUpCall {
        GiveUpCall::made(match how {
            GiveUp::Abort => self.abort().map_err(GiveUpError::Call),
            #[cfg(nccl_2_29)]
            GiveUp::Revoke => self.revoke(),
        })
    }
    /// The call [`hand_over`](Self::hand_over) gave had not returned when the bound passed: it is left
    /// to its thread, and the handle must never be touched again (later polls should answer
    /// `Abandoned`, later give-ups do nothing). By default nothing: nothing was handed over.
    fn forget(&mut self) {}
}

/// How a poll loop ended other than with all done: the deadline, or the first item (by index) that
/// failed in the last round.
pub(super) enum Stop {
    Timeout,
    Failed(usize, GpuError),
    Cancelled(usize, String),
    Refused(usize, GpuError),
    Abandoned(usize),
}

/// Polls every item not in `skip` with `poll` (`Watched::poll`, or `poll_revoked` after a revoke) until
/// all are done (`Ok`), one fails, or `timeout` passes, backing off between rounds. A round polls every item, so that each one NCCL refused
/// or an earlier wait gave up on joins `skip`: whatever gives up next leaves it alone.
pub(super) fn poll_until(
    work: &mut [&mut dyn Watched],
    skip: &mut [bool],
    timeout: Duration,
    poll: fn(&mut dyn Watched) -> Poll,
) -> Result<(), Stop> {
    let start = Instant::now();
    let mut pause = Duration::from_micros(5);
    loop {
        let (mut running, mut stop) = (false, None);
        for (index, item) in work.iter_mut().enumerate() {
            if skip[index] {
                continue;
            }
            let failed = match poll(&mut **item) {
                Poll::Done => continue,
                Poll::Running => {
                    running = true;
                    continue;
                }
                Poll::Failed(error) => Stop::Failed(index, error),
                Poll::Cancel(reason) => Stop::Cancelled(index, reason),
                Poll::Refused(error) => {
                    skip[index] = true;
                    Stop::Refused(index, error)
                }
                Poll::Abandoned => {
                    skip[index] = true;
                    Stop::Abandoned(index)
                }
            };
            stop.get_or_insert(failed);
        }
        if let Some(stop) = stop {
            return Err(stop);
        }
        if !running {
            return Ok(());
        }
        let waited = start.elapsed();
        if waited >= timeout {
            return Err(Stop::Timeout);
        }
        std::thread::sleep(pause.min(timeout - waited));
        pause = (pause * 2).min(MAX_POLL_INTERVAL);
    }
}
