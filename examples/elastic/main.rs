//! Recovering without a restart: ranks all-reduce in a loop; when some die, the survivors agree on who
//! died, make the communicator of the living (shrink, or init from a new unique id) and train on at the
//! size they have; when replacements arrive, they grow it, up to the first world's size. The README
//! beside this file says why and how.
//!
//! Launched like `multi_process` (the testkit's `launcher`): `--rank R --world-size N --local-rank G
//! --master HOST:PORT`, or the variables torchrun, srun, mpirun or a PMI launcher set, with
//! `MASTER_ADDR`/`MASTER_PORT`. A replacement is started with `--join` and its local rank and rank 0's
//! address, read the same way (rank 0 given port 0 picks one and prints it: `ELASTIC phase=listening
//! port=P`). `--deadline SECS` (default 5) bounds every collective and every recovery
//! step (metrale-gpu-watchdog, in its revoke mode); `--iters N` (default 100000) is the number of
//! rounds the job trains, across recoveries (start a replacement with the job's); `--min-size M`
//! (default 1) the fewest ranks it trains with: below it every rank ends with an error; `--step-ms MS`
//! (default 0) what each round computes before its all-reduce.
//!
//! How the survivors recover (see `membership.rs` for the rendezvous, `coordinator.rs` for the
//! agreement, `bounded.rs` for the grow's calls NCCL makes blocking): every process keeps its
//! connection to rank 0's rendezvous open; rank 0 reads the end of a dead one's connection and tells
//! every survivor that the communicator's generation is lost. A survivor's wait on its all-reduce polls
//! that news, `ncclCommGetAsyncError` and the stream, and gives up after the deadline if none of them moved: whichever comes first, the watchdog revokes the
//! communicator and waits until it is quiescent, or aborts it where NCCL still reports an error (NCCL
//! shrinks no communicator in that state: see metrale-gpu-watchdog's docs). Each survivor tells rank 0
//! how it holds the lost communicator; rank 0 waits for every live one (a silent one is treated as dead),
//! fixes one dead set, and sends one plan: `ncclCommShrink` when every survivor holds it revoked, else a
//! new communicator from a new unique id. Training goes on at once; replacements (`--join`) grow it at
//! the next round boundary, all that wait at once, ranks in order. A failure during any of this is one
//! more round. Rank 0 coordinates and is not replaced:
//! its death ends every other rank with a clear error (a production system keeps membership in an
//! external store and elects a new coordinator).
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

// Revoke, shrink and grow came with NCCL 2.29: built against older headers the example only says so.
#[cfg(nccl_2_29)]
mod bounded;
#[cfg(nccl_2_29)]
mod client;
#[cfg(nccl_2_29)]
mod comm;
#[cfg(nccl_2_29)]
mod coordinator;
#[cfg(nccl_2_29)]
mod fabric;
#[cfg(all(nccl_2_29, test))]
mod fake;
#[cfg(nccl_2_29)]
#[path = "../gate/mod.rs"]
mod gate;
#[cfg(all(nccl_2_29, test))]
mod lines;
#[cfg(nccl_2_29)]
mod membership;
#[cfg(nccl_2_29)]
mod protocol;
#[cfg(nccl_2_29)]
mod recovery;
#[cfg(all(test, nccl_2_29))]
mod strays;

use std::process::ExitCode;
#[cfg(nccl_2_29)]
use std::time::Duration;

#[cfg(nccl_2_29)]
use metrale_gpu_testkit::launcher;

#[cfg(not(nccl_2_29))]
fn main() -> ExitCode {
    eprintln!(
        "elastic needs NCCL 2.29 or newer (ncclCommRevoke, ncclCommShrink of a revoked communicator, \
         ncclCommGetUniqueId, ncclCommGrow); this build has the NCCL {} headers: rebuild against 2.29+",
        metrale_gpu_sys::version::NcclVersion::HEADERS
    );
    ExitCode::from(2)
}

