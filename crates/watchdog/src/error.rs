//! What a wait reports: how it ended ([`WaitError`]), what it did to the communicators ([`GiveUp`]), and
//! what went wrong doing that ([`GiveUpError`]). The watchdog's own findings (a deadline, a communicator
//! that did not quiesce, a handle given up on before) are variants of their own, never dressed as NCCL
//! errors: a `GpuError::Nccl` here is always a status NCCL itself returned.

use std::fmt;
use std::time::Duration;

use metrale_gpu_sys::nccl::{ncclResult_t, GpuError};

/// What a deadline wait did to the communicators when it gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GiveUp {
    /// `ncclCommAbort`: the handle is dead; it must not be used again, not even destroyed. A
    /// [`CommWork`](crate::CommWork) forgets it, so that no later call through it reaches NCCL.
    Abort,
    /// `ncclCommRevoke`, then a wait until the communicator is quiescent with no error: the handle stays
    /// valid for `ncclCommShrink`, `ncclCommSplit` and `ncclCommDestroy` (NCCL 2.29+).
    #[cfg(nccl_2_29)]
    Revoke,
}

/// Why giving up did not end as asked: a revoke that could not be used (the communicators were then
/// aborted), or an abort NCCL failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum GiveUpError {
    /// `ncclCommAbort` or `ncclCommRevoke` returned an error.
    Call(GpuError),
    /// This [`Watched`](crate::Watched) cannot revoke (`Watched::revoke`'s default), or its communicator
    /// was given up on before.
    CannotRevoke,
    /// Revoked, but still not quiescent (`ncclInProgress`) when the wait's timeout passed again.
    NotQuiescent {
        /// How long the wait for quiescence lasted.
        waited: Duration,
    },
    /// The revoke ended, but left the work failed: NCCL still reports an error on the communicator
    /// (`ncclCommGetAsyncError`: typically `ncclRemoteError` from its network proxy), refused the handle,
    /// or CUDA failed the stream. NCCL 2.29 refuses to shrink, split or destroy a communicator that
    /// reports an error (they begin with `ncclCommEnsureReady`, which returns it), so abort is all that is
    /// left: a smaller communicator must then come from a new unique id (`ncclCommInitRankConfig`).
    FailedAfterRevoke(GpuError),
    /// NCCL had not returned from the give-up call when its bound passed ([`GiveUpBound`]): the
    /// communicators named are stuck inside NCCL, left to a thread of their own, and never used again.
    /// NCCL cannot free them, so the process should end.
    ///
    /// [`GiveUpBound`]: crate::GiveUpBound
    Stuck {
        /// The call that did not return: `ncclCommAbort` or `ncclCommRevoke`.
        call: &'static str,
        /// The bound.
        after: Duration,
        /// How many of the wait's communicators were left.
        communicators: usize,
    },
}

impl From<GpuError> for GiveUpError {
    fn from(error: GpuError) -> GiveUpError {
        GiveUpError::Call(error)
    }
}

impl fmt::Display for GiveUpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GiveUpError::Call(e) => e.fmt(f),
            GiveUpError::CannotRevoke => write!(
                f,
                "it cannot be revoked (a Watched without revoke, or a communicator given up on before)"
            ),
            GiveUpError::NotQuiescent { waited } => write!(
                f,
                "revoked, but not quiescent after {:.3} s",
                waited.as_secs_f64()
            ),
            GiveUpError::FailedAfterRevoke(e) => write!(
                f,
                "revoked, but still failed ({e}): NCCL shrinks, splits or destroys no communicator that reports \
                 an error"
            ),
            GiveUpError::Stuck {
                call,
                after,
                communicators,
            } => write!(
                f,
                "{call} had not returned after {:.3} s: {communicators} communicator(s) stuck inside NCCL, \
                 left to a thread of their own and never used again; NCCL cannot free them in this process: \
                 end it",
                after.as_secs_f64()
            ),
        }
    }
}

impl std::error::Error for GiveUpError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            GiveUpError::Call(e) | GiveUpError::FailedAfterRevoke(e) => Some(e),
            GiveUpError::CannotRevoke
            | GiveUpError::NotQuiescent { .. }
            | GiveUpError::Stuck { .. } => None,
        }
    }
}

