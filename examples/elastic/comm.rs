//! The NCCL side of the example: a non-blocking communicator (every wait is bounded), one checked
//! all-reduce whose wait also listens to the rendezvous, the revoke and its quiescence, the shrink and
//! the grow.
// TODO(lead): once src/watchdog.rs has its revoke mode and its ncclInProgress helper, use them for
// `wait_ready`, `revoke` and the wait in `Gpu::all_reduce`, which stand in for them here.

use std::os::raw::c_void;
use std::time::{Duration, Instant};

use metrale_gpu_sys::cuda::{self, CUdeviceptr, CUstream};
use metrale_gpu_sys::nccl::*;

use crate::membership::Membership;

/// Floats per all-reduce.
pub const COUNT: usize = 1 << 18;
/// The longest sleep between two polls: waits do not hold a core.
const MAX_PAUSE: Duration = Duration::from_millis(2);

/// Every communicator of the example: non-blocking, so that no call can hang the rank.
pub fn config() -> NcclConfig {
    NcclConfig {
        blocking: 0,
        commName: c"elastic".as_ptr(),
        ..NcclConfig::default()
    }
}

/// How a rank learnt that the collective will never finish.
pub struct Lost {
    /// `rendezvous` (a member's connection closed), `nccl` (an error NCCL reported) or `timeout`.
    pub how: &'static str,
    pub detail: String,
    /// From the start of the wait.
    pub waited: Duration,
}

pub enum Outcome {
    /// The all-reduce finished and every element is right.
    Done,
    Lost(Lost),
}

/// `ncclSuccess` or `ncclInProgress`; anything else is the error, with `ncclGetLastError`'s text.
fn accepted(res: NcclResult, what: &str) -> Result<(), String> {
    if res == NcclResult::ncclInProgress {
        return Ok(());
    }
    check_nccl(res, what).map_err(|e| e.to_string())
}

/// `ncclCommGetAsyncError`: `Ok(None)` while in progress, `Ok(Some(Ok))` when ready, `Ok(Some(Err))`
/// for the error the communicator reports.
fn state(comm: NcclComm, what: &str) -> Result<Option<Result<(), String>>, String> {
    let mut state = NcclResult::ncclInProgress;
    // SAFETY: a live communicator; writes one status.
    let res = unsafe { ncclCommGetAsyncError(comm, &mut state) };
    check_nccl(res, "ncclCommGetAsyncError").map_err(|e| e.to_string())?;
    Ok((state != NcclResult::ncclInProgress)
        .then(|| check_nccl(state, what).map_err(|e| e.to_string())))
}

