//! An all-reduce in a kernel of its own, through NCCL's device API, at any rank count: this program starts
//! one process per rank (itself again), each on GPU `rank % GPUs`, placed as the GPU tests place theirs
//! (`METRALE_TEST_PLACEMENT`: `hosts`, or `multi-rank-gpu` for ranks sharing a GPU with NCCL 2.30+).
//! Every rank checks the device communicator its kernel sees (its rank, one LSA team of every rank, the
//! LSA barriers asked for) and the sums against the host's; the program exits 0 when every rank did.
//!
//! ```sh
//! cargo run --release -p metrale-gpu-device-example --example device_allreduce -- --ranks 2
//! METRALE_TEST_PLACEMENT=multi-rank-gpu device_allreduce --ranks 4     # 4 ranks on one GPU (NCCL 2.30+)
//! ```

use std::process::{Child, Command, ExitCode};
use std::time::{Duration, Instant};

use metrale_gpu_sys::nccl::*;
use metrale_gpu_sys::{cuda, version};
use metrale_gpu_testkit::hex;
use metrale_gpu_testkit::placement::{Mode, Plan, MODE};

/// The rank a child process plays (set by the parent), and the others it reads.
const RANK: &str = "DEVICE_ALLREDUCE_RANK";
const RANKS: &str = "DEVICE_ALLREDUCE_RANKS";
const DEVICE: &str = "DEVICE_ALLREDUCE_DEVICE";
const COUNT: &str = "DEVICE_ALLREDUCE_COUNT";
const UNIQUE_ID: &str = "DEVICE_ALLREDUCE_ID";
/// How long the ranks together may take before the parent kills them.
const LIMIT: Duration = Duration::from_secs(120);
const USAGE: &str = "device_allreduce [--ranks N (default 2)] [--count FLOATS (default 1048576)]";

fn main() -> ExitCode {
    let result = match std::env::var(RANK) {
        _ if !cfg!(device_api) => Err(
            "built against NCCL headers without the device API (nccl_device.h, NCCL 2.28+): rebuild \
             against newer ones (NCCL_HOME)"
                .into(),
        ),
        Ok(rank) => rank_main(&rank),
        Err(_) => parent(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("device_allreduce: {e}");
            ExitCode::FAILURE
        }
    }
}

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Starts the ranks and waits for them (at most [`LIMIT`]).
fn parent() -> Result<()> {
    let (mut ranks, mut count) = (2usize, 1usize << 20);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(USAGE)?;
        match flag.as_str() {
            "--ranks" => ranks = value.parse().map_err(|_| USAGE)?,
            "--count" => count = value.parse().map_err(|_| USAGE)?,
            _ => return Err(USAGE.into()),
        }
    }
    let library = version::check_library_version()?;
    let api = cuda::driver("device_allreduce")?;
    let mut gpus = 0;
    // SAFETY: writes one int.
    let counted = unsafe { api.cuDeviceGetCount(&mut gpus) };
    check_cuda(counted, "cuDeviceGetCount")?;
    let mode = std::env::var(MODE).map_or(Ok(Mode::Hosts), |m| Mode::parse(&m))?;
    let plan = Plan::new(ranks, gpus as usize, mode, library)?;
    println!(
        "device_allreduce: NCCL {library} ({}), {count} floats, {plan}: {}",
        version::library_path().unwrap_or_default(),
        plan.transport()
    );
    let id = hex::encode(&NcclUniqueId::new()?.to_bytes());
    let exe = std::env::current_exe()?;
    let mut children: Vec<(usize, Child)> = Vec::new();
    for rank in 0..ranks {
        let child = Command::new(&exe)
            .env(RANK, rank.to_string())
            .env(RANKS, ranks.to_string())
            .env(DEVICE, plan.place(rank).device.to_string())
            .env(COUNT, count.to_string())
            .env(UNIQUE_ID, &id)
            .envs(plan.nccl_env(rank))
            .spawn()?;
        children.push((rank, child));
    }
    let deadline = Instant::now() + LIMIT;
    let mut failed = Vec::new();
    while !children.is_empty() {
        let mut running = Vec::new();
        for (rank, mut child) in children {
            match child.try_wait()? {
                Some(status) if status.success() => {}
                Some(status) => failed.push(format!("rank {rank}: {status}")),
                None if Instant::now() > deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    failed.push(format!(
                        "rank {rank}: still running after {LIMIT:?}, killed"
                    ));
                }
                None => running.push((rank, child)),
            }
        }
        children = running;
        std::thread::sleep(Duration::from_millis(20));
    }
    if !failed.is_empty() {
        return Err(format!(
            "{} of {ranks} ranks failed: {}",
            failed.len(),
            failed.join("; ")
        )
        .into());
    }
    println!(
        "device_allreduce: {ranks} ranks: every rank's sums and device communicator as expected"
    );
    Ok(())
}

