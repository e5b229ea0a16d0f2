//! What the fault tests share: the GPU check, device buffers checked against host values, a pair of
//! communicators on GPUs 0 and 1, memory gauges, and child processes (the test binary run again).

use std::io::{BufRead, BufReader};
use std::os::raw::c_void;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metrale_gpu_sys::cuda::{self, CUdeviceptr, CUstream};
use metrale_gpu_sys::nccl::*;

/// The test that child processes run, and the variable that tells it which role to play.
pub const CHILD_TEST: &str = "fault_child";
pub const CHILD: &str = "METRALE_FAULT_CHILD";
/// Lines starting with this are the measured bound; ci/faults-run.sh puts them in its table.
pub const BOUND: &str = "FAULT-BOUND ";

/// Fails the test unless NVLink multicast is off (`NCCL_NVLS_ENABLE=0`, mandatory on the GPU host), the
/// loaded libnccl is not older than the headers, and there are at least 2 GPUs.
pub fn gpus() -> usize {
    match std::env::var("NCCL_NVLS_ENABLE") {
        Ok(v) if v == "0" => {}
        other => panic!(
            "NCCL_NVLS_ENABLE must be 0 in every process of these tests (NVLink multicast is forbidden on \
             the GPU host), found {other:?}: run them through ci/faults-run.sh"
        ),
    }
    metrale_gpu_sys::version::check_library_version().expect("libnccl not older than the headers");
    let api = match cuda::driver("fault test") {
        Ok(api) => api,
        Err(e) => panic!("needs 2 GPUs, but the CUDA driver is unavailable: {e}"),
    };
    let mut count = 0;
    // SAFETY: writes one int through a valid pointer.
    check_cuda(
        unsafe { api.cuDeviceGetCount(&mut count) },
        "cuDeviceGetCount",
    )
    .expect("cuDeviceGetCount");
    assert!(count >= 2, "needs 2 GPUs, found {count}");
    count as usize
}

/// Seconds from an env variable (for ci/faults-run.sh to shorten a bound), else `default`.
pub fn secs_from_env(var: &str, default: u64) -> Duration {
    let s = std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    Duration::from_secs(s)
}

/// Prints the measured bound on the line ci/faults-run.sh looks for.
pub fn report_bound(text: &str) {
    println!("{BOUND}{text}");
}

/// `cuMemGetInfo` free bytes of `device`.
pub fn device_free(device: i32) -> usize {
    let api = cuda::use_device(device, "device_free").expect("use_device");
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: writes two sizes through valid pointers; the device's context is current.
    check_cuda(
        unsafe { api.cuMemGetInfo_v2(&mut free, &mut total) },
        "cuMemGetInfo",
    )
    .expect("cuMemGetInfo");
    free
}

/// `VmRSS` of this process, in bytes.
pub fn rss() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kb: usize = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS in /proc/self/status");
    kb * 1024
}

pub const MIB: f64 = (1 << 20) as f64;

/// The element `i` of rank `rank`'s input for `seed`: small multiples of 1/4, so every sum over two
/// ranks is exact in f32 and the host's answer is exact.
pub fn input(seed: u64, rank: usize, i: usize) -> f32 {
    ((i as u64 * 7 + seed * 13 + rank as u64 * 101) % 4093) as f32 * 0.25
}

pub fn inputs(seed: u64, rank: usize, count: usize) -> Vec<f32> {
    (0..count).map(|i| input(seed, rank, i)).collect()
}

/// The host's all-reduce (sum) of `nranks` ranks' inputs.
pub fn expected_sum(seed: u64, nranks: usize, count: usize) -> Vec<f32> {
    (0..count)
        .map(|i| (0..nranks).map(|r| input(seed, r, i)).sum())
        .collect()
}

/// Compares `got` with `want`; the first mismatch, if any.
pub fn compare(what: &str, got: &[f32], want: &[f32]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} elements, expected {}",
            got.len(),
            want.len()
        ));
    }
    match got.iter().zip(want).position(|(g, w)| g != w) {
        Some(i) => Err(format!(
            "{what}: element {i} is {}, expected {} (host)",
            got[i], want[i]
        )),
        None => Ok(()),
    }
}

/// `cuMemAlloc` memory of `count` f32 on one device, freed on drop.
pub struct DevMem {
    pub dev: i32,
    pub ptr: CUdeviceptr,
    pub count: usize,
}

