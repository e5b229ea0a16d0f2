//! What every GPU test shares: the GPU count check, device buffers, a set of communicators with one
//! stream each, and the collective runner that uploads random data, poisons the output, runs one
//! collective on every rank and compares each rank's output with the host's answer.

use std::os::raw::c_void;
use std::time::{Duration, Instant};

use metrale_gpu_sys::cuda::{self, CUdeviceptr, CUevent, CUstream, DriverApi};
use metrale_gpu_sys::nccl::*;

use crate::data::{self, Dtype, Op, Rng};

/// GPUs every test needs.
pub const MIN_GPUS: usize = 2;

/// The byte every output is filled with before a run: NaN in every floating type, so a value NCCL
/// never wrote cannot pass a check.
pub const POISON: u8 = 0xff;

/// The driver, for the tests' own calls.
pub fn api() -> &'static DriverApi {
    cuda::driver("gpu test").expect("CUDA driver")
}

/// Fails the test unless this process may touch the GPUs (`NCCL_NVLS_ENABLE=0`: NVLink multicast is
/// forbidden on the GPU host), the loaded libnccl is not older than the headers, and there are at least
/// two GPUs. Returns the number of GPUs.
pub fn gpus() -> usize {
    match std::env::var("NCCL_NVLS_ENABLE") {
        Ok(v) if v == "0" => {}
        other => panic!(
            "NCCL_NVLS_ENABLE must be 0 in every process that runs these tests (NVLink multicast is \
             forbidden on the GPU host), found {other:?}: run them through ci/gpu"
        ),
    }
    metrale_gpu_sys::version::check_library_version().expect("libnccl matching the headers");
    let api = match cuda::driver("gpu test") {
        Ok(api) => api,
        Err(e) => panic!("needs {MIN_GPUS} GPUs, but the CUDA driver is unavailable: {e}"),
    };
    let mut count = 0;
    // SAFETY: writes one int through a valid pointer.
    check_cuda(
        unsafe { api.cuDeviceGetCount(&mut count) },
        "cuDeviceGetCount",
    )
    .expect("cuDeviceGetCount");
    assert!(
        count as usize >= MIN_GPUS,
        "needs {MIN_GPUS} GPUs, found {count}"
    );
    count as usize
}

// Thin wrappers over the stream and event helpers. Every stream and event the tests pass was created
// by create_stream / create_event and is destroyed only by its owner after its last use, which is the
// helpers' handle contract (they are `unsafe fn` because only the caller can promise a handle is live).

pub fn sync(stream: CUstream) -> Result<(), GpuError> {
    // SAFETY: a live stream (see above).
    unsafe { sync_stream(stream) }
}

pub fn ready(stream: CUstream) -> Result<bool, GpuError> {
    // SAFETY: a live stream (see above).
    unsafe { stream_ready(stream) }
}

pub fn record(event: CUevent, stream: CUstream) -> Result<(), GpuError> {
    // SAFETY: a live event and stream (see above).
    unsafe { record_event(event, stream) }
}

pub fn wait_event(stream: CUstream, event: CUevent) -> Result<(), GpuError> {
    // SAFETY: a live stream and event (see above).
    unsafe { stream_wait_event(stream, event) }
}

pub fn drop_stream(stream: CUstream) -> Result<(), GpuError> {
    // SAFETY: a live stream, not used after this (see above).
    unsafe { destroy_stream(stream) }
}

pub fn drop_event(event: CUevent) -> Result<(), GpuError> {
    // SAFETY: a live event, not used after this (see above).
    unsafe { destroy_event(event) }
}

/// Device memory from `cuMemAlloc` or from `ncclMemAlloc` (the crate's `nccl_mem_alloc`), freed on drop.
pub struct DevBuf {
    pub dev: i32,
    pub ptr: CUdeviceptr,
    pub bytes: usize,
    from_nccl: bool,
}

impl DevBuf {
    pub fn cuda(dev: i32, bytes: usize) -> DevBuf {
        let api = cuda::use_device(dev, "DevBuf::cuda").expect("use_device");
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: writes one device pointer; the device's context is current.
        check_cuda(
            unsafe { api.cuMemAlloc_v2(&mut ptr, bytes.max(1)) },
            "cuMemAlloc",
        )
        .unwrap_or_else(|e| panic!("cuMemAlloc of {bytes} bytes on GPU {dev}: {e}"));
        DevBuf {
            dev,
            ptr,
            bytes,
            from_nccl: false,
        }
    }

