//! The crate's `Communicator` and `CommWork`: against NCCL itself with NULL (which NCCL refuses), and
//! against a stand-in for the three calls they make (`counting_nccl.c`, preloaded in a child process),
//! which counts every call made with the handle after its abort: none may be, through the watch that gave
//! up, a later watch over the same communicator, or the communicator itself.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use metrale_gpu_sys::nccl::*;
use metrale_gpu_testkit::skip::skip;
use metrale_gpu_testkit::standin::{Load, StandIn};
#[cfg(nccl_2_29)]
use metrale_gpu_watchdog::GiveUpError;
use metrale_gpu_watchdog::{
    self as watchdog, CommWork, Communicator, GiveUp, GiveUpBound, Poll, WaitError, Watchdog,
    Watched,
};

#[test]
fn a_null_communicator_is_refused_not_aborted_and_then_never_touched() {
    // SAFETY: NCCL checks the handle: NULL is reported as an invalid argument (and nothing is aborted).
    let err = unsafe { watchdog::wait_comm_ready(std::ptr::null_mut(), Duration::from_secs(5)) }
        .expect_err("NULL is no communicator");
    let WaitError::Refused { error, .. } = &err else {
        panic!("{err}")
    };
    let GpuError::Nccl { code, text, .. } = &**error else {
        panic!("{err}")
    };
    assert_eq!(*code, NcclResult::ncclInvalidArgument, "{err}");
    assert!(text.contains("invalid argument"), "{err}");
    // The text claims no more than NCCL's check shows.
    assert!(
        err.to_string()
            .contains("it is NULL or not a communicator NCCL recognises; it was not aborted"),
        "{err}"
    );

    // SAFETY: NULL, which NCCL refuses; the Communicator then forgets it.
    let mut comm = unsafe { Communicator::from_raw(std::ptr::null_mut()) };
    let mut work = CommWork::new(&mut comm);
    let dog = Watchdog::abort_after(Duration::from_secs(5));
    let err = dog.wait(&mut [&mut work], "first").expect_err("refused");
    assert!(matches!(err, WaitError::Refused { .. }), "{err:?}");
    assert!(work.is_abandoned());
    let err = dog.wait(&mut [&mut work], "second").expect_err("forgotten");
    assert!(matches!(err, WaitError::Abandoned { .. }), "{err:?}");
    assert_eq!(work.abort(), Ok(()), "an abort of nothing does nothing");
    assert_eq!(comm.into_raw(), None, "forgotten");
}

/// A `Watched` of one's own around the crate's `CommWork`: it fails the wait on its own news (here a
/// flag; in the elastic example the rendezvous's dead ranks) and hands polls and give-ups to `CommWork`.
struct Composed<'c> {
    work: CommWork<'c>,
    news: Option<String>,
    aborts: u32,
}

impl Watched for Composed<'_> {
    fn poll(&mut self) -> Poll {
        match self.work.poll() {
            Poll::Running => self.news.clone().map_or(Poll::Running, Poll::Cancel),
            other => other,
        }
    }
    fn abort(&mut self) -> Result<(), GpuError> {
        self.aborts += 1;
        self.work.abort()
    }
    #[cfg(nccl_2_29)]
    fn revoke(&mut self) -> Result<(), GiveUpError> {
        self.work.revoke()
    }
    #[cfg(nccl_2_29)]
    fn poll_revoked(&mut self) -> Poll {
        self.work.poll_revoked()
    }
}

#[test]
fn comm_work_composes_into_a_watched_of_ones_own() {
    // SAFETY: NULL is no communicator: NCCL refuses it (ncclInvalidArgument) and it is never aborted.
    let mut comm = unsafe { Communicator::from_raw(std::ptr::null_mut()) };
    let mut composed = Composed {
        work: CommWork::new(&mut comm),
        news: Some("rank 1 died".into()),
        aborts: 0,
    };
    // The communicator's own answer comes first: NCCL refuses NULL, so nothing is given up on.
    let err = Watchdog::abort_after(Duration::from_secs(5))
        .wait(&mut [&mut composed], "composed")
        .expect_err("NULL is no communicator");
    assert!(matches!(err, WaitError::Refused { .. }), "{err:?}");
    assert_eq!(composed.aborts, 0);
}

