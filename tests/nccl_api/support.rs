//! What the tests of this binary share: the GPU check, device buffers, all-reduce data checked on the
//! host, communicators driven from one thread, and bounded polls of a communicator's state.
// TODO(lead): use testkit. These stand in for the shared test-support crate (GPU check, device
// buffers, communicators) until the merge; swap them for its equivalents.

use std::os::raw::c_void;
use std::time::{Duration, Instant};

use metrale_gpu_sys::cuda::{self, CUdeviceptr, CUstream, DriverApi};
use metrale_gpu_sys::nccl::*;

/// GPUs every test needs.
pub const MIN_GPUS: usize = 2;
/// The longest any init, grow or collective may take in these tests before they call it a hang.
pub const LIMIT: Duration = Duration::from_secs(60);

/// The driver, for the tests' own calls.
pub fn api() -> &'static DriverApi {
    cuda::driver("nccl_api test").expect("CUDA driver")
}

/// Fails unless this process may touch the GPUs (`NCCL_NVLS_ENABLE=0`: NVLink multicast is forbidden on
/// the GPU host), the loaded libnccl is not older than the headers, and there are 2 GPUs or more.
pub fn gpus() -> usize {
    let nvls = std::env::var("NCCL_NVLS_ENABLE");
    assert!(
        nvls.as_deref() == Ok("0"),
        "NCCL_NVLS_ENABLE must be 0 in every process that runs these tests (NVLink multicast is \
         forbidden on the GPU host), found {nvls:?}"
    );
    metrale_gpu_sys::version::check_library_version().expect("libnccl not older than the headers");
    let api = cuda::driver("nccl_api test").unwrap_or_else(|e| {
        panic!("needs {MIN_GPUS} GPUs, but the CUDA driver is unavailable: {e}")
    });
    let mut count = 0;
    // SAFETY: writes one int through a valid pointer.
    check_cuda(
        unsafe { api.cuDeviceGetCount(&mut count) },
        "cuDeviceGetCount",
    )
    .expect("count");
    assert!(
        count as usize >= MIN_GPUS,
        "needs {MIN_GPUS} GPUs, found {count}"
    );
    count as usize
}

/// Device memory from `cuMemAlloc` or `ncclMemAlloc`, freed on drop (its users synchronise first).
pub struct Buf {
    pub dev: i32,
    pub ptr: CUdeviceptr,
    pub bytes: usize,
    from_nccl: bool,
}

impl Buf {
    pub fn cuda(dev: i32, bytes: usize) -> Buf {
        let api = cuda::use_device(dev, "Buf::cuda").expect("use_device");
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: writes one device pointer; the device's context is current.
        check_cuda(unsafe { api.cuMemAlloc_v2(&mut ptr, bytes) }, "cuMemAlloc")
            .unwrap_or_else(|e| panic!("cuMemAlloc of {bytes} bytes on GPU {dev}: {e}"));
        Buf {
            dev,
            ptr,
            bytes,
            from_nccl: false,
        }
    }

    pub fn nccl(dev: i32, bytes: usize) -> Buf {
        let ptr = nccl_mem_alloc(dev, bytes)
            .unwrap_or_else(|e| panic!("ncclMemAlloc of {bytes} bytes on GPU {dev}: {e}"));
        Buf {
            dev,
            ptr: ptr as CUdeviceptr,
            bytes,
            from_nccl: true,
        }
    }

    /// The address `offset` bytes in.
    pub fn at(&self, offset: usize) -> *mut c_void {
        assert!(
            offset <= self.bytes,
            "offset {offset} past {} bytes",
            self.bytes
        );
        (self.ptr + offset as CUdeviceptr) as *mut c_void
    }

