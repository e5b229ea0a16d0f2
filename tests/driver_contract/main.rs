//! The driver contract, against a stand-in `libcuda.so.1` (`libcuda_standin.c`, compiled here with `cc`)
//! that has the required functions and lacks the newer optional ones: the helpers work, a missing optional
//! function is an error naming it, `cuEventElapsedTime` falls back to the original, a driver lacking a
//! required function or of an older CUDA major version is unavailable, and a driver whose `cuInit` failed
//! stays loaded and still names codes. Each case runs in a child process (the driver loads once per
//! process), which finds the stand-in through `LD_LIBRARY_PATH`. The stand-in is built with the C compiler
//! that built the crate's shim (the target's, when cross-compiling), and the child runs as this binary
//! does (through the target's runner, qemu-user, when cross-testing).

use std::path::PathBuf;

use metrale_gpu_sys::cuda::{self, CUDA_VERSION};
use metrale_gpu_sys::nccl::*;
use metrale_gpu_testkit::standin::{Load, StandIn};

/// Set in a child: the case it runs.
const CHILD: &str = "METRALE_STANDIN_CASE";

/// Runs `case` (a test of this file) in a child process against the stand-in built with `flags`;
/// returns false in that child, where the test itself then runs.
fn in_child(case: &str, flags: &[&str]) -> bool {
    if std::env::var(CHILD).as_deref() == Ok(case) {
        return false;
    }
    let flags: Vec<String> = flags.iter().map(|f| f.to_string()).collect();
    StandIn {
        cc: env!("METRALE_TARGET_CC"),
        source: concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/driver_contract/libcuda_standin.c"
        ),
        flags: &flags,
        dir: PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("standin-{case}")),
        name: "libcuda.so.1",
        load: Load::ByName,
    }
    .run(case, &[(CHILD, case.to_string())]);
    true
}

/// `-DDRIVER_VERSION=` for a driver of the headers' CUDA major version less `major_offset`, minor 0.
fn driver_version(major_offset: u32) -> String {
    format!(
        "-DDRIVER_VERSION={}",
        (CUDA_VERSION / 1000 - major_offset) * 1000
    )
}

#[test]
fn an_older_driver_serves_the_helpers_and_names_what_it_lacks() {
    let version = driver_version(0);
    if in_child(
        "an_older_driver_serves_the_helpers_and_names_what_it_lacks",
        &[&version],
    ) {
        return;
    }
    let api = cuda::driver("test").expect("the stand-in has every required function");
    // The helpers call required functions only.
    let stream = create_stream(0).expect("cuStreamCreate");
    let event = create_event(0).expect("cuEventCreate");
    // SAFETY: the stand-in's handles, live until destroyed below.
    unsafe {
        record_event(event, stream).expect("cuEventRecord");
        stream_wait_event(stream, event).expect("cuStreamWaitEvent");
        assert_eq!(stream_ready(stream), Ok(true));
        sync_stream(stream).expect("cuStreamSynchronize");
        destroy_event(event).expect("cuEventDestroy");
        destroy_stream(stream).expect("cuStreamDestroy");
    }

    // An optional function the driver lacks: an error naming it and the CUDA version it needs.
    // SAFETY: the call never reaches a driver that lacks it.
    let err = unsafe { api.cuGraphLaunch(std::ptr::null_mut(), std::ptr::null_mut()) }
        .expect_err("the stand-in has no graphs");
    let driver = (CUDA_VERSION / 1000 * 1000) as i32;
    assert_eq!(
        err,
        GpuError::DriverFunctionMissing {
            function: "cuGraphLaunch",
            needs: Some(10000),
            driver
        }
    );
    assert_eq!(
        err.to_string(),
        format!(
            "the loaded CUDA driver (CUDA {}.0) lacks cuGraphLaunch, which needs a driver for CUDA 10.0 or \
             newer: update the driver",
            CUDA_VERSION / 1000
        )
    );
    // check_cuda takes an optional function's result too.
    let mut ptr = 0;
    // SAFETY: as above.
    let err = check_cuda(unsafe { api.cuMemAlloc_v2(&mut ptr, 64) }, "cuMemAlloc")
        .expect_err("the stand-in has no cuMemAlloc_v2");
    assert!(
        matches!(
            err,
            GpuError::DriverFunctionMissing {
                function: "cuMemAlloc_v2",
                needs: Some(3020),
                ..
            }
        ),
        "{err:?}"
    );

    // Optional functions the driver has work; cuEventElapsedTime falls back to the original symbol.
    let mut count = 0;
    let mut ms = 0f32;
    // SAFETY: each writes one value through a valid pointer.
    unsafe {
        check_cuda(api.cuDeviceGetCount(&mut count), "cuDeviceGetCount").expect("present");
        let (start, end) = (std::ptr::null_mut(), std::ptr::null_mut());
        check_cuda(
            api.cuEventElapsedTime(&mut ms, start, end),
            "cuEventElapsedTime",
        )
        .expect("v1");
    }
    assert_eq!((count, ms), (2, 1.5));
}

#[test]
fn a_driver_lacking_a_required_function_is_unavailable() {
    let version = driver_version(0);
    if in_child(
        "a_driver_lacking_a_required_function_is_unavailable",
        &[&version, "-DLACK_REQUIRED"],
    ) {
        return;
    }
    let err = create_stream(0).expect_err("cuStreamQuery is missing");
    let GpuError::DriverUnavailable { context, reason } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(context, "create_stream");
    assert!(reason.contains("lacks cuStreamQuery"), "{err}");
}

#[test]
fn a_driver_of_an_older_cuda_major_version_is_unavailable() {
    let version = driver_version(1);
    if in_child(
        "a_driver_of_an_older_cuda_major_version_is_unavailable",
        &[&version],
    ) {
        return;
    }
    let err = cuda::driver("test").expect_err("older major version");
    assert!(
        matches!(err, GpuError::DriverUnavailable { ref reason, .. } if reason.contains("older than the major version")),
        "{err}"
    );
}

#[test]
fn a_failed_cuinit_keeps_the_driver_loaded_and_codes_named() {
    let version = driver_version(0);
    if in_child(
        "a_failed_cuinit_keeps_the_driver_loaded_and_codes_named",
        &[&version, "-DINIT_FAILS"],
    ) {
        return;
    }
    let err = cuda::driver("test").expect_err("cuInit fails");
    assert!(
        matches!(err, GpuError::Cuda { code: CUresult::CUDA_ERROR_NO_DEVICE, ref context, .. } if context == "test (cuInit)"),
        "{err:?}"
    );
    // cuInit ran: the driver must stay mapped.
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    assert!(
        maps.lines().any(|l| l.ends_with("/libcuda.so.1")),
        "libcuda.so.1 was unloaded after cuInit ran"
    );
    // check_cuda keeps the caller's code and names it through the loaded driver.
    let err = check_cuda(CUresult::CUDA_ERROR_INVALID_VALUE, "cuMemAlloc").expect_err("a failure");
    assert_eq!(
        err,
        GpuError::Cuda {
            context: "cuMemAlloc".into(),
            code: CUresult::CUDA_ERROR_INVALID_VALUE,
            name: "STANDIN_CUDA_ERROR_INVALID_VALUE".into(),
            text: "described by the stand-in".into(),
        }
    );
}
