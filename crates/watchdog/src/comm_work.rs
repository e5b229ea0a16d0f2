//! [`CommWork`]: a communicator and the work queued on a stream, as the waits poll and give up on them.

use metrale_gpu_sys::nccl::{check_nccl, ncclCommGetAsyncError, ncclResult_t, CUstream, GpuError};

#[cfg(nccl_2_29)]
use crate::GiveUpError;
use crate::{Communicator, Poll, Watched};

/// A [`Communicator`], borrowed, and optionally a stream whose queued work on it is awaited: what the
/// waits poll, for a [`Watched`] of one's own that watches more (another source of failure, say) and
/// hands the rest to it.
///
/// Giving up by an abort aborts the communicator in place, and NCCL's refusal of the handle forgets it:
/// either way every later poll (through this watch or any later one over the same [`Communicator`])
/// answers [`Poll::Abandoned`] and every later abort or revoke does nothing, so no safe call reaches NCCL
/// with a freed or refused handle.
pub struct CommWork<'c> {
    comm: &'c mut Communicator,
    stream: Option<CUstream>,
}

impl<'c> CommWork<'c> {
    /// The communicator alone: a wait ends once NCCL stops reporting `ncclInProgress` on it.
    pub fn new(comm: &'c mut Communicator) -> CommWork<'c> {
        CommWork { comm, stream: None }
    }

    /// The communicator and the work queued on `stream` (collectives on it, or anything else).
    ///
    /// # Safety
    /// `stream` is a live stream (see `metrale_gpu_sys::stream`), used by no other thread while this
    /// watch is polled or given up on.
    pub unsafe fn on_stream(comm: &'c mut Communicator, stream: CUstream) -> CommWork<'c> {
        CommWork {
            comm,
            stream: Some(stream),
        }
    }

    /// True once the communicator was aborted, NCCL refused its handle, or the handle was taken back:
    /// nothing will touch the handle again.
    pub fn is_abandoned(&self) -> bool {
        self.comm.is_abandoned()
    }

    /// The communicator: to take its handle back ([`Communicator::take_raw`]) for a release of one's own.
    pub fn communicator(&mut self) -> &mut Communicator {
        self.comm
    }

    /// `ncclCommGetAsyncError`'s state, or the poll that the call's own failure means (a refused handle
    /// is forgotten).
    fn state(&mut self) -> Result<ncclResult_t, Poll> {
        let Some(comm) = self.comm.as_raw() else {
            return Err(Poll::Abandoned);
        };
        let mut state = ncclResult_t::ncclSuccess;
        // SAFETY: a live communicator owned by the borrowed `Communicator` (its `from_raw` contract), not
        // aborted (that forgets it); state is valid for writes.
        let result = unsafe { ncclCommGetAsyncError(comm, &mut state) };
        match check_nccl(result, "ncclCommGetAsyncError") {
            Ok(()) => Ok(state),
            // NULL, or no communicator's magic words where the handle points: nothing there to abort.
            Err(e) if result == ncclResult_t::ncclInvalidArgument => {
                self.comm.forget_refused();
                Err(Poll::Refused(e))
            }
            Err(e) => Err(Poll::Failed(e)),
        }
    }

    /// `Some(false)` while the stream (if any) still runs work.
    fn stream_done(&self) -> Result<bool, GpuError> {
        match self.stream {
            // SAFETY: a live stream, as `on_stream`'s caller promised.
            Some(stream) => unsafe { metrale_gpu_sys::stream::stream_ready(stream) },
            None => Ok(true),
        }
    }

    /// The stream's answer, as a poll.
    fn poll_stream(&self) -> Poll {
        match self.stream_done() {
            Ok(true) => Poll::Done,
            Ok(false) => Poll::Running,
            Err(e) => Poll::Failed(e),
        }
    }
}

impl Watched for CommWork<'_> {
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
        self.poll_stream()
    }

    fn abort(&mut self) -> Result<(), GpuError> {
        self.comm.abort_in_place()
    }

    #[cfg(nccl_2_29)]
    fn revoke(&mut self) -> Result<(), GiveUpError> {
        use metrale_gpu_sys::nccl::{ncclCommRevoke, NCCL_REVOKE_DEFAULT};
        let Some(comm) = self.comm.as_raw() else {
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
    fn poll_revoked(&mut self) -> Poll {
        // The revoke's job sets the state when it ends (ncclInProgress until then). ncclCommGetAsyncError
        // then reports what the proxy thread saw before the revoke stopped it (ncclRemoteError when a
        // peer's sockets closed): an error that the revoke does not clear, and that makes NCCL refuse
        // to shrink, split or destroy the communicator.
        match self.state() {
            Ok(ncclResult_t::ncclInProgress) => Poll::Running,
            Ok(state) => {
                match check_nccl(state, "the revoked communicator (ncclCommGetAsyncError)") {
                    // The collective's kernel leaves the caller's stream once it sees the abort flag.
                    Ok(()) => self.poll_stream(),
                    Err(e) => Poll::Failed(e),
                }
            }
            Err(poll) => poll,
        }
    }
}
