//! The diagnostic to run first: which NCCL headers the crate was built from, which libnccl the process
//! loaded and whether the two agree, the CUDA driver and GPUs, and `ncclConfig_t` as the headers define it.
//! Where GPUs exist it runs one all-reduce across all of them and checks the sum.
//!
//! Exit status: 0 when everything found works (no driver or no GPU is reported, not an error),
//! 2 on a version skew (library older than the headers), 1 when a call fails or no libnccl loads.
//!
//! `cargo run --example nccl_info`

use std::process::ExitCode;

use metrale_gpu_sys::cuda::{self, CUdeviceptr, CUstream};
use metrale_gpu_sys::nccl::*;
use metrale_gpu_sys::version::{self, build_info, NcclVersion};

fn main() -> ExitCode {
    println!("metrale-gpu-sys {}", env!("CARGO_PKG_VERSION"));
    println!(
        "NCCL headers   {} (nccl.h in {}, found by {})",
        NcclVersion::HEADERS,
        build_info::NCCL_INCLUDE,
        build_info::NCCL_FOUND_BY
    );
    println!(
        "CUDA headers   {}.{} (cuda.h in {}, found by {})",
        CUDA_VERSION / 1000,
        CUDA_VERSION % 1000 / 10,
        build_info::CUDA_INCLUDE,
        build_info::CUDA_FOUND_BY
    );
    let path = version::library_path().unwrap_or_else(|| "(path unknown)".into());
    println!("NCCL search    how libnccl was found, in order:");
    for line in version::library_search().lines() {
        println!("               {line}");
    }
    let skew = match version::check_library_version() {
        Ok(v) => {
            let verdict = if v == NcclVersion::HEADERS {
                "same as the headers"
            } else {
                "newer than the headers: fine"
            };
            println!("NCCL library   {v} ({path}): {verdict}");
            None
        }
        Err(e) => {
            println!("NCCL library   ERROR: {e}");
            Some(e)
        }
    };
    print_config();

    let gpus = match gpus() {
        Ok(gpus) => gpus,
        Err(e @ GpuError::DriverUnavailable { .. }) => {
            println!("CUDA driver    not available: {e}");
            println!("GPUs           none usable here; the all-reduce check needs a GPU host");
            return exit(skew, Ok::<(), ()>(()));
        }
        // A driver without a GPU (a container without devices, say): cuInit says so.
        Err(GpuError::Cuda { code, .. }) if code == CUresult::CUDA_ERROR_NO_DEVICE => {
            println!("CUDA driver    found; cuInit reports no CUDA-capable device");
            Vec::new()
        }
        Err(e) => {
            println!("CUDA driver    ERROR: {e}");
            return exit(skew, Err(e));
        }
    };
    if gpus.is_empty() || skew.is_some() {
        let why = if gpus.is_empty() {
            "no GPU"
        } else {
            "skipped: no acceptable libnccl (see NCCL library above)"
        };
        println!("all-reduce     {why}");
        return exit(skew, Ok::<(), ()>(()));
    }
    let result = all_reduce_check(gpus.len());
    match &result {
        Ok(line) => println!("all-reduce     {line}"),
        Err(e) => println!("all-reduce     FAILED: {e}"),
    }
    exit(skew, result.map(|_| ()).map_err(|_| ()))
}

fn exit<E>(skew: Option<GpuError>, result: Result<(), E>) -> ExitCode {
    match (skew, result) {
        (Some(GpuError::VersionSkew { .. }), _) => ExitCode::from(2),
        (Some(_), _) => ExitCode::from(1),
        (None, Err(_)) => ExitCode::from(1),
        (None, Ok(())) => ExitCode::SUCCESS,
    }
}

fn print_config() {
    let config = NcclConfig::default();
    println!(
        "ncclConfig_t   {} bytes; NCCL_CONFIG_INITIALIZER: size {}, magic {:#x}, version {}, blocking {}, netName {:?}, commName {:?}",
        std::mem::size_of::<NcclConfig>(),
        config.size,
        config.magic,
        config.version,
        config.blocking,
        config.netName,
        config.commName
    );
}

