//! NCCL's device API from Rust, end to end: an all-reduce written as a kernel of its own
//! (`kernels/lsa_all_reduce.cu`, after NVIDIA's `06_device_api/01_allreduce_lsa`), compiled by nvcc when
//! this crate builds (`metrale-gpu-nvcc`), embedded, and run on a communicator's rank through
//! metrale-gpu-sys: symmetric windows over NCCL memory, a device communicator with one LSA barrier per
//! block, the launch, and a check against the sums the host computes. `examples/device_allreduce.rs`
//! runs it at any rank count; `docs/device-api.md` explains each step.

/// The kernels' fatbin (sm_90 machine code and compute_90 PTX, or `METRALE_CUDA_ARCHS`'), or why this
/// build made none.
pub const FATBIN: Result<&[u8], &str> = include!(concat!(env!("OUT_DIR"), "/fatbin.rs"));

#[cfg(device_api)]
mod rank;
#[cfg(device_api)]
pub use rank::{all_reduce, input, Report, BLOCKS, THREADS};
