//! The NCCL side of the example: non-blocking communicators (every wait is bounded by the crate's
//! watchdog), one checked all-reduce whose wait also listens to the rendezvous and revokes on failure,
//! the shrink and the grow.

use std::os::raw::c_void;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use metrale_gpu_sys::cuda::{self, CUdeviceptr, CUstream};
use metrale_gpu_sys::nccl::*;
use metrale_gpu_sys::watchdog::{CommWork, GiveUp, Poll, WaitError, Watchdog, Watched};

use crate::membership::Membership;

/// Floats per all-reduce.
pub const COUNT: usize = 1 << 18;

/// Every communicator of the example: non-blocking, so that no call can hang the rank.
pub fn config() -> NcclConfig {
    let mut config = NcclConfig {
        blocking: 0,
        ..NcclConfig::default()
    };
    // NCCL keeps this pointer (and hands it to shrunk and grown communicators): a `&'static CStr`.
    config.set_comm_name(c"elastic");
    config
}

/// How a rank learnt that the collective will never finish; the communicator is revoked and quiescent.
pub struct Lost {
    /// `rendezvous` (a member's connection closed), `nccl` (an error NCCL reported) or `timeout`.
    pub how: &'static str,
    pub detail: String,
    /// From the start of the all-reduce to the moment the watchdog gave up on it.
    pub waited: Duration,
    /// That moment, in µs since the Unix epoch.
    pub at_unix_us: u128,
    /// From then until the communicator was quiescent and the stream drained (`ncclCommRevoke`).
    pub revoked: Duration,
}

pub enum Outcome {
    /// The all-reduce finished and every element is right.
    Done,
    Lost(Lost),
}

/// A non-blocking call's status, then (`ncclInProgress`) its end within `limit`: the watchdog's check,
/// which aborts `comm` if the call fails. A call that made no communicator fails with its own status.
fn settle(res: NcclResult, comm: NcclComm, what: &str, limit: Duration) -> Result<(), String> {
    if comm.is_null() {
        if res != NcclResult::ncclInProgress {
            check_nccl(res, what).map_err(|e| e.to_string())?;
        }
        return Err(format!("{what} returned no communicator"));
    }
    // SAFETY: the handle the call returned, used by this thread alone.
    unsafe { Watchdog::abort_after(limit).check(res, comm, what) }.map_err(|e| e.to_string())
}

/// `ncclCommInitRankConfig`, waited for.
pub fn init(
    size: usize,
    id: NcclUniqueId,
    rank: usize,
    limit: Duration,
) -> Result<NcclComm, String> {
    let mut comm: NcclComm = std::ptr::null_mut();
    // SAFETY: writes one handle; the config is read during the call.
    let res =
        unsafe { ncclCommInitRankConfig(&mut comm, size as i32, id, rank as i32, &mut config()) };
    settle(res, comm, "ncclCommInitRankConfig", limit)?;
    Ok(comm)
}

/// `ncclCommShrink` of the revoked `comm` without `dead`: the survivors' communicator.
pub fn shrink(comm: NcclComm, dead: &[usize], limit: Duration) -> Result<NcclComm, String> {
    let mut exclude: Vec<i32> = dead.iter().map(|&r| r as i32).collect();
    let mut shrunk: NcclComm = std::ptr::null_mut();
    // SAFETY: a quiescent revoked communicator (nccl.h allows shrinking it); the list and config are
    // read during the call; the new handle is written when the shrink is done.
    let res = unsafe {
        ncclCommShrink(
            comm,
            exclude.as_mut_ptr(),
            exclude.len() as i32,
            &mut shrunk,
            &mut config(),
            NCCL_SHRINK_DEFAULT as i32,
        )
    };
    // Non-blocking: the parent reports the shrink's progress; the new handle is set once it is done.
    settle(res, comm, "ncclCommShrink", limit)?;
    settle(
        NcclResult::ncclInProgress,
        shrunk,
        "the shrunk communicator",
        limit,
    )?;
    Ok(shrunk)
}

/// `ncclCommGrow` to `size` ranks: a member passes its communicator and rank -1 (the root, the one that
/// called `ncclCommGetUniqueId`, also the id); a replacement no communicator, the id and its rank.
pub fn grow(
    comm: NcclComm,
    size: usize,
    id: Option<&NcclUniqueId>,
    rank: i32,
    limit: Duration,
) -> Result<NcclComm, String> {
    let mut grown: NcclComm = std::ptr::null_mut();
    let id = id.map_or(std::ptr::null(), |id| id as *const NcclUniqueId);
    // SAFETY: the arguments nccl.h prescribes for this caller; id and config are read during the call.
    let res = unsafe { ncclCommGrow(comm, size as i32, id, rank, &mut grown, &mut config()) };
    settle(res, grown, "ncclCommGrow", limit)?;
    Ok(grown)
}

