//! The deadline waits' logic, against fakes (the GPU suite runs them against real communicators): they
//! return as soon as the work is done, give up within their bound on every communicator they wait for, never
//! abort a handle NCCL refused or one given up on before, classify the error, and back off rather than spin.
//! `comm_work.rs`: the crate's `CommWork` against NCCL (NULL) and a counting stand-in; `errors.rs`: what
//! the errors say and hold.

mod comm_work;
mod errors;

use std::time::{Duration, Instant};

use metrale_gpu_sys::nccl::*;
#[cfg(nccl_2_29)]
use metrale_gpu_watchdog::GiveUpError;
use metrale_gpu_watchdog::{
    GiveUp, GiveUpBound, GiveUpCall, Poll, WaitError, Watchdog, Watched, MAX_POLL_INTERVAL,
};

/// Done after `polls_until_done` polls (never if `None`), or answering `answer` at the first poll.
#[derive(Default)]
pub struct Fake {
    polls: u32,
    polls_until_done: Option<u32>,
    answer: Option<Poll>,
    aborts: u32,
    #[cfg(nccl_2_29)]
    revokes: u32,
    /// Polls after the revoke before the communicator is quiescent (never if `None`).
    #[cfg(nccl_2_29)]
    revoked_polls_until_quiet: Option<u32>,
    #[cfg(nccl_2_29)]
    revoked_polls: u32,
    /// What every poll after the revoke answers instead (NCCL still reporting an error, say).
    #[cfg(nccl_2_29)]
    revoked_answer: Option<Poll>,
}

impl Fake {
    pub fn done_after(polls: u32) -> Fake {
        Fake {
            polls_until_done: Some(polls),
            ..Fake::default()
        }
    }
    pub fn hanging() -> Fake {
        Fake::default()
    }
    pub fn answering(answer: Poll) -> Fake {
        Fake {
            answer: Some(answer),
            ..Fake::default()
        }
    }
}

/// One poll of a fake, counted in `polls`: `answer` where set, else done once `until` polls were made.
fn fake_poll(polls: &mut u32, answer: &Option<Poll>, until: Option<u32>) -> Poll {
    *polls += 1;
    match (answer, until) {
        (Some(answer), _) => answer.clone(),
        (None, Some(n)) if *polls >= n => Poll::Done,
        (None, _) => Poll::Running,
    }
}

impl Watched for Fake {
    fn poll(&mut self) -> Poll {
        fake_poll(&mut self.polls, &self.answer, self.polls_until_done)
    }
    fn abort(&mut self) -> Result<(), GpuError> {
        self.aborts += 1;
        Ok(())
    }
    #[cfg(nccl_2_29)]
    fn revoke(&mut self) -> Result<(), GiveUpError> {
        self.revokes += 1;
        Ok(())
    }
    #[cfg(nccl_2_29)]
    fn poll_revoked(&mut self) -> Poll {
        fake_poll(
            &mut self.revoked_polls,
            &self.revoked_answer,
            self.revoked_polls_until_quiet,
        )
    }
}

/// A Watched that only polls and aborts: `Watched::revoke`'s default.
#[cfg(nccl_2_29)]
struct NoRevoke(Fake);

#[cfg(nccl_2_29)]
impl Watched for NoRevoke {
    fn poll(&mut self) -> Poll {
        self.0.poll()
    }
    fn abort(&mut self) -> Result<(), GpuError> {
        self.0.abort()
    }
}

pub fn nccl_error(code: NcclResult) -> GpuError {
    check_nccl(code, "ncclCommGetAsyncError").expect_err("a failure code")
}

/// Why a revoking wait aborted instead: `err` gave up by aborting, and says what made it.
#[cfg(nccl_2_29)]
pub fn why_aborted(err: &WaitError) -> &GiveUpError {
    match err {
        WaitError::Timeout {
            gave_up: GiveUp::Abort,
            give_up_error: Some(why),
            ..
        }
        | WaitError::Failed {
            gave_up: GiveUp::Abort,
            give_up_error: Some(why),
            ..
        } => why,
        _ => panic!("no abort with a reason: {err:?}"),
    }
}

