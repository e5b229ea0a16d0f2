//! [`CommWork`]: a communicator and the work queued on a stream, as the waits poll and give up on them.

#[cfg(nccl_2_29)]
use super::GiveUpError;
use super::{Poll, Watched};
use crate::bindings::{ncclCommAbort, ncclCommGetAsyncError, ncclComm_t, ncclResult_t, CUstream};
use crate::error::{check_nccl, GpuError};

/// A communicator and, optionally, a stream whose queued work on it is awaited: what the waits poll, for
/// a [`Watched`] of one's own that watches more (another source of failure, say) and hands the rest to
/// it.
///
/// Once given up on by an abort, or refused by NCCL, it forgets the handle: every later poll answers
/// [`Poll::Abandoned`] and every later abort or revoke does nothing, so no safe call through it reaches
/// NCCL with a freed or refused handle.
pub struct CommWork {
    /// `None` once aborted or refused: never touched again.
    comm: Option<ncclComm_t>,
    stream: Option<CUstream>,
}

impl CommWork {
    /// `comm`, and the work queued on `stream` when given.
    ///
    /// # Safety
    /// As for [`Watchdog::wait_all`](super::Watchdog::wait_all), for as long as it is polled or given up
    /// on: the handles are live and used by no other thread meanwhile.
    pub unsafe fn new(comm: ncclComm_t, stream: Option<CUstream>) -> CommWork {
        CommWork {
            comm: Some(comm),
            stream,
        }
    }

    /// True once it was aborted, or NCCL refused its handle: it will never touch the handle again.
    pub fn is_abandoned(&self) -> bool {
        self.comm.is_none()
    }

    /// `ncclCommGetAsyncError`'s state, or the poll that the call's own failure means (a refused handle
    /// is forgotten).
    fn state(&mut self) -> Result<ncclResult_t, Poll> {
        let Some(comm) = self.comm else {
            return Err(Poll::Abandoned);
        };
        let mut state = ncclResult_t::ncclSuccess;
        // SAFETY: a live communicator, as `new`'s caller promised, not aborted (that forgets it); state is
        // valid for writes.
        let result = unsafe { ncclCommGetAsyncError(comm, &mut state) };
        match check_nccl(result, "ncclCommGetAsyncError") {
            Ok(()) => Ok(state),
            // NULL, or no communicator's magic words where the handle points: nothing there to abort.
            Err(e) if result == ncclResult_t::ncclInvalidArgument => {
                self.comm = None;
                Err(Poll::Refused(e))
            }
            Err(e) => Err(Poll::Failed(e)),
        }
    }

    /// `Some(false)` while the stream (if any) still runs work.
    fn stream_done(&self) -> Result<bool, GpuError> {
        match self.stream {
            // SAFETY: a live stream, as `new`'s caller promised.
            Some(stream) => unsafe { crate::stream::stream_ready(stream) },
            None => Ok(true),
        }
    }
}

impl Watched for CommWork {
    fn poll(&mut self) -> Poll {
        // An asynchronous error first: a dead peer leaves the stream spinning forever. And a non-blocking
        // communicator may still be enqueueing (ncclInProgress) while the stream looks idle.
        let state = match self.state() {
            Ok(state) => state,
            Err(poll) => return poll,
        };
        if state == ncclResult_t::ncclInProgress {
            return Poll::Running;
        }
        if let Err(e) = check_nccl(state, "the communicator (ncclCommGetAsyncError)") {
            return Poll::Failed(e);
        }
        match self.stream_done() {
            Ok(true) => Poll::Done,
            Ok(false) => Poll::Running,
            Err(e) => Poll::Failed(e),
        }
    }

    fn abort(&mut self) -> Result<(), GpuError> {
        let Some(comm) = self.comm.take() else {
            return Ok(()); // aborted or refused before: nothing to do, nothing to touch
        };
        // SAFETY: a live communicator (not refused, not aborted before), forgotten above, so that
        // nothing calls NCCL with it again.
        check_nccl(unsafe { ncclCommAbort(comm) }, "ncclCommAbort")
    }

    #[cfg(nccl_2_29)]
    fn revoke(&mut self) -> Result<(), GiveUpError> {
        use crate::bindings::{ncclCommRevoke, NCCL_REVOKE_DEFAULT};
        let Some(comm) = self.comm else {
            return Err(GiveUpError::CannotRevoke);
        };
        // SAFETY: a live communicator (not refused, not aborted); the flags are nccl.h's only value.
        let result = unsafe { ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT as i32) };
        // A non-blocking communicator answers ncclInProgress (seen on the GPU host): the revoke has
        // begun, and `poll_revoked` waits for quiescence.
        if result == ncclResult_t::ncclInProgress {
            return Ok(());
        }
        Ok(check_nccl(result, "ncclCommRevoke")?)
    }

    #[cfg(nccl_2_29)]
    fn poll_revoked(&mut self) -> Result<bool, GpuError> {
        // The revoke's job sets the state when it ends (ncclInProgress until then). ncclCommGetAsyncError
        // then reports what the proxy thread saw before the revoke stopped it (ncclRemoteError when a
        // peer's sockets closed): an error that the revoke does not clear, and that makes NCCL refuse
        // to shrink, split or destroy the communicator.
        match self.state() {
            Ok(ncclResult_t::ncclInProgress) => Ok(false),
            Ok(state) => {
                check_nccl(state, "the revoked communicator (ncclCommGetAsyncError)")?;
                // The collective's kernel leaves the caller's stream once it sees the abort flag.
                self.stream_done()
            }
            Err(Poll::Failed(e) | Poll::Refused(e)) => Err(e),
            Err(_) => Err(GpuError::from(super::WaitError::Abandoned {
                context: "the revoked communicator".into(),
                others: None,
                abort_error: None,
            })),
        }
    }
}
