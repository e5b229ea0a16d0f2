//! Waits with a deadline: the way NCCL programs die in production is a hang (a peer process dies, a host
//! drops off, and every surviving rank spins inside a collective). These waits poll the stream and
//! `ncclCommGetAsyncError`, and on an asynchronous error or a passed deadline abort the communicator, so
//! the caller gets an error instead of a hang.
//!
//! This is what PyTorch's ProcessGroupNCCL watchdog does: a thread polls each work item's CUDA event and
//! `ncclCommGetAsyncError`; on an error or after `timeout` it calls `ncclCommAbort` and tears the process
//! group down. Here the thread that owns the communicator polls, and aborts the communicator (its handle is
//! dead afterwards) rather than the process. Only that thread may use the handle: a wait running on another
//! thread while the owner issues collectives, or an `ncclCommAbort` from another thread during a wait,
//! would use a freed communicator. (Aborting from another thread is sound while the owner waits in a call
//! that does not touch the communicator, such as `sync_stream`: the fault suite does exactly that.)
//!
//! Polling backs off from a few microseconds to [`MAX_POLL_INTERVAL`], so a long wait wakes up at most once
//! per 2 ms: it does not hold a core.

use std::time::{Duration, Instant};

use crate::bindings::{ncclCommAbort, ncclCommGetAsyncError, ncclComm_t, ncclResult_t, CUstream};
use crate::error::{check_nccl, GpuError};

/// The longest sleep between two polls.
pub const MAX_POLL_INTERVAL: Duration = Duration::from_millis(2);

/// Why a wait gave up. Every failure has called `ncclCommAbort` on the communicator (`abort_error` says
/// whether that failed too). Remote errors are `Failed` with `ncclRemoteError`: see [`WaitError::is_remote`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WaitError {
    /// The deadline passed with the work still running.
    Timeout {
        /// What was waited for.
        context: String,
        /// How long the wait lasted, the abort included.
        waited: Duration,
        /// The error `ncclCommAbort` itself returned, if any.
        abort_error: Option<Box<GpuError>>,
    },
    /// NCCL reported an error on the communicator: `ncclRemoteError` (a peer failed or left) or another
    /// asynchronous error, with NCCL's text; or a CUDA error on the stream.
    Failed {
        /// The error as NCCL or CUDA reported it.
        error: Box<GpuError>,
        /// The error `ncclCommAbort` itself returned, if any.
        abort_error: Option<Box<GpuError>>,
    },
}

impl WaitError {
    /// True for a timeout.
    pub fn is_timeout(&self) -> bool {
        matches!(self, WaitError::Timeout { .. })
    }

    /// True when NCCL blamed a peer (`ncclRemoteError`): it died, left, or its network failed.
    pub fn is_remote(&self) -> bool {
        matches!(self, WaitError::Failed { error, .. }
            if matches!(**error, GpuError::Nccl { code, .. } if code == ncclResult_t::ncclRemoteError))
    }
}

impl std::fmt::Display for WaitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let abort_error = match self {
            WaitError::Timeout {
                context,
                waited,
                abort_error,
            } => {
                write!(
                    f,
                    "{context} timed out after {:.3} s; the communicator was aborted",
                    waited.as_secs_f64()
                )?;
                abort_error
            }
            WaitError::Failed { error, abort_error } => {
                let kind = if self.is_remote() {
                    "a peer failed"
                } else {
                    "error"
                };
                write!(f, "{kind}: {error}; the communicator was aborted")?;
                abort_error
            }
        };
        match abort_error {
            Some(e) => write!(f, " (ncclCommAbort: {e})"),
            None => Ok(()),
        }
    }
}

impl std::error::Error for WaitError {}

/// What a wait polls, and how it gives up: the communicator and stream in production, fakes in tests.
pub trait Watched {
    /// `Ok(true)` once the awaited work is done.
    fn done(&mut self) -> Result<bool, GpuError>;
    /// Aborts the communicator.
    fn abort(&mut self) -> Result<(), GpuError>;
}

