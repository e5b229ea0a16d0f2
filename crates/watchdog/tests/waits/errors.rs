//! What the errors hold beyond their text: the chain to the error underneath (`Error::source`), and the
//! watchdog's own findings kept apart from NCCL's statuses.

use std::error::Error;
use std::time::Duration;

use metrale_gpu_sys::nccl::*;
use metrale_gpu_watchdog::{GiveUp, GiveUpError, Poll, WaitError, Watchdog};

use crate::{nccl_error, wait, Fake};

/// The NCCL code at the bottom of `error`'s chain of sources, if NCCL's status is there.
fn nccl_code_underneath(error: &(dyn Error + 'static)) -> Option<NcclResult> {
    let mut at = Some(error);
    while let Some(e) = at {
        if let Some(GpuError::Nccl { code, .. }) = e.downcast_ref::<GpuError>() {
            return Some(*code);
        }
        at = e.source();
    }
    None
}

/// The type of each error of `error`'s chain of sources, from `error` down.
fn levels(error: &(dyn Error + 'static)) -> Vec<&'static str> {
    let mut names = Vec::new();
    let mut at = Some(error);
    while let Some(e) = at {
        names.push(if e.is::<WaitError>() {
            "WaitError"
        } else if e.is::<GiveUpError>() {
            "GiveUpError"
        } else if e.is::<GpuError>() {
            "GpuError"
        } else {
            "another"
        });
        at = e.source();
    }
    names
}

#[test]
fn a_failed_wait_hands_on_the_nccl_error_underneath() {
    let mut fake = Fake::answering(Poll::Failed(nccl_error(NcclResult::ncclRemoteError)));
    let err = wait(&mut fake, Duration::from_secs(10), "step 9").expect_err("failed");
    let source = err.source().expect("the NCCL error underneath");
    assert_eq!(
        source.downcast_ref::<GpuError>().map(
            |e| matches!(e, GpuError::Nccl { code, .. } if *code == NcclResult::ncclRemoteError)
        ),
        Some(true),
        "{source:?}"
    );
    // Every level, one way: the wait, then NCCL's error, a leaf.
    assert_eq!(levels(&err), ["WaitError", "GpuError"]);
    assert!(nccl_error(NcclResult::ncclInternalError).source().is_none());
}

#[test]
fn the_watchdogs_own_findings_are_no_nccl_errors() {
    // A deadline: no NCCL status anywhere in the chain.
    let mut fake = Fake::hanging();
    let err = wait(&mut fake, Duration::from_millis(10), "x").expect_err("hangs");
    assert!(err.is_timeout());
    assert!(err.source().is_none(), "{:?}", err.source());

    // Giving up that met the watchdog's own trouble: not an NCCL error either.
    for finding in [
        GiveUpError::CannotRevoke,
        GiveUpError::NotQuiescent {
            waited: Duration::from_millis(5),
        },
    ] {
        assert!(finding.source().is_none(), "{finding:?}");
        assert!(!finding.to_string().contains("NCCL error"), "{finding}");
    }
    // An abort NCCL failed is NCCL's error, underneath.
    let call = GiveUpError::from(nccl_error(NcclResult::ncclInternalError));
    assert_eq!(
        nccl_code_underneath(&call),
        Some(NcclResult::ncclInternalError)
    );
    let timeout = WaitError::Timeout {
        context: "x".into(),
        waited: Duration::from_secs(1),
        gave_up: GiveUp::Abort,
        give_up_error: Some(Box::new(call)),
    };
    assert_eq!(
        nccl_code_underneath(timeout.source().expect("what giving up met")),
        Some(NcclResult::ncclInternalError)
    );
    // The wait, what giving up met, and NCCL's error under that: no level skipped.
    assert_eq!(levels(&timeout), ["WaitError", "GiveUpError", "GpuError"]);
    assert!(
        timeout.to_string().starts_with("x timed out after 1.000 s; the communicator was aborted (giving up: ncclCommGetAsyncError failed: NCCL error 3"),
        "{timeout}"
    );
}

#[test]
fn a_non_blocking_check_keeps_the_calls_own_error() {
    let mut fake = Fake::done_after(1);
    let err = Watchdog::abort_after(Duration::from_secs(1))
        .check_on(NcclResult::ncclSystemError, &mut fake, "ncclSend")
        .expect_err("failed");
    assert_eq!(
        nccl_code_underneath(&err),
        Some(NcclResult::ncclSystemError)
    );
    assert!(
        err.to_string()
            .starts_with("ncclSend: error: ncclSend failed: NCCL error 2"),
        "{err}"
    );
}
