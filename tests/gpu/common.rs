//! What every GPU test shares beyond the testkit (re-exported here): the stream and event helpers with
//! the suite's handle contract, and the collective runner that uploads random data, poisons the output,
//! runs one collective on every rank and compares each rank's output with the host's answer.

use std::os::raw::c_void;
use std::time::Instant;

use metrale_gpu_sys::cuda::{CUevent, CUstream};
use metrale_gpu_sys::nccl::*;
pub use metrale_gpu_testkit::devbuf::DevBuf;
pub use metrale_gpu_testkit::gpu::{api, gpus, gpus_in_one_process};
pub use metrale_gpu_testkit::op::Op;
pub use metrale_gpu_testkit::ranks::{self, Me};
pub use metrale_gpu_testkit::skip::skip_named;
pub use metrale_gpu_testkit::world::{group, group_with, wait_comms, World};

use crate::data::{self, Dtype, Rng};

/// The byte every output is filled with before a run: NaN in every floating type, so a value NCCL
/// never wrote cannot pass a check.
pub const POISON: u8 = 0xff;

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
    // ncclAlltoAll, ncclGather and ncclScatter came with NCCL 2.28.
    #[cfg(nccl_2_28)]
    AlltoAll,
    #[cfg(nccl_2_28)]
    Gather(usize),
    #[cfg(nccl_2_28)]
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
        match self {
            #[cfg(nccl_2_28)]
            Coll::AlltoAll => false,
            Coll::SendRecv => false,
            _ => true,
        }
    }

    pub fn has_out_of_place(&self) -> bool {
        !matches!(self, Coll::Bcast(_))
    }

    /// Elements of rank r's input and output, for `count` as the call takes it.
    fn sizes(&self, n: usize, count: usize) -> (usize, usize) {
        match self {
            Coll::ReduceScatter(_) => (n * count, count),
            #[cfg(nccl_2_28)]
            Coll::Scatter(_) => (n * count, count),
            Coll::AllGather => (count, n * count),
            #[cfg(nccl_2_28)]
            Coll::Gather(_) => (count, n * count),
            #[cfg(nccl_2_28)]
            Coll::AlltoAll => (n * count, n * count),
            _ => (count, count),
        }
    }

    /// In place: (elements of the one buffer, input offset, output offset), in elements, for rank r.
    fn in_place_layout(&self, n: usize, count: usize, r: usize) -> (usize, usize, usize) {
        match *self {
            Coll::ReduceScatter(_) => (n * count, 0, r * count),
            Coll::AllGather => (n * count, r * count, 0),
            #[cfg(nccl_2_28)]
            Coll::Gather(root) if r == root => (n * count, root * count, 0),
            #[cfg(nccl_2_28)]
            Coll::Scatter(root) if r == root => (n * count, 0, root * count),
            #[cfg(nccl_2_28)]
            Coll::Gather(_) | Coll::Scatter(_) => (n * count, 0, 0),
            _ => (count, 0, 0),
        }
    }

    /// Whether rank r's input is read (roots only for broadcasts and scatter): an unread input is not
    /// uploaded, so that an in-place output stays poisoned until NCCL writes it.
    fn input_used(&self, r: usize) -> bool {
        match *self {
            Coll::Broadcast(root) | Coll::Bcast(root) => r == root,
            #[cfg(nccl_2_28)]
            Coll::Scatter(root) => r == root,
            _ => true,
        }
    }

    /// Whether rank r's output is defined (roots only for reduce and gather).
    fn output_defined(&self, r: usize) -> bool {
        match *self {
            Coll::Reduce(_, root) => r == root,
            #[cfg(nccl_2_28)]
            Coll::Gather(root) => r == root,
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

/// One collective case: which collective, on what data (`count` as the call takes it, random input
/// from `seed`), in place or not.
#[derive(Clone, Copy)]
pub struct Case<'a> {
    pub coll: Coll,
    pub dt: &'a Dtype,
    pub count: usize,
    pub in_place: bool,
    pub seed: u64,
}

impl<'a> Case<'a> {
    pub fn new(coll: Coll, dt: &'a Dtype, count: usize, in_place: bool, seed: u64) -> Case<'a> {
        Case {
            coll,
            dt,
            count,
            in_place,
            seed,
        }
    }

    /// A name made of its parameters.
    pub fn name(&self) -> String {
        format!(
            "{} {} count {} ({} bytes) {}",
            self.coll.name(),
            self.dt.name,
            self.count,
            self.count * self.dt.size,
            if self.in_place {
                "in place"
            } else {
                "out of place"
            }
        )
    }
}

/// One collective on the ranks `world` drives (all of them, or this process's one): random input for
/// every rank of the communicator (each process computes them all from the seed), poisoned outputs, the
/// call on every local rank in one group, then each local rank's defined output compared with the
/// host's answer.
pub fn run_case(
    world: &World,
    case: Case,
    buffers: Buffers,
    premul: Option<&PreMul>,
) -> Result<(), String> {
    let Case {
        coll,
        dt,
        count,
        in_place,
        seed,
    } = case;
    let n = world.size;
    let local = world.n();
    let es = dt.size;
    let (in_elems, out_elems) = coll.sizes(n, count);
    let inputs: Vec<Vec<u8>> = (0..n)
        .map(|r| dt.random(&mut Rng::new(data::seed(seed, r)), in_elems))
        .collect();

    // Buffers and layouts, per local rank i: (input buffer, input offset, output buffer, output
    // offset), buffers as indices into `bufs`, offsets in bytes.
    let mut owned: Vec<DevBuf> = Vec::new();
    let mut bufs: Vec<&DevBuf> = Vec::new();
    let given = match buffers {
        Buffers::Given(g) => Some(g),
        Buffers::Fresh => None,
    };
    match given {
        None => {
            for i in 0..local {
                let dev = world.devs[i];
                if in_place {
                    let (elems, _, _) = coll.in_place_layout(n, count, world.ranks[i]);
                    owned.push(DevBuf::cuda(dev, elems * es));
                } else {
                    owned.push(DevBuf::cuda(dev, in_elems * es));
                    owned.push(DevBuf::cuda(dev, out_elems * es));
                }
            }
            bufs.extend(owned.iter());
        }
        Some(g) => {
            for &(i, o) in g {
                bufs.push(i);
                bufs.push(o);
            }
        }
    }
    let layout: Vec<(usize, usize, usize, usize)> = (0..local)
        .map(|i| {
            let (input, output) = match (&given, in_place) {
                (None, true) => (i, i),
                (None, false) => (2 * i, 2 * i + 1),
                (Some(_), true) => (2 * i + 1, 2 * i + 1),
                (Some(_), false) => (2 * i, 2 * i + 1),
            };
            let (in_off, out_off) = if in_place {
                let (_, a, b) = coll.in_place_layout(n, count, world.ranks[i]);
                (a * es, b * es)
            } else {
                (0, 0)
            };
            (input, in_off, output, out_off)
        })
        .collect();

    // Poison every output, then upload every input (in place: the input overwrites its slot).
    for i in 0..local {
        let r = world.ranks[i];
        let (input, in_off, output, out_off) = layout[i];
        let s = world.streams[i];
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

    // The reduction ops of a pre-multiplied sum, made per local rank before the group.
    let mut scalar_bufs: Vec<DevBuf> = Vec::new();
    let mut ops: Vec<NcclRedOp> = Vec::new();
    if let Some(p) = premul {
        for i in 0..local {
            let mut bytes = dt.encode_exact(p.scalars[world.ranks[i]]);
            let mut op = NcclRedOp::ncclSum;
            let (ptr, residence) = if p.on_device {
                let b = DevBuf::cuda(world.devs[i], bytes.len());
                b.upload(0, &bytes, world.streams[i]);
                sync(world.streams[i]).map_err(|e| e.to_string())?;
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
                    ncclRedOpCreatePreMulSum(&mut op, ptr, dt.nccl, residence, world.comms[i])
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
    let launched = world.group(&coll.name(), |i| {
        let (send, recv) = ptrs[i];
        let (comm, s, t, r) = (world.comms[i], world.streams[i], dt.nccl, world.ranks[i]);
        // SAFETY: send and recv hold the element counts this collective reads and writes on rank r
        // (Coll::sizes / in_place_layout), on the communicator's device, with that device's stream.
        unsafe {
            match coll {
                Coll::AllReduce(op) => ncclAllReduce(send, recv, count, t, op.nccl(), comm, s),
                Coll::PreMulSum => ncclAllReduce(send, recv, count, t, ops[i], comm, s),
                Coll::ReduceScatter(op) => {
                    ncclReduceScatter(send, recv, count, t, op.nccl(), comm, s)
                }
                Coll::Reduce(op, root) => {
                    ncclReduce(send, recv, count, t, op.nccl(), root as i32, comm, s)
                }
                Coll::AllGather => ncclAllGather(send, recv, count, t, comm, s),
                Coll::Broadcast(root) => ncclBroadcast(send, recv, count, t, root as i32, comm, s),
                Coll::Bcast(root) => ncclBcast(recv, count, t, root as i32, comm, s),
                #[cfg(nccl_2_28)]
                Coll::AlltoAll => ncclAlltoAll(send, recv, count, t, comm, s),
                #[cfg(nccl_2_28)]
                Coll::Gather(root) => ncclGather(send, recv, count, t, root as i32, comm, s),
                #[cfg(nccl_2_28)]
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
    for (i, &op) in ops.iter().enumerate() {
        check_nccl(
            // SAFETY: the op was made for this communicator; the collective that used it has completed.
            unsafe { ncclRedOpDestroy(op, world.comms[i]) },
            "ncclRedOpDestroy",
        )
        .map_err(|e| e.to_string())?;
    }
    launched.map_err(|e| e.to_string())?;
    synced.map_err(|e| e.to_string())?;

    let slice = |r: usize, from: usize, elems: usize| &inputs[r][from * es..(from + elems) * es];
    let mut errors = Vec::new();
    for i in 0..local {
        let r = world.ranks[i];
        if !coll.output_defined(r) {
            continue;
        }
        let (_, _, output, out_off) = layout[i];
        let got = bufs[output].download(out_off, out_elems * es, world.streams[i]);
        // Every rank's input, in rank order: an all-gather's output, and a gather's at the root.
        let gathered = || {
            let expected: Vec<u8> = (0..n).flat_map(|k| slice(k, 0, count).to_vec()).collect();
            data::check_equal(dt, &expected, &got)
        };
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
            Coll::AllGather => gathered(),
            #[cfg(nccl_2_28)]
            Coll::Gather(_) => gathered(),
            Coll::Broadcast(root) | Coll::Bcast(root) => {
                data::check_equal(dt, slice(root, 0, count), &got)
            }
            #[cfg(nccl_2_28)]
            Coll::AlltoAll => {
                let expected: Vec<u8> = (0..n)
                    .flat_map(|k| slice(k, r * count, count).to_vec())
                    .collect();
                data::check_equal(dt, &expected, &got)
            }
            #[cfg(nccl_2_28)]
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

/// `at_two` for a communicator of up to 2 ranks, `beyond` for more: sizes that keep a test short where
/// many ranks share one GPU and talk over loopback sockets.
pub fn sized(world: &World, at_two: usize, beyond: usize) -> usize {
    if world.size <= 2 {
        at_two
    } else {
        beyond
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

    /// Records whether `got` is `want`.
    pub fn check_eq<T: PartialEq + std::fmt::Debug>(&mut self, what: &str, got: T, want: T) {
        let result = if got == want {
            Ok(())
        } else {
            Err(format!("got {got:?}, expected {want:?}"))
        };
        self.record(what, result);
    }

    /// Runs the case on fresh buffers and records it under its name.
    pub fn case(&mut self, world: &World, case: Case) {
        self.run(world, case, Buffers::Fresh, None);
    }

    /// Runs the case with these buffers (and scalars) and records it under its name.
    pub fn run(&mut self, world: &World, case: Case, buffers: Buffers, premul: Option<&PreMul>) {
        self.record(&case.name(), run_case(world, case, buffers, premul));
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