/// Why a wait gave up. `Timeout`, `Failed` and `Cancelled` gave up on every communicator of the wait
/// (`gave_up` says how) but those it must not touch; `Refused` and `Abandoned` name one it must not touch
/// (left alone) and gave up on the others (`others` says how). Remote errors are `Failed` with
/// `ncclRemoteError`: see [`WaitError::is_remote`].
///
/// Where giving up did not end within its bound, `give_up_error` is [`GiveUpError::Stuck`]
/// ([`WaitError::is_stuck`]): the communicators it names are stuck inside NCCL, and the process should end.
///
/// `Display` gives the whole story in one message; [`source`](std::error::Error::source) hands programs
/// the error underneath (NCCL's or CUDA's, or what giving up met), whose text that message includes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WaitError {
    /// The deadline passed with the work still running.
    Timeout {
        /// What was waited for.
        context: String,
        /// How long the wait lasted, giving up included.
        waited: Duration,
        /// What was done to the communicators.
        gave_up: GiveUp,
        /// What giving up met, if anything: an abort's error, or why a revoke could not be used (the
        /// communicators were then aborted: `gave_up` is `Abort`) or left them failed.
        give_up_error: Option<Box<GiveUpError>>,
    },
    /// NCCL reported an error on a communicator: `ncclRemoteError` (a peer failed or left) or another
    /// asynchronous error, with NCCL's text; or a CUDA error on the stream; or the call a non-blocking
    /// check was given failed.
    Failed {
        /// What was waited for.
        context: String,
        /// The error as NCCL or CUDA reported it.
        error: Box<GpuError>,
        /// What was done to the communicators.
        gave_up: GiveUp,
        /// What giving up met, if anything (as for `Timeout`).
        give_up_error: Option<Box<GiveUpError>>,
    },
    /// A [`Watched`](crate::Watched) of the caller's gave up on its own news ([`Poll::Cancel`]: a
    /// rendezvous that saw a peer die, say).
    ///
    /// [`Poll::Cancel`]: crate::Poll::Cancel
    Cancelled {
        /// What was waited for.
        context: String,
        /// The caller's reason.
        reason: String,
        /// What was done to the communicators.
        gave_up: GiveUp,
        /// What giving up met, if anything (as for `Timeout`).
        give_up_error: Option<Box<GiveUpError>>,
    },
    /// NCCL refused a communicator handle itself: `ncclCommGetAsyncError` failed with
    /// `ncclInvalidArgument`. That is NCCL's answer for NULL and for memory without a communicator's magic
    /// words, a check that catches some invalid handles and not others: a freed communicator whose memory
    /// is unchanged passes it, so a refusal proves the handle bad, and its absence proves nothing. The
    /// refused handle was not aborted (aborting would write through whatever it points to) and a
    /// [`CommWork`](crate::CommWork) never touches it again; the wait's other communicators, if any, were
    /// given up on as for `Failed`.
    Refused {
        /// What was waited for.
        context: String,
        /// `ncclCommGetAsyncError`'s error.
        error: Box<GpuError>,
        /// What was done to the wait's other communicators: `None` in a wait over one. After `Abort`
        /// they must not be used again; after `Revoke` they are quiescent and still valid.
        others: Option<GiveUp>,
        /// What giving up on the others met, if anything (as for `Timeout`).
        give_up_error: Option<Box<GiveUpError>>,
    },
    /// A communicator of the wait had been given up on before (aborted, or its handle refused): nothing
    /// was called on it. The wait's other communicators, if any, were given up on as for `Failed`.
    Abandoned {
        /// What was waited for.
        context: String,
        /// What was done to the wait's other communicators (as for `Refused`).
        others: Option<GiveUp>,
        /// What giving up on the others met, if anything (as for `Timeout`).
        give_up_error: Option<Box<GiveUpError>>,
    },
}

/// `ncclTimeout`, which NCCL 2.30 added: its value from the headers where they define it.
#[cfg(nccl_2_30)]
const NCCL_TIMEOUT: ncclResult_t = ncclResult_t::ncclTimeout;
/// `ncclTimeout`, which NCCL 2.30 added as 8 (after `ncclInProgress`, 7): these older headers lack it, but
/// a newer library loaded at run time may return it.
#[cfg(not(nccl_2_30))]
const NCCL_TIMEOUT: ncclResult_t = ncclResult_t(8);

