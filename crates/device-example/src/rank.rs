//! One rank's part of the all-reduce: what a user of the device API writes on the host.

use std::ffi::c_void;

use metrale_gpu_sys::cuda::{self, arg, LaunchConfig, Module};
use metrale_gpu_sys::device::{require_device_api, requirements, DevComm, Window};
use metrale_gpu_sys::nccl::*;

/// Blocks the kernel runs: one LSA barrier each.
pub const BLOCKS: u32 = 16;
/// Threads per block.
pub const THREADS: u32 = 512;

/// What one rank saw: the device communicator as the kernel reads it, and the all-reduce's check.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// `ncclDevComm`'s rank, ranks, LSA rank, LSA team size and LSA barrier count, read by a kernel.
    pub dev_comm: [i32; 5],
    /// The LSA team as the host's `ncclTeamLsa` gives it: (ranks, rank).
    pub lsa_team: (i32, i32),
    /// Elements that differ from the host's sums (none when it worked).
    pub wrong: usize,
    /// The first of them: (index, got, wanted).
    pub first_wrong: Option<(usize, f32, f32)>,
}

/// Rank `rank`'s input: small integers, so that every sum is exact in f32.
pub fn input(rank: usize, count: usize) -> Vec<f32> {
    (0..count)
        .map(|i| ((i * 7 + rank * 13) % 31) as f32)
        .collect()
}

/// The all-reduce of `count` floats on `comm` (rank `rank` of `ranks`, on `device`): every rank calls it
/// at once. Checks the result against the host's sums of every rank's [`input`].
///
/// # Safety
/// `comm` is a live communicator of `ranks` ranks whose rank `rank` runs on `device`, used by nothing
/// else during the call.
pub unsafe fn all_reduce(
    comm: NcclComm,
    device: i32,
    rank: usize,
    ranks: usize,
    count: usize,
) -> Result<Report, Box<dyn std::error::Error>> {
    let image = crate::FATBIN.map_err(|why| format!("this build has no kernel: {why}"))?;
    let bytes = count * size_of::<f32>();
    // SAFETY: the caller promises a live `comm`, on `device`.
    unsafe { require_device_api(comm, 1)? };
    // SAFETY: the image is nvcc's fatbin, embedded by this crate's build.
    let module = unsafe { Module::load(device, image)? };
    let kernel = module.function(c"lsa_all_reduce_sum_f32")?;
    let info_kernel = module.function(c"dev_comm_info")?;

    // Symmetric memory: NCCL's allocations, registered as windows on every rank (collective). Dropped in
    // reverse: the device communicator, the windows, then the memory.
    let send = Buffer::new(device, bytes)?;
    let recv = Buffer::new(device, bytes)?;
    let info = Buffer::new(device, 5 * size_of::<i32>())?;
    // SAFETY: `comm` outlives the windows (dropped at the end of this function); the buffers are NCCL's
    // memory of `bytes` bytes on `device`, freed after the windows.
    let (send_window, recv_window) = unsafe {
        (
            Window::register(comm, send.0, bytes, NCCL_WIN_COLL_SYMMETRIC as i32)?,
            Window::register(comm, recv.0, bytes, NCCL_WIN_COLL_SYMMETRIC as i32)?,
        )
    };
    let mut wanted = requirements();
    wanted.lsaBarrierCount = BLOCKS as i32;
    // SAFETY: `comm` outlives the device communicator; `wanted` lists no resource or team requirements.
    let dev_comm = unsafe { DevComm::create(comm, &wanted)? };

    let api = cuda::driver("all_reduce")?;
    let stream = Stream(create_stream(device)?);
    let host = input(rank, count);
    let mut out = vec![0f32; count];
    let mut dev_comm_seen = [0i32; 5];
    let (send_handle, recv_handle, offset) = (send_window.handle(), recv_window.handle(), 0usize);
    let info_ptr = info.0;
    // SAFETY: every copy and launch is queued on `stream`, on `device`, and completes before
    // `sync_stream` returns; `host`, `out` and `dev_comm_seen` outlive it; the kernels' arguments match
    // their parameter lists in kernels/lsa_all_reduce.cu.
    unsafe {
        let copy = api.cuMemcpyHtoDAsync_v2(send.0 as u64, host.as_ptr().cast(), bytes, stream.0);
        check_cuda(copy, "cuMemcpyHtoDAsync")?;
        let one = LaunchConfig {
            grid: [1, 1, 1],
            block: [1, 1, 1],
            shared_bytes: 0,
        };
        info_kernel.launch(&one, stream.0, &[arg(dev_comm.get()), arg(&info_ptr)])?;
        let config = LaunchConfig {
            grid: [BLOCKS, 1, 1],
            block: [THREADS, 1, 1],
            shared_bytes: 0,
        };
        let args = [
            arg(&send_handle),
            arg(&offset),
            arg(&recv_handle),
            arg(&offset),
            arg(&count),
            arg(dev_comm.get()),
        ];
        kernel.launch(&config, stream.0, &args)?;
        let copy =
            api.cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), recv.0 as u64, bytes, stream.0);
        check_cuda(copy, "cuMemcpyDtoHAsync")?;
        let copy = api.cuMemcpyDtoHAsync_v2(
            dev_comm_seen.as_mut_ptr().cast(),
            info.0 as u64,
            size_of_val(&dev_comm_seen),
            stream.0,
        );
        check_cuda(copy, "cuMemcpyDtoHAsync")?;
        sync_stream(stream.0)?;
    }
    // SAFETY: `comm` is live; the host function returns the LSA team by value.
    let lsa = unsafe { ncclTeamLsa(comm) };
    dev_comm.destroy()?;
    send_window.deregister()?;
    recv_window.deregister()?;

    let inputs: Vec<Vec<f32>> = (0..ranks).map(|r| input(r, count)).collect();
    let mut wrong = 0;
    let mut first_wrong = None;
    for (i, &got) in out.iter().enumerate() {
        let want: f32 = inputs.iter().map(|v| v[i]).sum();
        if got != want {
            wrong += 1;
            first_wrong.get_or_insert((i, got, want));
        }
    }
    Ok(Report {
        dev_comm: dev_comm_seen,
        lsa_team: (lsa.nRanks, lsa.rank),
        wrong,
        first_wrong,
    })
}

/// NCCL memory, freed when dropped (after the windows over it).
struct Buffer(*mut c_void);

impl Buffer {
    fn new(device: i32, bytes: usize) -> Result<Buffer, GpuError> {
        nccl_mem_alloc(device, bytes).map(Buffer)
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: from nccl_mem_alloc, freed once; the stream that used it was synchronised or destroyed.
        let _ = unsafe { nccl_mem_free(self.0) };
    }
}

/// A stream, destroyed when dropped.
struct Stream(CUstream);

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: from create_stream, destroyed once.
        let _ = unsafe { destroy_stream(self.0) };
    }
}