    /// Copies `data` to `offset`, queued on `stream`.
    pub fn upload(&self, offset: usize, data: &[u8], stream: CUstream) {
        assert!(offset + data.len() <= self.bytes);
        // SAFETY: reads data.len() bytes of `data`, writes inside the allocation; a live stream.
        let res = unsafe {
            api().cuMemcpyHtoDAsync_v2(
                self.ptr + offset as u64,
                data.as_ptr().cast(),
                data.len(),
                stream,
            )
        };
        check_cuda(res, "cuMemcpyHtoDAsync").expect("upload");
    }

    /// Sets every byte to `byte`, queued on `stream`.
    pub fn fill(&self, byte: u8, stream: CUstream) {
        // SAFETY: the range is the allocation; a live stream.
        let res = unsafe { api().cuMemsetD8Async(self.ptr, byte, self.bytes, stream) };
        check_cuda(res, "cuMemsetD8Async").expect("fill");
    }

    /// All its bytes, after the work queued on `stream` so far.
    pub fn download(&self, stream: CUstream) -> Vec<u8> {
        let mut host = vec![0u8; self.bytes];
        // SAFETY: writes self.bytes bytes into `host`, reads the allocation; a live stream.
        let res = unsafe {
            api().cuMemcpyDtoHAsync_v2(host.as_mut_ptr().cast(), self.ptr, self.bytes, stream)
        };
        check_cuda(res, "cuMemcpyDtoHAsync").expect("download");
        // SAFETY: a live stream.
        unsafe { sync_stream(stream) }.expect("sync after download");
        host
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        let freed = if self.from_nccl {
            // SAFETY: from ncclMemAlloc, freed once, after its users synchronised.
            unsafe { nccl_mem_free(self.at(0)) }
        } else {
            cuda::use_device(self.dev, "Buf::drop").and_then(|api| {
                // SAFETY: from cuMemAlloc, freed once, after its users synchronised.
                check_cuda(unsafe { api.cuMemFree_v2(self.ptr) }, "cuMemFree")
            })
        };
        if let Err(e) = freed {
            eprintln!(
                "warning: freeing {} bytes on GPU {}: {e}",
                self.bytes, self.dev
            );
        }
    }
}

/// Rank `rank`'s share of element `i` of all-reduce number `round`: small integers, so that every sum
/// is exact in f32 and a wrong or missing contribution shows.
pub fn contribution(rank: usize, round: usize, i: usize) -> f32 {
    ((rank + 1) * (1 + (i * 7 + round) % 97)) as f32
}

/// Element `i` of the sum over `nranks` ranks of round `round`.
pub fn expected_sum(nranks: usize, round: usize, i: usize) -> f32 {
    (nranks * (nranks + 1) / 2 * (1 + (i * 7 + round) % 97)) as f32
}

pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_ne_bytes()).collect()
}