/// `ncclCommDestroy` (a healthy, idle communicator) or `ncclCommAbort` (a revoked one whose peers
/// are gone: nothing of it is needed, and abort touches no peer).
pub fn release(comm: NcclComm, abort: bool) -> Result<(), String> {
    // SAFETY: the caller's communicator, released once and never used again.
    let (res, what) = unsafe {
        if abort {
            (ncclCommAbort(comm), "ncclCommAbort")
        } else {
            (ncclCommDestroy(comm), "ncclCommDestroy")
        }
    };
    check_nccl(res, what).map_err(|e| e.to_string())
}

/// Element `i` of round `round`: `factor` times a small integer, so that every sum is exact. Rank r
/// contributes factor r + 1; the sum over `size` ranks has factor size (size + 1) / 2.
fn value(factor: usize, round: usize, i: usize) -> f32 {
    (factor * (1 + (i * 7 + round) % 97)) as f32
}

/// The all-reduce's wait: the communicator and stream (the crate's [`CommWork`]), then the
/// rendezvous, whose news of a dead rank fails the wait at once. The watchdog revokes on failure; this
/// notes when, and after the revoke waits for the stream to drain as well.
struct Watch<'a> {
    work: CommWork,
    stream: CUstream,
    who: &'a Membership,
    /// The dead ranks, once the rendezvous reported them.
    dead: Vec<usize>,
    revoked_at: Option<Instant>,
}

impl Watched for Watch<'_> {
    fn poll(&mut self) -> Poll {
        // Completion first: a rank that finished its last round may exit before this poll sees it.
        match self.work.poll() {
            Poll::Running => {}
            other => return other,
        }
        self.dead = self.who.dead();
        if self.dead.is_empty() {
            return Poll::Running;
        }
        Poll::Failed(GpuError::Nccl {
            context: "the rendezvous (a member's connection closed)".into(),
            code: NcclResult::ncclRemoteError,
            text: format!("remote process exited: ranks {:?} died", self.dead),
            last_error: None,
        })
    }

    fn abort(&mut self) -> Result<(), GpuError> {
        self.work.abort()
    }

    fn revoke(&mut self) -> Result<(), GpuError> {
        self.revoked_at = Some(Instant::now());
        self.work.revoke()
    }

    fn poll_revoked(&mut self) -> Poll {
        match self.work.poll_revoked() {
            // SAFETY: the rank's own live stream.
            Poll::Done => match unsafe { stream_ready(self.stream) } {
                Ok(true) => Poll::Done,
                Ok(false) => Poll::Running,
                Err(e) => Poll::Failed(e),
            },
            other => other,
        }
    }
}

impl Watch<'_> {
    /// What a failed wait means: the all-reduce is lost and the communicator revoked, or (nothing was
    /// revoked: NCCL refused the handle, a revoke failed, CUDA failed) the rank cannot go on.
    fn lost(
        &self,
        error: WaitError,
        start: Instant,
        deadline: Duration,
    ) -> Result<Outcome, String> {
        let (how, detail) = match &error {
            WaitError::Timeout {
                gave_up: GiveUp::Revoke,
                ..
            } => (
                "timeout",
                format!("the all-reduce did not finish within {deadline:?}"),
            ),
            WaitError::Failed {
                gave_up: GiveUp::Revoke,
                ..
            } if !self.dead.is_empty() => ("rendezvous", format!("ranks {:?} died", self.dead)),
            WaitError::Failed {
                gave_up: GiveUp::Revoke,
                error: e,
                ..
            } if matches!(**e, GpuError::Nccl { .. }) => ("nccl", e.to_string()),
            _ => return Err(error.to_string()),
        };
        // Revoked: the watchdog called `revoke` when it gave up.
        let revoked_at = self.revoked_at.unwrap_or(start);
        let revoked = revoked_at.elapsed();
        Ok(Outcome::Lost(Lost {
            how,
            detail,
            waited: revoked_at - start,
            at_unix_us: unix_us() - revoked.as_micros(),
            revoked,
        }))
    }
}

/// Now, in µs since the Unix epoch.
pub fn unix_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0)
}