pub fn wait(fake: &mut Fake, timeout: Duration, context: &str) -> Result<(), WaitError> {
    Watchdog::abort_after(timeout).wait(&mut [fake], context)
}

#[test]
fn finished_work_returns_without_abort() {
    let mut fake = Fake::done_after(5);
    assert_eq!(wait(&mut fake, Duration::from_secs(10), "x"), Ok(()));
    assert_eq!((fake.polls, fake.aborts), (5, 0));
}

#[test]
fn a_hang_times_out_within_its_bound_aborts_once_and_does_not_spin() {
    let timeout = Duration::from_millis(200);
    let mut fake = Fake::hanging();
    let start = Instant::now();
    let err = wait(&mut fake, timeout, "all-reduce on rank 0").expect_err("never done");
    let took = start.elapsed();
    assert!(took >= timeout, "gave up early: {took:?}");
    // The stated bound: the timeout plus one poll interval; a loaded CI machine may oversleep, hence 1 s.
    assert!(
        took < timeout + Duration::from_secs(1),
        "gave up late: {took:?}"
    );
    assert!(err.is_timeout() && !err.is_remote(), "{err}");
    assert_eq!(fake.aborts, 1);
    // Backoff: after a few short pauses, at most one poll per MAX_POLL_INTERVAL.
    let bound = 20 + (timeout.as_micros() / MAX_POLL_INTERVAL.as_micros()) as u32;
    assert!(
        fake.polls <= bound,
        "{} polls in {took:?}: busy-waiting",
        fake.polls
    );
    let msg = err.to_string();
    assert!(
        msg.starts_with("all-reduce on rank 0 timed out after 0.2"),
        "{msg}"
    );
    assert!(msg.contains("the communicator was aborted"), "{msg}");
}

#[test]
fn a_remote_error_aborts_and_says_a_peer_failed() {
    let mut fake = Fake::answering(Poll::Failed(nccl_error(NcclResult::ncclRemoteError)));
    let err = wait(&mut fake, Duration::from_secs(10), "step 7").expect_err("peer died");
    assert!(err.is_remote() && !err.is_timeout(), "{err}");
    assert_eq!((fake.polls, fake.aborts), (1, 1));
    let msg = err.to_string();
    assert!(msg.starts_with("step 7: a peer failed: ncclCommGetAsyncError failed: NCCL error 6 (remote process exited or there was a network error)"), "{msg}");
}

#[test]
fn other_errors_are_neither_timeout_nor_remote_and_keep_their_context() {
    let mut fake = Fake::answering(Poll::Failed(nccl_error(NcclResult::ncclUnhandledCudaError)));
    let err = wait(&mut fake, Duration::from_secs(10), "step 8").expect_err("failed");
    assert!(!err.is_remote() && !err.is_timeout(), "{err}");
    let WaitError::Failed {
        context,
        gave_up: GiveUp::Abort,
        give_up_error: None,
        ..
    } = &err
    else {
        panic!("{err:?}")
    };
    assert_eq!(context, "step 8");
}

#[test]
fn nccls_own_timeout_code_is_a_timeout() {
    // ncclTimeout (NCCL 2.30+) is 8; older headers lack the name, a newer library may still return it.
    #[cfg(nccl_2_30)]
    assert_eq!(NcclResult::ncclTimeout, NcclResult(8));
    let mut fake = Fake::answering(Poll::Failed(nccl_error(NcclResult(8))));
    let err = wait(&mut fake, Duration::from_secs(10), "x").expect_err("failed");
    assert!(err.is_timeout() && !err.is_remote(), "{err}");
    assert_eq!(fake.aborts, 1);
}

#[test]
fn a_handle_nccl_refuses_is_never_aborted() {
    let mut fake = Fake::answering(Poll::Refused(nccl_error(NcclResult::ncclInvalidArgument)));
    let err = wait(&mut fake, Duration::from_secs(10), "x").expect_err("refused");
    assert!(matches!(err, WaitError::Refused { .. }), "{err:?}");
    assert!(!err.is_timeout() && !err.is_remote(), "{err}");
    assert_eq!(
        fake.aborts, 0,
        "aborting a refused handle writes through it"
    );
    assert!(err.to_string().contains("it was not aborted"), "{err}");
}

