//! One process per rank, across hosts (or many on one GPU: see its README): rank 0 creates the
//! `ncclUniqueId` and hands it to the others over a small TCP rendezvous, then every rank all-reduces and
//! checks the sum.
//!
//! Rank, world size and GPU come from flags or from the launcher's variables: torchrun, Slurm's `srun`,
//! Open MPI's `mpirun` or a PMI launcher (metrale-gpu-launch's `placement` says the order and the conflict
//! rule); rank 0's address from `--master` or `MASTER_ADDR`/`MASTER_PORT`. The id crosses rank 0's
//! rendezvous (metrale-gpu-launch's `rendezvous`), which admits the ranks of this job only.
//!
//! ```sh
//! # one host, two GPUs
//! multi_process --rank 0 --world-size 2 --local-rank 0 --master 127.0.0.1:29500 &
//! multi_process --rank 1 --world-size 2 --local-rank 1 --master 127.0.0.1:29500
//! # one GPU, two ranks: each its own simulated host, connected by NCCL's sockets over loopback
//! NCCL_HOSTID=sim-0 NCCL_SOCKET_IFNAME=lo multi_process --rank 0 --world-size 2 --master 127.0.0.1:29500 &
//! NCCL_HOSTID=sim-1 NCCL_SOCKET_IFNAME=lo multi_process --rank 1 --world-size 2 --master 127.0.0.1:29500
//! # two hosts, one GPU each (host A is 10.0.0.1)
//! A$ RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 multi_process
//! B$ RANK=1 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 multi_process
//! # Slurm, 2 nodes x 4 GPUs (in a batch script); Open MPI, 8 processes on two hosts
//! export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
//! srun --nodes 2 --ntasks-per-node 4 multi_process
//! mpirun -np 8 -H 10.0.0.1:4,10.0.0.2:4 -x MASTER_ADDR=10.0.0.1 -x MASTER_PORT=29500 multi_process
//! ```

use std::process::ExitCode;
use std::time::Duration;

use metrale_gpu_sys::cuda::{self, CUdeviceptr};
use metrale_gpu_sys::nccl::*;
use metrale_gpu_watchdog as watchdog;

use metrale_gpu_launch::placement::{self, Placement};
use metrale_gpu_launch::rendezvous;

/// How long rank 0 waits for the others, and every rank for the collective.
const TIMEOUT: Duration = Duration::from_secs(120);
const COUNT: usize = 1 << 24;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let me = match placement::placement(&args, &|name| std::env::var(name).ok()) {
        Ok(me) => me,
        Err(e) => {
            eprintln!(
                "multi_process: {e}\nusage: multi_process {}",
                placement::USAGE
            );
            return ExitCode::from(2);
        }
    };
    println!("rank {}/{}: {me}", me.rank, me.world_size);
    match run(&me) {
        Ok(msg) => {
            println!("rank {}/{}: {msg}", me.rank, me.world_size);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rank {}/{}: FAILED: {e}", me.rank, me.world_size);
            ExitCode::FAILURE
        }
    }
}

/// A short fingerprint of the id (FNV-1a), so that the ranks' logs show they hold the same one.
fn fingerprint(id: &[u8]) -> u64 {
    id.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

fn run(me: &Placement) -> Result<String, Box<dyn std::error::Error>> {
    metrale_gpu_sys::version::check_library_version()?;
    // Rank 0 hands the id to every other rank before it joins: the others wait in init until it does, and
    // a failed rendezvous is reported here rather than as a hang inside init.
    let id = if me.rank == 0 {
        let id = NcclUniqueId::new()?;
        rendezvous::serve(&me.master, me.world_size, &id.to_bytes(), TIMEOUT)?;
        id
    } else {
        NcclUniqueId::from_bytes(rendezvous::fetch(&me.master, me.rank, TIMEOUT)?)
    };
    println!(
        "rank {}/{}: unique id {:016x} {}",
        me.rank,
        me.world_size,
        fingerprint(&id.to_bytes()),
        if me.rank == 0 {
            format!("served to {} rank(s)", me.world_size - 1)
        } else {
            format!("received from rank 0 at {}", me.master)
        }
    );

    let stream = create_stream(me.local_rank as i32)?;
    let mut comm: NcclComm = std::ptr::null_mut();
    let mut config = NcclConfig {
        commName: c"multi_process".as_ptr(),
        ..NcclConfig::default()
    };
    check_nccl(
        // SAFETY: comm and config are valid for the call; init blocks until every rank has joined.
        unsafe {
            ncclCommInitRankConfig(
                &mut comm,
                me.world_size as i32,
                id,
                me.rank as i32,
                &mut config,
            )
        },
        "ncclCommInitRankConfig",
    )?;

    let api = cuda::driver("multi_process")?;
    let mut buf: CUdeviceptr = 0;
    let host = vec![(me.rank + 1) as f32; COUNT];
    let mut out = vec![0f32; COUNT];
    // SAFETY: create_stream made the device current; the buffer holds COUNT floats. Both copies are
    // queued on the collective's stream, in order with it: a plain cuMemcpyHtoD runs on the legacy
    // stream, which a non-blocking stream does not wait for. From pageable memory the driver has staged
    // `host` when the call returns; `out` is read only after the stream is synchronised.
    unsafe {
        check_cuda(api.cuMemAlloc_v2(&mut buf, COUNT * 4), "cuMemAlloc")?;
        check_cuda(
            api.cuMemcpyHtoDAsync_v2(buf, host.as_ptr().cast(), COUNT * 4, stream),
            "cuMemcpyHtoDAsync",
        )?;
        let ptr = buf as *mut std::os::raw::c_void;
        let r = ncclAllReduce(
            ptr,
            ptr,
            COUNT,
            NcclDataType::ncclFloat32,
            NcclRedOp::ncclSum,
            comm,
            stream,
        );
        check_nccl(r, "ncclAllReduce")?;
        check_cuda(
            api.cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), buf, COUNT * 4, stream),
            "cuMemcpyDtoHAsync",
        )?;
        // A peer that dies would leave this rank spinning: the watchdog aborts instead.
        watchdog::wait_stream(comm, stream, TIMEOUT)?;
        check_cuda(api.cuMemFree_v2(buf), "cuMemFree")?;
        check_nccl(ncclCommDestroy(comm), "ncclCommDestroy")?;
        destroy_stream(stream)?;
    }
    let n = me.world_size as usize;
    let expected = (n * (n + 1) / 2) as f32;
    match out.iter().position(|&x| x != expected) {
        Some(i) => Err(format!("element {i} is {}, expected {expected}", out[i]).into()),
        None => Ok(format!(
            "all-reduce of {COUNT} floats over {n} processes correct ({expected} everywhere)"
        )),
    }
}
