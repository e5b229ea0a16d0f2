//! Nothing leaks: many create/destroy cycles leave this process's device memory (nvidia-smi's
//! per-process figure, see `device_memory`) and host memory (VmRSS) where they started, within stated
//! tolerances (communicators over every rank, one process per rank; streams, events and NCCL memory in
//! one process); and the helpers and the driver loader from 32 threads of one process. Each test is a
//! process of its own under the GPU runner (nextest), so other tests and runners on the GPU do not count.

use std::sync::Barrier;
use std::time::Instant;

use metrale_gpu_sys::cuda;
use metrale_gpu_sys::nccl::*;

use crate::common::*;

/// The device memory this process uses on its GPUs and its host memory, before and after; fails beyond
/// the tolerances (MiB).
struct Gauge {
    what: String,
    devices: Vec<i32>,
    used: Used,
    rss: usize,
    start: Instant,
}

impl Gauge {
    fn start(what: &str, devices: Vec<i32>) -> Gauge {
        Gauge {
            what: what.to_string(),
            used: device_memory::used(&devices),
            devices,
            rss: rss(),
            start: Instant::now(),
        }
    }

    /// Measures (device MiB grown, host MiB grown), then prints and checks; the device figure is not
    /// checked where `dev_tolerance_mib` is `None` (the caller has said why).
    fn finish(self, dev_tolerance_mib: Option<f64>, rss_tolerance_mib: f64) -> String {
        let dev_grown = self.used.grown_mib(&device_memory::used(&self.devices));
        let rss_grown = (rss() as f64 - self.rss as f64) / MIB;
        let tolerance = match dev_tolerance_mib {
            Some(t) => format!("tolerance {t} MiB"),
            None => "not checked".to_string(),
        };
        let line = format!(
            "{}: {:.1} s; device memory grown {dev_grown:.1} MiB ({}; {tolerance}), VmRSS grown {rss_grown:.1} MiB (tolerance {rss_tolerance_mib} MiB)",
            self.what,
            self.start.elapsed().as_secs_f64(),
            self.used.source,
        );
        println!("{line}");
        assert!(
            dev_tolerance_mib.is_none_or(|t| dev_grown <= t),
            "device memory leaked: {line}"
        );
        assert!(rss_grown <= rss_tolerance_mib, "host memory leaked: {line}");
        line
    }
}

/// 100 000 stream and event create/destroy cycles, 1 000 `nccl_mem_alloc`/`nccl_mem_free` of 2 MiB, in
/// one process, spread over every GPU of the host (no communicator: the rank count does not matter).
#[test]
#[ignore = "needs a GPU: run through ci/gpu-run.sh"]
fn no_leak_streams_events_nccl_memory() {
    let devices: Vec<i32> = (0..gpus() as i32).collect();
    let on = |i: usize| devices[i % devices.len()];
    // Warm up: the driver's pools and NCCL's allocator state exist before the baseline.
    let cycle = |dev: i32| {
        let s = create_stream(dev).expect("create_stream");
        let e = create_event(dev).expect("create_event");
        // SAFETY: both handles were just created and are destroyed once.
        unsafe {
            record_event(e, s).expect("record_event");
            destroy_event(e).expect("destroy_event");
            destroy_stream(s).expect("destroy_stream");
        }
    };
    for i in 0..1000 {
        cycle(on(i));
    }
    let g = Gauge::start("100000 stream+event cycles", devices.clone());
    for i in 0..100_000 {
        cycle(on(i));
    }
    let a = g.finish(Some(8.0), 16.0);

    let alloc = |dev: i32, i: usize| {
        let p = nccl_mem_alloc(dev, (2 << 20) + i % 7).expect("nccl_mem_alloc");
        // SAFETY: from nccl_mem_alloc, unused, freed once.
        unsafe { nccl_mem_free(p) }.expect("nccl_mem_free");
    };
    for i in 0..10 {
        alloc(on(i), i);
    }
    let g = Gauge::start("1000 nccl_mem_alloc/free cycles of 2 MiB", devices.clone());
    for i in 0..1000 {
        alloc(on(i), i);
    }
    let b = g.finish(Some(8.0), 16.0);
    measured(&format!("{a} | {b}"));
}

/// Communicator cycles per rank after two to warm up (default 24: half reported, half checked, where a
/// leak of 3 MiB a cycle in each process shows): each a fresh unique id, ncclCommInitRank over every
/// rank, one all-reduce checked against the host (so connections are set up and torn down each time),
/// ncclCommDestroy.
const LEAK_CYCLES_VAR: &str = "METRALE_FAULT_LEAK_CYCLES";

