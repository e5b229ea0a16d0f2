//! nccl-tests, reproduced through this crate: `all_reduce`, `all_gather`, `reduce_scatter`, `broadcast`,
//! `reduce`, `alltoall` and `sendrecv` over the GPUs of one process, with nccl-tests' options, columns and
//! bus-bandwidth formulas, a real check of every output element, and a CUDA-graph mode. `--helpers` times
//! the crate's checked helpers instead. `c/perf_twin.c` is the same program in C, the reference this one
//! is held to; `stage` stages both for a GPU host and `run.sh` runs them there, beside a build of
//! NVIDIA's nccl-tests when given one (README.md in this folder).
//!
//! ```text
//! cargo run --release -p metrale-gpu-bench -- all_reduce -b 8 -e 4G -f 4 -g 2 -w 5 -n 20
//! cargo run --release -p metrale-gpu-bench -- all_reduce -b 8 -e 64K -f 4 -g 2 -n 100 -G 20 -R 2
//! cargo run --release -p metrale-gpu-bench -- --helpers
//! ```

mod args;
mod coll;
mod data;
mod helpers;
mod register;

use std::error::Error;
use std::io::{IsTerminal, Write};
use std::os::raw::c_void;
use std::process::ExitCode;

use metrale_gpu_sys::cuda::{
    self, CUdeviceptr, CUevent, CUgraph, CUgraphExec, CUstream, DriverApi,
};
use metrale_gpu_sys::nccl::*;
use metrale_gpu_sys::version;

use args::{Coll, Command, DType, Options, Register};
use coll::Counts;
use data::{with_elem, Elem};
use register::Handle;

/// Elements per host-side chunk of the check (64 MiB of the largest type).
const CHUNK_BYTES: usize = 64 << 20;

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    let program = argv.first().map_or("perf", |s| s.as_str());
    let options = match args::parse(&argv[1..]) {
        Ok(Command::Help) => {
            println!("{}", args::usage(program));
            return ExitCode::SUCCESS;
        }
        Ok(Command::Run(options)) => options,
        Err(e) => {
            eprintln!("perf: {e}\nperf: try '{program} --help'");
            return ExitCode::from(1);
        }
    };
    let result = if options.helpers {
        helpers::run(&options).map(|()| 0)
    } else {
        run(&options)
    };
    match result {
        Ok(0) => ExitCode::SUCCESS,
        Ok(wrong) => {
            eprintln!("perf: {wrong} wrong elements: the results are not what the inputs give");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("perf: error: {e}");
            ExitCode::from(1)
        }
    }
}

/// One GPU of the process: its communicator, stream, timing events, the two buffers (`ncclMemAlloc`) and
/// their registrations (`-R`).
struct Gpu {
    device: i32,
    comm: NcclComm,
    stream: CUstream,
    start: CUevent,
    stop: CUevent,
    send: CUdeviceptr,
    recv: CUdeviceptr,
    registered: Vec<Handle>,
}

/// All GPUs, released (best effort) when dropped, also on an error path: registrations first, then the
/// communicators, then the memory, in nccl-tests' order.
struct Gpus {
    list: Vec<Gpu>,
}

impl Drop for Gpus {
    fn drop(&mut self) {
        for g in &self.list {
            // SAFETY: every handle is null/0 or live and owned here; the stream is drained before anything
            // it uses is released, each registration is released once with its own communicator before that
            // communicator, and nothing uses any of them afterwards. Failures are ignored: the process ends.
            unsafe {
                if !g.stream.is_null() {
                    let _ = sync_stream(g.stream);
                }
                for handle in &g.registered {
                    let _ = register::deregister(g.comm, handle);
                }
                if !g.comm.is_null() {
                    let _ = ncclCommDestroy(g.comm);
                }
                for event in [g.start, g.stop] {
                    if !event.is_null() {
                        let _ = destroy_event(event);
                    }
                }
                if !g.stream.is_null() {
                    let _ = destroy_stream(g.stream);
                }
                let _ = cuda::use_device(g.device, "ncclMemFree");
                for ptr in [g.send, g.recv] {
                    if ptr != 0 {
                        let _ = nccl_mem_free(ptr as *mut c_void);
                    }
                }
            }
        }
    }
}