    pub fn nccl(dev: i32, bytes: usize) -> DevBuf {
        let ptr = nccl_mem_alloc(dev, bytes.max(1))
            .unwrap_or_else(|e| panic!("nccl_mem_alloc of {bytes} bytes on GPU {dev}: {e}"));
        DevBuf {
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

    /// Fills `len` bytes from `offset` with `byte`, queued on `stream`.
    pub fn fill(&self, offset: usize, len: usize, byte: u8, stream: CUstream) {
        assert!(offset + len <= self.bytes);
        // SAFETY: the range lies inside the allocation; the stream is live.
        check_cuda(
            unsafe { api().cuMemsetD8Async(self.ptr + offset as u64, byte, len, stream) },
            "cuMemsetD8Async",
        )
        .expect("poison");
    }

    /// Copies `data` to `offset`, queued on `stream` (the driver stages pageable memory before returning).
    pub fn upload(&self, offset: usize, data: &[u8], stream: CUstream) {
        assert!(offset + data.len() <= self.bytes);
        if data.is_empty() {
            return;
        }
        // SAFETY: reads data.len() bytes from `data`, writes inside the allocation; the stream is live.
        check_cuda(
            unsafe {
                api().cuMemcpyHtoDAsync_v2(
                    self.ptr + offset as u64,
                    data.as_ptr().cast(),
                    data.len(),
                    stream,
                )
            },
            "cuMemcpyHtoDAsync",
        )
        .expect("upload");
    }

    /// `len` bytes from `offset`, after all work queued on `stream` so far.
    pub fn download(&self, offset: usize, len: usize, stream: CUstream) -> Vec<u8> {
        assert!(offset + len <= self.bytes);
        let mut host = vec![0u8; len];
        if len > 0 {
            // SAFETY: writes len bytes into `host`, reads inside the allocation; the stream is live.
            check_cuda(
                unsafe {
                    api().cuMemcpyDtoHAsync_v2(
                        host.as_mut_ptr().cast(),
                        self.ptr + offset as u64,
                        len,
                        stream,
                    )
                },
                "cuMemcpyDtoHAsync",
            )
            .expect("download");
        }
        sync(stream).expect("sync after download");
        host
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        let result = if self.from_nccl {
            // SAFETY: from nccl_mem_alloc, freed once; its users synchronised before dropping it.
            unsafe { nccl_mem_free(self.ptr as *mut c_void) }
        } else {
            cuda::use_device(self.dev, "DevBuf::drop").and_then(|api| {
                // SAFETY: from cuMemAlloc, freed once; its users synchronised before dropping it.
                check_cuda(unsafe { api.cuMemFree_v2(self.ptr) }, "cuMemFree")
            })
        };
        if let Err(e) = result {
            eprintln!(
                "warning: freeing {} bytes on GPU {}: {e}",
                self.bytes, self.dev
            );
        }
    }
}

/// One communicator per rank, all driven by this thread, each with a stream of its device.
pub struct World {
    pub comms: Vec<NcclComm>,
    pub devs: Vec<i32>,
    pub streams: Vec<CUstream>,
    /// `false` for communicators made with `blocking = 0`: calls may return `ncclInProgress`.
    pub blocking: bool,
    /// How often a call or group returned `ncclInProgress` (non-blocking communicators).
    pub in_progress_seen: std::cell::Cell<usize>,
}

impl World {
    /// `ncclCommInitAll` over GPUs 0..n.
    pub fn init_all(n: usize) -> World {
        let devs: Vec<i32> = (0..n as i32).collect();
        let mut comms = vec![std::ptr::null_mut(); n];
        // SAFETY: comms has room for n handles; devs lists n ordinals.
        check_nccl(
            unsafe { ncclCommInitAll(comms.as_mut_ptr(), n as i32, devs.as_ptr()) },
            "ncclCommInitAll",
        )
        .expect("ncclCommInitAll");
        World::from_comms(comms, true)
    }

    /// `ncclCommInitRank` for each GPU 0..n from this thread, inside `ncclGroupStart/End`.
    pub fn init_rank_group(n: usize) -> World {
        let id = NcclUniqueId::new().expect("ncclGetUniqueId");
        let mut comms = vec![std::ptr::null_mut(); n];
        group("ncclCommInitRank", n, |r| {
            cuda::use_device(r as i32, "init").expect("use_device");
            // SAFETY: writes one handle; rank r of n on the current device r.
            unsafe { ncclCommInitRank(&mut comms[r], n as i32, id, r as i32) }
        })
        .expect("ncclCommInitRank in a group");
        World::from_comms(comms, true)
    }

    /// `ncclCommInitRankConfig` for each GPU 0..n inside a group, with `config(rank)`. For a
    /// non-blocking config, waits until every communicator is ready by polling `ncclCommGetAsyncError`.
    /// Returns the world and what `ncclGroupEnd` returned.
    pub fn init_config(
        n: usize,
        mut config: impl FnMut(usize) -> NcclConfig,
    ) -> Result<(World, NcclResult), GpuError> {
        let id = NcclUniqueId::new()?;
        let mut comms = vec![std::ptr::null_mut(); n];
        let mut configs: Vec<NcclConfig> = (0..n).map(&mut config).collect();
        let blocking = configs[0].blocking != 0;
        // SAFETY: no arguments.
        check_nccl(unsafe { ncclGroupStart() }, "ncclGroupStart")?;
        let mut first_error = None;
        for r in 0..n {
            cuda::use_device(r as i32, "init").expect("use_device");
            // SAFETY: writes one handle; the config lives until the group ends.
            let res = unsafe {
                ncclCommInitRankConfig(&mut comms[r], n as i32, id, r as i32, &mut configs[r])
            };
            if !(res == NcclResult::ncclSuccess || (!blocking && res == NcclResult::ncclInProgress))
            {
                first_error.get_or_insert(res);
            }
        }
        // SAFETY: closes the group opened above.
        let end = unsafe { ncclGroupEnd() };
        if let Some(res) = first_error {
            check_nccl(res, "ncclCommInitRankConfig")?;
        }
        if !(end == NcclResult::ncclSuccess || (!blocking && end == NcclResult::ncclInProgress)) {
            check_nccl(end, "ncclGroupEnd after ncclCommInitRankConfig")?;
        }
        wait_comms(&comms, "ncclCommInitRankConfig")?;
        Ok((World::from_comms(comms, blocking), end))
    }

    /// Takes over communicators made elsewhere (e.g. by a split): one new stream per rank, on the device
    /// the communicator reports.
    pub fn from_comms(comms: Vec<NcclComm>, blocking: bool) -> World {
        let mut world = World {
            devs: Vec::new(),
            streams: Vec::new(),
            comms,
            blocking,
            in_progress_seen: std::cell::Cell::new(0),
        };
        for r in 0..world.comms.len() {
            let dev = world.device(r);
            world.devs.push(dev);
            world
                .streams
                .push(create_stream(dev).expect("create_stream"));
        }
        world
    }

    pub fn n(&self) -> usize {
        self.comms.len()
    }

    /// `ncclCommCuDevice` of rank r.
    pub fn device(&self, r: usize) -> i32 {
        let mut dev = -1;
        // SAFETY: a live communicator; writes one int.
        check_nccl(
            unsafe { ncclCommCuDevice(self.comms[r], &mut dev) },
            "ncclCommCuDevice",
        )
        .expect("ncclCommCuDevice");
        dev
    }

    /// For non-blocking communicators: polls `ncclCommGetAsyncError` until no rank is in progress.
    pub fn wait_ready(&self, what: &str) -> Result<(), GpuError> {
        wait_comms(&self.comms, what)
    }

    /// Calls `f(rank)` for every rank inside one `ncclGroupStart/End` and, for non-blocking
    /// communicators, waits until the group's work is enqueued.
    pub fn group(&self, what: &str, f: impl FnMut(usize) -> NcclResult) -> Result<(), GpuError> {
        let blocking = self.blocking;
        let end = group_with(what, self.n(), blocking, f)?;
        if end == NcclResult::ncclInProgress {
            self.in_progress_seen.set(self.in_progress_seen.get() + 1);
            self.wait_ready(what)?;
        }
        Ok(())
    }

    pub fn sync_all(&self) {
        for &s in &self.streams {
            sync(s).expect("sync_stream");
        }
    }

    /// Gives the communicators up without destroying them (a test finalized, destroyed or aborted them).
    pub fn forget_comms(&mut self) {
        self.comms.clear();
    }
}

impl Drop for World {
    fn drop(&mut self) {
        for &s in &self.streams {
            if let Err(e) = sync(s) {
                eprintln!("warning: sync before teardown: {e}");
            }
        }
        for &comm in &self.comms {
            // SAFETY: a communicator this world owns, idle, destroyed once.
            if let Err(e) = check_nccl(unsafe { ncclCommDestroy(comm) }, "ncclCommDestroy") {
                eprintln!("warning: {e}");
            }
        }
        for &s in &self.streams {
            if let Err(e) = drop_stream(s) {
                eprintln!("warning: {e}");
            }
        }
    }
}

/// Polls `ncclCommGetAsyncError` on every communicator until none is `ncclInProgress`; an error state
/// is returned as the error.
pub fn wait_comms(comms: &[NcclComm], what: &str) -> Result<(), GpuError> {
    let deadline = Instant::now() + Duration::from_secs(120);
    for &comm in comms {
        loop {
            let mut state = NcclResult::ncclInProgress;
            check_nccl(
                // SAFETY: a live communicator; writes one value.
                unsafe { ncclCommGetAsyncError(comm, &mut state) },
                "ncclCommGetAsyncError",
            )?;
            if state != NcclResult::ncclInProgress {
                check_nccl(state, &format!("{what} (async state)"))?;
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: still ncclInProgress after 120 s"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    Ok(())
}

/// `ncclGroupStart`, `f(r)` for r in 0..n, `ncclGroupEnd` (always, even after a failed call). Blocking:
/// every status must be success. Non-blocking: `ncclInProgress` is accepted too. Returns ncclGroupEnd's.
pub fn group_with(
    what: &str,
    n: usize,
    blocking: bool,
    mut f: impl FnMut(usize) -> NcclResult,
) -> Result<NcclResult, GpuError> {
    let ok = |res: NcclResult| {
        res == NcclResult::ncclSuccess || (!blocking && res == NcclResult::ncclInProgress)
    };
    // SAFETY: no arguments.
    check_nccl(unsafe { ncclGroupStart() }, "ncclGroupStart")?;
    let mut first_error = None;
    for r in 0..n {
        let res = f(r);
        if !ok(res) && first_error.is_none() {
            first_error = Some((r, res));
        }
    }
    // SAFETY: closes the group opened above.
    let end = unsafe { ncclGroupEnd() };
    if let Some((r, res)) = first_error {
        check_nccl(res, &format!("{what} (rank {r})"))?;
    }
    if !ok(end) {
        check_nccl(end, &format!("ncclGroupEnd after {what}"))?;
    }
    Ok(end)
}

/// A group over n ranks of blocking communicators.
pub fn group(what: &str, n: usize, f: impl FnMut(usize) -> NcclResult) -> Result<(), GpuError> {
    group_with(what, n, true, f).map(|_| ())
}

/// The collectives the runner knows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Coll {
    AllReduce(Op),
    ReduceScatter(Op),
    Reduce(Op, usize),
    AllGather,
    Broadcast(usize),
    /// `ncclBcast`: in place by definition.
    Bcast(usize),
    AlltoAll,
    Gather(usize),
    Scatter(usize),
    /// `ncclSend` to rank + 1 and `ncclRecv` from rank - 1, in one group.
    SendRecv,
    /// `ncclAllReduce` with an op from `ncclRedOpCreatePreMulSum` (one per rank).
    PreMulSum,
}

impl Coll {
    pub fn name(&self) -> String {
        format!("{self:?}")
    }

    /// Whether the runner has an in-place form of it.
    pub fn has_in_place(&self) -> bool {
        !matches!(self, Coll::AlltoAll | Coll::SendRecv)
    }

    pub fn has_out_of_place(&self) -> bool {
        !matches!(self, Coll::Bcast(_))
    }

    /// Elements of rank r's input and output, for `count` as the call takes it.
    fn sizes(&self, n: usize, count: usize) -> (usize, usize) {
        match self {
            Coll::ReduceScatter(_) | Coll::Scatter(_) => (n * count, count),
            Coll::AllGather | Coll::Gather(_) => (count, n * count),
            Coll::AlltoAll => (n * count, n * count),
            _ => (count, count),
        }
    }

    /// In place: (elements of the one buffer, input offset, output offset), in elements, for rank r.
    fn in_place_layout(&self, n: usize, count: usize, r: usize) -> (usize, usize, usize) {
        match *self {
            Coll::ReduceScatter(_) => (n * count, 0, r * count),
            Coll::AllGather => (n * count, r * count, 0),
            Coll::Gather(root) if r == root => (n * count, root * count, 0),
            Coll::Gather(_) => (n * count, 0, 0),
            Coll::Scatter(root) if r == root => (n * count, 0, root * count),
            Coll::Scatter(_) => (n * count, 0, 0),
            _ => (count, 0, 0),
        }
    }

    /// Whether rank r's input is read (roots only for broadcasts and scatter): an unread input is not
    /// uploaded, so that an in-place output stays poisoned until NCCL writes it.
    fn input_used(&self, r: usize) -> bool {
        match *self {
            Coll::Broadcast(root) | Coll::Bcast(root) | Coll::Scatter(root) => r == root,
            _ => true,
        }
    }

    /// Whether rank r's output is defined (roots only for reduce and gather).
    fn output_defined(&self, r: usize) -> bool {
        match *self {
            Coll::Reduce(_, root) | Coll::Gather(root) => r == root,
            _ => true,
        }
    }
}

/// Where a case's buffers come from: fresh `cuMemAlloc` memory, or given buffers (registered ones),
/// `(input, output)` per rank (for in place, the output buffer alone is used).
pub enum Buffers<'a> {
    Fresh,
    Given(&'a [(&'a DevBuf, &'a DevBuf)]),
}

/// Per-rank scalars for `Coll::PreMulSum`, and whether they live on the device.
#[derive(Clone)]
pub struct PreMul {
    pub scalars: Vec<f64>,
    pub on_device: bool,
}

/// One collective on every rank of `world`: random input (seeded by `seed`), poisoned outputs, the
/// call on every rank in one group, then every rank's defined output compared with the host's answer.
#[allow(clippy::too_many_arguments)]
pub fn run_case(
    world: &World,
    coll: Coll,
    dt: &Dtype,
    count: usize,
    in_place: bool,
    seed: u64,
    buffers: Buffers,
    premul: Option<&PreMul>,
) -> Result<(), String> {
    let n = world.n();
    let es = dt.size;
    let (in_elems, out_elems) = coll.sizes(n, count);
    let inputs: Vec<Vec<u8>> = (0..n)
        .map(|r| dt.random(&mut Rng::new(data::seed(seed, r)), in_elems))
        .collect();

    // Buffers and layouts: (input buffer, input offset, output buffer, output offset) in bytes.
    let mut owned: Vec<DevBuf> = Vec::new();
    let mut layout: Vec<(usize, usize, usize, usize)> = Vec::new(); // indices into `bufs` + offsets
    let mut bufs: Vec<&DevBuf> = Vec::new();
    let given = match buffers {
        Buffers::Given(g) => Some(g),
        Buffers::Fresh => None,
    };
    if given.is_none() {
        for r in 0..n {
            let dev = world.devs[r];
            if in_place {
                let (elems, _, _) = coll.in_place_layout(n, count, r);
                owned.push(DevBuf::cuda(dev, elems * es));
            } else {
                owned.push(DevBuf::cuda(dev, in_elems * es));
                owned.push(DevBuf::cuda(dev, out_elems * es));
            }
        }
        bufs.extend(owned.iter());
    } else if let Some(g) = given {
        for &(i, o) in g {
            bufs.push(i);
            bufs.push(o);
        }
    }
    for r in 0..n {
        let (input, output) = match (&given, in_place) {
            (None, true) => (r, r),
            (None, false) => (2 * r, 2 * r + 1),
            (Some(_), true) => (2 * r + 1, 2 * r + 1),
            (Some(_), false) => (2 * r, 2 * r + 1),
        };
        let (in_off, out_off) = if in_place {
            let (_, i, o) = coll.in_place_layout(n, count, r);
            (i * es, o * es)
        } else {
            (0, 0)
        };
        layout.push((input, in_off, output, out_off));
    }

    // Poison every output, then upload every input (in place: the input overwrites its slot).
    for r in 0..n {
        let (input, in_off, output, out_off) = layout[r];
        let s = world.streams[r];
        let span = if in_place {
            coll.in_place_layout(n, count, r).0 * es
        } else {
            out_elems * es
        };
        let start = if in_place { 0 } else { out_off };
        bufs[output].fill(start, span, POISON, s);
        if coll.input_used(r) {
            bufs[input].upload(in_off, &inputs[r], s);
        }
    }

    // The reduction ops of a pre-multiplied sum, made per rank before the group.
    let mut scalar_bufs: Vec<DevBuf> = Vec::new();
    let mut ops: Vec<NcclRedOp> = Vec::new();
    if let Some(p) = premul {
        for r in 0..n {
            let mut bytes = dt.encode_exact(p.scalars[r]);
            let mut op = NcclRedOp::ncclSum;
            let (ptr, residence) = if p.on_device {
                let b = DevBuf::cuda(world.devs[r], bytes.len());
                b.upload(0, &bytes, world.streams[r]);
                sync(world.streams[r]).map_err(|e| e.to_string())?;
                let ptr = b.at(0);
                scalar_bufs.push(b);
                (ptr, ncclScalarResidence_t::ncclScalarDevice)
            } else {
                (
                    bytes.as_mut_ptr().cast(),
                    ncclScalarResidence_t::ncclScalarHostImmediate,
                )
            };
            check_nccl(
                // SAFETY: the scalar holds one element of dt: host memory read before the call returns,
                // or device memory kept alive (scalar_bufs) until the collective has completed.
                unsafe {
                    ncclRedOpCreatePreMulSum(&mut op, ptr, dt.nccl, residence, world.comms[r])
                },
                "ncclRedOpCreatePreMulSum",
            )
            .map_err(|e| e.to_string())?;
            ops.push(op);
        }
    }

    let ptrs: Vec<(*mut c_void, *mut c_void)> = layout
        .iter()
        .map(|&(i, io, o, oo)| (bufs[i].at(io), bufs[o].at(oo)))
        .collect();
    let launched = world.group(&coll.name(), |r| {
        let (send, recv) = ptrs[r];
        let (comm, s, t) = (world.comms[r], world.streams[r], dt.nccl);
        // SAFETY: send and recv hold the element counts this collective reads and writes on rank r
        // (Coll::sizes / in_place_layout), on the communicator's device, with that device's stream.
        unsafe {
            match coll {
                Coll::AllReduce(op) => ncclAllReduce(send, recv, count, t, op.nccl(), comm, s),
                Coll::PreMulSum => ncclAllReduce(send, recv, count, t, ops[r], comm, s),
                Coll::ReduceScatter(op) => {
                    ncclReduceScatter(send, recv, count, t, op.nccl(), comm, s)
                }
                Coll::Reduce(op, root) => {
                    ncclReduce(send, recv, count, t, op.nccl(), root as i32, comm, s)
                }
                Coll::AllGather => ncclAllGather(send, recv, count, t, comm, s),
                Coll::Broadcast(root) => ncclBroadcast(send, recv, count, t, root as i32, comm, s),
                Coll::Bcast(root) => ncclBcast(recv, count, t, root as i32, comm, s),
                Coll::AlltoAll => ncclAlltoAll(send, recv, count, t, comm, s),
                Coll::Gather(root) => ncclGather(send, recv, count, t, root as i32, comm, s),
                Coll::Scatter(root) => ncclScatter(send, recv, count, t, root as i32, comm, s),
                Coll::SendRecv => {
                    let next = ((r + 1) % n) as i32;
                    let prev = ((r + n - 1) % n) as i32;
                    let sent = ncclSend(send, count, t, next, comm, s);
                    if sent != NcclResult::ncclSuccess && sent != NcclResult::ncclInProgress {
                        return sent;
                    }
                    ncclRecv(recv, count, t, prev, comm, s)
                }
            }
        }
    });
    // Whatever happened, wait for the streams before buffers and ops go away.
    let synced: Result<(), GpuError> = world.streams.iter().try_for_each(|&s| sync(s));
    for (r, &op) in ops.iter().enumerate() {
        check_nccl(
            // SAFETY: the op was made for this communicator; the collective that used it has completed.
            unsafe { ncclRedOpDestroy(op, world.comms[r]) },
            "ncclRedOpDestroy",
        )
        .map_err(|e| e.to_string())?;
    }
    launched.map_err(|e| e.to_string())?;
    synced.map_err(|e| e.to_string())?;

    let slice = |r: usize, from: usize, elems: usize| &inputs[r][from * es..(from + elems) * es];
    let mut errors = Vec::new();
    for r in 0..n {
        if !coll.output_defined(r) {
            continue;
        }
        let (_, _, output, out_off) = layout[r];
        let got = bufs[output].download(out_off, out_elems * es, world.streams[r]);
        let verdict = match coll {
            Coll::AllReduce(op) | Coll::Reduce(op, _) => {
                let ins: Vec<&[u8]> = (0..n).map(|k| slice(k, 0, count)).collect();
                data::check_reduce(dt, op, &ins, &got)
            }
            Coll::ReduceScatter(op) => {
                let ins: Vec<&[u8]> = (0..n).map(|k| slice(k, r * count, count)).collect();
                data::check_reduce(dt, op, &ins, &got)
            }
            Coll::PreMulSum => {
                let ins: Vec<&[u8]> = (0..n).map(|k| slice(k, 0, count)).collect();
                let scalars = &premul.expect("PreMulSum needs scalars").scalars;
                data::check_premul_sum(dt, scalars, &ins, &got)
            }
            Coll::AllGather | Coll::Gather(_) => {
                let expected: Vec<u8> = (0..n).flat_map(|k| slice(k, 0, count).to_vec()).collect();
                data::check_equal(dt, &expected, &got)
            }
            Coll::Broadcast(root) | Coll::Bcast(root) => {
                data::check_equal(dt, slice(root, 0, count), &got)
            }
            Coll::AlltoAll => {
                let expected: Vec<u8> = (0..n)
                    .flat_map(|k| slice(k, r * count, count).to_vec())
                    .collect();
                data::check_equal(dt, &expected, &got)
            }
            Coll::Scatter(root) => data::check_equal(dt, slice(root, r * count, count), &got),
            Coll::SendRecv => data::check_equal(dt, slice((r + n - 1) % n, 0, count), &got),
        };
        if let Err(e) = verdict {
            errors.push(format!("rank {r}: {e}"));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join(" | "))
    }
}

/// Runs many cases, prints one line each, and fails at the end with every failure listed.
pub struct Tally {
    pub passed: usize,
    pub failures: Vec<String>,
    started: Instant,
}

impl Tally {
    pub fn new() -> Tally {
        Tally {
            passed: 0,
            failures: Vec::new(),
            started: Instant::now(),
        }
    }

    pub fn record(&mut self, what: &str, result: Result<(), String>) {
        match result {
            Ok(()) => {
                self.passed += 1;
                println!("ok    {what}");
            }
            Err(e) => {
                println!("FAIL  {what}: {e}");
                self.failures.push(format!("{what}: {e}"));
            }
        }
    }

    /// Runs the case and records it under a name made of its parameters.
    #[allow(clippy::too_many_arguments)]
    pub fn case(
        &mut self,
        world: &World,
        coll: Coll,
        dt: &Dtype,
        count: usize,
        in_place: bool,
        seed: u64,
        buffers: Buffers,
        premul: Option<&PreMul>,
    ) {
        let what = format!(
            "{} {} count {count} ({} bytes) {}",
            coll.name(),
            dt.name,
            count * dt.size,
            if in_place { "in place" } else { "out of place" }
        );
        let result = run_case(world, coll, dt, count, in_place, seed, buffers, premul);
        self.record(&what, result);
    }

    pub fn finish(self, test: &str) {
        println!(
            "{test}: {} cases passed, {} failed, {:.1} s",
            self.passed,
            self.failures.len(),
            self.started.elapsed().as_secs_f64()
        );
        assert!(
            self.failures.is_empty(),
            "{test}: {} case(s) failed:\n{}",
            self.failures.len(),
            self.failures.join("\n")
        );
    }
}