impl WaitError {
    /// True when the deadline passed, or NCCL itself reported a timeout (`ncclTimeout`, NCCL 2.30+).
    pub fn is_timeout(&self) -> bool {
        match self {
            WaitError::Timeout { .. } => true,
            WaitError::Failed { error, .. } => {
                matches!(**error, GpuError::Nccl { code, .. } if code == NCCL_TIMEOUT)
            }
            _ => false,
        }
    }

    /// True when giving up did not end within its bound ([`GiveUpError::Stuck`]): communicators are
    /// stuck inside NCCL, and the process should end.
    pub fn is_stuck(&self) -> bool {
        matches!(self.give_up_error(), Some(GiveUpError::Stuck { .. }))
    }

    /// True when NCCL blamed a peer (`ncclRemoteError`): it died, left, or its network failed.
    pub fn is_remote(&self) -> bool {
        matches!(self, WaitError::Failed { error, .. }
            if matches!(**error, GpuError::Nccl { code, .. } if code == ncclResult_t::ncclRemoteError))
    }

    /// How the wait's communicators were given up on (but the one a `Refused` or `Abandoned` names);
    /// `None` when there were no others.
    pub fn gave_up(&self) -> Option<GiveUp> {
        match self {
            WaitError::Timeout { gave_up, .. }
            | WaitError::Failed { gave_up, .. }
            | WaitError::Cancelled { gave_up, .. } => Some(*gave_up),
            WaitError::Refused { others, .. } | WaitError::Abandoned { others, .. } => *others,
        }
    }

    /// What giving up met, if anything: an abort NCCL failed, or why a revoke was not used (or left the
    /// communicators failed) and they were aborted instead. [`source`](std::error::Error::source) hands it
    /// on where the wait's own cause has no error underneath (a timeout, a cancel, an abandoned handle).
    pub fn give_up_error(&self) -> Option<&GiveUpError> {
        match self {
            WaitError::Timeout { give_up_error, .. }
            | WaitError::Failed { give_up_error, .. }
            | WaitError::Cancelled { give_up_error, .. }
            | WaitError::Refused { give_up_error, .. }
            | WaitError::Abandoned { give_up_error, .. } => give_up_error.as_deref(),
        }
    }
}

impl fmt::Display for WaitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // What happened, then what was given up on and how, and what that met: the tail every variant
        // shares. `plural`: the subject is the wait's other communicators.
        let plural = match self {
            WaitError::Timeout {
                context, waited, ..
            } => {
                let secs = waited.as_secs_f64();
                write!(f, "{context} timed out after {secs:.3} s")?;
                false
            }
            WaitError::Failed { context, error, .. } => {
                let kind = if self.is_remote() {
                    "a peer failed"
                } else {
                    "error"
                };
                write!(f, "{context}: {kind}: {error}")?;
                false
            }
            WaitError::Cancelled {
                context, reason, ..
            } => {
                write!(f, "{context}: given up: {reason}")?;
                false
            }
            WaitError::Refused { context, error, .. } => {
                write!(
                    f,
                    "{context}: NCCL refused the communicator handle ({error}): it is NULL or not a \
                     communicator NCCL recognises; it was not aborted"
                )?;
                true
            }
            WaitError::Abandoned { context, .. } => {
                write!(
                    f,
                    "{context}: the communicator was given up on before (aborted, or its handle refused); \
                     nothing was called on it"
                )?;
                true
            }
        };
        let Some(gave_up) = self.gave_up() else {
            return Ok(());
        };
        let (subject, was) = match plural {
            false => ("the communicator", "was"),
            true => ("the wait's other communicators", "were"),
        };
        if let Some(stuck @ GiveUpError::Stuck { .. }) = self.give_up_error() {
            return write!(f, "; giving up on {subject} did not end: {stuck}");
        }
        match gave_up {
            GiveUp::Abort => write!(f, "; {subject} {was} aborted")?,
            #[cfg(nccl_2_29)]
            GiveUp::Revoke => {
                let is = if plural { "are" } else { "is" };
                write!(f, "; {subject} {was} revoked and {is} quiescent")?
            }
        }
        match self.give_up_error() {
            Some(e) => write!(f, " (giving up: {e})"),
            None => Ok(()),
        }
    }
}

impl std::error::Error for WaitError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            WaitError::Failed { error, .. } | WaitError::Refused { error, .. } => Some(&**error),
            _ => self
                .give_up_error()
                .map(|e| e as &(dyn std::error::Error + 'static)),
        }
    }
}