/// One size of the sweep: its counts and nccl-tests' per-iteration buffer shift.
struct Shape {
    counts: Counts,
    /// max(send, recv) in bytes: the printed size, and the stride of the shift.
    total_bytes: usize,
    /// Iteration i works at offset `total_bytes * (i % steps)`, as nccl-tests does (avoids cache effects).
    steps: usize,
}

impl Shape {
    fn new(o: &Options, bytes: usize) -> Shape {
        let elem = o.dtype.size();
        let counts = coll::counts(o.coll, bytes, elem, o.gpus);
        let total_bytes = counts.send.max(counts.recv) * elem;
        let steps = o.max_bytes.checked_div(total_bytes).unwrap_or(1).max(1);
        Shape {
            counts,
            total_bytes,
            steps,
        }
    }
}

struct Bench<'a> {
    o: &'a Options,
    api: &'static DriverApi,
    gpus: Gpus,
    dtype: NcclDataType,
    op: NcclRedOp,
    elem: usize,
    /// The size of each buffer.
    buffer_bytes: usize,
}

/// `-R`: registers both buffers of every GPU with its communicator, in one group for all GPUs, as
/// nccl-tests does.
fn register_all(gpus: &mut Gpus, mode: Register, bytes: usize) -> Result<(), GpuError> {
    if mode == Register::Off {
        return Ok(());
    }
    // SAFETY: no preconditions.
    check_nccl(unsafe { ncclGroupStart() }, "ncclGroupStart")?;
    let mut registered = Ok(());
    for g in &mut gpus.list {
        registered = registered.and_then(|()| cuda::use_device(g.device, "register").map(drop));
        for ptr in [g.send, g.recv] {
            // SAFETY: the communicator is live; ptr is an ncclMemAlloc allocation of `bytes` bytes on its
            // device, freed only after the registration is released (Gpus::drop).
            match unsafe { register::register(mode, g.comm, ptr as *mut c_void, bytes) } {
                Ok(Some(handle)) => g.registered.push(handle),
                Ok(None) => {}
                Err(e) => registered = registered.and(Err(e)),
            }
        }
    }
    // SAFETY: closes the group opened above, whatever happened inside it.
    let ended = check_nccl(unsafe { ncclGroupEnd() }, "ncclGroupEnd");
    registered.and(ended)
}

fn nccl_dtype(t: DType) -> NcclDataType {
    match t {
        DType::Int8 => NcclDataType::ncclInt8,
        DType::Uint8 => NcclDataType::ncclUint8,
        DType::Int32 => NcclDataType::ncclInt32,
        DType::Uint32 => NcclDataType::ncclUint32,
        DType::Int64 => NcclDataType::ncclInt64,
        DType::Uint64 => NcclDataType::ncclUint64,
        DType::Half => NcclDataType::ncclFloat16,
        DType::Float => NcclDataType::ncclFloat32,
        DType::Double => NcclDataType::ncclFloat64,
        DType::Bfloat16 => NcclDataType::ncclBfloat16,
    }
}

fn version_code(v: version::NcclVersion) -> u32 {
    v.major * 10000 + v.minor * 100 + v.patch
}