impl DevMem {
    pub fn new(dev: i32, count: usize) -> DevMem {
        let api = cuda::use_device(dev, "DevMem").expect("use_device");
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: writes one device pointer; the device's context is current.
        check_cuda(
            unsafe { api.cuMemAlloc_v2(&mut ptr, count * 4) },
            "cuMemAlloc",
        )
        .unwrap_or_else(|e| panic!("cuMemAlloc of {count} floats on GPU {dev}: {e}"));
        DevMem { dev, ptr, count }
    }

    pub fn void(&self) -> *mut c_void {
        self.ptr as *mut c_void
    }

    pub fn upload(&self, data: &[f32]) {
        assert_eq!(data.len(), self.count);
        let api = cuda::use_device(self.dev, "upload").expect("use_device");
        // SAFETY: copies count floats from `data` into the allocation (synchronous copy).
        check_cuda(
            unsafe { api.cuMemcpyHtoD_v2(self.ptr, data.as_ptr().cast(), self.count * 4) },
            "cuMemcpyHtoD",
        )
        .expect("upload");
    }

    /// The buffer's contents; the caller has synchronised the streams that write it.
    pub fn download(&self) -> Vec<f32> {
        let api = cuda::use_device(self.dev, "download").expect("use_device");
        let mut host = vec![0f32; self.count];
        // SAFETY: copies count floats from the allocation into `host`.
        check_cuda(
            unsafe { api.cuMemcpyDtoH_v2(host.as_mut_ptr().cast(), self.ptr, self.count * 4) },
            "cuMemcpyDtoH",
        )
        .expect("download");
        host
    }

    /// Frees it now, returning the driver's verdict (drop only warns).
    pub fn free(self) -> Result<(), GpuError> {
        let this = std::mem::ManuallyDrop::new(self);
        let api = cuda::use_device(this.dev, "DevMem::free")?;
        // SAFETY: from cuMemAlloc, freed once (ManuallyDrop keeps Drop from freeing it again).
        check_cuda(unsafe { api.cuMemFree_v2(this.ptr) }, "cuMemFree")
    }
}

impl Drop for DevMem {
    fn drop(&mut self) {
        let result = cuda::use_device(self.dev, "DevMem::drop").and_then(|api| {
            // SAFETY: from cuMemAlloc, freed once; its users synchronised before dropping it.
            check_cuda(unsafe { api.cuMemFree_v2(self.ptr) }, "cuMemFree")
        });
        if let Err(e) = result {
            eprintln!(
                "warning: freeing {} floats on GPU {}: {e}",
                self.count, self.dev
            );
        }
    }
}

/// A raw handle moved to another thread; the tests keep the handle alive until that thread is done.
pub struct Handle<T>(pub T);
// SAFETY: NCCL communicators and CUDA streams may be used from any thread; the tests never use one
// handle from two threads in a way NCCL or CUDA forbid (abort from another thread is allowed).
unsafe impl<T> Send for Handle<T> {}

/// Two blocking communicators (ncclCommInitAll over GPUs 0 and 1), a stream and `count` floats of
/// input and output per rank.
pub struct Pair {
    pub comms: [NcclComm; 2],
    pub streams: [CUstream; 2],
    pub send: [DevMem; 2],
    pub recv: [DevMem; 2],
}

impl Pair {
    pub fn init_all(count: usize) -> Pair {
        let mut comms: [NcclComm; 2] = [std::ptr::null_mut(); 2];
        let devs = [0, 1];
        // SAFETY: comms has room for 2 handles; devs lists 2 ordinals.
        check_nccl(
            unsafe { ncclCommInitAll(comms.as_mut_ptr(), 2, devs.as_ptr()) },
            "ncclCommInitAll",
        )
        .expect("ncclCommInitAll over GPUs 0 and 1");
        Pair {
            comms,
            streams: [
                create_stream(0).expect("create_stream"),
                create_stream(1).expect("create_stream"),
            ],
            send: [DevMem::new(0, count), DevMem::new(1, count)],
            recv: [DevMem::new(0, count), DevMem::new(1, count)],
        }
    }