#[test]
fn a_wait_over_several_communicators_gives_up_on_all_of_them() {
    let watchdog = Watchdog::abort_after(Duration::from_secs(10));
    let (mut done, mut failing, mut hanging) = (
        Fake::done_after(1),
        Fake::answering(Poll::Failed(nccl_error(NcclResult::ncclRemoteError))),
        Fake::hanging(),
    );
    let err = watchdog
        .wait(&mut [&mut done, &mut failing, &mut hanging], "step 3")
        .expect_err("one failed");
    assert!(err.is_remote(), "{err}");
    assert_eq!((done.aborts, failing.aborts, hanging.aborts), (1, 1, 1));
    assert!(
        err.to_string().starts_with("step 3 (communicator 1 of 3)"),
        "{err}"
    );

    // A timeout gives up on all; a refused handle is left alone while the others are given up on.
    let (mut a, mut b) = (Fake::hanging(), Fake::hanging());
    let err = Watchdog::abort_after(Duration::from_millis(20))
        .wait(&mut [&mut a, &mut b], "x")
        .expect_err("hangs");
    assert!(err.is_timeout(), "{err}");
    assert_eq!((a.aborts, b.aborts), (1, 1));
    let (mut refused, mut other) = (
        Fake::answering(Poll::Refused(nccl_error(NcclResult::ncclInvalidArgument))),
        Fake::hanging(),
    );
    let err = watchdog
        .wait(&mut [&mut other, &mut refused], "x")
        .expect_err("refused");
    let WaitError::Refused {
        others: Some(GiveUp::Abort),
        give_up_error: None,
        ..
    } = &err
    else {
        panic!("the caller must learn what became of the others: {err:?}")
    };
    assert!(
        err.to_string()
            .contains("it was not aborted; the wait's other communicators were aborted"),
        "{err}"
    );
    assert_eq!((refused.aborts, other.aborts), (0, 1));

    // Every communicator done: no abort.
    let (mut a, mut b) = (Fake::done_after(3), Fake::done_after(1));
    assert_eq!(watchdog.wait(&mut [&mut a, &mut b], "x"), Ok(()));
    assert_eq!((a.aborts, b.aborts), (0, 0));
}

#[test]
fn the_non_blocking_check_waits_until_the_communicator_accepts_the_next_call() {
    let watchdog = Watchdog::abort_after(Duration::from_secs(10));
    // ncclSuccess from a ready communicator: one poll.
    let mut fake = Fake::done_after(1);
    assert_eq!(
        watchdog.check_on(NcclResult::ncclSuccess, &mut fake, "ncclBroadcast"),
        Ok(())
    );
    assert_eq!((fake.polls, fake.aborts), (1, 0));
    // ncclSuccess from one still initialising (ncclCommGrow's existing ranks): polled until ready.
    let mut fake = Fake::done_after(3);
    assert_eq!(
        watchdog.check_on(NcclResult::ncclSuccess, &mut fake, "ncclCommGrow"),
        Ok(())
    );
    assert_eq!((fake.polls, fake.aborts), (3, 0));
    // ncclInProgress: polls until the communicator leaves it.
    let mut fake = Fake::done_after(4);
    assert_eq!(
        watchdog.check_on(NcclResult::ncclInProgress, &mut fake, "ncclBroadcast"),
        Ok(())
    );
    assert_eq!((fake.polls, fake.aborts), (4, 0));
    // ...within the deadline.
    let mut fake = Fake::hanging();
    let err = Watchdog::abort_after(Duration::from_millis(20))
        .check_on(NcclResult::ncclInProgress, &mut fake, "ncclBroadcast")
        .expect_err("never leaves ncclInProgress");
    assert!(err.is_timeout(), "{err}");
    assert_eq!(fake.aborts, 1);
    // A call that failed outright: its own error, and the communicator is given up on.
    let mut fake = Fake::done_after(1);
    let err = watchdog
        .check_on(NcclResult::ncclInvalidUsage, &mut fake, "ncclAllGather")
        .expect_err("failed");
    let WaitError::Failed { error, .. } = &err else {
        panic!("{err:?}")
    };
    assert!(
        matches!(**error, GpuError::Nccl { code, ref context, .. } if code == NcclResult::ncclInvalidUsage && context == "ncclAllGather"),
        "{err}"
    );
    assert_eq!(fake.aborts, 1);
    // ...unless NCCL refuses the handle: then nothing is aborted.
    let mut fake = Fake::answering(Poll::Refused(nccl_error(NcclResult::ncclInvalidArgument)));
    let err = watchdog
        .check_on(NcclResult::ncclInvalidArgument, &mut fake, "ncclAllGather")
        .expect_err("refused");
    assert!(matches!(err, WaitError::Refused { .. }), "{err:?}");
    assert_eq!(fake.aborts, 0);
}