pub fn bytes_f32(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// One rank driven by this process: its communicator, device and stream (destroyed by `teardown`).
pub struct Rank {
    pub comm: NcclComm,
    pub dev: i32,
    pub stream: CUstream,
}

// SAFETY: the handles are addresses NCCL and the driver accept from any thread; the tests hand each
// rank to one thread at a time (scoped threads), never to two at once.
unsafe impl Send for Rank {}
// SAFETY: as above; a shared `&Rank` is only read (the handles), never used by two threads at once.
unsafe impl Sync for Rank {}

impl Rank {
    /// A rank on `comm`, with a new stream on the communicator's device.
    pub fn new(comm: NcclComm) -> Rank {
        let mut dev = -1;
        // SAFETY: a live communicator; writes one int.
        check_nccl(
            unsafe { ncclCommCuDevice(comm, &mut dev) },
            "ncclCommCuDevice",
        )
        .expect("device");
        Rank {
            comm,
            dev,
            stream: create_stream(dev).expect("create_stream"),
        }
    }

    /// `ncclCommUserRank` and `ncclCommCount`.
    pub fn rank_and_size(&self) -> (usize, usize) {
        let (mut rank, mut size) = (-1, -1);
        // SAFETY: a live communicator; each call writes one int.
        unsafe {
            check_nccl(ncclCommUserRank(self.comm, &mut rank), "ncclCommUserRank").expect("rank");
            check_nccl(ncclCommCount(self.comm, &mut size), "ncclCommCount").expect("count");
        }
        (rank as usize, size as usize)
    }

    /// Uploads this rank's share of round `round` into `buf` and queues an in-place all-reduce of
    /// `count` floats; NCCL's status.
    pub fn enqueue_all_reduce(&self, buf: &Buf, count: usize, round: usize) -> NcclResult {
        let (rank, _) = self.rank_and_size();
        let mine: Vec<f32> = (0..count).map(|i| contribution(rank, round, i)).collect();
        buf.upload(0, &f32_bytes(&mine), self.stream);
        // SAFETY: buf holds `count` floats on this communicator's device; the stream is that device's.
        unsafe {
            ncclAllReduce(
                buf.at(0),
                buf.at(0),
                count,
                NcclDataType::ncclFloat32,
                NcclRedOp::ncclSum,
                self.comm,
                self.stream,
            )
        }
    }

    /// After the queued all-reduce: `buf` holds the sum over the communicator's ranks.
    pub fn check_all_reduce(&self, buf: &Buf, count: usize, round: usize) -> Result<(), String> {
        let (rank, size) = self.rank_and_size();
        let got = bytes_f32(&buf.download(self.stream));
        match (0..count).find(|&i| got[i] != expected_sum(size, round, i)) {
            None => Ok(()),
            Some(i) => {
                Err(format!(
                "rank {rank} of {size}: all-reduce round {round}: element {i} is {}, expected {} \
                 ({} of {count} elements wrong)",
                got[i],
                expected_sum(size, round, i),
                (0..count).filter(|&i| got[i] != expected_sum(size, round, i)).count()
            ))
            }
        }
    }

    /// This rank alone (the others run in their own threads or processes): an all-reduce, waited for
    /// within `LIMIT`, checked.
    pub fn all_reduce(&self, count: usize, round: usize) -> Result<(), String> {
        let buf = Buf::cuda(self.dev, count * 4);
        accepted(self.enqueue_all_reduce(&buf, count, round), "ncclAllReduce")?;
        wait_ready(self.comm, "ncclAllReduce", LIMIT)?;
        wait_stream(self.stream, "the all-reduce", LIMIT)?;
        self.check_all_reduce(&buf, count, round)
    }
}

/// Every rank from this thread: one all-reduce in one group, waited for, checked on every rank.
pub fn all_reduce_group(ranks: &[Rank], count: usize, round: usize) -> Result<(), String> {
    let bufs: Vec<Buf> = ranks.iter().map(|r| Buf::cuda(r.dev, count * 4)).collect();
    group("ncclAllReduce", ranks.len(), |i| {
        ranks[i].enqueue_all_reduce(&bufs[i], count, round)
    })?;
    for r in ranks {
        wait_ready(r.comm, "ncclAllReduce", LIMIT)?;
        wait_stream(r.stream, "the all-reduce", LIMIT)?;
    }
    ranks
        .iter()
        .zip(&bufs)
        .try_for_each(|(r, b)| r.check_all_reduce(b, count, round))
}

/// `f(i)` for i in 0..n inside one `ncclGroupStart/End`; every status must be success or in progress.
pub fn group(what: &str, n: usize, mut f: impl FnMut(usize) -> NcclResult) -> Result<(), String> {
    // SAFETY: no arguments.
    accepted(unsafe { ncclGroupStart() }, "ncclGroupStart")?;
    let statuses: Vec<NcclResult> = (0..n).map(&mut f).collect();
    // SAFETY: closes the group opened above.
    let end = unsafe { ncclGroupEnd() };
    for (i, s) in statuses.into_iter().enumerate() {
        accepted(s, &format!("{what} (rank {i})"))?;
    }
    accepted(end, &format!("ncclGroupEnd after {what}"))
}

/// `ncclSuccess`, or `ncclInProgress` (non-blocking communicators); anything else is the error with
/// its code and `ncclGetLastError`'s text.
pub fn accepted(res: NcclResult, what: &str) -> Result<(), String> {
    if res == NcclResult::ncclInProgress {
        return Ok(());
    }
    check_nccl(res, what).map_err(|e| e.to_string())
}

/// Polls `ncclCommGetAsyncError` until it leaves `ncclInProgress`: how long that took, or the error
/// it reported, or a timeout after `limit`.
pub fn wait_ready(comm: NcclComm, what: &str, limit: Duration) -> Result<Duration, String> {
    let start = Instant::now();
    loop {
        let mut state = NcclResult::ncclInProgress;
        // SAFETY: a live communicator; writes one status.
        let res = unsafe { ncclCommGetAsyncError(comm, &mut state) };
        check_nccl(res, "ncclCommGetAsyncError").map_err(|e| e.to_string())?;
        if state != NcclResult::ncclInProgress {
            return check_nccl(state, &format!("{what} (ncclCommGetAsyncError)"))
                .map(|()| start.elapsed())
                .map_err(|e| e.to_string());
        }
        if start.elapsed() > limit {
            return Err(format!("{what}: still ncclInProgress after {limit:?}"));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Polls the stream until its queued work has finished: how long that took, or a timeout.
pub fn wait_stream(stream: CUstream, what: &str, limit: Duration) -> Result<Duration, String> {
    let start = Instant::now();
    // SAFETY: a live stream (the callers' own).
    while !unsafe { stream_ready(stream) }.map_err(|e| e.to_string())? {
        if start.elapsed() > limit {
            return Err(format!("{what}: the stream is still busy after {limit:?}"));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(start.elapsed())
}

/// `ncclCommInitRankConfig` for GPUs 0..n from this thread in one group, blocking or not, waited for
/// until every communicator is ready; a stream each.
pub fn init_ranks(n: usize, blocking: bool) -> Vec<Rank> {
    let id = NcclUniqueId::new().expect("ncclGetUniqueId");
    let mut comms: Vec<NcclComm> = vec![std::ptr::null_mut(); n];
    let mut configs: Vec<NcclConfig> = (0..n)
        .map(|_| NcclConfig {
            blocking: blocking as i32,
            ..NcclConfig::default()
        })
        .collect();
    group("ncclCommInitRankConfig", n, |r| {
        cuda::use_device(r as i32, "init").expect("use_device");
        // SAFETY: writes one handle; rank r of n on the current device r; the config outlives the group.
        unsafe { ncclCommInitRankConfig(&mut comms[r], n as i32, id, r as i32, &mut configs[r]) }
    })
    .expect("ncclCommInitRankConfig on every GPU");
    for &c in &comms {
        wait_ready(c, "ncclCommInitRankConfig", LIMIT).expect("communicator ready");
    }
    comms.into_iter().map(Rank::new).collect()
}

/// Destroys the communicators (when `destroy`; the caller has aborted or destroyed them otherwise)
/// and the streams.
pub fn teardown(ranks: Vec<Rank>, destroy: bool) {
    for r in ranks {
        if destroy {
            // SAFETY: an idle communicator, destroyed once.
            check_nccl(unsafe { ncclCommDestroy(r.comm) }, "ncclCommDestroy").expect("destroy");
        }
        // SAFETY: the rank's own stream, idle, destroyed once.
        unsafe { destroy_stream(r.stream) }.expect("destroy stream");
    }
}

pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The unique id another process printed as hex.
pub fn id_from_hex(hex: &str) -> NcclUniqueId {
    let bytes: Vec<u8> = (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex digits"))
        .collect();
    NcclUniqueId::from_bytes(
        bytes
            .try_into()
            .expect("a unique id of NCCL_UNIQUE_ID_BYTES bytes"),
    )
}