/// What the command line (or torchrun's variables) says.
#[cfg(nccl_2_29)]
pub struct Args {
    /// A rank of the first world: its rank and the world's size. `None` for a replacement (`--join`),
    /// which learns both from its grow (the coordinator's `GROWID`: a grow restores the full size).
    pub first: Option<First>,
    pub local_rank: i32,
    pub master: String,
    pub deadline: Duration,
    /// Rounds the job trains, across recoveries and grows.
    pub iters: usize,
    /// The fewest ranks the job trains with (`--min-size`, default 1; rank 0's counts).
    pub min_size: usize,
    /// What each round computes before its all-reduce (`--step-ms`, default 0): a stand-in for the
    /// forward and backward pass, which gives a run of `--iters` rounds a length a test can plan on.
    pub step_time: Duration,
    /// For tests only (`METRALE_ELASTIC_GROW_ID_DELAY_MS`): how long rank 0 waits between its last look
    /// at the rendezvous and `ncclCommGetUniqueId`, so that a rank killed on its `phase=growid` line
    /// dies after that look, as in the race `bounded.rs` guards against.
    pub grow_id_delay: Duration,
}

#[cfg(nccl_2_29)]
fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!(
                "elastic: {e}\nusage: elastic [--deadline SECS] [--iters N] [--min-size M] [--step-ms MS] {}\n       \
                 elastic --join [--deadline SECS] [--iters N] [--step-ms MS] [--local-rank G --master \
                 HOST:PORT]",
                launcher::USAGE
            );
            return ExitCode::from(2);
        }
    };
    let who = args
        .first
        .map_or("replacement".to_string(), |f| format!("rank {}", f.rank));
    let result = metrale_gpu_sys::version::check_library_version()
        .map_err(|e| e.to_string())
        .and_then(|_| comm::Gpu::new(args.local_rank).map_err(|e| e.to_string()))
        .and_then(|mut gpu| match args.first {
            Some(first) => recovery::run_member(&args, first, &mut gpu),
            None => recovery::run_replacement(&args, &mut gpu),
        });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("elastic {who}: FAILED: {e}");
            println!("ELASTIC result=failed");
            ExitCode::FAILURE
        }
    }
}

/// A rank of the first world.
#[cfg(nccl_2_29)]
#[derive(Clone, Copy)]
pub struct First {
    pub rank: usize,
    pub world_size: usize,
}

/// The variable behind [`Args::grow_id_delay`].
#[cfg(nccl_2_29)]
const GROW_ID_DELAY: &str = "METRALE_ELASTIC_GROW_ID_DELAY_MS";

/// `--join`, `--deadline SECS`, `--iters N`, `--min-size M` and `--step-ms MS` are the example's own; the rest is read as
/// `multi_process` reads it (flags, or the variables of torchrun, srun, mpirun or a PMI launcher).
#[cfg(nccl_2_29)]
fn parse_args() -> Result<Args, String> {
    let (mut join, mut deadline, mut iters, mut min_size, mut step_ms) = (false, 5, 100_000, 1, 0);
    let mut rest = Vec::new();
    let mut argv = std::env::args().skip(1);
    while let Some(arg) = argv.next() {
        let mut number = |flag: &str| -> Result<usize, String> {
            let v = argv.next().ok_or(format!("{flag} needs a value"))?;
            v.parse()
                .map_err(|_| format!("{flag} is not a number: '{v}'"))
        };
        match arg.as_str() {
            "--join" => join = true,
            "--deadline" => deadline = number("--deadline")?,
            "--iters" => iters = number("--iters")?,
            "--min-size" => min_size = number("--min-size")?,
            "--step-ms" => step_ms = number("--step-ms")?,
            _ => rest.push(arg),
        }
    }
    let env = |name: &str| std::env::var(name).ok();
    let delay = GROW_ID_DELAY;
    let grow_id_delay = match env(delay) {
        None => Duration::ZERO,
        Some(ms) => Duration::from_millis(
            ms.parse()
                .map_err(|_| format!("{delay}={ms:?} is not a number of milliseconds"))?,
        ),
    };
    let (first, local_rank, master) = if join {
        let (local_rank, master) = launcher::joiner(&rest, &env)?;
        (None, local_rank, master)
    } else {
        let me = launcher::placement(&rest, &env)?;
        // Where this rank stands and which launcher said so, as multi_process prints it.
        println!("elastic rank {}/{}: {me}", me.rank, me.world_size);
        let first = First {
            rank: me.rank as usize,
            world_size: me.world_size as usize,
        };
        if min_size == 0 || min_size > first.world_size {
            return Err(format!(
                "--min-size {min_size} is not a size from 1 to the world's {}",
                first.world_size
            ));
        }
        (Some(first), me.local_rank, me.master)
    };
    Ok(Args {
        first,
        local_rank: local_rank as i32,
        master,
        deadline: Duration::from_secs(deadline as u64),
        iters,
        min_size,
        step_time: Duration::from_millis(step_ms as u64),
        grow_id_delay,
    })
}
