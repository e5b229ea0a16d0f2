//! The device memory this process uses, for the leak and cleanup checks: the driver's per-process
//! accounting as `nvidia-smi --query-compute-apps` lists it, so that other processes on the same GPU
//! (ranks sharing it, other runners) do not move the figures. Its unit is the MiB: fit for tolerances
//! of 8 MiB and up. (The driver maps device memory in 2 MiB pages, so an allocation's whole MiBs show.)
//!
//! Where nvidia-smi is missing, fails, or lists no row for this process although it holds a context
//! (in a PID namespace it shows the host's pids), the figures are the whole GPU's (`cuMemGetInfo`):
//! one visible line says so, and so does every reading's [`Source`]. They then hold only while nothing
//! else uses the GPU. The first reading decides, for the life of the process, so that two readings
//! always compare like with like.

use std::fmt;
use std::io::Write as _;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use metrale_gpu_sys::cuda;
use metrale_gpu_sys::nccl::check_cuda;

use crate::child;

/// How long nvidia-smi may take before it is killed and the reading fails.
const NVIDIA_SMI_LIMIT: Duration = Duration::from_secs(20);

/// Where the figures come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// This process's own memory on every GPU, from nvidia-smi.
    Process,
    /// The listed GPUs' used memory (total minus free, `cuMemGetInfo`), every process's; why.
    GpuWide(String),
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Process => write!(f, "this process's, nvidia-smi, MiB granularity"),
            Source::GpuWide(why) => write!(
                f,
                "GPU-wide, cuMemGetInfo ({why}): valid only when nothing else uses the GPU"
            ),
        }
    }
}

/// One reading: bytes of device memory in use, and where the figure comes from.
#[derive(Debug, Clone)]
pub struct Used {
    pub bytes: u64,
    pub source: &'static Source,
}

impl Used {
    /// Bytes in MiB.
    pub fn mib(&self) -> f64 {
        self.bytes as f64 / (1u64 << 20) as f64
    }

    /// MiB that `later` uses beyond this reading (negative where memory was given back).
    pub fn grown_mib(&self, later: &Used) -> f64 {
        later.mib() - self.mib()
    }

    /// Whether the figure is this process's alone.
    pub fn per_process(&self) -> bool {
        *self.source == Source::Process
    }
}

/// The device memory in use now: this process's on every GPU (nvidia-smi), else, GPU-wide, on
/// `devices` (see the module). Makes each of `devices`' primary context current in turn, so that this
/// process holds a context (and has an nvidia-smi row) before the first reading: the last stays current.
/// Panics, naming the GPUs and the cause, where there is no reading (the test cannot measure).
pub fn used(devices: &[i32]) -> Used {
    read(devices).unwrap_or_else(|e| panic!("device memory on GPUs {devices:?}: {e}"))
}

fn read(devices: &[i32]) -> Result<Used, String> {
    for &d in devices {
        cuda::use_device(d, "device memory reading").map_err(|e| e.to_string())?;
    }
    static SOURCE: OnceLock<Source> = OnceLock::new();
    // The reading that decides the source is the first reading too: nvidia-smi runs once for it.
    let mut first = None;
    let source = SOURCE.get_or_init(|| match this_process_mib() {
        Ok(mib) => {
            first = Some(mib);
            Source::Process
        }
        Err(why) => {
            // Past the test harness's capture, as skip lines are: nobody misses it.
            let line = format!(
                "\ndevice memory: GPU-wide ({why}): valid only when nothing else uses the GPU\n"
            );
            let _ = std::io::stderr().lock().write_all(line.as_bytes());
            Source::GpuWide(why)
        }
    });
    let bytes = match source {
        Source::Process => first.map_or_else(this_process_mib, Ok)? << 20,
        Source::GpuWide(_) => gpu_wide_used(devices)?,
    };
    Ok(Used { bytes, source })
}

/// This process's MiB on every GPU, from nvidia-smi.
fn this_process_mib() -> Result<u64, String> {
    let csv = nvidia_smi(&[
        "--query-compute-apps=pid,used_memory",
        "--format=csv,noheader,nounits",
    ])?;
    process_mib(&csv, std::process::id())
}

