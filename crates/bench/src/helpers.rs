//! `--helpers`: what the crate's checked helpers cost per call, against the bare driver/NCCL call. The C
//! twin prints the same rows for the direct calls (cuStreamQuery, cuEventRecord, cuStreamWaitEvent, a
//! status compare, ncclGroupStart/End); `raw_*` rows call the crate's driver table without the helper.

use std::error::Error;
use std::hint::black_box;
use std::time::Instant;

use metrale_gpu_sys::cuda::{self, CUresult};
use metrale_gpu_sys::nccl::*;
use metrale_gpu_sys::version;

use crate::args::Options;

/// ns per call of each repetition: (median, min, max).
fn stats(mut per_call: Vec<f64>) -> (f64, f64, f64) {
    per_call.sort_by(f64::total_cmp);
    let n = per_call.len();
    let median = if n % 2 == 1 {
        per_call[n / 2]
    } else {
        (per_call[n / 2 - 1] + per_call[n / 2]) / 2.0
    };
    (median, per_call[0], per_call[n - 1])
}

/// Times `calls` calls of `f`, `reps` times after one untimed repetition; `drain` runs between repetitions
/// (outside the timing). Generic, so that `f` is inlined into the loop as a direct call would be in C.
fn bench<F, D>(o: &Options, name: &str, what: &str, mut f: F, mut drain: D) -> Result<(), GpuError>
where
    F: FnMut() -> Result<(), GpuError>,
    D: FnMut() -> Result<(), GpuError>,
{
    let mut per_call = Vec::with_capacity(o.helper_reps);
    for rep in 0..=o.helper_reps {
        let start = Instant::now();
        for _ in 0..o.helper_calls {
            f()?;
        }
        let elapsed = start.elapsed();
        drain()?;
        if rep > 0 {
            per_call.push(elapsed.as_nanos() as f64 / o.helper_calls as f64);
        }
    }
    let (median, min, max) = stats(per_call);
    println!("helper  {name:<22} {median:9.2} {min:9.2} {max:9.2}  {what}");
    Ok(())
}

pub fn run(o: &Options) -> Result<(), Box<dyn Error>> {
    let library = version::check_library_version()?;
    let api = cuda::driver("perf --helpers")?;
    let stream = create_stream(0)?;
    let event = create_event(0)?;
    // SAFETY: both handles are live; the event is recorded once so that waiting on it is defined.
    unsafe {
        record_event(event, stream)?;
        sync_stream(stream)?;
    }
    println!(
        "# metrale-gpu-sys perf --helpers (Rust, through the crate) nccl-headers={} nccl-library={}",
        NCCL_VERSION_CODE,
        library.major * 10000 + library.minor * 100 + library.patch
    );
    println!(
        "# {} calls per repetition, {} repetitions (+1 untimed); ns per call over the repetitions",
        o.helper_calls, o.helper_reps
    );
    println!("#       name                      median       min       max  call");
    // Every closure below uses `stream` and `event`, which stay live until the end of this function.
    let drain = || {
        // SAFETY: the stream is live.
        unsafe { sync_stream(stream) }
    };
    let idle = || Ok(());
    bench(
        o,
        "stream_ready",
        "metrale_gpu_sys::stream_ready (cuStreamQuery)",
        || {
            // SAFETY: the stream is live.
            unsafe { stream_ready(stream) }.map(|ready| {
                black_box(ready);
            })
        },
        idle,
    )?;
    bench(
        o,
        "check_nccl",
        "metrale_gpu_sys::check_nccl(ncclSuccess)",
        || {
            black_box(check_nccl(
                black_box(NcclResult::ncclSuccess),
                black_box("check_nccl"),
            ))
        },
        idle,
    )?;
    bench(
        o,
        "group_start_end",
        "check_nccl(ncclGroupStart()) + check_nccl(ncclGroupEnd())",
        || {
            // SAFETY: no preconditions.
            check_nccl(unsafe { ncclGroupStart() }, "ncclGroupStart")?;
            // SAFETY: closes the group opened on the line above.
            check_nccl(unsafe { ncclGroupEnd() }, "ncclGroupEnd")
        },
        idle,
    )?;
    bench(
        o,
        "record_event",
        "metrale_gpu_sys::record_event (cuEventRecord)",
        || {
            // SAFETY: event and stream are live and belong to GPU 0.
            unsafe { record_event(event, stream) }
        },
        drain,
    )?;
    bench(
        o,
        "stream_wait_event",
        "metrale_gpu_sys::stream_wait_event (cuStreamWaitEvent)",
        || {
            // SAFETY: event and stream are live; the event was recorded.
            unsafe { stream_wait_event(stream, event) }
        },
        drain,
    )?;
    // The same driver calls through the crate's table, without the helper: where any difference comes from.
    let ok = |r: CUresult, what: &str| {
        if r == CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            check_cuda(r, what)
        }
    };
    bench(
        o,
        "raw_cuStreamQuery",
        "cuda::driver()?.cuStreamQuery",
        || {
            // SAFETY: the stream is live.
            ok(unsafe { api.cuStreamQuery(stream) }, "cuStreamQuery")
        },
        idle,
    )?;
    bench(
        o,
        "raw_cuEventRecord",
        "cuda::driver()?.cuEventRecord",
        || {
            // SAFETY: event and stream are live and belong to GPU 0.
            ok(unsafe { api.cuEventRecord(event, stream) }, "cuEventRecord")
        },
        drain,
    )?;
    bench(
        o,
        "raw_cuStreamWaitEvent",
        "cuda::driver()?.cuStreamWaitEvent",
        || {
            // SAFETY: event and stream are live; the event was recorded.
            let r = unsafe { api.cuStreamWaitEvent(stream, event, 0) };
            ok(r, "cuStreamWaitEvent")
        },
        drain,
    )?;
    // SAFETY: the stream is drained; nothing uses either handle afterwards.
    unsafe {
        sync_stream(stream)?;
        destroy_event(event)?;
        destroy_stream(stream)?;
    }
    Ok(())
}