/// Set in the child: the case it runs against the counting stand-in.
const CHILD: &str = "METRALE_COUNTING_NCCL_CASE";

/// Builds `counting_nccl.c` with nccl.h's codes from the bindings and runs `case` in a child that
/// preloads it; `None` in that child (where the case then runs), else whether the child ran it.
fn in_counting_child(case: &str) -> Option<bool> {
    if std::env::var(CHILD).as_deref() == Ok(case) {
        return None;
    }
    let code = |name: &str, code: NcclResult| format!("-D{name}={}", code.0);
    let flags = [
        code("NCCL_SUCCESS", NcclResult::ncclSuccess),
        code("NCCL_INVALID_ARGUMENT", NcclResult::ncclInvalidArgument),
        code("NCCL_IN_PROGRESS", NcclResult::ncclInProgress),
    ];
    let standin = StandIn {
        cc: env!("METRALE_TARGET_CC"),
        source: concat!(env!("CARGO_MANIFEST_DIR"), "/tests/waits/counting_nccl.c"),
        flags: &flags,
        dir: PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("counting-nccl-{case}")),
        name: "libcounting_nccl.so",
        load: Load::Preload,
    };
    // The harness names a test by its path below the crate: this module's, then the case.
    let text = standin.run(&format!("comm_work::{case}"), &[(CHILD, case.to_string())]);
    let ran = !text.contains("SKIP");
    if !ran {
        skip(format_args!(
            "the child could not preload the stand-in (a cross-built binary?):\n{text}"
        ));
    }
    Some(ran)
}

/// The stand-in's counter `name`, if the stand-in is what this process calls.
fn counter(name: &std::ffi::CStr) -> Option<extern "C" fn() -> i32> {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only looks a symbol up.
    let symbol = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    // SAFETY: the stand-in defines these names as `int name(void)`.
    (!symbol.is_null()).then(|| unsafe {
        std::mem::transmute::<*mut libc::c_void, extern "C" fn() -> i32>(symbol)
    })
}

/// Every safe way to reach an aborted communicator again (the watch that gave up, a second watch over
/// the same `Communicator`, the `Communicator` itself), then the count of calls the stand-in saw with
/// the handle after its abort: all must leave it at 0, and the watchdog says what became of the
/// communicator without asking NCCL.
fn reuse_after_abort(mut work: CommWork, after_abort: extern "C" fn() -> i32) {
    assert!(work.is_abandoned(), "the abort forgot the handle");
    reach_again(&mut work);
    // A second watch over the same communicator, made after the first gave up (the sequence:
    // two watches over one handle, abort one, poll and abort the other).
    let comm = work.communicator();
    let mut second = CommWork::new(comm);
    assert_eq!(second.poll(), Poll::Abandoned);
    assert_eq!(second.abort(), Ok(()));
    reach_again(&mut second);
    let comm = second.communicator();
    assert_eq!((comm.as_raw(), comm.take_raw()), (None, None));
    assert_eq!(
        after_abort(),
        0,
        "calls reached NCCL with the aborted handle"
    );
}

/// Every wait, check, abort and revoke through `work`: each answers at once that it was given up on.
fn reach_again(work: &mut CommWork) {
    let dog = Watchdog::abort_after(Duration::from_millis(50));
    let start = Instant::now();
    let err = dog
        .wait(&mut [&mut *work], "a second wait")
        .expect_err("abandoned");
    assert!(matches!(err, WaitError::Abandoned { .. }), "{err:?}");
    assert!(start.elapsed() < Duration::from_millis(50), "no poll loop");
    assert_eq!(work.abort(), Ok(()));
    for status in [NcclResult::ncclInProgress, NcclResult::ncclInvalidUsage] {
        let err = dog
            .check_on(status, &mut *work, "a check")
            .expect_err("abandoned");
        assert!(matches!(err, WaitError::Abandoned { .. }), "{err:?}");
    }
    #[cfg(nccl_2_29)]
    {
        assert_eq!(work.revoke(), Err(GiveUpError::CannotRevoke));
        let err = Watchdog::revoke_after(Duration::from_millis(50))
            .wait(&mut [&mut *work], "a revoking wait")
            .expect_err("abandoned");
        assert!(matches!(err, WaitError::Abandoned { .. }), "{err:?}");
    }
}