/// This process's GPU: its stream and the all-reduce buffer.
pub struct Gpu {
    stream: CUstream,
    buf: CUdeviceptr,
    host: Vec<f32>,
}

impl Gpu {
    pub fn new(device: i32) -> Result<Gpu, GpuError> {
        let stream = create_stream(device)?; // also makes the device current on this thread
        let mut buf: CUdeviceptr = 0;
        let api = cuda::driver("elastic")?;
        // SAFETY: writes one device pointer; the device's context is current.
        let res = unsafe { api.cuMemAlloc_v2(&mut buf, COUNT * 4) };
        check_cuda(res, "cuMemAlloc")?;
        Ok(Gpu {
            stream,
            buf,
            host: vec![0.0; COUNT],
        })
    }

    /// Copies the host values into the device buffer (`to_device`) or back, queued on the stream.
    fn copy(&mut self, to_device: bool) -> Result<(), String> {
        let api = cuda::driver("elastic").map_err(|e| e.to_string())?;
        let (host, bytes) = (self.host.as_mut_ptr(), COUNT * 4);
        // SAFETY: both buffers hold COUNT floats; the copy is queued on the stream of the collective
        // (never the legacy stream, which a non-blocking stream does not wait for), and from pageable
        // memory the driver has staged the host values when an upload returns.
        let res = unsafe {
            if to_device {
                api.cuMemcpyHtoDAsync_v2(self.buf, host.cast(), bytes, self.stream)
            } else {
                api.cuMemcpyDtoHAsync_v2(host.cast(), self.buf, bytes, self.stream)
            }
        };
        check_cuda(res, "cuMemcpyAsync").map_err(|e| e.to_string())
    }

    /// One all-reduce of round `round` as rank `rank` of `size`, checked against the host's sum. Gives
    /// up (`Outcome::Lost`, the communicator revoked) when the rendezvous reports a dead rank, NCCL
    /// reports an error, or `deadline` passes.
    pub fn all_reduce(
        &mut self,
        comm: NcclComm,
        rank: usize,
        size: usize,
        round: usize,
        who: &Membership,
        deadline: Duration,
    ) -> Result<Outcome, String> {
        let start = Instant::now();
        for (i, v) in self.host.iter_mut().enumerate() {
            *v = value(rank + 1, round, i);
        }
        self.copy(true)?;
        let (ptr, f32, sum) = (
            self.buf as *mut c_void,
            NcclDataType::ncclFloat32,
            NcclRedOp::ncclSum,
        );
        // SAFETY: the buffer holds COUNT floats on this communicator's device, the stream is that
        // device's; the upload is queued before the all-reduce on the same stream.
        let res = unsafe { ncclAllReduce(ptr, ptr, COUNT, f32, sum, comm, self.stream) };
        let mut watch = Watch {
            // SAFETY: the rank's live communicator and stream, used by this thread alone.
            work: unsafe { CommWork::new(comm, Some(self.stream)) },
            stream: self.stream,
            who,
            dead: Vec::new(),
            revoked_at: None,
        };
        let dog = Watchdog::revoke_after(deadline);
        let waited = dog
            .check_on(res, &mut watch, "ncclAllReduce")
            .and_then(|()| dog.wait(&mut [&mut watch], "the all-reduce"));
        if let Err(e) = waited {
            return watch.lost(e, start, deadline);
        }
        self.copy(false)?;
        // SAFETY: the rank's own live stream.
        unsafe { sync_stream(self.stream) }.map_err(|e| e.to_string())?;
        let factor = size * (size + 1) / 2;
        match (0..COUNT).find(|&i| self.host[i] != value(factor, round, i)) {
            None => Ok(Outcome::Done),
            Some(i) => Err(format!(
                "all-reduce round {round} over {size} ranks: element {i} is {}, expected {}",
                self.host[i],
                value(factor, round, i)
            )),
        }
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // The buffer and stream are this struct's and idle: every wait drained the stream, or the
        // communicator using it was revoked (which drains it too).
        let freed = cuda::driver("elastic").and_then(|api| {
            // SAFETY: the buffer from cuMemAlloc, freed once.
            check_cuda(unsafe { api.cuMemFree_v2(self.buf) }, "cuMemFree")?;
            // SAFETY: the stream from create_stream, destroyed once.
            unsafe { destroy_stream(self.stream) }
        });
        if let Err(e) = freed {
            eprintln!("warning: releasing the GPU buffer: {e}");
        }
    }
}
