//! Recovering without a restart: ranks all-reduce in a loop; when one dies, the survivors detect it,
//! revoke the communicator, shrink it to the living ranks and go on; when a replacement arrives, they
//! grow it back to full size.
//!
//! Launched like `multi_process`: `--rank R --world-size N --local-rank G --master HOST:PORT`, or the
//! variables torchrun sets (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`). A
//! replacement is started with `--join --local-rank G --master HOST:PORT`. `--deadline SECS` (default 5)
//! bounds every collective and every recovery step; `--iters N` (default 100000) ends a run in which
//! nobody dies.
//!
//! How a survivor learns who died: every process keeps its connection to rank 0's rendezvous open
//! (see `elastic/membership.rs`); the kernel closes a dead process's sockets, rank 0 reads the end of
//! the connection and tells every survivor the dead set. A survivor's wait on its all-reduce polls that
//! set, `ncclCommGetAsyncError` and the stream, and gives up after the deadline if none of them moved.
//! Rank 0 is the coordinator and must survive: in the demo another rank is killed.
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

#[path = "elastic/comm.rs"]
mod comm;
#[path = "elastic/membership.rs"]
mod membership;

use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use metrale_gpu_sys::nccl::*;

use comm::{Gpu, Outcome};
use membership::{Client, Coordinator, Membership};

/// How long the rendezvous, the first init and a replacement's arrival may take.
const STARTUP: Duration = Duration::from_secs(120);
/// After this many all-reduces a rank says it is in its steady loop (a supervisor may kill it then).
const STEADY_MARK: usize = 100;
/// All-reduces checked on the grown communicator before the ranks finish.
const AFTER_GROW: usize = 20;