/// The driver's version and each GPU's name; an empty list when the driver finds none.
fn gpus() -> Result<Vec<String>, GpuError> {
    let api = cuda::driver("nccl_info")?;
    let (mut version, mut count) = (0, 0);
    // SAFETY: each writes one int through a valid pointer.
    unsafe {
        check_cuda(api.cuDriverGetVersion(&mut version), "cuDriverGetVersion")?;
        check_cuda(api.cuDeviceGetCount(&mut count), "cuDeviceGetCount")?;
    }
    println!(
        "CUDA driver    supports CUDA {}.{}",
        version / 1000,
        version % 1000 / 10
    );
    let mut names = Vec::new();
    for ordinal in 0..count {
        let mut name = [0 as std::os::raw::c_char; 128];
        let mut dev = 0;
        // SAFETY: cuDeviceGetName writes at most `len` bytes, NUL-terminated.
        let name = unsafe {
            check_cuda(api.cuDeviceGet(&mut dev, ordinal), "cuDeviceGet")?;
            check_cuda(
                api.cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, dev),
                "cuDeviceGetName",
            )?;
            std::ffi::CStr::from_ptr(name.as_ptr())
                .to_string_lossy()
                .into_owned()
        };
        println!("GPU {ordinal}          {name}");
        names.push(name);
    }
    Ok(names)
}

type Checked = Result<String, Box<dyn std::error::Error>>;

/// One float all-reduce (sum) across `n` GPUs of this process: rank r contributes r + 1 everywhere.
fn all_reduce_check(n: usize) -> Checked {
    const COUNT: usize = 1 << 20;
    let api = cuda::driver("nccl_info")?;
    let devices: Vec<i32> = (0..n as i32).collect();
    let mut comms: Vec<NcclComm> = vec![std::ptr::null_mut(); n];
    check_nccl(
        // SAFETY: comms has room for n handles; devices lists n ordinals.
        unsafe { ncclCommInitAll(comms.as_mut_ptr(), n as i32, devices.as_ptr()) },
        "ncclCommInitAll",
    )?;
    let mut bufs: Vec<(CUdeviceptr, CUstream)> = Vec::new();
    let run = (|| -> Checked {
        for &d in &devices {
            let stream = create_stream(d)?;
            let mut ptr: CUdeviceptr = 0;
            let host = vec![(d + 1) as f32; COUNT];
            // SAFETY: create_stream made device d current; the copy reads COUNT floats from `host`. It is
            // queued on the all-reduce's own stream: a plain cuMemcpyHtoD runs on the legacy stream, which
            // a non-blocking stream does not wait for. From pageable memory the driver has staged `host`
            // when the call returns, so `host` may go away.
            unsafe {
                check_cuda(api.cuMemAlloc_v2(&mut ptr, COUNT * 4), "cuMemAlloc")?;
                bufs.push((ptr, stream));
                check_cuda(
                    api.cuMemcpyHtoDAsync_v2(ptr, host.as_ptr().cast(), COUNT * 4, stream),
                    "cuMemcpyHtoDAsync",
                )?;
            }
        }
        // SAFETY: each buffer holds COUNT floats on its communicator's device, with that device's stream.
        unsafe {
            check_nccl(ncclGroupStart(), "ncclGroupStart")?;
            for (comm, &(ptr, stream)) in comms.iter().zip(&bufs) {
                let buf = ptr as *mut std::os::raw::c_void;
                let r = ncclAllReduce(
                    buf,
                    buf,
                    COUNT,
                    NcclDataType::ncclFloat32,
                    NcclRedOp::ncclSum,
                    *comm,
                    stream,
                );
                check_nccl(r, "ncclAllReduce")?;
            }
            check_nccl(ncclGroupEnd(), "ncclGroupEnd")?;
        }
        let expected = (n * (n + 1) / 2) as f32;
        for &(ptr, stream) in &bufs {
            let mut host = vec![0f32; COUNT];
            // SAFETY: writes COUNT floats into `host` from a buffer of that size, on the all-reduce's
            // stream; `host` is read only after the stream is synchronised. The stream is live until the
            // clean-up below.
            unsafe {
                check_cuda(
                    api.cuMemcpyDtoHAsync_v2(host.as_mut_ptr().cast(), ptr, COUNT * 4, stream),
                    "cuMemcpyDtoHAsync",
                )?;
                sync_stream(stream)?;
            }
            if let Some(i) = host.iter().position(|&x| x != expected) {
                return Err(
                    format!("element {i} is {} on a GPU, expected {expected}", host[i]).into(),
                );
            }
        }
        Ok(format!(
            "{n} GPUs, {COUNT} floats, sum correct ({expected} everywhere)"
        ))
    })();
    // SAFETY: every stream was synchronised (or the run failed before queueing work on it).
    unsafe {
        for &(ptr, stream) in &bufs {
            let _ = sync_stream(stream);
            let _ = api.cuMemFree_v2(ptr);
            let _ = destroy_stream(stream);
        }
        for comm in comms {
            check_nccl(ncclCommDestroy(comm), "ncclCommDestroy")?;
        }
    }
    run
}