/// Polls `done` with backoff until it says yes (its value) or `limit` passes.
fn poll<T>(
    limit: Duration,
    what: &str,
    mut done: impl FnMut() -> Result<Option<T>, String>,
) -> Result<T, String> {
    let start = Instant::now();
    let mut pause = Duration::from_micros(5);
    loop {
        if let Some(value) = done()? {
            return Ok(value);
        }
        if start.elapsed() > limit {
            return Err(format!("{what}: not done after {limit:?}"));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

/// Waits until the communicator leaves `ncclInProgress` (a non-blocking call finished).
pub fn wait_ready(comm: NcclComm, what: &str, limit: Duration) -> Result<(), String> {
    poll(limit, what, || state(comm, what)).and_then(|ready| ready)
}

/// Waits until the stream has run everything queued on it.
fn wait_stream(stream: CUstream, what: &str, limit: Duration) -> Result<(), String> {
    poll(limit, what, || {
        // SAFETY: the rank's own live stream.
        Ok(unsafe { stream_ready(stream) }
            .map_err(|e| e.to_string())?
            .then_some(()))
    })
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
    accepted(res, "ncclCommInitRankConfig")?;
    wait_ready(comm, "ncclCommInitRankConfig", limit)?;
    Ok(comm)
}

/// Stops whatever runs on `comm` (`ncclCommRevoke`), then waits until it is quiescent
/// (`ncclCommGetAsyncError` leaves `ncclInProgress`) and the rank's stream has drained, within `limit`.
pub fn revoke(comm: NcclComm, stream: CUstream, limit: Duration) -> Result<(), String> {
    // SAFETY: a live communicator, revoked once.
    let res = unsafe { ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT as i32) };
    accepted(res, "ncclCommRevoke")?;
    wait_ready(comm, "the revoked communicator", limit)?;
    wait_stream(stream, "the stream after ncclCommRevoke", limit)
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
    accepted(res, "ncclCommShrink")?;
    // Non-blocking: the parent reports the shrink's progress; the new handle is set once it is done.
    wait_ready(comm, "ncclCommShrink", limit)?;
    if shrunk.is_null() {
        return Err("ncclCommShrink finished without a communicator".into());
    }
    wait_ready(shrunk, "the shrunk communicator", limit)?;
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
    accepted(res, "ncclCommGrow")?;
    if grown.is_null() {
        return Err("ncclCommGrow returned no communicator".into());
    }
    wait_ready(grown, "ncclCommGrow", limit)?;
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

/// Rank `rank`'s share of element `i` in round `round`: small integers, so every sum is exact.
fn share(rank: usize, round: usize, i: usize) -> f32 {
    ((rank + 1) * (1 + (i * 7 + round) % 97)) as f32
}

/// This process's GPU: its stream and the all-reduce buffer.
pub struct Gpu {
    pub stream: CUstream,
    buf: CUdeviceptr,
    host: Vec<f32>,
}

impl Gpu {
    /// Whether the stream has run everything queued on it.
    fn idle(&self) -> Result<bool, String> {
        // SAFETY: this struct's own live stream.
        unsafe { stream_ready(self.stream) }.map_err(|e| e.to_string())
    }

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

    /// One all-reduce of round `round` as rank `rank` of `size`, checked against the host's sum. Gives
    /// up (`Outcome::Lost`) when the rendezvous reports a dead rank, NCCL reports an error, or
    /// `deadline` passes.
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
        let lost = |how, detail: String| {
            Ok(Outcome::Lost(Lost {
                how,
                detail,
                waited: start.elapsed(),
            }))
        };
        if !who.dead().is_empty() {
            return lost("rendezvous", format!("ranks {:?} died", who.dead()));
        }
        let api = cuda::driver("elastic").map_err(|e| e.to_string())?;
        self.host
            .iter_mut()
            .enumerate()
            .for_each(|(i, v)| *v = share(rank, round, i));
        let ptr = self.buf as *mut c_void;
        // SAFETY: the buffer holds COUNT floats on this communicator's device, the stream is that
        // device's; the upload is queued before the all-reduce on the same stream.
        let res = unsafe {
            check_cuda(
                api.cuMemcpyHtoDAsync_v2(
                    self.buf,
                    self.host.as_ptr().cast(),
                    COUNT * 4,
                    self.stream,
                ),
                "cuMemcpyHtoDAsync",
            )
            .map_err(|e| e.to_string())?;
            ncclAllReduce(
                ptr,
                ptr,
                COUNT,
                NcclDataType::ncclFloat32,
                NcclRedOp::ncclSum,
                comm,
                self.stream,
            )
        };
        if let Err(e) = accepted(res, "ncclAllReduce") {
            return lost("nccl", e);
        }
        let mut pause = Duration::from_micros(5);
        loop {
            // Completion first: a rank that finished its last round may exit before this poll sees it.
            match state(comm, "the all-reduce")? {
                Some(Err(e)) => return lost("nccl", e),
                Some(Ok(())) if self.idle()? => break,
                _ => {}
            }
            if !who.dead().is_empty() {
                return lost("rendezvous", format!("ranks {:?} died", who.dead()));
            }
            if start.elapsed() > deadline {
                return lost(
                    "timeout",
                    format!("the all-reduce did not finish within {deadline:?}"),
                );
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(MAX_PAUSE);
        }
        // SAFETY: copies COUNT floats back after the all-reduce (same stream), then waits for them.
        unsafe {
            check_cuda(
                api.cuMemcpyDtoHAsync_v2(
                    self.host.as_mut_ptr().cast(),
                    self.buf,
                    COUNT * 4,
                    self.stream,
                ),
                "cuMemcpyDtoHAsync",
            )
            .and_then(|()| sync_stream(self.stream))
            .map_err(|e| e.to_string())?;
        }
        let factor = size * (size + 1) / 2;
        match (0..COUNT).find(|&i| self.host[i] != (factor * (1 + (i * 7 + round) % 97)) as f32) {
            None => Ok(Outcome::Done),
            Some(i) => Err(format!(
                "all-reduce round {round} over {size} ranks: element {i} is {}, expected {}",
                self.host[i],
                (factor * (1 + (i * 7 + round) % 97)) as f32
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
