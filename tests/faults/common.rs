//! What the fault tests share beyond the testkit (re-exported here): host-computed inputs and sums,
//! memory gauges, and a pair of communicators on GPUs 0 and 1 with buffers, checked against the host.

use std::time::Duration;

pub use metrale_gpu_testkit::child;
pub use metrale_gpu_testkit::devbuf::DevBuf;
pub use metrale_gpu_testkit::gpu::{gpus, measured};
pub use metrale_gpu_testkit::world::World;

use metrale_gpu_sys::cuda;
use metrale_gpu_sys::nccl::*;

/// Seconds from an env variable (for the GPU runner to shorten a bound), else `default`.
pub fn secs_from_env(var: &str, default: u64) -> Duration {
    let s = std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    Duration::from_secs(s)
}

/// `cuMemGetInfo` free bytes of `device`.
pub fn device_free(device: i32) -> usize {
    let api = cuda::use_device(device, "device_free").expect("use_device");
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: writes two sizes through valid pointers; the device's context is current.
    check_cuda(
        unsafe { api.cuMemGetInfo_v2(&mut free, &mut total) },
        "cuMemGetInfo",
    )
    .expect("cuMemGetInfo");
    free
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

/// The element `i` of rank `rank`'s input for `seed`: small multiples of 1/4, so every sum over two
/// ranks is exact in f32 and the host's answer is exact.
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

/// Two blocking communicators (ncclCommInitAll over GPUs 0 and 1), a stream and `count` floats of
/// input and output per rank. The world goes first on drop: its streams are idle before the buffers go.
pub struct Pair {
    pub world: World,
    pub send: [DevBuf; 2],
    pub recv: [DevBuf; 2],
    pub count: usize,
}

impl Pair {
    pub fn init_all(count: usize) -> Pair {
        let buffers = || [DevBuf::cuda(0, count * 4), DevBuf::cuda(1, count * 4)];
        Pair {
            world: World::init_all(2),
            send: buffers(),
            recv: buffers(),
            count,
        }
    }

    /// One all-reduce (sum) across both ranks, checked against the host's answer on both. Inputs and
    /// outputs are written on each rank's stream, before the collective.
    pub fn check_all_reduce(&self, seed: u64) -> Result<(), String> {
        let count = self.count;
        for r in 0..2 {
            self.send[r].upload_f32(&inputs(seed, r, count), self.world.streams[r]);
            self.recv[r].upload_f32(&vec![f32::NAN; count], self.world.streams[r]);
        }
        self.world
            .group("ncclAllReduce", |r| {
                // SAFETY: each buffer holds `count` floats on the communicator's device and each
                // stream belongs to that device.
                unsafe {
                    ncclAllReduce(
                        self.send[r].at(0),
                        self.recv[r].at(0),
                        count,
                        NcclDataType::ncclFloat32,
                        NcclRedOp::ncclSum,
                        self.world.comms[r],
                        self.world.streams[r],
                    )
                }
            })
            .map_err(|e| e.to_string())?;
        let want = expected_sum(seed, 2, count);
        for r in 0..2 {
            compare(
                &format!("all-reduce on rank {r}"),
                &self.recv[r].download_f32(self.world.streams[r]),
                &want,
            )?;
        }
        Ok(())
    }
}