#[test]
fn an_aborted_comm_work_never_calls_nccl_again() {
    if in_counting_child("an_aborted_comm_work_never_calls_nccl_again").is_some() {
        return;
    }
    let (Some(calls), Some(after_abort)) = (
        counter(c"metrale_counting_calls"),
        counter(c"metrale_counting_calls_after_abort"),
    ) else {
        return skip("the counting stand-in is not loaded: no fake handle is made");
    };
    // Handles only the stand-in sees: they never leave ncclInProgress and are never dereferenced.
    let fake = std::ptr::NonNull::<u8>::dangling().as_ptr().cast();
    #[cfg(nccl_2_29)]
    let other_fake = std::ptr::NonNull::<u64>::dangling().as_ptr().cast();

    // Abort mode: the deadline passes, the watchdog aborts once.
    // SAFETY: the stand-in answers for this handle and never dereferences it.
    let mut comm = unsafe { Communicator::from_raw(fake) };
    let mut work = CommWork::new(&mut comm);
    let err = Watchdog::abort_after(Duration::from_millis(50))
        .wait(&mut [&mut work], "all-reduce")
        .expect_err("never done");
    assert!(
        err.is_timeout() && err.gave_up() == Some(GiveUp::Abort),
        "{err:?}"
    );
    assert!(calls() > 1, "the wait polled the stand-in");
    reuse_after_abort(work, after_abort);
    // The communicator itself, aborted again (consumed): nothing to do.
    assert_eq!(comm.abort(), Ok(()));
    assert_eq!(after_abort(), 0, "the owner's abort reached NCCL again");

    // Revoke mode: revoked, never quiescent, then aborted: forgotten just the same.
    #[cfg(nccl_2_29)]
    {
        // SAFETY: as above.
        let mut comm = unsafe { Communicator::from_raw(other_fake) };
        let mut work = CommWork::new(&mut comm);
        let err = Watchdog::revoke_after(Duration::from_millis(20))
            .wait(&mut [&mut work], "all-reduce")
            .expect_err("never done");
        let why = crate::why_aborted(&err);
        assert!(matches!(why, GiveUpError::NotQuiescent { .. }), "{why:?}");
        reuse_after_abort(work, after_abort);
    }
}

/// The stand-in's counters of calls after an abort and of aborts, or a visible skip.
fn abort_counters() -> Option<(extern "C" fn() -> i32, extern "C" fn() -> i32)> {
    let found = (
        counter(c"metrale_counting_calls_after_abort"),
        counter(c"metrale_counting_aborts"),
    );
    match found {
        (Some(after_abort), Some(aborts)) => Some((after_abort, aborts)),
        _ => {
            skip("the counting stand-in is not loaded: no fake handle is made");
            None
        }
    }
}

#[test]
fn wait_all_gives_up_once_on_a_communicator_listed_twice() {
    if in_counting_child("wait_all_gives_up_once_on_a_communicator_listed_twice").is_some() {
        return;
    }
    let Some((after_abort, aborts)) = abort_counters() else {
        return;
    };
    // Handles only the stand-in sees (never ncclInProgress's end, never dereferenced); the streams are
    // never polled while the communicator is in progress.
    let fake: NcclComm = std::ptr::NonNull::<u8>::dangling().as_ptr().cast();
    let other: NcclComm = std::ptr::NonNull::<u64>::dangling().as_ptr().cast();
    let (s1, s2): (CUstream, CUstream) = (std::ptr::null_mut(), std::ptr::null_mut());
    let dog = Watchdog::abort_after(Duration::from_millis(50));
    // SAFETY: the stand-in answers for these handles and never dereferences them; no stream is polled.
    let err = unsafe { dog.wait_all(&[(fake, s1), (other, s1), (fake, s2)]) }.expect_err("hangs");
    assert!(
        err.is_timeout() && err.gave_up() == Some(GiveUp::Abort),
        "{err:?}"
    );
    assert_eq!(aborts(), 2, "each communicator aborted once: {err}");
    assert_eq!(
        after_abort(),
        0,
        "a call reached NCCL with an aborted handle"
    );
}

