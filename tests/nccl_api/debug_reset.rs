//! `ncclResetDebugInit`: NCCL reads `NCCL_DEBUG` once per process, on its first log call, and keeps
//! it; `ncclResetDebugInit` makes it read it again. Shown in every rank's process (each fresh, so its
//! NCCL has not logged yet): with `NCCL_DEBUG` removed and `NCCL_DEBUG_FILE` naming a file of the
//! rank's, which NCCL creates only when it logs, an init over every rank writes no log; setting
//! `NCCL_DEBUG=INFO` changes nothing by itself; after `ncclResetDebugInit` the next init writes "NCCL
//! INFO" lines. (A `NCCL_DEBUG` in /etc/nccl.conf or ~/.nccl.conf would defeat the first step; the
//! message says so.) Where nccl.h defines `ncclResetDebugInit` as an empty macro (2.30+, outside NCCL's
//! own build, which sets `NCCL_OS_LINUX`) there is no function to call, and the test skips.

use metrale_gpu_sys::cuda;
use metrale_gpu_sys::nccl::*;
use metrale_gpu_testkit::skip::skip;

use crate::support::*;

#[test]
#[ignore = "needs a GPU: run through ci/gpu-run.sh"]
fn reset_debug_init_makes_a_changed_nccl_debug_take_effect() {
    if cfg!(nccl_macro = "ncclResetDebugInit") {
        return skip("nccl.h defines ncclResetDebugInit as an empty macro (NCCL_OS_LINUX unset): no function to call");
    }
    ranks::test("debug_reset::reset_debug_init_makes_a_changed_nccl_debug_take_effect")
        .run_raw(reset_in_a_rank);
}

/// The three steps above in one rank's process. Nothing here has called NCCL yet, so the variables
/// changed first are the ones NCCL reads on its first log call.
fn reset_in_a_rank(me: &Me) {
    let log = std::env::temp_dir().join(format!(
        "metrale-nccl-debug-{}-rank{}.log",
        std::process::id(),
        me.rank
    ));
    let _ = std::fs::remove_file(&log);
    std::env::remove_var("NCCL_DEBUG");
    std::env::remove_var("NCCL_DEBUG_SUBSYS");
    std::env::set_var("NCCL_DEBUG_FILE", &log);
    let written = || std::fs::read_to_string(&log).ok();

    init_and_destroy(me, "step-1");
    assert_eq!(
        written(),
        None,
        "with NCCL_DEBUG unset NCCL wrote {} (is NCCL_DEBUG set in /etc/nccl.conf or ~/.nccl.conf?)",
        log.display()
    );
    println!("step 1: NCCL_DEBUG unset: an init logs nothing");

    std::env::set_var("NCCL_DEBUG", "INFO");
    init_and_destroy(me, "step-2");
    assert_eq!(
        written(),
        None,
        "NCCL read the changed NCCL_DEBUG without ncclResetDebugInit: the reset proves nothing"
    );
    println!("step 2: NCCL_DEBUG=INFO set: still nothing (NCCL keeps the level it read first)");

    reset_debug_init();
    init_and_destroy(me, "step-3");
    let text = written().unwrap_or_else(|| {
        panic!(
            "after ncclResetDebugInit, NCCL_DEBUG=INFO did not create {}",
            log.display()
        )
    });
    let _ = std::fs::remove_file(&log);
    let info: Vec<&str> = text.lines().filter(|l| l.contains("NCCL INFO")).collect();
    println!(
        "step 3: after ncclResetDebugInit: {} \"NCCL INFO\" lines, the first:\n  {}",
        info.len(),
        info.iter()
            .take(3)
            .copied()
            .collect::<Vec<_>>()
            .join("\n  ")
    );
    assert!(
        !info.is_empty(),
        "no \"NCCL INFO\" line in {}:\n{text}",
        log.display()
    );
}

/// `ncclResetDebugInit`, where nccl.h declares the function.
#[cfg(not(nccl_macro = "ncclResetDebugInit"))]
fn reset_debug_init() {
    // SAFETY: no arguments; deprecated in nccl.h but exported (NCCL's debug.cc keeps it).
    unsafe { ncclResetDebugInit() };
}

/// Where nccl.h makes it an empty macro the test skips, and never reaches this.
#[cfg(nccl_macro = "ncclResetDebugInit")]
fn reset_debug_init() {
    panic!("nccl.h defines ncclResetDebugInit as an empty macro: no function to call");
}

/// A communicator over every rank, from a unique id shared under `key`, created and destroyed: NCCL
/// logs plenty at INFO while doing so.
fn init_and_destroy(me: &Me, key: &str) {
    let id = me.share_id(key, 0);
    cuda::use_device(me.device, "debug reset").expect("use_device");
    let mut comm: NcclComm = std::ptr::null_mut();
    // SAFETY: writes one handle; rank `rank` of `nranks` on the current device.
    check_nccl(
        unsafe { ncclCommInitRank(&mut comm, me.nranks as i32, id, me.rank as i32) },
        "ncclCommInitRank",
    )
    .expect("init");
    // SAFETY: an idle communicator, destroyed once.
    check_nccl(unsafe { ncclCommDestroy(comm) }, "ncclCommDestroy").expect("destroy");
}