/// Headers without the device API: `main` says so before any rank starts.
#[cfg(not(device_api))]
fn rank_main(_: &str) -> Result<()> {
    unreachable!("main refuses to start ranks without the device API")
}

/// One rank: joins the communicator, runs the kernel, checks what it saw.
#[cfg(device_api)]
fn rank_main(rank: &str) -> Result<()> {
    let var = |name: &str| std::env::var(name).map_err(|_| format!("{name} is unset"));
    let rank: usize = rank.parse()?;
    let ranks: usize = var(RANKS)?.parse()?;
    let device: i32 = var(DEVICE)?.parse()?;
    let count: usize = var(COUNT)?.parse()?;
    let bytes = hex::decode(&var(UNIQUE_ID)?).ok_or("the unique id is not hex")?;
    let id = NcclUniqueId::from_bytes(bytes.try_into().map_err(|_| "the unique id's length")?);
    cuda::use_device(device, "device_allreduce")?;
    let mut comm: NcclComm = std::ptr::null_mut();
    // SAFETY: writes one communicator; every rank joins with the same id.
    let joined = unsafe { ncclCommInitRank(&mut comm, ranks as i32, id, rank as i32) };
    check_nccl(joined, "ncclCommInitRank")?;
    // SAFETY: `comm` is this rank's live communicator, on `device`; nothing else uses it meanwhile.
    let report =
        unsafe { metrale_gpu_device_example::all_reduce(comm, device, rank, ranks, count) };
    // SAFETY: the communicator is live and used by nothing else now; destroyed once.
    unsafe {
        check_nccl(ncclCommFinalize(comm), "ncclCommFinalize")?;
        check_nccl(ncclCommDestroy(comm), "ncclCommDestroy")?;
    }
    let report = report?;
    let [dev_rank, dev_ranks, lsa_rank, lsa_size, barriers] = report.dev_comm;
    println!(
        "rank {rank}/{ranks} on GPU {device}: device communicator: rank {dev_rank} of {dev_ranks}, LSA rank \
         {lsa_rank} of {lsa_size}, {barriers} LSA barriers; host's ncclTeamLsa: {} ranks, rank {}; \
         {count} sums: {} wrong",
        report.lsa_team.0, report.lsa_team.1, report.wrong
    );
    let expected = [
        rank as i32,
        ranks as i32,
        rank as i32,
        ranks as i32,
        metrale_gpu_device_example::BLOCKS as i32,
    ];
    if report.dev_comm != expected || report.lsa_team != (ranks as i32, rank as i32) {
        return Err(format!(
            "rank {rank}: the device communicator is {:?} (rank, ranks, LSA rank, LSA size, LSA barriers), \
             the host's LSA team {:?}; expected {expected:?} and ({ranks}, {rank})",
            report.dev_comm, report.lsa_team
        )
        .into());
    }
    if let Some((i, got, want)) = report.first_wrong {
        return Err(format!(
            "rank {rank}: {} of {count} sums wrong, the first at {i}: {got}, the host's {want}",
            report.wrong
        )
        .into());
    }
    Ok(())
}
