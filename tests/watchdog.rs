//! The deadline waits' logic, against fakes (the GPU suite runs them against real communicators): they
//! return as soon as the work is done, give up within their bound, abort exactly once on failure, classify
//! the error, and back off rather than spin.

use std::time::{Duration, Instant};

use metrale_gpu_sys::nccl::*;
use metrale_gpu_sys::watchdog::{self, wait_until, WaitError, Watched, MAX_POLL_INTERVAL};

/// Done after `polls_until_done` polls (never if `None`), or failing with `error` at the first poll.
struct Fake {
    polls: u32,
    polls_until_done: Option<u32>,
    error: Option<GpuError>,
    aborts: u32,
}

impl Fake {
    fn new(polls_until_done: Option<u32>, error: Option<GpuError>) -> Fake {
        Fake {
            polls: 0,
            polls_until_done,
            error,
            aborts: 0,
        }
    }
}

impl Watched for Fake {
    fn done(&mut self) -> Result<bool, GpuError> {
        self.polls += 1;
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        Ok(self.polls_until_done.is_some_and(|n| self.polls >= n))
    }
    fn abort(&mut self) -> Result<(), GpuError> {
        self.aborts += 1;
        Ok(())
    }
}

fn nccl_error(code: NcclResult) -> GpuError {
    check_nccl(code, "ncclCommGetAsyncError").expect_err("a failure code")
}

#[test]
fn finished_work_returns_without_abort() {
    let mut fake = Fake::new(Some(5), None);
    assert_eq!(wait_until(&mut fake, Duration::from_secs(10), "x"), Ok(()));
    assert_eq!((fake.polls, fake.aborts), (5, 0));
}

#[test]
fn a_hang_times_out_within_its_bound_aborts_once_and_does_not_spin() {
    let timeout = Duration::from_millis(200);
    let mut fake = Fake::new(None, None);
    let start = Instant::now();
    let err = wait_until(&mut fake, timeout, "all-reduce on rank 0").expect_err("never done");
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
    let mut fake = Fake::new(None, Some(nccl_error(NcclResult::ncclRemoteError)));
    let err = wait_until(&mut fake, Duration::from_secs(10), "x").expect_err("peer died");
    assert!(err.is_remote() && !err.is_timeout(), "{err}");
    assert_eq!((fake.polls, fake.aborts), (1, 1));
    let msg = err.to_string();
    assert!(msg.starts_with("a peer failed: ncclCommGetAsyncError failed: NCCL error 6 (remote process exited or there was a network error)"), "{msg}");
}

#[test]
fn other_errors_are_neither_timeout_nor_remote() {
    let mut fake = Fake::new(None, Some(nccl_error(NcclResult::ncclUnhandledCudaError)));
    let err = wait_until(&mut fake, Duration::from_secs(10), "x").expect_err("failed");
    assert!(!err.is_remote() && !err.is_timeout(), "{err}");
    assert!(matches!(
        err,
        WaitError::Failed {
            abort_error: None,
            ..
        }
    ));
}

#[test]
fn a_null_communicator_is_an_error_not_a_crash() {
    // SAFETY: NCCL checks the handle: NULL is reported as an invalid argument, and aborting NULL is a no-op.
    let err = unsafe { watchdog::wait_comm_ready(std::ptr::null_mut(), Duration::from_secs(5)) }
        .expect_err("NULL is no communicator");
    let WaitError::Failed { error, .. } = &err else {
        panic!("{err}")
    };
    let GpuError::Nccl { code, text, .. } = &**error else {
        panic!("{err}")
    };
    assert_eq!(*code, NcclResult::ncclInvalidArgument, "{err}");
    assert!(text.contains("invalid argument"), "{err}");
}
