//! [`Communicator`]: an NCCL communicator owned by one value, so that giving up on it (an abort) is seen
//! by everything that can reach it afterwards.

use std::time::Duration;

use metrale_gpu_sys::nccl::{check_nccl, ncclCommAbort, GpuError, NcclComm};

use crate::give_up::{self, Outcome};
use crate::{GiveUpBound, GiveUpCall, GiveUpError};

/// An NCCL communicator handle, owned: made from the raw handle once ([`from_raw`](Self::from_raw), the
/// one `unsafe` step), then reached through this value alone. [`abort`](Self::abort) consumes it; a wait
/// that gives up on it through a [`CommWork`](crate::CommWork) (which borrows it mutably, so that no
/// two watches over it exist at once) aborts it in place and forgets the handle, as does NCCL's refusal
/// of the handle: every later poll, abort or revoke through it then reaches no NCCL call.
///
/// Dropping it makes no NCCL call: the communicator lives on (until process exit, unless released
/// through the raw handle). A destroy in `Drop` could block on a dead peer's unfinished work, and an
/// abort would throw away a communicator the caller may still shrink; release it with
/// [`abort`](Self::abort), or take the handle back with [`into_raw`](Self::into_raw) for
/// `ncclCommDestroy`, `ncclCommShrink` and the like.
///
/// Two watches over one communicator cannot exist at once:
/// ```compile_fail
/// use metrale_gpu_watchdog::{CommWork, Communicator};
/// fn twice(comm: &mut Communicator) {
///     let a = CommWork::new(comm);
///     let b = CommWork::new(comm); // a second mutable borrow while `a` lives
///     drop((a, b));
/// }
/// ```
/// and an aborted one cannot be watched again:
/// ```compile_fail
/// use metrale_gpu_watchdog::{CommWork, Communicator};
/// fn after_abort(mut comm: Communicator) {
///     let _ = comm.abort();
///     let _ = CommWork::new(&mut comm); // moved by the abort
/// }
/// ```
#[derive(Debug)]
pub struct Communicator {
    /// `None` once aborted, refused by NCCL, or taken back: never touched again.
    handle: Option<NcclComm>,
}

impl Communicator {
    /// Takes ownership of `comm`.
    ///
    /// # Safety
    /// `comm` is a communicator handle NCCL returned (`ncclCommInitRank*`, `ncclCommSplit`,
    /// `ncclCommShrink`, …) or NULL, not destroyed or aborted. While this value lives and holds it (until
    /// it is dropped, or the handle taken back with [`into_raw`](Self::into_raw) or
    /// [`take_raw`](Self::take_raw)), nothing but this value and the watches that borrow it uses the
    /// handle, releases it, or makes a second `Communicator` of it; it is used by one thread at a time.
    pub unsafe fn from_raw(comm: NcclComm) -> Communicator {
        Communicator { handle: Some(comm) }
    }

    /// The handle, for the calls this crate does not make (collectives, `ncclCommShrink`); `None` once
    /// aborted, refused or taken back. Calling NCCL with it is `unsafe`: it must not be aborted or
    /// destroyed behind this value's back.
    pub fn as_raw(&self) -> Option<NcclComm> {
        self.handle
    }

    /// True once it was aborted, NCCL refused its handle, or the handle was taken back: nothing through
    /// this value will touch the handle again.
    pub fn is_abandoned(&self) -> bool {
        self.handle.is_none()
    }

    /// `ncclCommAbort`, unless it was given up on before (then nothing is called, and the answer is
    /// `Ok`).
    pub fn abort(mut self) -> Result<(), GpuError> {
        self.abort_in_place()
    }

    /// `ncclCommAbort` on a thread of its own, the calling thread's CUDA context current there, waited
    /// for at most `bound`: NCCL's abort first joins the communicator's pending init or group job, which
    /// a dead peer may hold for good. Past the bound the call is left to its thread, and the error says
    /// so ([`GiveUpError::Stuck`]). Nothing is called if it was given up on before.
    pub fn abort_within(mut self, bound: Duration) -> Result<(), GiveUpError> {
        let Some(comm) = self.take_raw() else {
            return Ok(());
        };
        let handed = Handed(comm);
        // SAFETY: a live communicator owned by this value (`from_raw`'s contract), forgotten above: the
        // call's thread is the only one to touch it again.
        let call = GiveUpCall::new("ncclCommAbort", move || Ok(unsafe { handed.abort() }?));
        let (mut outcomes, stuck) = give_up::make(vec![call], GiveUpBound::Return(bound));
        match (outcomes.pop(), stuck) {
            (Some(Outcome::Returned(result)), _) => result,
            (_, stuck) => Err(stuck.unwrap_or(GiveUpError::Stuck {
                call: "ncclCommAbort",
                after: bound,
                communicators: 1,
            })),
        }
    }

    /// Gives the handle back to the caller, who owns it again (`None` once aborted or refused).
    pub fn into_raw(mut self) -> Option<NcclComm> {
        self.take_raw()
    }

    /// Gives the handle back to the caller, who owns it again, and leaves this value abandoned, as after
    /// an abort: for a caller that releases it its own way (an abort on a thread of its own, with a
    /// bound) while a watch still borrows it. `None` once aborted, refused or taken back.
    pub fn take_raw(&mut self) -> Option<NcclComm> {
        self.handle.take()
    }

    /// `ncclCommAbort` through a borrow (a wait giving up), forgetting the handle first.
    pub(crate) fn abort_in_place(&mut self) -> Result<(), GpuError> {
        let Some(comm) = self.handle.take() else {
            return Ok(()); // aborted, refused or taken back before: nothing to do, nothing to touch
        };
        // SAFETY: a live communicator owned by this value (`from_raw`'s contract), neither refused nor
        // aborted before; forgotten above, so that nothing through this value calls NCCL with it again.
        unsafe { Handed(comm).abort() }
    }

    /// Forgets a handle NCCL refused (`ncclInvalidArgument`): nothing there to abort, nothing to touch.
    pub(crate) fn forget_refused(&mut self) {
        self.handle = None;
    }
}

/// A raw handle handed to the thread of a give-up call (`give_up.rs`).
#[derive(Clone, Copy)]
pub(crate) struct Handed(pub(crate) NcclComm);

// SAFETY: NCCL takes a communicator from any thread, one thread at a time: the waiting thread hands the
// handle over and does not touch it while the call runs, nor ever again if it stops waiting.
unsafe impl Send for Handed {}

impl Handed {
    /// The handle (a method, so that a closure captures the `Send` wrapper, not the bare handle): for
    /// the revoke, which only headers of NCCL 2.29 or newer declare.
    #[cfg(nccl_2_29)]
    pub(crate) fn get(self) -> NcclComm {
        self.0
    }

    /// `ncclCommAbort`.
    ///
    /// # Safety
    /// A live communicator, neither refused nor aborted before, used by no other thread meanwhile and
    /// never again.
    pub(crate) unsafe fn abort(self) -> Result<(), GpuError> {
        // SAFETY: as the caller promises.
        check_nccl(unsafe { ncclCommAbort(self.0) }, "ncclCommAbort")
    }
}