/// nccl-tests prints the average with C's `%g`: six significant digits, no trailing zeros.
fn format_g(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return format!("{x}");
    }
    let exp = x.abs().log10().floor() as i32;
    if !(-5..6).contains(&exp) {
        return format!("{x:.5e}");
    }
    let decimals = (5 - exp).max(0) as usize;
    let s = format!("{x:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// The sweep; returns the number of wrong elements.
fn run(o: &Options) -> Result<u64, Box<dyn Error>> {
    let library = version::check_library_version()?;
    let api = cuda::driver("perf")?;
    let mut available = 0;
    // SAFETY: writes one int through a valid pointer.
    let r = unsafe { api.cuDeviceGetCount(&mut available) };
    check_cuda(r, "cuDeviceGetCount")?;
    if (available as usize) < o.gpus {
        return Err(format!(
            "-g {} asks for more GPUs than the {available} this process sees",
            o.gpus
        )
        .into());
    }
    let bench = Bench::new(o, api)?;
    let sizes = args::sizes(o);

    println!(
        "# metrale-gpu-sys perf (Rust, through the crate) nccl-headers={} nccl-library={}",
        NCCL_VERSION_CODE,
        version_code(library)
    );
    println!("# Collective test starting: {}", o.coll.name());
    let step = if o.step_factor > 1 {
        format!("{}(factor)", o.step_factor)
    } else {
        format!("{}(bytes)", o.step_bytes)
    };
    println!(
        "# nThread 1 nGpus {} minBytes {} maxBytes {} step: {step} warmup iters: {} iters: {} agg iters: 1 validation: {} graph: {}",
        o.gpus, o.min_bytes, o.max_bytes, o.warmup, o.iters, o.check as i32, o.graph_launches
    );
    println!("# Timing: CUDA events on each GPU's stream around the iterations; the slowest GPU's time / iterations");
    println!(
        "# Buffers: {} bytes each, {}",
        bench.buffer_bytes,
        o.register.describe()
    );
    println!("#\n# Using devices");
    for (rank, g) in bench.gpus.list.iter().enumerate() {
        println!(
            "#  Rank {rank:2} Group  0 Pid {:6} device {:2} {}",
            std::process::id(),
            g.device,
            device_name(api, g.device)?
        );
    }
    println!("#");
    println!("#                                                              out-of-place                       in-place          ");
    println!("#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong ");
    println!("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)         ");

    let tty = std::io::stderr().is_terminal();
    let (mut wrong_total, mut bw_sum, mut bw_count) = (0u64, 0.0, 0u32);
    for (i, &size) in sizes.iter().enumerate() {
        if tty {
            eprint!(
                "\rperf: {} {}/{} sizes ({size} B)   ",
                o.coll.name(),
                i + 1,
                sizes.len()
            );
        } else if size >= 256 << 20 {
            eprintln!(
                "perf: {} {size} B ({}/{})",
                o.coll.name(),
                i + 1,
                sizes.len()
            );
        }
        let shape = Shape::new(o, size);
        let c = &shape.counts;
        let redop = if o.coll.reduces() {
            o.op.name()
        } else {
            "none"
        };
        let root = if o.coll.rooted() { o.root as i64 } else { -1 };
        let mut line = format!(
            "{:12}  {:12}  {:>8}  {:>6}  {:6}",
            shape.total_bytes,
            c.param,
            o.dtype.name(),
            redop,
            root
        );
        for in_place in [false, true] {
            let usec = bench.measure(&shape, in_place)?;
            let wrong = bench.check(&shape, in_place)?;
            let (algbw, busbw) = coll::bandwidths(o.coll, c, bench.elem, o.gpus, usec * 1e-6);
            bw_sum += busbw;
            bw_count += 1;
            let wrong = match wrong {
                Some(w) => {
                    wrong_total += w;
                    w.to_string()
                }
                None => "N/A".to_string(),
            };
            line += &format!("  {usec:7.2}  {algbw:6.2}  {busbw:6.2}  {wrong:>6}");
        }
        println!("{line}");
        std::io::stdout().flush()?;
    }
    if tty {
        eprintln!();
    }
    let verdict = if wrong_total == 0 { "OK" } else { "FAILED" };
    println!("# Wrong elements       : {wrong_total} {verdict}");
    let avg = if bw_count > 0 {
        bw_sum / bw_count as f64
    } else {
        0.0
    };
    println!("# Avg bus bandwidth    : {} ", format_g(avg));
    println!("#\n# Collective test concluded: {}\n#", o.coll.name());
    drop(bench);
    Ok(wrong_total)
}

fn device_name(api: &DriverApi, ordinal: i32) -> Result<String, GpuError> {
    let mut name = [0 as std::os::raw::c_char; 128];
    let mut dev = 0;
    // SAFETY: cuDeviceGetName writes at most `len` bytes, NUL-terminated, into `name`.
    unsafe {
        check_cuda(api.cuDeviceGet(&mut dev, ordinal), "cuDeviceGet")?;
        check_cuda(
            api.cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, dev),
            "cuDeviceGetName",
        )?;
        Ok(std::ffi::CStr::from_ptr(name.as_ptr())
            .to_string_lossy()
            .into_owned())
    }
}

