//! Recovering without a restart, as a program: ranks all-reduce a buffer round after round, each sum
//! checked on the host; when some die, the survivors recover and train on, and replacements started
//! with `--join` grow the world back. The work is this file's; everything else is metrale-gpu-elastic
//! (its README says what happens and within which bounds).
//!
//! Launched like `multi_process`: `--rank R --world-size N --local-rank G --master HOST:PORT`, or the
//! variables torchrun, srun, mpirun or a PMI launcher set, with `MASTER_ADDR`/`MASTER_PORT`; a
//! replacement with `--join`, its local rank and rank 0's address (rank 0 given port 0 picks one and
//! prints it: `ELASTIC phase=listening port=P`). The library's flags: `--deadline SECS` (default 5),
//! `--iters N` (default 100000), `--min-size M` (default 1); this program's: `--step-ms MS` (default 0),
//! what each round computes before its all-reduce.
//!
//! ```sh
//! # two GPUs: 2 -> 1 -> 2 ranks
//! elastic --rank 0 --world-size 2 --local-rank 0 --master 127.0.0.1:29500 &
//! elastic --rank 1 --world-size 2 --local-rank 1 --master 127.0.0.1:29500 &
//! sleep 10; kill -KILL %2                      # rank 0 shrinks to 1 rank
//! elastic --join --local-rank 1 --master 127.0.0.1:29500   # and grows back to 2
//! ```
//!
//! Every phase prints one line, `ELASTIC phase=… key=value …`, with its measured times.
//!
//! Built with `--features metrale-gpu-elastic/etcd`, the program keeps its membership in etcd where
//! `METRALE_ETCD_ENDPOINTS` is set (with a job token, `METRALE_JOB_TOKEN`, the same on every rank):
//! the job then outlives any rank, the coordinator included, and a replacement joins through etcd. The
//! default build compiles none of etcd's client. The library's README says how it works.

use std::process::ExitCode;

#[cfg(not(nccl_2_29))]
fn main() -> ExitCode {
    eprintln!(
        "elastic needs NCCL 2.29 or newer (ncclCommRevoke, ncclCommShrink of a revoked communicator, \
         ncclCommGetUniqueId, ncclCommGrow); this build has the NCCL {} headers: rebuild against 2.29+",
        metrale_gpu_sys::version::NcclVersion::HEADERS
    );
    ExitCode::from(2)
}

#[cfg(nccl_2_29)]
fn main() -> ExitCode {
    checked::main()
}

#[cfg(nccl_2_29)]
mod checked {
    use std::io::Write;
    use std::os::raw::c_void;
    use std::process::ExitCode;
    use std::time::Duration;

    use metrale_gpu_elastic::{config, Config, Place, Training};
    use metrale_gpu_sys::cuda::{self, CUdeviceptr, CUstream};
    use metrale_gpu_sys::nccl::*;

    /// Floats per all-reduce.
    const COUNT: usize = 1 << 18;

