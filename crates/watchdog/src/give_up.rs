//! Giving up on a wait's communicators within a bound: each [`Watched`](crate::Watched) hands over its
//! abort or revoke as a [`GiveUpCall`], and the watchdog makes the calls in order, each on a thread of its
//! own, until the bound passes ([`GiveUpBound`]). A call that has not returned by then is left to its
//! thread: its communicator is stuck inside NCCL and is never used again.

use std::time::{Duration, Instant};

use crate::bounded;
use crate::{CudaContext, GiveUpError};

/// How long a wait's give-up (all its aborts, or all its revokes) may take, and what follows when NCCL
/// has not returned by then. `ncclCommAbort` and `ncclCommRevoke` first join the communicator's pending
/// group job, so a non-blocking call whose kernel launch is held in the driver holds them as long.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GiveUpBound {
    /// The wait returns once the bound passes: the calls that had not returned are left to their
    /// threads, their communicators are never used again, and the error says so
    /// ([`GiveUpError::Stuck`]; [`WaitError::is_stuck`](crate::WaitError::is_stuck)). The process should
    /// then end: NCCL holds a communicator it can no longer free. [`Watchdog::abort_after`] and
    /// [`Watchdog::revoke_after`] set this, with the wait's own timeout.
    ///
    /// [`Watchdog::abort_after`]: crate::Watchdog::abort_after
    /// [`Watchdog::revoke_after`]: crate::Watchdog::revoke_after
    Return(Duration),
    /// The process ends once the bound passes (`std::process::abort`, after the same message on
    /// stderr), as PyTorch's heartbeat monitor ends a process whose NCCL watchdog is stuck.
    EndProcess(Duration),
    /// No bound: the waiting thread makes the calls itself and waits for NCCL however long it takes.
    Unbounded,
}

impl GiveUpBound {
    /// The bound, where there is one.
    pub fn limit(self) -> Option<Duration> {
        match self {
            GiveUpBound::Return(limit) | GiveUpBound::EndProcess(limit) => Some(limit),
            GiveUpBound::Unbounded => None,
        }
    }
}

/// A give-up, handed over by a [`Watched`](crate::Watched): made already, on the waiting thread (a fake,
/// a communicator given up on before, a `Watched` of one's own), or a call for the watchdog to make on
/// a thread of its own. A pending call owns what it needs (the raw handle, say): the waiting thread
/// does not touch that while the call runs, and never again if the call is left to its thread.
#[must_use = "a pending call does nothing until the watchdog makes it"]
pub struct GiveUpCall {
    what: &'static str,
    state: State,
}

/// A pending call's work, and what its thread does if the wait stopped waiting before it returned.
type Call = Box<dyn FnOnce() -> Result<(), GiveUpError> + Send>;
type Late = Box<dyn FnOnce() + Send>;

enum State {
    Made(Result<(), GiveUpError>),
    Pending { call: Call, late: Late },
}

impl GiveUpCall {
    /// A give-up made already, with its result.
    pub fn made(result: Result<(), GiveUpError>) -> GiveUpCall {
        GiveUpCall {
            what: "",
            state: State::Made(result),
        }
    }

    /// A call (`what`: `ncclCommAbort`, `ncclCommRevoke`) for the watchdog to make.
    pub fn new(
        what: &'static str,
        call: impl FnOnce() -> Result<(), GiveUpError> + Send + 'static,
    ) -> GiveUpCall {
        GiveUpCall {
            what,
            state: State::Pending {
                call: Box::new(call),
                late: Box::new(|| ()),
            },
        }
    }

    /// What the call's thread does when the call returns after the wait stopped waiting: release what
    /// it holds (abort a communicator whose revoke returned late, say). Nothing for a call made already.
    pub fn or_if_late(mut self, release: impl FnOnce() + Send + 'static) -> GiveUpCall {
        if let State::Pending { late, .. } = &mut self.state {
            *late = Box::new(release);
        }
        self
    }
}

/// How a handed-over call ended.
pub(crate) enum Outcome {
    Returned(Result<(), GiveUpError>),
    /// Not returned when the bound passed: left to its thread.
    Stuck,
}

/// Makes `calls` in order within `bound` (counted from now): each pending one on a thread of its own,
/// waited for until the bound passes; once it has, each call still to make is started and left to its
/// thread at once. Returns each call's outcome, and the first stuck call's error.
pub(crate) fn make(
    calls: Vec<GiveUpCall>,
    bound: GiveUpBound,
) -> (Vec<Outcome>, Option<GiveUpError>) {
    let start = Instant::now();
    // The waiting thread's context, made current on each call's thread, so that NCCL's call runs there
    // as it would have on the waiting thread; none where there is no driver or no current context.
    let context = CudaContext::current().ok().flatten();
    let mut stuck: Option<GiveUpError> = None;
    let outcomes = calls
        .into_iter()
        .map(|GiveUpCall { what, state }| match state {
            State::Made(result) => Outcome::Returned(result),
            State::Pending { call, late } => match bound.limit() {
                None => Outcome::Returned(call()),
                Some(limit) => {
                    let left = limit.saturating_sub(start.elapsed());
                    let call = move || {
                        if let Some(context) = context {
                            // SAFETY: the waiting thread's context, alive while its communicators
                            // are. A failure is NCCL's to meet: the call then runs without it, as on
                            // a thread of the application's that never set one.
                            let _ = unsafe { context.make_current() };
                        }
                        call()
                    };
                    match bounded::call(what, left, &|| None, call, move |_| late()) {
                        Ok(result) => Outcome::Returned(result),
                        Err(_) => {
                            match &mut stuck {
                                Some(GiveUpError::Stuck { communicators, .. }) => {
                                    *communicators += 1
                                }
                                _ => {
                                    stuck = Some(GiveUpError::Stuck {
                                        call: what,
                                        after: limit,
                                        communicators: 1,
                                    })
                                }
                            }
                            Outcome::Stuck
                        }
                    }
                }
            },
        })
        .collect();
    if let (Some(error), GiveUpBound::EndProcess(_)) = (&stuck, bound) {
        eprintln!("metrale-gpu-watchdog: {error}: ending the process");
        std::process::abort();
    }
    (outcomes, stuck)
}