#[cfg(nccl_2_29)]
#[test]
fn revoking_waits_for_quiescence_and_aborts_what_does_not_quiesce() {
    // Both revoked, quiescent after a few polls: nothing aborted.
    let (mut failing, mut hanging) = (
        Fake {
            revoked_polls_until_quiet: Some(3),
            ..Fake::answering(Poll::Failed(nccl_error(NcclResult::ncclRemoteError)))
        },
        Fake {
            revoked_polls_until_quiet: Some(5),
            ..Fake::hanging()
        },
    );
    let err = Watchdog::revoke_after(Duration::from_secs(10))
        .wait(&mut [&mut failing, &mut hanging], "x")
        .expect_err("one failed");
    let WaitError::Failed {
        gave_up: GiveUp::Revoke,
        give_up_error: None,
        ..
    } = &err
    else {
        panic!("{err:?}")
    };
    assert!(
        err.to_string().contains("revoked and is quiescent"),
        "{err}"
    );
    assert_eq!((failing.revokes, hanging.revokes), (1, 1));
    assert_eq!((failing.aborts, hanging.aborts), (0, 0));
    assert!(hanging.revoked_polls >= 5);

    // One never quiesces: after the deadline every communicator is aborted, and the error says why.
    let (mut quiet, mut stuck) = (
        Fake {
            revoked_polls_until_quiet: Some(1),
            ..Fake::hanging()
        },
        Fake::hanging(),
    );
    let start = Instant::now();
    let timeout = Duration::from_millis(50);
    let err = Watchdog::revoke_after(timeout)
        .wait(&mut [&mut quiet, &mut stuck], "x")
        .expect_err("hangs");
    // The wait's deadline, then the quiescence deadline; 1 s of slack for a loaded machine.
    assert!(start.elapsed() < 2 * timeout + Duration::from_secs(1));
    assert!(err.is_timeout(), "{err:?}");
    let why = why_aborted(&err);
    // The watchdog's own finding, not an NCCL status (nor NCCL's unrelated last-error text).
    assert!(
        matches!(*why, GiveUpError::NotQuiescent { waited } if waited >= timeout),
        "{why:?}"
    );
    assert!(
        why.to_string()
            .starts_with("revoked, but not quiescent after 0.0"),
        "{why}"
    );
    assert_eq!((quiet.aborts, stuck.aborts), (1, 1));

    // Quiescent, but NCCL still reports the error its proxy saw (a peer's sockets closed): NCCL refuses
    // to shrink such a communicator, so every communicator of the wait is aborted, and the error says why.
    let (mut quiet, mut failed) = (
        Fake {
            revoked_polls_until_quiet: Some(2),
            ..Fake::hanging()
        },
        Fake {
            revoked_answer: Some(Poll::Failed(nccl_error(NcclResult::ncclRemoteError))),
            ..Fake::answering(Poll::Failed(nccl_error(NcclResult::ncclRemoteError)))
        },
    );
    let err = Watchdog::revoke_after(Duration::from_secs(10))
        .wait(&mut [&mut quiet, &mut failed], "x")
        .expect_err("failed");
    assert!(err.is_remote(), "{err:?}");
    assert!(
        matches!(why_aborted(&err), GiveUpError::FailedAfterRevoke(GpuError::Nccl { code, .. }) if *code == NcclResult::ncclRemoteError),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("the communicator was aborted (giving up: revoked, but still failed"),
        "{err}"
    );
    assert_eq!((quiet.revokes, failed.revokes), (1, 1));
    assert_eq!((quiet.aborts, failed.aborts), (1, 1));
}

