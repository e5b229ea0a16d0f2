//! What run-time loading costs a call: one cheap NCCL call (`ncclGetVersion`, no GPU needed) through the
//! crate (by default its loaded table: an atomic load and an indirect call) against the same call
//! linked (bindgen's own declaration, DT_NEEDED on libnccl), in one run, taking turns: ns per call, the
//! median of the rounds. Not a test: timings are reported, never asserted.
//!
//! `cargo run --release -p metrale-gpu-bench --bin call_cost [CALLS [ROUNDS]]`

use std::hint::black_box;
use std::time::Instant;

/// bindgen's output for the headers the crate was built from (`DEP_NCCL_BINDINGS`): its `extern "C"`
/// declarations, linked against libnccl by build.rs.
#[allow(
    dead_code,
    unused_imports,
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    clippy::all,
    clippy::undocumented_unsafe_blocks,
    clippy::missing_safety_doc,
    // cuda.h's comments, carried over as they are (CUdevice_attribute's name a URL).
    rustdoc::bare_urls
)]
mod linked {
    include!(env!("METRALE_BENCH_BINDINGS"));
}

/// ns per call of `call`, over `calls` calls.
fn per_call(calls: u32, call: impl Fn() -> u32) -> f64 {
    let start = Instant::now();
    let mut failures = 0u32;
    for _ in 0..calls {
        failures += black_box(call());
    }
    let ns = start.elapsed().as_nanos() as f64 / f64::from(calls);
    assert_eq!(failures, 0, "ncclGetVersion failed");
    ns
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<u32>());
    let calls = args.next().and_then(Result::ok).unwrap_or(10_000_000);
    let rounds = args.next().and_then(Result::ok).unwrap_or(11).max(1);
    let through_crate = || {
        let mut v = 0;
        // SAFETY: writes one int through a valid pointer.
        let r = unsafe { metrale_gpu_sys::ncclGetVersion(black_box(&mut v)) };
        u32::from(r != metrale_gpu_sys::NcclResult::ncclSuccess)
    };
    let direct = || {
        let mut v = 0;
        // SAFETY: writes one int through a valid pointer.
        let r = unsafe { linked::ncclGetVersion(black_box(&mut v)) };
        u32::from(r != linked::ncclResult_t::ncclSuccess)
    };
    let first_line = metrale_gpu_sys::version::library_search();
    println!(
        "the crate's libnccl: {}",
        first_line.trim_end().replace('\n', "; ")
    );
    // The first call through the crate loads the library and resolves the function: not timed.
    per_call(1000, through_crate);
    per_call(1000, direct);
    let (mut crate_ns, mut linked_ns) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        if round % 2 == 0 {
            crate_ns.push(per_call(calls, through_crate));
            linked_ns.push(per_call(calls, direct));
        } else {
            linked_ns.push(per_call(calls, direct));
            crate_ns.push(per_call(calls, through_crate));
        }
    }
    let spread = |v: &[f64]| {
        let (lo, hi) = v
            .iter()
            .fold((f64::MAX, 0f64), |(l, h), &x| (l.min(x), h.max(x)));
        format!("min {lo:.2}, max {hi:.2}")
    };
    println!("ncclGetVersion, {rounds} rounds of {calls} calls, ns per call (median; spread):");
    println!(
        "  through the crate  {:.2} ({})",
        median(crate_ns.clone()),
        spread(&crate_ns)
    );
    println!(
        "  linked             {:.2} ({})",
        median(linked_ns.clone()),
        spread(&linked_ns)
    );
    println!(
        "  difference         {:+.2}",
        median(crate_ns) - median(linked_ns)
    );
}
