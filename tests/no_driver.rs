//! On a machine without the CUDA driver (every build and CI machine), every helper that needs it returns
//! the one clear error, naming itself, the library and what to do; nothing panics.

use metrale_gpu_sys::cuda;
use metrale_gpu_sys::nccl::*;
use metrale_gpu_testkit::skip::skip;

/// True where there is no driver; false, after a visible skip, where one loads (with or without a GPU:
/// cuInit may then fail).
fn driver_absent() -> bool {
    let absent = matches!(
        cuda::driver("probe"),
        Err(GpuError::DriverUnavailable { .. })
    );
    if !absent {
        skip("libcuda.so.1 loads here: this test is for machines without a driver (CI); tests/gpu/ covers GPUs");
    }
    absent
}

#[test]
fn every_helper_reports_the_missing_driver() {
    if !driver_absent() {
        return;
    }
    let null_stream: CUstream = std::ptr::null_mut();
    let null_event: CUevent = std::ptr::null_mut();
    // SAFETY: the driver is absent, so no handle is ever dereferenced (null handles besides).
    let results: Vec<(&str, Result<(), GpuError>)> = unsafe {
        vec![
            ("create_stream", create_stream(0).map(drop)),
            ("destroy_stream", destroy_stream(null_stream)),
            ("create_event", create_event(0).map(drop)),
            ("destroy_event", destroy_event(null_event)),
            ("record_event", record_event(null_event, null_stream)),
            (
                "stream_wait_event",
                stream_wait_event(null_stream, null_event),
            ),
            ("sync_stream", sync_stream(null_stream)),
            ("stream_ready", stream_ready(null_stream).map(drop)),
            ("nccl_mem_alloc", nccl_mem_alloc(0, 1024).map(drop)),
            ("nccl_mem_free", nccl_mem_free(std::ptr::null_mut())),
        ]
    };
    for (helper, result) in results {
        let err = result.expect_err(helper);
        let GpuError::DriverUnavailable { context, reason } = &err else {
            panic!("{helper}: {err}")
        };
        assert_eq!(context, helper);
        let msg = err.to_string();
        assert!(
            msg.starts_with(&format!("{helper} needs the CUDA driver")),
            "{msg}"
        );
        assert!(
            reason.contains("libcuda.so.1") && reason.contains("install the driver"),
            "{msg}"
        );
    }
}

#[test]
fn check_cuda_keeps_the_callers_code_without_a_driver() {
    if !driver_absent() {
        return;
    }
    let err = check_cuda(CUresult::CUDA_ERROR_INVALID_VALUE, "cuMemAlloc").expect_err("a failure");
    let GpuError::Cuda {
        context,
        code,
        name,
        text,
    } = &err
    else {
        panic!("{err:?}")
    };
    assert_eq!(
        (context.as_str(), *code, name.as_str()),
        (
            "cuMemAlloc",
            CUresult::CUDA_ERROR_INVALID_VALUE,
            "CUDA_ERROR_INVALID_VALUE"
        )
    );
    assert!(text.contains("libcuda.so.1"), "{err}");
}

#[test]
fn the_driver_is_loaded_once_from_many_threads() {
    let errors: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..32)
            .map(|_| s.spawn(|| cuda::driver("thread").err().map(|e| e.to_string())))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("no panic").unwrap_or_default())
            .collect()
    });
    assert!(
        errors.windows(2).all(|w| w[0] == w[1]),
        "threads saw different outcomes: {errors:?}"
    );
}