#[cfg(nccl_2_29)]
#[test]
fn revoking_leaves_alone_what_nccl_refused_and_aborts_what_cannot_revoke() {
    // Item 0 fails, item 1 is refused in the same round: the revoke and the abort leave item 1 alone.
    let (mut failing, mut refused) = (
        Fake {
            revoked_polls_until_quiet: Some(1),
            ..Fake::answering(Poll::Failed(nccl_error(NcclResult::ncclRemoteError)))
        },
        Fake::answering(Poll::Refused(nccl_error(NcclResult::ncclInvalidArgument))),
    );
    let err = Watchdog::revoke_after(Duration::from_secs(10))
        .wait(&mut [&mut failing, &mut refused], "x")
        .expect_err("failed");
    assert!(err.is_remote(), "{err:?}");
    assert_eq!(err.gave_up(), Some(GiveUp::Revoke));
    assert_eq!((failing.revokes, refused.revokes), (1, 0));
    assert_eq!(
        refused.aborts, 0,
        "aborting a refused handle writes through it"
    );

    // A Watched without revoke: aborted, and the reason is the watchdog's own, not an NCCL error.
    let mut plain = NoRevoke(Fake::hanging());
    let err = Watchdog::revoke_after(Duration::from_millis(20))
        .wait(&mut [&mut plain], "x")
        .expect_err("hangs");
    assert_eq!(why_aborted(&err), &GiveUpError::CannotRevoke);
    assert_eq!(plain.0.aborts, 1);
}

#[test]
fn the_callers_own_news_cancels_the_wait_without_dressing_as_nccl() {
    let mut fake = Fake::answering(Poll::Cancel("the rendezvous: rank 3 died".into()));
    let err = wait(&mut fake, Duration::from_secs(10), "all-reduce 12").expect_err("cancelled");
    let WaitError::Cancelled {
        context,
        reason,
        gave_up: GiveUp::Abort,
        give_up_error: None,
    } = &err
    else {
        panic!("{err:?}")
    };
    assert_eq!(
        (context.as_str(), reason.as_str()),
        ("all-reduce 12", "the rendezvous: rank 3 died")
    );
    assert!(!err.is_remote() && !err.is_timeout(), "{err}");
    assert_eq!(fake.aborts, 1);
    assert_eq!(
        err.to_string(),
        "all-reduce 12: given up: the rendezvous: rank 3 died; the communicator was aborted"
    );
    // Nothing underneath: the reason is the caller's, with no NCCL code or NCCL text attached.
    assert!(std::error::Error::source(&err).is_none());
}

