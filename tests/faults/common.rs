//! What the fault tests share beyond the testkit (re-exported here): host-computed inputs and sums,
//! host memory, and a world's all-reduces checked against the host.

use std::time::Duration;

pub use metrale_gpu_testkit::child;
pub use metrale_gpu_testkit::devbuf::DevBuf;
pub use metrale_gpu_testkit::device_memory::{self, Source, Used};
pub use metrale_gpu_testkit::gpu::{gpus, measured};
pub use metrale_gpu_testkit::ranks::{self, Me};
pub use metrale_gpu_testkit::world::World;

use metrale_gpu_sys::nccl::*;
use metrale_gpu_watchdog::Watchdog;

/// Seconds from an env variable (for the GPU runner to shorten a bound), else `default`.
pub fn secs_from_env(var: &str, default: u64) -> Duration {
    let s = std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    Duration::from_secs(s)
}

/// `VmRSS` of this process, in bytes.
pub fn rss() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kb: usize = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS in /proc/self/status");
    kb * 1024
}

pub const MIB: f64 = (1 << 20) as f64;

/// The element `i` of rank `rank`'s input for `seed`: multiples of 1/4 below 1024, so every sum over up
/// to 4096 ranks is exact in f32 (below 2^24 quarters) and the host's answer is exact.
pub fn input(seed: u64, rank: usize, i: usize) -> f32 {
    ((i as u64 * 7 + seed * 13 + rank as u64 * 101) % 4093) as f32 * 0.25
}

pub fn inputs(seed: u64, rank: usize, count: usize) -> Vec<f32> {
    (0..count).map(|i| input(seed, rank, i)).collect()
}

/// The host's all-reduce (sum) of `nranks` ranks' inputs.
pub fn expected_sum(seed: u64, nranks: usize, count: usize) -> Vec<f32> {
    (0..count)
        .map(|i| (0..nranks).map(|r| input(seed, r, i)).sum())
        .collect()
}

/// Compares `got` with `want`; the first mismatch, if any.
pub fn compare(what: &str, got: &[f32], want: &[f32]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} elements, expected {}",
            got.len(),
            want.len()
        ));
    }
    match got.iter().zip(want).position(|(g, w)| g != w) {
        Some(i) => Err(format!(
            "{what}: element {i} is {}, expected {} (host)",
            got[i], want[i]
        )),
        None => Ok(()),
    }
}

/// Fails with every failure listed, if there are any.
pub fn expect_no_failures(failures: &[String]) {
    assert!(
        failures.is_empty(),
        "{} case(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// A raw handle moved to another thread; the tests keep the handle alive until that thread is done.
pub struct Handle<T>(pub T);
// SAFETY: NCCL communicators and CUDA streams may be used from any thread; the tests never use one
// handle from two threads in a way NCCL or CUDA forbid (abort from another thread is allowed).
unsafe impl<T> Send for Handle<T> {}

/// The waits of every checked all-reduce: a peer that fails leaves the others an error, not a hang.
const ALL_REDUCE_LIMIT: Duration = Duration::from_secs(60);

/// A world (this rank's communicator, in a rank's process) with `count` floats of input and output per
/// communicator, for all-reduces checked against the host. The world goes first on drop: its streams
/// are idle before the buffers go.
pub struct Summed {
    pub world: World,
    pub send: Vec<DevBuf>,
    pub recv: Vec<DevBuf>,
    pub count: usize,
}

impl Summed {
    pub fn new(world: World, count: usize) -> Summed {
        let buffers = || {
            world
                .devs
                .iter()
                .map(|&d| DevBuf::cuda(d, count * 4))
                .collect()
        };
        let (send, recv) = (buffers(), buffers());
        Summed {
            world,
            send,
            recv,
            count,
        }
    }

    /// One all-reduce (sum) over every rank of the world's communicators, checked against the host's
    /// answer on the communicators this process drives. Inputs and outputs are written on each one's
    /// stream, before the collective; the wait is the watchdog's. After an `Err` the communicators are
    /// aborted and the world has forgotten them: a handle copied out of it must not be used again.
    pub fn check_all_reduce(&mut self, seed: u64) -> Result<(), String> {
        let result = self.all_reduce(seed);
        if result.is_err() {
            for &comm in &self.world.comms {
                // SAFETY: a live communicator the world holds, aborted once, then forgotten.
                if let Err(e) = check_nccl(unsafe { ncclCommAbort(comm) }, "ncclCommAbort") {
                    eprintln!("warning: {e}");
                }
            }
            self.world.forget_comms();
        }
        result
    }

    fn all_reduce(&mut self, seed: u64) -> Result<(), String> {
        let (w, count) = (&self.world, self.count);
        for i in 0..w.n() {
            self.send[i].upload_f32(&inputs(seed, w.ranks[i], count), w.streams[i]);
            self.recv[i].upload_f32(&vec![f32::NAN; count], w.streams[i]);
        }
        w.group("ncclAllReduce", |i| {
            // SAFETY: each buffer holds `count` floats on the communicator's device and each stream
            // belongs to that device.
            unsafe {
                ncclAllReduce(
                    self.send[i].at(0),
                    self.recv[i].at(0),
                    count,
                    NcclDataType::ncclFloat32,
                    NcclRedOp::ncclSum,
                    w.comms[i],
                    w.streams[i],
                )
            }
        })
        .map_err(|e| e.to_string())?;
        // SAFETY: the world's live communicators and streams, used by this thread alone.
        if let Err(e) = unsafe { Watchdog::abort_after(ALL_REDUCE_LIMIT).wait_all(&w.work()) } {
            // The watchdog aborted them: nothing left to give up on.
            self.world.forget_comms();
            return Err(format!("the all-reduce: {e}"));
        }
        let want = expected_sum(seed, w.size, count);
        for i in 0..w.n() {
            compare(
                &format!("all-reduce on rank {} of {}", w.ranks[i], w.size),
                &self.recv[i].download_f32(w.streams[i]),
                &want,
            )?;
        }
        Ok(())
    }
}