struct Args {
    /// `None` for a replacement (`--join`).
    rank: Option<usize>,
    world_size: usize,
    local_rank: i32,
    master: String,
    deadline: Duration,
    iters: usize,
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!(
                "elastic: {e}\nusage: elastic --rank R --world-size N --local-rank G --master HOST:PORT \
                 [--deadline SECS] [--iters N]\n       elastic --join --local-rank G --master HOST:PORT \
                 [--deadline SECS]\n(or RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT as torchrun sets them)"
            );
            return ExitCode::from(2);
        }
    };
    let who = args
        .rank
        .map_or("replacement".to_string(), |r| format!("rank {r}"));
    let result = metrale_gpu_sys::version::check_library_version()
        .map_err(|e| e.to_string())
        .and_then(|_| Gpu::new(args.local_rank).map_err(|e| e.to_string()))
        .and_then(|mut gpu| match args.rank {
            Some(rank) => run_member(&args, rank, &mut gpu),
            None => run_replacement(&args, &mut gpu),
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

/// Flags first, then torchrun's variables.
fn parse_args() -> Result<Args, String> {
    let mut flags = std::collections::HashMap::new();
    let mut join = false;
    let mut argv = std::env::args().skip(1);
    while let Some(flag) = argv.next() {
        if flag == "--join" {
            join = true;
            continue;
        }
        let value = argv.next().ok_or(format!("{flag} needs a value"))?;
        flags.insert(flag, value);
    }
    let get = |flag: &str, var: &str| flags.get(flag).cloned().or_else(|| std::env::var(var).ok());
    let num = |flag: &str, var: &str, default: Option<usize>| -> Result<usize, String> {
        match get(flag, var) {
            Some(v) => v
                .parse()
                .map_err(|_| format!("{flag} ({var}) is not a number: '{v}'")),
            None => default.ok_or(format!("missing {flag} (or {var})")),
        }
    };
    let master = match get("--master", "") {
        Some(m) => m,
        None => {
            let addr =
                std::env::var("MASTER_ADDR").map_err(|_| "missing --master (or MASTER_ADDR)")?;
            format!(
                "{addr}:{}",
                std::env::var("MASTER_PORT").unwrap_or_else(|_| "29500".into())
            )
        }
    };
    let (rank, world_size) = if join {
        (None, 0)
    } else {
        let (rank, world_size) = (
            num("--rank", "RANK", None)?,
            num("--world-size", "WORLD_SIZE", None)?,
        );
        if rank >= world_size {
            return Err(format!("rank {rank} is outside a world of {world_size}"));
        }
        (Some(rank), world_size)
    };
    Ok(Args {
        rank,
        world_size,
        local_rank: num("--local-rank", "LOCAL_RANK", Some(0))? as i32,
        master,
        deadline: Duration::from_secs(num("--deadline", "", Some(5))? as u64),
        iters: num("--iters", "", Some(100_000))?,
    })
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

fn unix_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0)
}

/// A rank of the first world: steady loop, then (if a rank died) revoke, shrink, grow.
fn run_member(args: &Args, rank: usize, gpu: &mut Gpu) -> Result<(), String> {
    let (who, id) = if rank == 0 {
        let id = NcclUniqueId::new().map_err(|e| e.to_string())?;
        let hex = hex(&id.to_bytes());
        (
            Membership::Coordinator(Coordinator::start(
                &args.master,
                args.world_size,
                &hex,
                STARTUP,
            )?),
            id,
        )
    } else {
        let (client, hex) = Client::hello(&args.master, rank as u32, STARTUP)?;
        (Membership::Member(client), id_from_hex(&hex)?)
    };
    let comm = comm::init(args.world_size, id, rank, STARTUP)?;
    let (mut rank, mut size) = (rank, args.world_size);

    // Steady: all-reduce until a rank dies (or `iters` pass with nobody dead).
    let mut lost = None;
    for round in 0..args.iters {
        match gpu.all_reduce(comm, rank, size, round, &who, args.deadline)? {
            Outcome::Done if round + 1 == STEADY_MARK => {
                println!("ELASTIC phase=steady rank={rank} size={size} iterations={STEADY_MARK}")
            }
            Outcome::Done => {}
            Outcome::Lost(l) => {
                lost = Some(l);
                break;
            }
        }
    }
    let Some(lost) = lost else {
        comm::release(comm, false)?;
        println!(
            "ELASTIC result=ok rank={rank} size={size} recovered=none (nobody died in {} rounds)",
            args.iters
        );
        return Ok(());
    };
    // A timeout or an NCCL error may come before the rendezvous has seen the death: give it a moment.
    let wait = Instant::now();
    while who.dead().is_empty() && wait.elapsed() < Duration::from_secs(1) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let dead = who.dead();
    println!(
        "ELASTIC phase=detect rank={rank} dead={} how={} at_unix_us={} waited_ms={} detail={:?}",
        dead.iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(","),
        lost.how,
        unix_us(),
        ms(lost.waited),
        lost.detail
    );
    if dead.is_empty() {
        comm::revoke(comm, gpu.stream, args.deadline)?;
        return Err(format!(
            "the collective failed ({}) but the rendezvous knows of no dead rank (or rank 0, the \
             coordinator, died): nothing to shrink",
            lost.detail
        ));
    }

    // Revoke, shrink without the dead, check.
    let t = Instant::now();
    comm::revoke(comm, gpu.stream, args.deadline)?;
    let revoked = t.elapsed();
    let t = Instant::now();
    let shrunk = comm::shrink(comm, &dead, args.deadline)?;
    let shrink_took = t.elapsed();
    comm::release(comm, true)?;
    who.forget_dead();
    rank -= dead.iter().filter(|&&d| d < rank).count();
    size -= dead.len();
    check_rounds(gpu, shrunk, rank, size, &who, args.deadline, 3)?;
    println!(
        "ELASTIC phase=shrink rank={rank} size={size} revoke_ms={} shrink_ms={} allreduce=ok",
        ms(revoked),
        ms(shrink_took)
    );

    // Grow back: rank 0 waits for the replacements, makes the grow id and hands it out.
    let (grown, grow_took) = if rank == 0 {
        let Membership::Coordinator(coordinator) = &who else {
            unreachable!("rank 0 coordinates")
        };
        let mut id = NcclUniqueId::from_bytes([0; NcclUniqueId::BYTES]);
        // SAFETY: a live, idle communicator; writes one id.
        let res = unsafe { ncclCommGetUniqueId(shrunk, &mut id) };
        check_nccl(res, "ncclCommGetUniqueId").map_err(|e| e.to_string())?;
        size = coordinator.grow(dead.len(), &hex(&id.to_bytes()), STARTUP)?;
        let t = Instant::now();
        let grown = comm::grow(shrunk, size, Some(&id), -1, STARTUP)?;
        (grown, t.elapsed())
    } else {
        let Membership::Member(client) = &who else {
            unreachable!("other ranks are members")
        };
        size = client.wait_grow(STARTUP)?;
        let t = Instant::now();
        (comm::grow(shrunk, size, None, -1, STARTUP)?, t.elapsed())
    };
    comm::release(shrunk, false)?;
    finish(gpu, grown, rank, size, &who, args.deadline, grow_took)
}

/// A replacement: joins through the rendezvous and `ncclCommGrow`, then all-reduces with the others.
fn run_replacement(args: &Args, gpu: &mut Gpu) -> Result<(), String> {
    let (client, rank, size, hex) = membership::Client::join(&args.master, STARTUP)?;
    let id = id_from_hex(&hex)?;
    let t = Instant::now();
    let grown = comm::grow(std::ptr::null_mut(), size, Some(&id), rank as i32, STARTUP)?;
    finish(
        gpu,
        grown,
        rank,
        size,
        &Membership::Member(client),
        args.deadline,
        t.elapsed(),
    )
}

/// On the grown communicator: checked all-reduces, the grow line, clean-up.
fn finish(
    gpu: &mut Gpu,
    grown: NcclComm,
    rank: usize,
    size: usize,
    who: &Membership,
    deadline: Duration,
    took: Duration,
) -> Result<(), String> {
    check_rounds(gpu, grown, rank, size, who, deadline, AFTER_GROW)?;
    println!(
        "ELASTIC phase=grow rank={rank} size={size} grow_ms={} allreduce=ok",
        ms(took)
    );
    comm::release(grown, false)?;
    println!("ELASTIC result=ok rank={rank} size={size}");
    Ok(())
}

/// `rounds` all-reduces that must all finish and be right (no further failure is handled).
fn check_rounds(
    gpu: &mut Gpu,
    comm: NcclComm,
    rank: usize,
    size: usize,
    who: &Membership,
    deadline: Duration,
    rounds: usize,
) -> Result<(), String> {
    for round in 0..rounds {
        if let Outcome::Lost(l) = gpu.all_reduce(comm, rank, size, round, who, deadline)? {
            return Err(format!(
                "all-reduce {round} over {size} ranks lost ({}): {}",
                l.how, l.detail
            ));
        }
    }
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn id_from_hex(hex: &str) -> Result<NcclUniqueId, String> {
    let bytes: Result<Vec<u8>, _> = (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16))
        .collect();
    let bytes: [u8; NcclUniqueId::BYTES] = bytes
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or(format!("not a unique id: {hex:?}"))?;
    Ok(NcclUniqueId::from_bytes(bytes))
}