#[test]
fn work_given_up_on_before_is_never_touched_again() {
    let mut gone = Fake::answering(Poll::Abandoned);
    let start = Instant::now();
    let err = wait(&mut gone, Duration::from_secs(10), "x").expect_err("abandoned");
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "it returns at once"
    );
    assert!(
        matches!(
            err,
            WaitError::Abandoned {
                others: None,
                give_up_error: None,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!((gone.polls, gone.aborts), (1, 0));
    assert!(
        err.to_string().contains("nothing was called on it"),
        "{err}"
    );
    // The check of a failed call on it gives up on nothing either.
    let err = Watchdog::abort_after(Duration::from_secs(10))
        .check_on(NcclResult::ncclInvalidUsage, &mut gone, "ncclAllReduce")
        .expect_err("abandoned");
    assert!(matches!(err, WaitError::Abandoned { .. }), "{err:?}");
    assert_eq!(gone.aborts, 0);
    // Beside others: they are given up on, it is not.
    let (mut gone, mut other) = (Fake::answering(Poll::Abandoned), Fake::hanging());
    let err = Watchdog::abort_after(Duration::from_secs(10))
        .wait(&mut [&mut other, &mut gone], "x")
        .expect_err("abandoned");
    assert_eq!(err.gave_up(), Some(GiveUp::Abort));
    assert!(
        err.to_string()
            .ends_with("nothing was called on it; the wait's other communicators were aborted"),
        "{err}"
    );
    assert_eq!((gone.aborts, other.aborts), (0, 1));
}

/// A Watched that hands over an abort which returns once its gate opens, and says when its thread
/// released what it held after the wait stopped waiting.
struct HandsOver {
    gate: Option<std::sync::mpsc::Receiver<()>>,
    released: std::sync::mpsc::Sender<&'static str>,
    forgotten: u32,
    /// The thread the call ran on.
    ran_on: std::sync::Arc<std::sync::Mutex<Option<std::thread::ThreadId>>>,
}

impl HandsOver {
    fn new(
        gate: std::sync::mpsc::Receiver<()>,
        released: std::sync::mpsc::Sender<&'static str>,
    ) -> Self {
        HandsOver {
            gate: Some(gate),
            released,
            forgotten: 0,
            ran_on: Default::default(),
        }
    }
}

impl Watched for HandsOver {
    fn poll(&mut self) -> Poll {
        Poll::Running
    }
    fn abort(&mut self) -> Result<(), GpuError> {
        panic!("the watchdog makes the handed-over call, not this one")
    }
    fn hand_over(&mut self, _: GiveUp) -> GiveUpCall {
        let gate = self.gate.take().expect("handed over once");
        let released = self.released.clone();
        let ran_on = std::sync::Arc::clone(&self.ran_on);
        GiveUpCall::new("the fake's abort", move || {
            *ran_on.lock().expect("not poisoned") = Some(std::thread::current().id());
            let _ = gate.recv();
            Ok(())
        })
        .or_if_late(move || {
            let _ = released.send("released late");
        })
    }
    fn forget(&mut self) {
        self.forgotten += 1;
    }
}

#[test]
fn a_handed_over_call_past_its_bound_is_forgotten_and_released_by_its_thread_when_it_returns() {
    let (open, gate) = std::sync::mpsc::channel();
    let (released, late) = std::sync::mpsc::channel();
    let mut item = HandsOver::new(gate, released);
    let dog = Watchdog::abort_after(Duration::from_millis(50))
        .with_give_up_bound(GiveUpBound::Return(Duration::from_millis(50)));
    let err = dog.wait(&mut [&mut item], "x").expect_err("hangs");
    assert!(err.is_stuck() && err.is_timeout(), "{err:?}");
    assert_eq!(
        item.forgotten, 1,
        "the stuck item was told to forget its handle"
    );
    assert!(
        err.to_string()
            .contains("the fake's abort had not returned after 0.050 s"),
        "{err}"
    );
    assert!(late.try_recv().is_err(), "released before it returned");
    open.send(()).expect("the call still waits");
    assert_eq!(
        late.recv_timeout(Duration::from_secs(10)),
        Ok("released late")
    );
    let ran_on = *item.ran_on.lock().expect("not poisoned");
    assert!(
        ran_on.is_some() && ran_on != Some(std::thread::current().id()),
        "{ran_on:?}"
    );
}

#[test]
fn without_a_bound_the_handed_over_call_is_made_on_the_waiting_thread() {
    let (open, gate) = std::sync::mpsc::channel();
    let (released, late) = std::sync::mpsc::channel();
    let mut item = HandsOver::new(gate, released);
    open.send(()).expect("the gate is open before the call");
    let waiting = std::thread::current().id();
    let dog =
        Watchdog::abort_after(Duration::from_millis(20)).with_give_up_bound(GiveUpBound::Unbounded);
    let err = dog.wait(&mut [&mut item], "x").expect_err("hangs");
    assert!(!err.is_stuck() && err.give_up_error().is_none(), "{err:?}");
    assert_eq!(item.forgotten, 0);
    assert!(late.try_recv().is_err(), "nothing is late without a bound");
    assert_eq!(*item.ran_on.lock().expect("not poisoned"), Some(waiting));
}