    /// One all-reduce (sum) across both ranks, checked against the host's answer on both.
    pub fn check_all_reduce(&self, seed: u64) -> Result<(), String> {
        let count = self.send[0].count;
        for r in 0..2 {
            self.send[r].upload(&inputs(seed, r, count));
            self.recv[r].upload(&vec![f32::NAN; count]);
        }
        // SAFETY: a group over both live communicators; each buffer holds `count` floats on the
        // communicator's device and each stream belongs to that device.
        let results = unsafe {
            let start = ncclGroupStart();
            let a = ncclAllReduce(
                self.send[0].void(),
                self.recv[0].void(),
                count,
                NcclDataType::ncclFloat32,
                NcclRedOp::ncclSum,
                self.comms[0],
                self.streams[0],
            );
            let b = ncclAllReduce(
                self.send[1].void(),
                self.recv[1].void(),
                count,
                NcclDataType::ncclFloat32,
                NcclRedOp::ncclSum,
                self.comms[1],
                self.streams[1],
            );
            [start, a, b, ncclGroupEnd()]
        };
        for (res, what) in results.into_iter().zip([
            "ncclGroupStart",
            "ncclAllReduce rank 0",
            "ncclAllReduce rank 1",
            "ncclGroupEnd",
        ]) {
            check_nccl(res, what).map_err(|e| e.to_string())?;
        }
        for &s in &self.streams {
            // SAFETY: a live stream of this pair.
            unsafe { sync_stream(s) }.map_err(|e| e.to_string())?;
        }
        let want = expected_sum(seed, 2, count);
        for r in 0..2 {
            compare(
                &format!("all-reduce on rank {r}"),
                &self.recv[r].download(),
                &want,
            )?;
        }
        Ok(())
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        for &s in &self.streams {
            // SAFETY: a live stream of this pair.
            if let Err(e) = unsafe { sync_stream(s) } {
                eprintln!("warning: {e}");
            }
        }
        for &comm in &self.comms {
            // SAFETY: a communicator this pair owns, idle, destroyed once.
            if let Err(e) = check_nccl(unsafe { ncclCommDestroy(comm) }, "ncclCommDestroy") {
                eprintln!("warning: {e}");
            }
        }
        for &s in &self.streams {
            // SAFETY: a live stream, not used after this.
            if let Err(e) = unsafe { destroy_stream(s) } {
                eprintln!("warning: {e}");
            }
        }
    }
}

/// A child process: this test binary running [`CHILD_TEST`] in `role`. Its stdout and stderr lines
/// arrive, with the moment they were read, on `lines`, and are kept in `log`.
pub struct ChildProc {
    pub name: String,
    child: Child,
    lines: Receiver<(Instant, String)>,
    log: Arc<Mutex<String>>,
}

pub fn spawn_child(name: &str, role: &str, env: &[(&str, String)]) -> ChildProc {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut cmd = Command::new(exe);
    cmd.args([
        CHILD_TEST,
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD, role)
    .env("NCCL_NVLS_ENABLE", "0")
    .env("RUST_BACKTRACE", "1")
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start child {name}: {e}"));
    let (tx, lines) = mpsc::channel();
    let log = Arc::new(Mutex::new(String::new()));
    let stdout = child.stdout.take().expect("piped stdout");
    let stderr = child.stderr.take().expect("piped stderr");
    for (pipe, prefix) in [
        (Box::new(stdout) as Box<dyn std::io::Read + Send>, ""),
        (Box::new(stderr), "[stderr] "),
    ] {
        let (tx, log) = (tx.clone(), Arc::clone(&log));
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let line = format!("{prefix}{line}");
                if let Ok(mut l) = log.lock() {
                    l.push_str(&line);
                    l.push('\n');
                }
                let _ = tx.send((Instant::now(), line));
            }
        });
    }
    ChildProc {
        name: name.to_string(),
        child,
        lines,
        log,
    }
}

impl ChildProc {
    /// The first line (from now on) containing `needle`, and when it was read; `None` after `timeout`.
    pub fn wait_line(&self, needle: &str, timeout: Duration) -> Option<(Instant, String)> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((at, line)) if line.contains(needle) => return Some((at, line)),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => {
                    return None
                }
            }
        }
    }

    /// SIGKILL (`Child::kill`), then reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits until it exits or `limit` passes (then kills it): its status, `None` if it was killed.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                // Let the readers drain the pipes.
                std::thread::sleep(Duration::from_millis(100));
                return Some(status);
            }
            if Instant::now() > deadline {
                eprintln!(
                    "child {} still running after {limit:?}: killing it",
                    self.name
                );
                self.kill();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn output(&self) -> String {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// Prints everything it wrote, framed by its name.
    pub fn dump(&self) {
        println!(
            "===== child {} =====\n{}===== end of {} =====",
            self.name,
            self.output(),
            self.name
        );
    }
}

impl Drop for ChildProc {
    fn drop(&mut self) {
        // Never leave one behind (it is ours: we started it).
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn from_hex(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex digits"))
        .collect()
}
