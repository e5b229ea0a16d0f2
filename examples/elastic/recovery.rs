//! A rank's life: the steady all-reduce loop; when a rank dies, detect it, revoke, shrink to the living
//! and check; then grow back when the replacements have joined. Each phase prints its `ELASTIC` line.

use std::time::{Duration, Instant};

use metrale_gpu_sys::nccl::*;
use metrale_gpu_testkit::hex;

pub use crate::comm::Gpu;
use crate::comm::{self, Outcome};
use crate::membership::{Client, Coordinator, Membership};
use crate::Args;

/// How long the rendezvous, the first init and a replacement's arrival may take.
const STARTUP: Duration = Duration::from_secs(120);
/// After this many all-reduces a rank says it is in its steady loop (a supervisor may kill it then).
const STEADY_MARK: usize = 100;
/// All-reduces checked on the grown communicator before the ranks finish.
const AFTER_GROW: usize = 20;

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

/// A rank of the first world: steady loop, then (if a rank died) revoke, shrink, grow.
pub fn run_member(args: &Args, rank: usize, gpu: &mut Gpu) -> Result<(), String> {
    let (who, id) = if rank == 0 {
        let id = NcclUniqueId::new().map_err(|e| e.to_string())?;
        let hex = hex::encode(&id.to_bytes());
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
        lost.at_unix_us,
        ms(lost.waited),
        lost.detail
    );
    if dead.is_empty() {
        return Err(format!(
            "the collective failed ({}) but the rendezvous knows of no dead rank (or rank 0, the \
             coordinator, died): nothing to shrink",
            lost.detail
        ));
    }

    // The watchdog revoked the communicator when it gave up: shrink without the dead, check.
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
        ms(lost.revoked),
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
        size = coordinator.grow(dead.len(), &hex::encode(&id.to_bytes()), STARTUP)?;
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
pub fn run_replacement(args: &Args, gpu: &mut Gpu) -> Result<(), String> {
    let (client, rank, size, hex) = Client::join(&args.master, STARTUP)?;
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

/// The unique id a peer sent as hex; an error, never a panic, for anything else.
fn id_from_hex(text: &str) -> Result<NcclUniqueId, String> {
    hex::decode(text)
        .and_then(|bytes| <[u8; NcclUniqueId::BYTES]>::try_from(bytes).ok())
        .map(NcclUniqueId::from_bytes)
        .ok_or(format!("not a unique id: {text:?}"))
}