/// Polls `watched` until it is done, it fails, or `timeout` passes; on failure or timeout aborts it.
pub fn wait_until(
    watched: &mut dyn Watched,
    timeout: Duration,
    context: &str,
) -> Result<(), WaitError> {
    let start = Instant::now();
    let mut pause = Duration::from_micros(5);
    loop {
        match watched.done() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(error) => {
                let abort_error = watched.abort().err().map(Box::new);
                return Err(WaitError::Failed {
                    error: Box::new(error),
                    abort_error,
                });
            }
        }
        let waited = start.elapsed();
        if waited >= timeout {
            let abort_error = watched.abort().err().map(Box::new);
            return Err(WaitError::Timeout {
                context: context.to_string(),
                // Until the communicator is aborted: the bound a caller sees.
                waited: start.elapsed(),
                abort_error,
            });
        }
        std::thread::sleep(pause.min(timeout - waited));
        pause = (pause * 2).min(MAX_POLL_INTERVAL);
    }
}

/// A communicator and, optionally, a stream whose queued work on it is awaited.
struct CommWork {
    comm: ncclComm_t,
    stream: Option<CUstream>,
}

impl CommWork {
    /// `ncclCommGetAsyncError`: `Ok(true)` for success, `Ok(false)` while in progress.
    fn comm_ready(&self) -> Result<bool, GpuError> {
        let mut state = ncclResult_t::ncclSuccess;
        // SAFETY: the caller of the public waits promises a live communicator; state is valid for writes.
        check_nccl(
            unsafe { ncclCommGetAsyncError(self.comm, &mut state) },
            "ncclCommGetAsyncError",
        )?;
        if state == ncclResult_t::ncclInProgress {
            return Ok(false);
        }
        check_nccl(state, "the communicator (ncclCommGetAsyncError)").map(|()| true)
    }
}

impl Watched for CommWork {
    fn done(&mut self) -> Result<bool, GpuError> {
        // An asynchronous error first: a dead peer leaves the stream spinning forever. And a non-blocking
        // communicator may still be enqueueing (ncclInProgress) while the stream looks idle.
        let comm_ready = self.comm_ready()?;
        match self.stream {
            // SAFETY: the caller of wait_stream promises a live stream.
            Some(stream) => Ok(comm_ready && unsafe { crate::stream::stream_ready(stream)? }),
            None => Ok(comm_ready),
        }
    }

    fn abort(&mut self) -> Result<(), GpuError> {
        // SAFETY: the communicator is live and, after this call, never used again by the wait.
        check_nccl(unsafe { ncclCommAbort(self.comm) }, "ncclCommAbort")
    }
}

/// Waits for the work queued on `stream` (collectives on `comm`, or anything else) to finish, polling
/// `ncclCommGetAsyncError` as well. On an asynchronous NCCL error (e.g. `ncclRemoteError` when a peer died),
/// a CUDA error on the stream, or when `timeout` passes, aborts `comm` and returns why.
///
/// # Safety
/// `comm` and `stream` are live. After an `Err`, `comm` has been aborted: its handle must not be used
/// again (not even destroyed), and buffers the aborted work used may hold anything.
pub unsafe fn wait_stream(
    comm: ncclComm_t,
    stream: CUstream,
    timeout: Duration,
) -> Result<(), WaitError> {
    wait_until(
        &mut CommWork {
            comm,
            stream: Some(stream),
        },
        timeout,
        "waiting for the stream",
    )
}

/// Waits until a communicator leaves `ncclInProgress`: after a non-blocking `ncclCommInitRankConfig`
/// (`config.blocking = 0`), `ncclCommSplit`, `ncclCommFinalize` or a non-blocking group. On an error or
/// when `timeout` passes (a peer that never arrives) aborts it and returns why.
///
/// # Safety
/// `comm` is a handle the non-blocking call returned. After an `Err` it has been aborted and must not be
/// used again.
pub unsafe fn wait_comm_ready(comm: ncclComm_t, timeout: Duration) -> Result<(), WaitError> {
    wait_until(
        &mut CommWork { comm, stream: None },
        timeout,
        "waiting for the communicator",
    )
}
