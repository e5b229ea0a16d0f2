//! What a wait polls ([`Watched`], answering a [`Poll`]), and the poll loop every wait runs.

use std::time::{Duration, Instant};

use super::{GiveUpError, MAX_POLL_INTERVAL};
use crate::error::GpuError;

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
    /// The work was given up on before (its communicator aborted, or its handle refused): nothing was
    /// called, and nothing may be.
    Abandoned,
}

/// What a wait polls, and how it gives up: communicators and streams in production, fakes in tests.
pub trait Watched {
    /// Polls the awaited work once.
    fn poll(&mut self) -> Poll;
    /// Aborts the communicator (`ncclCommAbort`). Never called after `poll` returned `Refused` or
    /// `Abandoned` in the same wait; after it, the handle must never be touched again: later polls should
    /// answer `Abandoned` and later aborts do nothing ([`CommWork`](super::CommWork) does both).
    fn abort(&mut self) -> Result<(), GpuError>;
    /// Revokes the communicator (`ncclCommRevoke`, NCCL 2.29+ headers). Never called after `poll`
    /// returned `Refused` or `Abandoned`. By default it cannot, which makes a revoking watchdog abort
    /// instead; the methods exist whatever the headers, so an implementation compiles against every NCCL.
    fn revoke(&mut self) -> Result<(), GiveUpError> {
        Err(GiveUpError::CannotRevoke)
    }
    /// After `revoke`: `Ok(true)` once the communicator is quiescent with no error (ready to be shrunk),
    /// `Ok(false)` while not yet, `Err` when the revoke left it failed (the watchdog then aborts every
    /// communicator of the wait, this one too: where NCCL refused the handle, make that abort touch
    /// nothing).
    fn poll_revoked(&mut self) -> Result<bool, GpuError> {
        Ok(true)
    }
}

/// How a poll loop ended: for a failure, the first item (by index) that failed in the last round.
pub(super) enum Stop {
    Done,
    Timeout,
    Failed(usize, GpuError),
    Cancelled(usize, String),
    Refused(usize, GpuError),
    Abandoned(usize),
}

/// Polls every item not in `skip` with `poll` (given its index) until all are done, one fails, or
/// `timeout` passes, backing off between rounds. A round polls every item, so that each one NCCL refused
/// or an earlier wait gave up on joins `skip`: whatever gives up next leaves it alone.
pub(super) fn poll_until(
    work: &mut [&mut dyn Watched],
    skip: &mut [bool],
    timeout: Duration,
    mut poll: impl FnMut(usize, &mut dyn Watched) -> Poll,
) -> Stop {
    let start = Instant::now();
    let mut pause = Duration::from_micros(5);
    loop {
        let (mut running, mut stop) = (false, None);
        for (index, item) in work.iter_mut().enumerate() {
            if skip[index] {
                continue;
            }
            let failed = match poll(index, &mut **item) {
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
            return stop;
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
pub(super) fn for_others<E>(
    work: &mut [&mut dyn Watched],
    skip: &[bool],
    mut give_up: impl FnMut(&mut dyn Watched) -> Result<(), E>,
) -> Option<E> {
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