/// The bound of the blocking cases: the wait's timeout, and the give-up's (the default: the same).
const BLOCKING: Duration = Duration::from_millis(200);

/// A counter of the stand-in's (or its switch).
type Counter = extern "C" fn() -> i32;

/// In the child that runs `case`: the stand-in's counters of calls after an abort and of aborts, and
/// its switch that makes every abort and revoke block for good. `None` in the test's own process (it
/// ran the child), or where the stand-in is not loaded.
fn blocking_standin(case: &str) -> Option<(Counter, Counter, Counter)> {
    if in_counting_child(case).is_some() {
        return None;
    }
    let (after_abort, aborts) = abort_counters()?;
    Some((after_abort, aborts, counter(c"metrale_counting_block")?))
}

#[test]
fn a_blocking_abort_is_left_to_its_thread_and_the_wait_returns_within_its_bound() {
    let case = "a_blocking_abort_is_left_to_its_thread_and_the_wait_returns_within_its_bound";
    let Some((after_abort, aborts, block)) = blocking_standin(case) else {
        return;
    };
    block();
    let fake: NcclComm = std::ptr::NonNull::<u8>::dangling().as_ptr().cast();
    // SAFETY: the stand-in answers for this handle and never dereferences it.
    let mut comm = unsafe { Communicator::from_raw(fake) };
    let mut work = CommWork::new(&mut comm);
    let start = Instant::now();
    let err = Watchdog::abort_after(BLOCKING)
        .wait(&mut [&mut work], "all-reduce")
        .expect_err("never done");
    let took = start.elapsed();
    // The stated bound: the timeout, then the give-up's bound (both 200 ms); a loaded machine may
    // oversleep, and a give-up without a bound would never return, hence the wide margin.
    assert!(
        took >= 2 * BLOCKING && took < 2 * BLOCKING + Duration::from_secs(10),
        "{took:?}"
    );
    assert!(err.is_stuck() && err.is_timeout(), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains(
            "; giving up on the communicator did not end: ncclCommAbort had not returned after 0.200 s: \
             1 communicator(s) stuck inside NCCL, left to a thread of their own and never used again"
        ) && text.ends_with("end it"),
        "{text}"
    );
    assert_eq!(aborts(), 1, "the abort was made, once");
    // The stuck communicator is never used again: every way to reach it answers at once.
    reach_again(&mut work);
    assert_eq!(
        after_abort(),
        0,
        "a call reached NCCL with the stuck handle"
    );
}

