//! One process per GPU, across hosts: rank 0 creates the `ncclUniqueId` and hands it to the others over a
//! small TCP rendezvous, then every rank all-reduces and checks the sum.
//!
//! Rank and world size come from the arguments or from the variables torchrun sets:
//! `RANK`, `WORLD_SIZE`, `LOCAL_RANK` (the GPU on this host), `MASTER_ADDR`, `MASTER_PORT`.
//!
//! ```sh
//! # one host, two GPUs
//! multi_process --rank 0 --world-size 2 --local-rank 0 --master 127.0.0.1:29500 &
//! multi_process --rank 1 --world-size 2 --local-rank 1 --master 127.0.0.1:29500
//! # two hosts, one GPU each (host A is 10.0.0.1)
//! A$ RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 multi_process
//! B$ RANK=1 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 multi_process
//! ```

#[path = "multi_process/rendezvous.rs"]
mod rendezvous;

use std::process::ExitCode;
use std::time::Duration;

use metrale_gpu_sys::cuda::{self, CUdeviceptr};
use metrale_gpu_sys::nccl::*;
use metrale_gpu_sys::watchdog;

/// How long rank 0 waits for the others, and every rank for the collective.
const TIMEOUT: Duration = Duration::from_secs(120);
const COUNT: usize = 1 << 24;

struct Args {
    rank: u32,
    world_size: u32,
    local_rank: i32,
    master: String,
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("multi_process: {e}\nusage: multi_process [--rank R --world-size N --local-rank G --master HOST:PORT]\n\
                       (or RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT as torchrun sets them)");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(msg) => {
            println!("rank {}/{}: {msg}", args.rank, args.world_size);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rank {}/{}: FAILED: {e}", args.rank, args.world_size);
            ExitCode::FAILURE
        }
    }
}

fn parse_args() -> Result<Args, String> {
    let mut flags = std::collections::HashMap::new();
    let mut argv = std::env::args().skip(1);
    while let Some(flag) = argv.next() {
        let value = argv.next().ok_or_else(|| format!("{flag} needs a value"))?;
        flags.insert(flag, value);
    }
    let get = |flag: &str, var: &str| flags.get(flag).cloned().or_else(|| std::env::var(var).ok());
    let num = |flag: &str, var: &str| -> Result<u32, String> {
        let v = get(flag, var).ok_or_else(|| format!("missing {flag} (or {var})"))?;
        v.parse()
            .map_err(|_| format!("{flag}/{var} is not a number: '{v}'"))
    };
    let rank = num("--rank", "RANK")?;
    let world_size = num("--world-size", "WORLD_SIZE")?;
    if world_size == 0 || rank >= world_size {
        return Err(format!("rank {rank} is outside a world of {world_size}"));
    }
    let local_rank = match get("--local-rank", "LOCAL_RANK") {
        Some(v) => v
            .parse()
            .map_err(|_| format!("--local-rank/LOCAL_RANK is not a number: '{v}'"))?,
        None => 0,
    };
    let master = match get("--master", "") {
        Some(m) => m,
        None => {
            let addr = std::env::var("MASTER_ADDR")
                .map_err(|_| "missing --master (or MASTER_ADDR)".to_string())?;
            let port = std::env::var("MASTER_PORT").unwrap_or_else(|_| "29500".into());
            format!("{addr}:{port}")
        }
    };
    Ok(Args {
        rank,
        world_size,
        local_rank,
        master,
    })
}

fn run(args: &Args) -> Result<String, Box<dyn std::error::Error>> {
    metrale_gpu_sys::version::check_library_version()?;
    // Rank 0 hands the id to every other rank before it joins: the others wait in init until it does, and
    // a failed rendezvous is reported here rather than as a hang inside init.
    let id = if args.rank == 0 {
        let id = NcclUniqueId::new()?;
        rendezvous::serve(&args.master, args.world_size, &id.to_bytes(), TIMEOUT)?;
        id
    } else {
        NcclUniqueId::from_bytes(rendezvous::fetch(&args.master, args.rank, TIMEOUT)?)
    };

    let stream = create_stream(args.local_rank)?;
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
                args.world_size as i32,
                id,
                args.rank as i32,
                &mut config,
            )
        },
        "ncclCommInitRankConfig",
    )?;

    let api = cuda::driver("multi_process")?;
    let mut buf: CUdeviceptr = 0;
    let host = vec![(args.rank + 1) as f32; COUNT];
    // SAFETY: create_stream made the device current; the buffer holds COUNT floats.
    unsafe {
        check_cuda(api.cuMemAlloc_v2(&mut buf, COUNT * 4), "cuMemAlloc")?;
        check_cuda(
            api.cuMemcpyHtoD_v2(buf, host.as_ptr().cast(), COUNT * 4),
            "cuMemcpyHtoD",
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
        // A peer that dies would leave this rank spinning: the watchdog aborts instead.
        watchdog::wait_stream(comm, stream, TIMEOUT)?;
    }
    let mut out = vec![0f32; COUNT];
    // SAFETY: copies COUNT floats into `out`; then everything is released once.
    unsafe {
        check_cuda(
            api.cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), buf, COUNT * 4),
            "cuMemcpyDtoH",
        )?;
        check_cuda(api.cuMemFree_v2(buf), "cuMemFree")?;
        check_nccl(ncclCommDestroy(comm), "ncclCommDestroy")?;
        destroy_stream(stream)?;
    }
    let n = args.world_size as usize;
    let expected = (n * (n + 1) / 2) as f32;
    match out.iter().position(|&x| x != expected) {
        Some(i) => Err(format!("element {i} is {}, expected {expected}", out[i]).into()),
        None => Ok(format!(
            "all-reduce of {COUNT} floats over {n} processes correct ({expected} everywhere)"
        )),
    }
}