/// The MiB of process `pid` in nvidia-smi's `pid, used_memory` rows, summed over its GPUs (one row per
/// GPU it holds a context on); lines that are not such rows are passed over.
pub fn process_mib(csv: &str, pid: u32) -> Result<u64, String> {
    let mut total = None;
    for line in csv.lines() {
        let mut fields = line.split(',').map(str::trim);
        let (Some(p), Some(mib)) = (fields.next(), fields.next()) else {
            continue;
        };
        if p.parse::<u32>() != Ok(pid) {
            continue;
        }
        let mib: u64 = mib
            .parse()
            .map_err(|_| format!("nvidia-smi reports {mib:?} as process {pid}'s memory"))?;
        *total.get_or_insert(0) += mib;
    }
    total.ok_or_else(|| format!("nvidia-smi lists no process {pid}"))
}

/// nvidia-smi's output for `args` (a child of the testkit's: its stderr lines marked `[stderr] `, which
/// no row parser takes for a row); killed after [`NVIDIA_SMI_LIMIT`].
fn nvidia_smi(args: &[&str]) -> Result<String, String> {
    let mut cmd = Command::new("nvidia-smi");
    cmd.args(args);
    let mut smi =
        child::try_start("nvidia-smi", cmd).map_err(|e| format!("cannot run nvidia-smi: {e}"))?;
    match smi.wait_exit(NVIDIA_SMI_LIMIT) {
        Some(status) if status.success() => Ok(smi.output()),
        Some(status) => Err(format!(
            "nvidia-smi {} exited with {status}: {}",
            args.join(" "),
            smi.output().trim()
        )),
        None => Err(format!(
            "nvidia-smi did not answer within {NVIDIA_SMI_LIMIT:?}: killed"
        )),
    }
}

/// Total minus free memory (`cuMemGetInfo`) summed over `devices`: every process's.
fn gpu_wide_used(devices: &[i32]) -> Result<u64, String> {
    let mut used = 0;
    for &d in devices {
        let api = cuda::use_device(d, "device memory reading").map_err(|e| e.to_string())?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: writes two sizes through valid pointers; the device's context is current.
        let res = unsafe { api.cuMemGetInfo_v2(&mut free, &mut total) };
        check_cuda(res, "cuMemGetInfo").map_err(|e| format!("GPU {d}: {e}"))?;
        used += (total - free) as u64;
    }
    Ok(used)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_this_process_rows_over_its_gpus() {
        let csv = "4711, 512\n47110, 9000\n 4711 , 1030\n12, 7\n";
        assert_eq!(process_mib(csv, 4711), Ok(1542));
        assert_eq!(process_mib(csv, 12), Ok(7));
        // The child's stderr lines, as the testkit collects them, are no rows.
        assert_eq!(process_mib("[stderr] 4711, 9\n4711, 64\n", 4711), Ok(64));
    }

    #[test]
    fn no_row_for_this_process() {
        let no = Err("nvidia-smi lists no process 4711".to_string());
        assert_eq!(process_mib("", 4711), no);
        assert_eq!(process_mib("471, 5\n47110, 6\n", 4711), no);
        // What older nvidia-smi prints when nothing runs; blank lines.
        assert_eq!(process_mib("No running processes found\n\n", 4711), no);
    }

    #[test]
    fn unreadable_memory_of_this_process_is_an_error() {
        assert_eq!(
            process_mib("4711, [N/A]\n", 4711),
            Err("nvidia-smi reports \"[N/A]\" as process 4711's memory".to_string())
        );
        // Another process's unreadable row does not matter.
        assert_eq!(process_mib("12, [N/A]\n4711, 64\n", 4711), Ok(64));
    }

    #[test]
    fn sources_say_where_the_figures_come_from() {
        assert!(Source::Process.to_string().contains("this process's"));
        let wide = Source::GpuWide("nvidia-smi lists no process 4711".into()).to_string();
        assert!(wide.contains("GPU-wide") && wide.contains("no process 4711"));
        assert!(wide.contains("valid only when nothing else uses the GPU"));
        let first = Used {
            bytes: 3 << 20,
            source: &Source::Process,
        };
        let later = Used {
            bytes: 1 << 20,
            ..first.clone()
        };
        assert_eq!(first.grown_mib(&later), -2.0);
        assert!(first.per_process());
    }
}
