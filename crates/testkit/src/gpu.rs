//! The preamble of every GPU test: the conditions it may run under, checked first.

use metrale_gpu_sys::cuda::{self, DriverApi};
use metrale_gpu_sys::nccl::check_cuda;

/// GPUs a test needs that drives several GPUs from one process (`ncclCommInitAll`, a group over
/// several devices); every other GPU test runs on one or more ([`crate::ranks`]).
pub const MIN_GPUS: usize = 2;

/// The driver, for the tests' own calls.
pub fn api() -> &'static DriverApi {
    cuda::driver("gpu test").expect("CUDA driver")
}

/// Fails the test unless this process may touch the GPUs (`NCCL_NVLS_ENABLE=0`: NVLink multicast is
/// forbidden on the project's GPU host, so the runner and every child process set it), the loaded
/// libnccl is not older than the headers, and there is at least one GPU. Returns how many.
pub fn gpus() -> usize {
    match std::env::var("NCCL_NVLS_ENABLE") {
        Ok(v) if v == "0" => {}
        other => panic!(
            "NCCL_NVLS_ENABLE must be 0 in every process that runs these tests (NVLink multicast is \
             forbidden on the GPU host), found {other:?}: run them through ci/gpu-run.sh"
        ),
    }
    metrale_gpu_sys::version::check_library_version().expect("libnccl not older than the headers");
    let api = match cuda::driver("gpu test") {
        Ok(api) => api,
        Err(e) => panic!("needs a GPU, but the CUDA driver is unavailable: {e}"),
    };
    let mut count = 0;
    // SAFETY: writes one int through a valid pointer.
    check_cuda(
        unsafe { api.cuDeviceGetCount(&mut count) },
        "cuDeviceGetCount",
    )
    .expect("cuDeviceGetCount");
    assert!(count >= 1, "needs a GPU, found none");
    count as usize
}

/// The GPU count for a test that drives `need` or more GPUs from one process: `None`, with the skip
/// line printed, when this host has fewer.
pub fn gpus_in_one_process(test: &str, need: usize) -> Option<usize> {
    let found = gpus();
    if found < need {
        crate::skip::skip_named(
            test,
            format_args!("needs {need} GPUs in one process, found {found}"),
        );
        return None;
    }
    Some(found)
}

/// The marker of a measured figure in a test's output (a bound, a count): the GPU runner lists every
/// such line in its summary.
pub const MEASURED: &str = "MEASURED ";

/// Prints `text` on a [`MEASURED`] line.
pub fn measured(text: &str) {
    println!("{MEASURED}{text}");
}