    pub fn main() -> ExitCode {
        let (config, step_time) = match parse_args() {
            Ok(parsed) => parsed,
            Err(e) => {
                eprintln!(
                    "elastic: {e}\nusage: elastic [--step-ms MS] {}",
                    config::USAGE
                );
                return ExitCode::from(2);
            }
        };
        let who = config
            .first
            .map_or("replacement".to_string(), |f| format!("rank {}", f.rank));
        if let (Some(first), Some(placed)) = (config.first, &config.placed) {
            // Where this rank stands and which launcher said so, as multi_process prints it.
            println!("elastic rank {}/{}: {placed}", first.rank, first.world_size);
        }
        let result = Checked::new(step_time).and_then(|mut work| {
            let lived = metrale_gpu_elastic::run(&config, &mut work);
            lived.and(work.free())
        });
        match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                // One write: an unbuffered stderr writes each piece of a format on its own, and a
                // launcher that merges the ranks' output could split the line.
                let line = format!("elastic {who}: FAILED: {e}\n");
                let _ = std::io::stderr().write_all(line.as_bytes());
                println!("ELASTIC result=failed");
                ExitCode::FAILURE
            }
        }
    }

    /// `--step-ms MS` is this program's; the rest is the library's ([`Config::from_args`]).
    fn parse_args() -> Result<(Config, Duration), String> {
        let (mut step_time, mut rest) = (Duration::ZERO, Vec::new());
        let mut argv = std::env::args().skip(1);
        while let Some(arg) = argv.next() {
            match arg.as_str() {
                "--step-ms" => {
                    let ms = argv.next().ok_or("--step-ms needs a value")?;
                    step_time = config::millis("--step-ms", &ms)?;
                }
                _ => rest.push(arg),
            }
        }
        let config = Config::from_args(&rest, &|name| std::env::var(name).ok())?;
        Ok((config, step_time))
    }

    /// Element `i` of round `round`: `factor` times a small integer, so that every sum is exact. Rank
    /// r contributes factor r + 1; the sum over `size` ranks has factor size (size + 1) / 2.
    fn value(factor: usize, round: usize, i: usize) -> f32 {
        (factor * (1 + (i * 7 + round) % 97)) as f32
    }

    /// The checked all-reduce: a device buffer and its host copy. The device is allocated lazily, on
    /// the first round (the library makes the GPU current first).
    struct Checked {
        buf: CUdeviceptr,
        host: Vec<f32>,
        step_time: Duration,
    }

    impl Checked {
        fn new(step_time: Duration) -> Result<Checked, String> {
            Ok(Checked {
                buf: 0,
                host: vec![0.0; COUNT],
                step_time,
            })
        }

        /// Frees the device buffer, if one was made.
        fn free(self) -> Result<(), String> {
            if self.buf == 0 {
                return Ok(());
            }
            let api = cuda::driver("elastic").map_err(|e| e.to_string())?;
            // SAFETY: the buffer from cuMemAlloc, idle (the last round's stream was drained or its
            // communicator revoked or aborted), freed once.
            check_cuda(unsafe { api.cuMemFree_v2(self.buf) }, "cuMemFree")
                .map_err(|e| e.to_string())
        }
    }

    impl Training for Checked {
        fn step(
            &mut self,
            world: Place,
            round: usize,
            comm: NcclComm,
            stream: CUstream,
        ) -> Result<NcclResult, String> {
            // The step's computation, before its gradients are all-reduced.
            std::thread::sleep(self.step_time);
            let api = cuda::driver("elastic").map_err(|e| e.to_string())?;
            if self.buf == 0 {
                // SAFETY: writes one device pointer; the library made the rank's device current.
                let res = unsafe { api.cuMemAlloc_v2(&mut self.buf, COUNT * 4) };
                check_cuda(res, "cuMemAlloc").map_err(|e| e.to_string())?;
            }
            for (i, v) in self.host.iter_mut().enumerate() {
                *v = value(world.rank + 1, round, i);
            }
            let (host, bytes, ptr) = (self.host.as_mut_ptr(), COUNT * 4, self.buf as *mut c_void);
            // SAFETY: both buffers hold COUNT floats on this communicator's device; the upload is
            // queued on the collective's stream (never the legacy stream, which a non-blocking stream
            // does not wait for), and from pageable memory the driver has staged the host values when
            // it returns. Nothing is queued after the all-reduce: the sum is read in `finish`.
            unsafe {
                let up = api.cuMemcpyHtoDAsync_v2(self.buf, host.cast(), bytes, stream);
                check_cuda(up, "cuMemcpyHtoDAsync").map_err(|e| e.to_string())?;
                let (f32, sum) = (NcclDataType::ncclFloat32, NcclRedOp::ncclSum);
                Ok(ncclAllReduce(ptr, ptr, COUNT, f32, sum, comm, stream))
            }
        }

        fn finish(&mut self, world: Place, round: usize) -> Result<(), String> {
            let api = cuda::driver("elastic").map_err(|e| e.to_string())?;
            let (host, bytes) = (self.host.as_mut_ptr(), COUNT * 4);
            // SAFETY: both buffers hold COUNT floats; the round's stream has drained, so the device
            // buffer holds the sum, and the synchronous copy writes the host buffer before it returns.
            let down = unsafe { api.cuMemcpyDtoH_v2(host.cast(), self.buf, bytes) };
            check_cuda(down, "cuMemcpyDtoH").map_err(|e| e.to_string())?;
            let factor = world.size * (world.size + 1) / 2;
            match (0..COUNT).find(|&i| self.host[i] != value(factor, round, i)) {
                None => Ok(()),
                Some(i) => Err(format!(
                    "all-reduce round {round} over {} ranks: element {i} is {}, expected {}",
                    world.size,
                    self.host[i],
                    value(factor, round, i)
                )),
            }
        }
    }
}