/// Cycles of a communicator over every rank, each rank in its own process: each process's device
/// memory and VmRSS stay where they were.
#[test]
#[ignore = "needs a GPU: run through ci/gpu-run.sh"]
fn no_leak_communicators() {
    ranks::test("leaks::no_leak_communicators").run_raw(|me| {
        let cycles: usize = std::env::var(LEAK_CYCLES_VAR)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(24);
        let cycle = |i: usize| {
            let mut summed = Summed::new(me.join_id(&format!("cycle-{i}")), 1024);
            summed
                .check_all_reduce(1000 + i as u64)
                .unwrap_or_else(|e| panic!("cycle {i}: {e}"));
        };
        // Warm up: NCCL's kernels, topology and plugins are loaded by the first communicator.
        cycle(0);
        cycle(1);
        let test = "leaks::no_leak_communicators (device memory)";
        let dev_tolerance = match device_memory::used(&[me.device]).source {
            Source::Process => Some(32.0),
            Source::GpuWide(_) => {
                // The whole GPU's figure counts every rank on it, each in the middle of its own cycles.
                me.publish(&format!("device.{}", me.rank), &me.device.to_le_bytes());
                let sharing = (0..me.nranks)
                    .filter(|k| me.fetch(&format!("device.{k}")) == me.device.to_le_bytes())
                    .count();
                if sharing > 1 {
                    metrale_gpu_testkit::skip::skip_named(test, format_args!(
                        "rank {}: {sharing} ranks share GPU {} and only its GPU-wide figure is known \
                         (see the device memory line): VmRSS is checked",
                        me.rank, me.device
                    ));
                }
                (sharing == 1).then_some(32.0)
            }
        };
        // The first half is reported; the second half is checked: a leak grows with every cycle, while
        // malloc's per-thread arenas (NCCL starts threads per communicator) fill once and then stay.
        let half = cycles / 2;
        let rss_start = rss();
        for i in 0..half {
            cycle(2 + i);
        }
        println!(
            "first {half} communicator cycles (reported): VmRSS grew {:.1} MiB",
            (rss() as f64 - rss_start as f64) / MIB
        );
        let g = Gauge::start(
            &format!(
                "rank {} of {}: next {half} communicator init/all-reduce/destroy cycles (GPU {})",
                me.rank, me.nranks, me.device
            ),
            vec![me.device],
        );
        for i in half..2 * half {
            cycle(2 + i);
        }
        let line = g.finish(dev_tolerance, 64.0);
        if me.rank == 0 {
            measured(&line);
        }
    });
}

/// What a thread saw: the driver table's address, its current context, a unique id's bytes.
type Seen = (usize, usize, Vec<u8>);

/// 32 threads of one process at once, from a barrier, spread over every GPU of the host: the driver
/// loaded once (every thread gets the same table), one primary context per device, and every helper
/// working: streams, events, NCCL memory, unique ids.
#[test]
#[ignore = "needs a GPU: run through ci/gpu-run.sh"]
fn many_threads_share_one_driver_and_helpers_work() {
    let gpus = gpus();
    const THREADS: usize = 32;
    let barrier = Barrier::new(THREADS);
    let results: Vec<Result<Seen, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || -> Result<Seen, String> {
                    barrier.wait();
                    let api = cuda::driver("thread").map_err(|e| e.to_string())?;
                    let dev = (t % gpus) as i32;
                    let api2 = cuda::use_device(dev, "thread").map_err(|e| e.to_string())?;
                    let mut ctx = std::ptr::null_mut();
                    // SAFETY: writes one handle through a valid pointer.
                    check_cuda(unsafe { api2.cuCtxGetCurrent(&mut ctx) }, "cuCtxGetCurrent")
                        .map_err(|e| e.to_string())?;
                    let id = NcclUniqueId::new().map_err(|e| e.to_string())?;
                    for i in 0..20u8 {
                        let stream = create_stream(dev).map_err(|e| e.to_string())?;
                        let event = create_event(dev).map_err(|e| e.to_string())?;
                        let bytes = 4096 + t;
                        let buf = nccl_mem_alloc(dev, bytes).map_err(|e| e.to_string())?;
                        let pattern = (t as u8).wrapping_mul(7).wrapping_add(i);
                        let mut host = vec![0u8; bytes];
                        // SAFETY: the buffer holds `bytes` bytes on this thread's current device; the
                        // stream and event are live and destroyed once, after the stream is idle.
                        unsafe {
                            check_cuda(
                                api.cuMemsetD8Async(buf as u64, pattern, bytes, stream),
                                "cuMemsetD8Async",
                            )
                            .map_err(|e| e.to_string())?;
                            record_event(event, stream).map_err(|e| e.to_string())?;
                            stream_wait_event(stream, event).map_err(|e| e.to_string())?;
                            check_cuda(
                                api.cuMemcpyDtoHAsync_v2(
                                    host.as_mut_ptr().cast(),
                                    buf as u64,
                                    bytes,
                                    stream,
                                ),
                                "cuMemcpyDtoHAsync",
                            )
                            .map_err(|e| e.to_string())?;
                            sync_stream(stream).map_err(|e| e.to_string())?;
                            if !stream_ready(stream).map_err(|e| e.to_string())? {
                                return Err("stream_ready false after sync_stream".into());
                            }
                            nccl_mem_free(buf).map_err(|e| e.to_string())?;
                            destroy_event(event).map_err(|e| e.to_string())?;
                            destroy_stream(stream).map_err(|e| e.to_string())?;
                        }
                        if let Some(k) = host.iter().position(|&b| b != pattern) {
                            return Err(format!(
                                "thread {t}: byte {k} is {}, expected {pattern} (host)",
                                host[k]
                            ));
                        }
                    }
                    Ok((
                        api as *const _ as usize,
                        ctx as usize,
                        id.to_bytes().to_vec(),
                    ))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("thread panicked".into())))
            .collect()
    });
    let mut failures = Vec::new();
    let mut tables = Vec::new();
    let mut contexts: Vec<Vec<usize>> = vec![Vec::new(); gpus];
    let mut ids = Vec::new();
    for (t, r) in results.into_iter().enumerate() {
        match r {
            Ok((table, ctx, id)) => {
                tables.push(table);
                contexts[t % gpus].push(ctx);
                ids.push(id);
            }
            Err(e) => failures.push(format!("thread {t}: {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    tables.dedup();
    assert_eq!(
        tables.len(),
        1,
        "threads got different driver tables: loaded more than once"
    );
    for (d, c) in contexts.iter_mut().enumerate() {
        c.dedup();
        assert_eq!(
            c.len(),
            1,
            "GPU {d}: threads got different primary contexts {c:?}"
        );
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), THREADS, "unique ids repeated across threads");
    measured(&format!("{THREADS} threads x 20 rounds over {gpus} GPU(s): one driver table, one context per GPU, every memset read back correct"));
}
