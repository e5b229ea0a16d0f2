//! [`CommWork`]: a communicator and the work queued on a stream, as the waits poll and give up on them.

use metrale_gpu_sys::nccl::{check_nccl, ncclCommGetAsyncError, ncclResult_t, CUstream, GpuError};

use crate::communicator::Handed;
#[cfg(nccl_2_29)]
use crate::GiveUpError;
use crate::{Communicator, GiveUp, GiveUpCall, Poll, Watched};

/// A [`Communicator`], borrowed, and the streams (none, one, or several) whose queued work on it is
/// awaited: what the waits poll, for a [`Watched`] of one's own that watches more (another source of
/// failure, say) and hands the rest to it.
///
/// Giving up by an abort forgets the handle before the abort is made, and NCCL's refusal of the handle
/// forgets it too; so does a give-up call left to its thread ([`Watched::forget`]). Every later poll
/// (through this watch or any later one over the same [`Communicator`]) then answers
/// [`Poll::Abandoned`] and every later abort or revoke does nothing, so no safe call reaches NCCL with a
/// freed, refused or stuck handle.
pub struct CommWork<'c> {
    comm: &'c mut Communicator,
    streams: Vec<CUstream>,
}

impl<'c> CommWork<'c> {
    /// The communicator alone: a wait ends once NCCL stops reporting `ncclInProgress` on it.
    pub fn new(comm: &'c mut Communicator) -> CommWork<'c> {
        CommWork {
            comm,
            streams: Vec::new(),
        }
    }

    /// The communicator and the work queued on `stream` (collectives on it, or anything else).
    ///
    /// # Safety
    /// `stream` is a live stream (see `metrale_gpu_sys::stream`), used by no other thread while this
    /// watch is polled or given up on.
    pub unsafe fn on_stream(comm: &'c mut Communicator, stream: CUstream) -> CommWork<'c> {
        // SAFETY: the caller's promise, for the one stream.
        unsafe { CommWork::on_streams(comm, vec![stream]) }
    }

    /// The communicator and the work queued on each of `streams`: done once all are.
    ///
    /// # Safety
    /// As for [`on_stream`](Self::on_stream), for each stream.
    pub unsafe fn on_streams(comm: &'c mut Communicator, streams: Vec<CUstream>) -> CommWork<'c> {
        CommWork { comm, streams }
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

    /// `Ok(false)` while a stream still runs work.
    fn stream_done(&self) -> Result<bool, GpuError> {
        for &stream in &self.streams {
            // SAFETY: a live stream, as `on_stream`'s caller promised.
            if !unsafe { metrale_gpu_sys::stream::stream_ready(stream) }? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The streams' answer, as a poll.
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

    /// The abort or revoke as a call on the raw handle, for the watchdog to make on a thread of its own.
    /// An abort forgets the handle first; a revoke keeps it (the communicator is used again once the
    /// revoke returned in time), and aborts it on its thread if it returns late.
    fn hand_over(&mut self, how: GiveUp) -> GiveUpCall {
        match how {
            GiveUp::Abort => match self.comm.take_raw() {
                None => GiveUpCall::made(Ok(())), // given up on before: nothing to touch
                Some(comm) => {
                    let handed = Handed(comm);
                    // SAFETY: a live communicator (not refused, not aborted: those are forgotten),
                    // forgotten above: the call's thread is the only one to touch it again.
                    GiveUpCall::new("ncclCommAbort", move || Ok(unsafe { handed.abort() }?))
                }
            },
            #[cfg(nccl_2_29)]
            GiveUp::Revoke => match self.comm.as_raw() {
                None => GiveUpCall::made(Err(GiveUpError::CannotRevoke)),
                Some(comm) => {
                    let handed = Handed(comm);
                    // SAFETY: a live communicator, which the waiting thread leaves alone while the
                    // revoke runs, and forgets if it stops waiting (`forget`).
                    GiveUpCall::new("ncclCommRevoke", move || unsafe { revoke(handed.get()) })
                        // SAFETY: the revoke returned after the wait forgot the handle: this thread
                        // alone holds it, and releases it.
                        .or_if_late(move || drop(unsafe { handed.abort() }))
                }
            },
        }
    }

    fn forget(&mut self) {
        self.comm.take_raw();
    }

    #[cfg(nccl_2_29)]
    fn revoke(&mut self) -> Result<(), GiveUpError> {
        let Some(comm) = self.comm.as_raw() else {
            return Err(GiveUpError::CannotRevoke);
        };
        // SAFETY: a live communicator (not refused, not aborted), used by this thread.
        unsafe { revoke(comm) }
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

/// `ncclCommRevoke`: `Ok` once it has begun (a non-blocking communicator answers `ncclInProgress`, seen
/// on the GPU host; `poll_revoked` waits for quiescence).
///
/// # Safety
/// A live communicator, neither refused nor aborted, used by no other thread meanwhile.
#[cfg(nccl_2_29)]
unsafe fn revoke(comm: metrale_gpu_sys::nccl::NcclComm) -> Result<(), GiveUpError> {
    use metrale_gpu_sys::nccl::{ncclCommRevoke, NCCL_REVOKE_DEFAULT};
    // SAFETY: as the caller promises; the flags are nccl.h's only value.
    let result = unsafe { ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT as i32) };
    if result == ncclResult_t::ncclInProgress {
        return Ok(());
    }
    Ok(check_nccl(result, "ncclCommRevoke")?)
}
