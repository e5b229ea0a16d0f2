//! `ncclResetDebugInit`: NCCL reads `NCCL_DEBUG` once per process, on its first log call, and keeps
//! it; `ncclResetDebugInit` makes it read it again. Shown in a fresh child process (started without
//! `NCCL_DEBUG`, with `NCCL_DEBUG_FILE` naming a file, which NCCL creates only when it logs): an init
//! writes no log; setting `NCCL_DEBUG=INFO` changes nothing by itself; after `ncclResetDebugInit` the
//! next init writes "NCCL INFO" lines. (A `NCCL_DEBUG` in /etc/nccl.conf or ~/.nccl.conf would defeat
//! the first step; the child's message says so.) Where nccl.h defines `ncclResetDebugInit` as an empty
//! macro (2.30+, outside NCCL's own build, which sets `NCCL_OS_LINUX`) there is no function to call, and
//! the test skips.

use std::path::PathBuf;

use metrale_gpu_sys::cuda;
use metrale_gpu_sys::nccl::*;

use metrale_gpu_testkit::child;
use metrale_gpu_testkit::skip::skip;

use crate::support::*;

#[test]
#[ignore = "needs a GPU (run with the GPU suite)"]
fn reset_debug_init_makes_a_changed_nccl_debug_take_effect() {
    if cfg!(nccl_macro = "ncclResetDebugInit") {
        return skip("nccl.h defines ncclResetDebugInit as an empty macro (NCCL_OS_LINUX unset): no function to call");
    }
    gpus();
    let log = std::env::temp_dir().join(format!("metrale-nccl-debug-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let mut cmd = child::command(
        "debug-reset",
        &[("NCCL_DEBUG_FILE", log.display().to_string())],
    );
    cmd.env_remove("NCCL_DEBUG").env_remove("NCCL_DEBUG_SUBSYS");
    let reset = child::start("debug-reset child", cmd);
    child::expect_success("ncclResetDebugInit", &child::wait_all(vec![reset], LIMIT));
    let _ = std::fs::remove_file(&log);
}

/// The child: the three steps above on a one-rank communicator on GPU 0.
pub fn child() {
    let log = PathBuf::from(child::var("NCCL_DEBUG_FILE"));
    assert!(
        std::env::var_os("NCCL_DEBUG").is_none(),
        "the parent removes NCCL_DEBUG"
    );
    let written = || std::fs::read_to_string(&log).ok();

    init_and_destroy();
    assert_eq!(
        written(),
        None,
        "with NCCL_DEBUG unset NCCL wrote {} (is NCCL_DEBUG set in /etc/nccl.conf or ~/.nccl.conf?)",
        log.display()
    );
    println!("step 1: NCCL_DEBUG unset: an init logs nothing");

    std::env::set_var("NCCL_DEBUG", "INFO");
    init_and_destroy();
    assert_eq!(
        written(),
        None,
        "NCCL read the changed NCCL_DEBUG without ncclResetDebugInit: the reset proves nothing"
    );
    println!("step 2: NCCL_DEBUG=INFO set: still nothing (NCCL keeps the level it read first)");

    reset_debug_init();
    init_and_destroy();
    let text = written().unwrap_or_else(|| {
        panic!(
            "after ncclResetDebugInit, NCCL_DEBUG=INFO did not create {}",
            log.display()
        )
    });
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
    println!("DEBUG RESET CHILD OK");
}

/// `ncclResetDebugInit`, where nccl.h declares the function.
#[cfg(not(nccl_macro = "ncclResetDebugInit"))]
fn reset_debug_init() {
    // SAFETY: no arguments; deprecated in nccl.h but exported (NCCL's debug.cc keeps it).
    unsafe { ncclResetDebugInit() };
}

/// Where nccl.h makes it an empty macro the parent skips, and never starts this child.
#[cfg(nccl_macro = "ncclResetDebugInit")]
fn reset_debug_init() {
    panic!("nccl.h defines ncclResetDebugInit as an empty macro: no function to call");
}

/// A one-rank communicator on GPU 0, created and destroyed: NCCL logs plenty at INFO while doing so.
fn init_and_destroy() {
    cuda::use_device(0, "debug-reset child").expect("use_device");
    let id = NcclUniqueId::new().expect("ncclGetUniqueId");
    let mut comm: NcclComm = std::ptr::null_mut();
    // SAFETY: writes one handle; the only rank on the current device.
    check_nccl(
        unsafe { ncclCommInitRank(&mut comm, 1, id, 0) },
        "ncclCommInitRank",
    )
    .expect("init");
    // SAFETY: an idle communicator, destroyed once.
    check_nccl(unsafe { ncclCommDestroy(comm) }, "ncclCommDestroy").expect("destroy");
}
