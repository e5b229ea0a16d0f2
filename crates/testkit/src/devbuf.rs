//! Device memory for tests: allocated, filled, copied in and out on a stream, freed on drop.
//!
//! Every copy is queued on the stream the caller names, the stream its collective runs on. A plain
//! `cuMemcpyHtoD` from pageable memory runs on the legacy default stream and may return before the data
//! has landed; a `CU_STREAM_NON_BLOCKING` stream (what `create_stream` makes) does not wait for the legacy
//! stream, so a collective queued right after it can read stale data (the GPU suite's `stale_copy` test
//! shows the window).
//!
//! Handle contract: every `stream` passed here comes from `create_stream` (a `World`'s or the test's own)
//! and stays alive until its owner destroys it after its last use; the methods are safe functions on
//! that promise, as the suites' stream helpers are, rather than `unsafe fn` at every call of every test.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use std::os::raw::c_void;

use metrale_gpu_sys::cuda::{self, CUdeviceptr, CUstream};
use metrale_gpu_sys::nccl::{check_cuda, nccl_mem_alloc, nccl_mem_free, sync_stream, GpuError};

use crate::gpu::api;

/// Device memory from `cuMemAlloc` or from `ncclMemAlloc` (the crate's `nccl_mem_alloc`), freed on drop.
pub struct DevBuf {
    pub dev: i32,
    pub ptr: CUdeviceptr,
    pub bytes: usize,
    from_nccl: bool,
}

impl DevBuf {
    pub fn cuda(dev: i32, bytes: usize) -> DevBuf {
        let api = cuda::use_device(dev, "DevBuf::cuda").expect("use_device");
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: writes one device pointer; the device's context is current.
        check_cuda(
            unsafe { api.cuMemAlloc_v2(&mut ptr, bytes.max(1)) },
            "cuMemAlloc",
        )
        .unwrap_or_else(|e| panic!("cuMemAlloc of {bytes} bytes on GPU {dev}: {e}"));
        DevBuf {
            dev,
            ptr,
            bytes,
            from_nccl: false,
        }
    }

    pub fn nccl(dev: i32, bytes: usize) -> DevBuf {
        let ptr = nccl_mem_alloc(dev, bytes.max(1))
            .unwrap_or_else(|e| panic!("nccl_mem_alloc of {bytes} bytes on GPU {dev}: {e}"));
        DevBuf {
            dev,
            ptr: ptr as CUdeviceptr,
            bytes,
            from_nccl: true,
        }
    }

    /// The address `offset` bytes in.
    pub fn at(&self, offset: usize) -> *mut c_void {
        assert!(
            offset <= self.bytes,
            "offset {offset} past {} bytes",
            self.bytes
        );
        (self.ptr + offset as CUdeviceptr) as *mut c_void
    }

    /// Fills `len` bytes from `offset` with `byte`, queued on `stream`.
    pub fn fill(&self, offset: usize, len: usize, byte: u8, stream: CUstream) {
        assert!(offset + len <= self.bytes);
        // SAFETY: the range lies inside the allocation; the stream is live (the handle contract above).
        check_cuda(
            unsafe { api().cuMemsetD8Async(self.ptr + offset as u64, byte, len, stream) },
            "cuMemsetD8Async",
        )
        .expect("cuMemsetD8Async");
    }

    /// Copies `data` to `offset`, queued on `stream`. From pageable memory the driver stages `data`
    /// before it returns, so `data` may change or go away afterwards; the copy is ordered before
    /// everything queued on `stream` later.
    pub fn upload(&self, offset: usize, data: &[u8], stream: CUstream) {
        assert!(offset + data.len() <= self.bytes);
        if data.is_empty() {
            return;
        }
        // SAFETY: reads data.len() bytes from `data`, writes inside the allocation; the stream is live.
        check_cuda(
            unsafe {
                api().cuMemcpyHtoDAsync_v2(
                    self.ptr + offset as u64,
                    data.as_ptr().cast(),
                    data.len(),
                    stream,
                )
            },
            "cuMemcpyHtoDAsync",
        )
        .expect("upload");
    }

    /// `len` bytes from `offset`, after all work queued on `stream` so far.
    pub fn download(&self, offset: usize, len: usize, stream: CUstream) -> Vec<u8> {
        assert!(offset + len <= self.bytes);
        let mut host = vec![0u8; len];
        if len > 0 {
            // SAFETY: writes len bytes into `host`, reads inside the allocation; the stream is live.
            check_cuda(
                unsafe {
                    api().cuMemcpyDtoHAsync_v2(
                        host.as_mut_ptr().cast(),
                        self.ptr + offset as u64,
                        len,
                        stream,
                    )
                },
                "cuMemcpyDtoHAsync",
            )
            .expect("download");
        }
        // SAFETY: a live stream (the caller's).
        unsafe { sync_stream(stream) }.expect("sync after download");
        host
    }

    /// [`DevBuf::upload`] of `f32` values from offset 0.
    pub fn upload_f32(&self, data: &[f32], stream: CUstream) {
        let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.upload(0, &bytes, stream);
    }

    /// The whole buffer as `f32` values, after all work queued on `stream` so far.
    pub fn download_f32(&self, stream: CUstream) -> Vec<f32> {
        self.download(0, self.bytes / 4 * 4, stream)
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }

    /// Frees it now, returning the driver's verdict (drop only warns). Its users have synchronised.
    pub fn free(self) -> Result<(), GpuError> {
        let this = std::mem::ManuallyDrop::new(self);
        this.release()
    }

    fn release(&self) -> Result<(), GpuError> {
        if self.from_nccl {
            // SAFETY: from nccl_mem_alloc, freed once (free() keeps Drop from running; Drop runs once).
            unsafe { nccl_mem_free(self.ptr as *mut c_void) }
        } else {
            let api = cuda::use_device(self.dev, "DevBuf::release")?;
            // SAFETY: from cuMemAlloc, freed once (as above).
            check_cuda(unsafe { api.cuMemFree_v2(self.ptr) }, "cuMemFree")
        }
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        if let Err(e) = self.release() {
            eprintln!(
                "warning: freeing {} bytes on GPU {}: {e}",
                self.bytes, self.dev
            );
        }
    }
}