/// `Communicator::abort_within`: an abort that returns is its answer; one that blocks is left to its
/// thread once the bound passed, and the error says so; one given up on before calls nothing.
#[test]
fn abort_within_returns_within_its_bound_and_leaves_a_blocking_abort_to_its_thread() {
    let case = "abort_within_returns_within_its_bound_and_leaves_a_blocking_abort_to_its_thread";
    let Some((after_abort, aborts, block)) = blocking_standin(case) else {
        return;
    };
    let fake: NcclComm = std::ptr::NonNull::<u8>::dangling().as_ptr().cast();
    // SAFETY: the stand-in answers for this handle and never dereferences it.
    let comm = unsafe { Communicator::from_raw(fake) };
    assert_eq!(comm.abort_within(BLOCKING), Ok(()));
    assert_eq!(aborts(), 1, "aborted once");
    // SAFETY: as above.
    let mut taken = unsafe { Communicator::from_raw(fake) };
    assert_eq!(taken.take_raw(), Some(fake));
    assert_eq!(taken.abort_within(BLOCKING), Ok(()), "nothing to abort");
    assert_eq!(aborts(), 1, "a handle taken back is not aborted");

    block();
    let other: NcclComm = std::ptr::NonNull::<u64>::dangling().as_ptr().cast();
    // SAFETY: as above.
    let comm = unsafe { Communicator::from_raw(other) };
    let start = Instant::now();
    let err = comm.abort_within(BLOCKING).expect_err("blocked for good");
    let took = start.elapsed();
    // The stated bound (200 ms); a loaded machine may oversleep, an unbounded abort never returns.
    assert!(
        took >= BLOCKING && took < BLOCKING + Duration::from_secs(10),
        "{took:?}"
    );
    assert!(
        matches!(
            err,
            watchdog::GiveUpError::Stuck {
                call: "ncclCommAbort",
                communicators: 1,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(aborts(), 2, "the abort was made, once");
    assert_eq!(
        after_abort(),
        0,
        "a call reached NCCL with an aborted handle"
    );
}

#[cfg(nccl_2_29)]
#[test]
fn a_blocking_revoke_is_left_to_its_thread_and_its_communicator_is_not_aborted() {
    let case = "a_blocking_revoke_is_left_to_its_thread_and_its_communicator_is_not_aborted";
    if in_counting_child(case).is_some() {
        return;
    }
    let (Some((_, aborts)), Some(calls), Some(block)) = (
        abort_counters(),
        counter(c"metrale_counting_calls"),
        counter(c"metrale_counting_block"),
    ) else {
        return;
    };
    block();
    let fake: NcclComm = std::ptr::NonNull::<u8>::dangling().as_ptr().cast();
    // SAFETY: the stand-in answers for this handle and never dereferences it.
    let mut comm = unsafe { Communicator::from_raw(fake) };
    let mut work = CommWork::new(&mut comm);
    let err = Watchdog::revoke_after(BLOCKING)
        .wait(&mut [&mut work], "all-reduce")
        .expect_err("never done");
    assert!(err.is_stuck(), "{err:?}");
    assert!(
        err.to_string()
            .contains("ncclCommRevoke had not returned after 0.200 s"),
        "{err}"
    );
    let seen = calls();
    assert_eq!(aborts(), 0, "an abort beside the stuck revoke: {err}");
    reach_again(&mut work);
    assert_eq!(calls(), seen, "a call reached NCCL with the stuck handle");
}

/// Set in the grandchild that ends itself.
const ENDS: &str = "METRALE_COUNTING_ENDS";

#[test]
fn a_blocking_abort_with_end_process_ends_the_process_saying_why() {
    let case = "a_blocking_abort_with_end_process_ends_the_process_saying_why";
    if in_counting_child(case).is_some() {
        return;
    }
    let Some(block) = counter(c"metrale_counting_block") else {
        return skip("the counting stand-in is not loaded: no fake handle is made");
    };
    if std::env::var_os(ENDS).is_none() {
        // The child: the grandchild (with the same stand-in preloaded) must end, by SIGABRT, saying why.
        let test = format!("comm_work::{case}");
        let out = metrale_gpu_testkit::child::test_command(&test, &[(ENDS, "1".into())])
            .output()
            .expect("the grandchild runs");
        let text = String::from_utf8_lossy(&out.stderr);
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGABRT),
            "{:?}\n{text}",
            out.status
        );
        assert!(
            text.contains(
                "metrale-gpu-watchdog: ncclCommAbort had not returned after 0.200 s: 1 communicator(s) \
                 stuck inside NCCL"
            ) && text.contains("end it: ending the process"),
            "{text}"
        );
        return;
    }
    block();
    let fake: NcclComm = std::ptr::NonNull::<u8>::dangling().as_ptr().cast();
    // SAFETY: the stand-in answers for this handle and never dereferences it.
    let mut comm = unsafe { Communicator::from_raw(fake) };
    let dog = Watchdog::abort_after(BLOCKING).with_give_up_bound(GiveUpBound::EndProcess(BLOCKING));
    let err = dog.wait(&mut [&mut CommWork::new(&mut comm)], "all-reduce");
    panic!("the process should have ended: {err:?}");
}
