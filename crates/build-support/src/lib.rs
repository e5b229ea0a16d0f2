//! What the build script of metrale-gpu-sys decides, as a library its tests can drive: where NCCL and the
//! CUDA headers are ([`find`]), and what a panic inside bindgen means ([`bindgen_panic`]).
//!
//! Nothing here names metrale-gpu-sys, runs a compiler, or reads the environment on its own.

pub mod bindgen_panic;
pub mod find;
