//! Nothing leaks: many create/destroy cycles leave device memory (cuMemGetInfo) and host memory (VmRSS)
//! where they started, within stated tolerances; and the helpers and the driver loader from 32 threads.

use std::sync::Barrier;
use std::time::Instant;

use metrale_gpu_sys::cuda;
use metrale_gpu_sys::nccl::*;

use crate::common::*;

/// Device and host memory before and after; fails beyond the tolerances (MiB).
struct Gauge {
    what: String,
    dev: [usize; 2],
    rss: usize,
    start: Instant,
}

impl Gauge {
    fn start(what: &str) -> Gauge {
        Gauge {
            what: what.to_string(),
            dev: [device_free(0), device_free(1)],
            rss: rss(),
            start: Instant::now(),
        }
    }

    /// (device MiB lost on the worse GPU, host MiB grown), printed and checked.
    fn finish(self, dev_tolerance_mib: f64, rss_tolerance_mib: f64) -> String {
        let dev_lost = (0..2)
            .map(|d| (self.dev[d] as f64 - device_free(d as i32) as f64) / MIB)
            .fold(f64::MIN, f64::max);
        let rss_grown = (rss() as f64 - self.rss as f64) / MIB;
        let line = format!(
            "{}: {:.1} s; device memory lost {dev_lost:.1} MiB (tolerance {dev_tolerance_mib} MiB), VmRSS grown {rss_grown:.1} MiB (tolerance {rss_tolerance_mib} MiB)",
            self.what,
            self.start.elapsed().as_secs_f64()
        );
        println!("{line}");
        assert!(
            dev_lost <= dev_tolerance_mib,
            "device memory leaked: {line}"
        );
        assert!(rss_grown <= rss_tolerance_mib, "host memory leaked: {line}");
        line
    }
}

/// 100 000 stream and event create/destroy cycles, 1 000 `nccl_mem_alloc`/`nccl_mem_free` of 2 MiB.
#[test]
#[ignore = "needs 2 GPUs: run through ci/gpu-run.sh"]
fn no_leak_streams_events_nccl_memory() {
    gpus();
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
        cycle(i % 2);
    }
    let g = Gauge::start("100000 stream+event cycles");
    for i in 0..100_000 {
        cycle(i % 2);
    }
    let a = g.finish(8.0, 16.0);

    let alloc = |dev: i32, i: usize| {
        let p = nccl_mem_alloc(dev, (2 << 20) + i % 7).expect("nccl_mem_alloc");
        // SAFETY: from nccl_mem_alloc, unused, freed once.
        unsafe { nccl_mem_free(p) }.expect("nccl_mem_free");
    };
    for i in 0..10 {
        alloc((i % 2) as i32, i);
    }
    let g = Gauge::start("1000 nccl_mem_alloc/free cycles of 2 MiB");
    for i in 0..1000 {
        alloc((i % 2) as i32, i);
    }
    let b = g.finish(8.0, 16.0);
    measured(&format!("{a} | {b}"));
}

/// 100 cycles of a 2-GPU communicator: ncclCommInitAll, one all-reduce checked against the host (so
/// connections are set up and torn down each time), ncclCommDestroy.
#[test]
#[ignore = "needs 2 GPUs: run through ci/gpu-run.sh"]
fn no_leak_communicators() {
    gpus();
    const CYCLES: u64 = 100;
    let cycle = |i: u64| {
        let pair = Pair::init_all(1024);
        pair.check_all_reduce(1000 + i)
            .unwrap_or_else(|e| panic!("cycle {i}: {e}"));
    };
    // Warm up: NCCL's kernels, topology and plugins are loaded by the first communicator.
    cycle(0);
    cycle(1);
    // The first half is reported; the second half is checked: a leak grows with every cycle, while
    // malloc's per-thread arenas (NCCL starts threads per communicator) fill once and then stay.
    let first = Gauge::start(&format!(
        "first {} communicator cycles (reported)",
        CYCLES / 2
    ));
    let rss_start = rss();
    for i in 0..CYCLES / 2 {
        cycle(2 + i);
    }
    println!(
        "{}: VmRSS grew {:.1} MiB",
        first.what,
        (rss() as f64 - rss_start as f64) / MIB
    );
    let g = Gauge::start(&format!(
        "next {} communicator init/all-reduce/destroy cycles",
        CYCLES / 2
    ));
    for i in CYCLES / 2..CYCLES {
        cycle(2 + i);
    }
    let line = g.finish(32.0, 64.0);
    measured(&line);
}

/// What a thread saw: the driver table's address, its current context, a unique id's bytes.
type Seen = (usize, usize, Vec<u8>);

/// 32 threads at once, from a barrier: the driver loaded once (every thread gets the same table), one
/// primary context per device, and every helper working: streams, events, NCCL memory, unique ids.
#[test]
#[ignore = "needs 2 GPUs: run through ci/gpu-run.sh"]
fn many_threads_share_one_driver_and_helpers_work() {
    gpus();
    const THREADS: usize = 32;
    let barrier = Barrier::new(THREADS);
    let results: Vec<Result<Seen, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || -> Result<Seen, String> {
                    barrier.wait();
                    let api = cuda::driver("thread").map_err(|e| e.to_string())?;
                    let dev = (t % 2) as i32;
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
    let mut contexts: [Vec<usize>; 2] = [Vec::new(), Vec::new()];
    let mut ids = Vec::new();
    for (t, r) in results.into_iter().enumerate() {
        match r {
            Ok((table, ctx, id)) => {
                tables.push(table);
                contexts[t % 2].push(ctx);
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
    measured(&format!("{THREADS} threads x 20 rounds: one driver table, one context per GPU, every memset read back correct"));
}