impl<'a> Bench<'a> {
    /// nccl-tests' set-up: a stream and two timing events per GPU, the communicators (`ncclCommInitAll`),
    /// then two buffers of `max(-e, 256)` bytes per GPU from `ncclMemAlloc`, zeroed, registered as `-R`
    /// asks.
    fn new(o: &'a Options, api: &'static DriverApi) -> Result<Bench<'a>, GpuError> {
        let mut gpus = Gpus { list: Vec::new() };
        for d in 0..o.gpus as i32 {
            gpus.list.push(Gpu {
                device: d,
                comm: std::ptr::null_mut(),
                stream: std::ptr::null_mut(),
                start: std::ptr::null_mut(),
                stop: std::ptr::null_mut(),
                send: 0,
                recv: 0,
                registered: Vec::new(),
            });
            let g = &mut gpus.list[d as usize];
            // Makes device d current on this thread.
            g.stream = create_stream(d)?;
            // SAFETY: device d's context is current; each call writes one handle through a valid pointer.
            unsafe {
                check_cuda(api.cuEventCreate(&mut g.start, 0), "cuEventCreate")?;
                check_cuda(api.cuEventCreate(&mut g.stop, 0), "cuEventCreate")?;
            }
        }
        let devices: Vec<i32> = (0..o.gpus as i32).collect();
        let mut comms: Vec<NcclComm> = vec![std::ptr::null_mut(); o.gpus];
        // SAFETY: comms has room for o.gpus handles; devices lists as many ordinals.
        let r = unsafe { ncclCommInitAll(comms.as_mut_ptr(), o.gpus as i32, devices.as_ptr()) };
        check_nccl(r, "ncclCommInitAll")?;
        for (g, comm) in gpus.list.iter_mut().zip(comms) {
            g.comm = comm;
        }
        let bytes = o.max_bytes.max(256);
        for g in &mut gpus.list {
            g.send = nccl_mem_alloc(g.device, bytes)? as CUdeviceptr;
            g.recv = nccl_mem_alloc(g.device, bytes)? as CUdeviceptr; // leaves g's device current
            for ptr in [g.send, g.recv] {
                // SAFETY: ptr holds `bytes` bytes on g's device, which is current; the stream is g's.
                let r = unsafe { api.cuMemsetD8Async(ptr, 0, bytes, g.stream) };
                check_cuda(r, "cuMemsetD8Async")?;
            }
            // SAFETY: the stream is live.
            unsafe { sync_stream(g.stream)? };
        }
        register_all(&mut gpus, o.register, bytes)?;
        Ok(Bench {
            o,
            api,
            gpus,
            dtype: nccl_dtype(o.dtype),
            op: o.op.nccl(),
            elem: o.dtype.size(),
            buffer_bytes: bytes,
        })
    }

    /// The send and receive pointers of rank `rank` for one iteration.
    fn buffers(
        &self,
        s: &Shape,
        g: &Gpu,
        rank: usize,
        in_place: bool,
        shift: usize,
    ) -> (CUdeviceptr, CUdeviceptr) {
        let c = &s.counts;
        if in_place {
            let base = g.recv + shift as u64;
            (
                base + (c.send_inplace * rank * self.elem) as u64,
                base + (c.recv_inplace * rank * self.elem) as u64,
            )
        } else {
            (g.send + shift as u64, g.recv + shift as u64)
        }
    }

    /// One iteration: the collective on every GPU, in one group when there are several (nccl-tests'
    /// `startColl`). Nothing here waits for the GPUs.
    #[inline]
    fn launch(&self, s: &Shape, in_place: bool, iter: usize) -> Result<(), GpuError> {
        let shift = s.total_bytes * (iter % s.steps);
        let grouped = self.gpus.list.len() > 1;
        if grouped {
            // SAFETY: no preconditions.
            check_nccl(unsafe { ncclGroupStart() }, "ncclGroupStart")?;
        }
        for (rank, g) in self.gpus.list.iter().enumerate() {
            let (send, recv) = self.buffers(s, g, rank, in_place, shift);
            // SAFETY: send and recv lie inside this GPU's two max_bytes buffers for the counts of `s` (the
            // shift is at most max_bytes - total_bytes); comm and stream belong to this GPU.
            unsafe { self.issue(s, rank, g, send, recv)? };
        }
        if grouped {
            // SAFETY: closes the group opened above.
            check_nccl(unsafe { ncclGroupEnd() }, "ncclGroupEnd")?;
        }
        Ok(())
    }

    /// The collective of rank `rank`, as nccl-tests' `runColl` of each test issues it.
    ///
    /// # Safety
    /// `send` and `recv` are device pointers valid for the counts of `s` on `g`'s device.
    #[inline]
    unsafe fn issue(
        &self,
        s: &Shape,
        rank: usize,
        g: &Gpu,
        send: CUdeviceptr,
        recv: CUdeviceptr,
    ) -> Result<(), GpuError> {
        let p = s.counts.param;
        let (dt, op, comm, stream) = (self.dtype, self.op, g.comm, g.stream);
        let (sendp, recvp) = (send as *const c_void, recv as *mut c_void);
        let root = self.o.root as i32;
        let n = self.gpus.list.len();
        // SAFETY: guaranteed by the caller (every call below); comm and stream are g's.
        unsafe {
            match self.o.coll {
                Coll::AllReduce => check_nccl(
                    ncclAllReduce(sendp, recvp, p, dt, op, comm, stream),
                    "ncclAllReduce",
                ),
                Coll::AllGather => check_nccl(
                    ncclAllGather(sendp, recvp, p, dt, comm, stream),
                    "ncclAllGather",
                ),
                Coll::ReduceScatter => check_nccl(
                    ncclReduceScatter(sendp, recvp, p, dt, op, comm, stream),
                    "ncclReduceScatter",
                ),
                Coll::Broadcast => check_nccl(
                    ncclBroadcast(sendp, recvp, p, dt, root, comm, stream),
                    "ncclBroadcast",
                ),
                Coll::Reduce => check_nccl(
                    ncclReduce(sendp, recvp, p, dt, op, root, comm, stream),
                    "ncclReduce",
                ),
                Coll::AllToAll => {
                    let block = (p * self.elem) as u64;
                    check_nccl(ncclGroupStart(), "ncclGroupStart")?;
                    for peer in 0..n {
                        let off = block * peer as u64;
                        check_nccl(
                            ncclSend(
                                (send + off) as *const c_void,
                                p,
                                dt,
                                peer as i32,
                                comm,
                                stream,
                            ),
                            "ncclSend",
                        )?;
                        check_nccl(
                            ncclRecv(
                                (recv + off) as *mut c_void,
                                p,
                                dt,
                                peer as i32,
                                comm,
                                stream,
                            ),
                            "ncclRecv",
                        )?;
                    }
                    check_nccl(ncclGroupEnd(), "ncclGroupEnd")
                }
                Coll::SendRecv => {
                    let to = ((rank + 1) % n) as i32;
                    let from = ((rank + n - 1) % n) as i32;
                    check_nccl(ncclGroupStart(), "ncclGroupStart")?;
                    check_nccl(ncclSend(sendp, p, dt, to, comm, stream), "ncclSend")?;
                    check_nccl(ncclRecv(recvp, p, dt, from, comm, stream), "ncclRecv")?;
                    check_nccl(ncclGroupEnd(), "ncclGroupEnd")
                }
            }
        }
    }

    fn sync_all(&self) -> Result<(), GpuError> {
        for g in &self.gpus.list {
            // SAFETY: the stream is live (owned by self.gpus).
            unsafe { sync_stream(g.stream)? };
        }
        Ok(())
    }

    /// µs per iteration: `warmup` untimed iterations, then `iters` timed ones (eagerly, or captured in a
    /// CUDA graph per GPU and launched `graph_launches` times), between CUDA events on each GPU's stream.
    fn measure(&self, s: &Shape, in_place: bool) -> Result<f64, GpuError> {
        let (api, o) = (self.api, self.o);
        for i in 0..o.warmup {
            self.launch(s, in_place, i)?;
        }
        self.sync_all()?;
        // A zero-element size has nothing to capture (an empty graph): it runs eagerly, as the C twin does.
        let graphed = o.graph_launches > 0 && s.counts.param > 0;
        let execs = if graphed {
            self.capture(s, in_place)?
        } else {
            Vec::new()
        };
        let timed = (|| -> Result<f32, GpuError> {
            for g in &self.gpus.list {
                // SAFETY: the event and the stream are live and belong to the same device.
                unsafe { record_event(g.start, g.stream)? };
            }
            if !graphed {
                for i in 0..o.iters {
                    self.launch(s, in_place, i)?;
                }
            } else {
                for _ in 0..o.graph_launches {
                    for (g, &exec) in self.gpus.list.iter().zip(&execs) {
                        // SAFETY: exec was instantiated from a capture of g's stream and is live.
                        let r = unsafe { api.cuGraphLaunch(exec, g.stream) };
                        check_cuda(r, "cuGraphLaunch")?;
                    }
                }
            }
            let mut ms = 0f32;
            for g in &self.gpus.list {
                // SAFETY: events and stream are live; elapsed time is read after the stop event completed.
                unsafe {
                    record_event(g.stop, g.stream)?;
                }
            }
            for g in &self.gpus.list {
                let mut t = 0f32;
                // SAFETY: as above.
                unsafe {
                    check_cuda(api.cuEventSynchronize(g.stop), "cuEventSynchronize")?;
                    check_cuda(
                        api.cuEventElapsedTime(&mut t, g.start, g.stop),
                        "cuEventElapsedTime",
                    )?;
                }
                ms = ms.max(t);
            }
            Ok(ms)
        })();
        for exec in execs {
            // SAFETY: the streams finished every launch (or the run failed); nothing uses exec afterwards.
            unsafe {
                let _ = self.sync_all();
                let _ = api.cuGraphExecDestroy(exec);
            }
        }
        let launches = if graphed { o.graph_launches } else { 1 };
        Ok(timed? as f64 * 1000.0 / (o.iters * launches) as f64)
    }

    /// Captures `iters` iterations into one graph per GPU (thread-local capture mode, as nccl-tests), and
    /// launches each once untimed so that the timed launches find them uploaded.
    fn capture(&self, s: &Shape, in_place: bool) -> Result<Vec<CUgraphExec>, GpuError> {
        let api = self.api;
        let mode = cuda::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        for g in &self.gpus.list {
            // SAFETY: the stream is live and idle.
            let r = unsafe { api.cuStreamBeginCapture_v2(g.stream, mode) };
            check_cuda(r, "cuStreamBeginCapture")?;
        }
        let captured = (0..self.o.iters).try_for_each(|i| self.launch(s, in_place, i));
        // End every capture, whatever happened during it.
        let mut graphs: Vec<CUgraph> = Vec::new();
        let mut ended = Ok(());
        for g in &self.gpus.list {
            let mut graph: CUgraph = std::ptr::null_mut();
            // SAFETY: the stream is capturing; writes one handle.
            let r = unsafe { api.cuStreamEndCapture(g.stream, &mut graph) };
            let r = check_cuda(r, "cuStreamEndCapture");
            if !graph.is_null() {
                graphs.push(graph);
            }
            ended = ended.and(r);
        }
        let mut execs = Vec::new();
        let result = captured.and(ended).and_then(|()| {
            for (g, &graph) in self.gpus.list.iter().zip(&graphs) {
                cuda::use_device(g.device, "cuGraphInstantiate")?;
                let mut exec: CUgraphExec = std::ptr::null_mut();
                // SAFETY: graph is a live graph from the capture; writes one handle.
                let r = unsafe { api.cuGraphInstantiateWithFlags(&mut exec, graph, 0) };
                check_cuda(r, "cuGraphInstantiate")?;
                execs.push(exec);
            }
            for (g, &exec) in self.gpus.list.iter().zip(&execs) {
                // SAFETY: exec is live; g's stream is the stream it was captured from.
                let r = unsafe { api.cuGraphLaunch(exec, g.stream) };
                check_cuda(r, "cuGraphLaunch")?;
            }
            self.sync_all()
        });
        for graph in graphs {
            // SAFETY: the executable graphs are independent of the graph they came from.
            let _ = unsafe { api.cuGraphDestroy(graph) };
        }
        match result {
            Ok(()) => Ok(execs),
            Err(e) => {
                for exec in execs {
                    // SAFETY: not launched, or its launch was waited for above.
                    let _ = unsafe { api.cuGraphExecDestroy(exec) };
                }
                Err(e)
            }
        }
    }

    /// The `#wrong` column: re-fills the inputs with the pattern (outputs with 0xff bytes), runs the
    /// collective once (iteration 0), and compares every output element with the host's expected value.
    /// `None` where nccl-tests prints `N/A` (in-place alltoall and sendrecv) or with `-c 0`.
    fn check(&self, s: &Shape, in_place: bool) -> Result<Option<u64>, GpuError> {
        if !self.o.check || (in_place && self.o.coll.in_place_unchecked()) {
            return Ok(None);
        }
        with_elem!(self.o.dtype, T => self.check_typed::<T>(s, in_place)).map(Some)
    }

    fn check_typed<T: Elem>(&self, s: &Shape, in_place: bool) -> Result<u64, GpuError> {
        debug_assert_eq!(std::mem::size_of::<T>(), self.elem);
        let (api, o) = (self.api, self.o);
        let n = self.gpus.list.len();
        let c = &s.counts;
        let pattern_op = if o.coll.reduces() { Some(o.op) } else { None };
        let chunk = (CHUNK_BYTES / self.elem).min(c.send.max(c.recv)).max(1);
        for (rank, g) in self.gpus.list.iter().enumerate() {
            cuda::use_device(g.device, "check")?;
            // SAFETY: the receive buffer holds max_bytes >= total_bytes; the stream is g's.
            unsafe {
                check_cuda(
                    api.cuMemsetD8Async(g.recv, 0xff, s.total_bytes, g.stream),
                    "cuMemsetD8Async",
                )?;
                sync_stream(g.stream)?;
            }
            let table = data::input_table::<T>(pattern_op, rank);
            let tiled = data::tile(&table, chunk.min(c.send));
            let (send, _) = self.buffers(s, g, rank, in_place, 0);
            let mut done = 0;
            while done < c.send {
                let m = chunk.min(c.send - done);
                let src = &tiled[done % table.len()..][..m];
                // SAFETY: copies m elements from `src` into the send region, which holds c.send elements;
                // the stream is drained before `tiled` is dropped.
                unsafe {
                    let dst = send + (done * self.elem) as u64;
                    let bytes = m * self.elem;
                    check_cuda(
                        api.cuMemcpyHtoDAsync_v2(dst, src.as_ptr().cast(), bytes, g.stream),
                        "cuMemcpyHtoDAsync",
                    )?;
                    sync_stream(g.stream)?;
                }
                done += m;
            }
        }
        self.launch(s, in_place, 0)?;
        self.sync_all()?;
        let mut wrong = 0;
        let mut host = vec![T::default(); chunk];
        let reduction = data::expected_reduction::<T>(o.op, n, o.dtype);
        for (rank, g) in self.gpus.list.iter().enumerate() {
            cuda::use_device(g.device, "check")?;
            let (_, recv) = self.buffers(s, g, rank, in_place, 0);
            for seg in coll::segments(o.coll, c, rank, n, o.root) {
                let copy;
                let expected = match seg.source {
                    Some(source) => {
                        copy = data::expected_copy::<T>(source);
                        &copy
                    }
                    None => &reduction,
                };
                let period = expected.values.len();
                let tiled = data::tile(&data::typed::<T>(expected), chunk.min(seg.len));
                let mut done = 0;
                while done < seg.len {
                    let m = chunk.min(seg.len - done);
                    // SAFETY: reads m elements of the segment, inside the receive region, into `host`.
                    unsafe {
                        let src = recv + ((seg.offset + done) * self.elem) as u64;
                        let bytes = m * self.elem;
                        check_cuda(
                            api.cuMemcpyDtoHAsync_v2(
                                host.as_mut_ptr().cast(),
                                src,
                                bytes,
                                g.stream,
                            ),
                            "cuMemcpyDtoHAsync",
                        )?;
                        sync_stream(g.stream)?;
                    }
                    // Equal to the expected values: done at memcmp speed; otherwise count, with the tolerance.
                    let start = seg.start + done;
                    if host[..m] != tiled[start % period..][..m] {
                        wrong += data::count_wrong(&host[..m], expected, start);
                    }
                    done += m;
                }
            }
        }
        Ok(wrong)
    }
}
