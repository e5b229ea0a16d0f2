//! A rank's life: the steady all-reduce loop; when a generation is lost, the agreement on one plan
//! (shrink, or init from a new id), the new communicator checked; then the grow back to full size when
//! the replacements have joined. A failure at any step (a rank killed during the shrink or the grow)
//! is one more lost generation and one more round, up to [`MAX_ROUNDS`]. Each phase prints its
//! `ELASTIC` line.

use std::time::{Duration, Instant};

use metrale_gpu_sys::nccl::*;
use metrale_gpu_testkit::hex;

use crate::client::Client;
use crate::comm::{self, Gpu, Lost, Outcome};
use crate::coordinator::Coordinator;
use crate::membership::{Bounds, Membership, Order};
use crate::protocol::{rank_list, Held, How};
use crate::{Args, First};

/// How long the rendezvous, the first init and a replacement's arrival may take.
const STARTUP: Duration = Duration::from_secs(120);
/// After this many all-reduces a rank says it is in its steady loop (a supervisor may kill it then).
const STEADY_MARK: usize = 100;
/// All-reduces checked on each recovered communicator, and on the grown one before the ranks finish.
const CHECKS: usize = 3;
const AFTER_GROW: usize = 20;
/// Lost generations a rank recovers from before it gives up: each one follows a new failure.
pub const MAX_ROUNDS: usize = 8;

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

/// The communicator a rank works on.
struct Current {
    comm: NcclComm,
    gen: u64,
    rank: usize,
    size: usize,
}

/// Where a rank's life stands.
enum Step {
    /// It lost generation `gen` (in which it was `rank`), holding its communicator revoked
    /// (`Some`, it can be shrunk) or not at all (aborted).
    Lost {
        gen: u64,
        rank: usize,
        parent: Option<NcclComm>,
        lost: Lost,
    },
    /// A new communicator: `checks` checked all-reduces on it, then `line`, then grow back or finish.
    Made {
        now: Current,
        checks: usize,
        line: String,
    },
}

impl Step {
    /// After a lost wait on `now`: what the rank holds of it.
    fn lost(now: &Current, lost: Lost) -> Step {
        let parent = (lost.held == Held::Revoked).then_some(now.comm);
        Step::Lost {
            gen: now.gen,
            rank: now.rank,
            parent,
            lost,
        }
    }

    /// A step that failed to make generation `gen` (its communicators were aborted).
    fn failed(gen: u64, rank: usize, detail: String, took: Duration) -> Step {
        let lost = Lost {
            how: "setup",
            detail,
            held: Held::Aborted,
            waited: took,
            at_unix_us: comm::unix_us(),
            revoked: Duration::ZERO,
        };
        Step::Lost {
            gen,
            rank,
            parent: None,
            lost,
        }
    }
}

/// A rank of the first world: rendezvous, init, steady loop, then recovery as it comes.
pub fn run_member(args: &Args, first: First, gpu: &mut Gpu) -> Result<(), String> {
    let First { rank, world_size } = first;
    let (who, id) = if rank == 0 {
        let id = NcclUniqueId::new().map_err(|e| e.to_string())?;
        let coordinator =
            Coordinator::listen(&args.master, world_size, &hex::encode(&id.to_bytes()))?;
        println!("ELASTIC phase=listening port={}", coordinator.port());
        coordinator.wait_members(STARTUP)?;
        (Membership::Coordinator(coordinator), id)
    } else {
        let (client, hex) = Client::hello(&args.master, rank, STARTUP)?;
        (Membership::Member(client), id_from_hex(&hex)?)
    };
    let comm = comm::init(world_size, id, rank, STARTUP, &who, 0)?;
    let now = Current {
        comm,
        gen: 0,
        rank,
        size: world_size,
    };
    for round in 0..args.iters {
        match gpu.all_reduce(now.comm, now.rank, now.size, round, &who, 0, args.deadline)? {
            Outcome::Done if round + 1 == STEADY_MARK => {
                println!(
                    "ELASTIC phase=steady rank={rank} size={} iterations={STEADY_MARK}",
                    now.size
                )
            }
            Outcome::Done => {}
            Outcome::Lost(lost) => {
                return live(args, world_size, gpu, &who, Step::lost(&now, lost))
            }
        }
    }
    comm::release(now.comm, false)?;
    who.finish(Bounds::new(args.deadline).report)?;
    println!(
        "ELASTIC result=ok rank={rank} size={} recovered=none (nobody died in {} rounds)",
        now.size, args.iters
    );
    Ok(())
}

/// A replacement: joins through the rendezvous and `ncclCommGrow`, then lives as the others do. The
/// grow's size is the full world's (a grow restores it): the size this rank's later recoveries grow
/// back to, like the first world's ranks.
pub fn run_replacement(args: &Args, gpu: &mut Gpu) -> Result<(), String> {
    let (client, joined) = Client::join(&args.master, STARTUP)?;
    let who = Membership::Member(client);
    let id = id_from_hex(&joined.id)?;
    let setup = Bounds::new(args.deadline).setup;
    let t = Instant::now();
    let grown = comm::grow(
        std::ptr::null_mut(),
        joined.size,
        Some(&id),
        joined.rank as i32,
        setup,
        &who,
        joined.gen,
    );
    let step = match grown {
        Ok(comm) => Step::Made {
            now: Current {
                comm,
                gen: joined.gen,
                rank: joined.rank,
                size: joined.size,
            },
            checks: AFTER_GROW,
            line: grow_line(joined.rank, joined.size, joined.gen, t.elapsed()),
        },
        Err(e) => Step::failed(joined.gen, joined.rank, e, t.elapsed()),
    };
    live(args, joined.size, gpu, &who, step)
}

fn grow_line(rank: usize, size: usize, gen: u64, took: Duration) -> String {
    format!(
        "ELASTIC phase=grow rank={rank} size={size} gen={gen} grow_ms={} allreduce=ok",
        ms(took)
    )
}

/// From `step` on: recover, check, grow, until the rank finishes at full size (`world` ranks) or
/// cannot go on.
fn live(
    args: &Args,
    world: usize,
    gpu: &mut Gpu,
    who: &Membership,
    mut step: Step,
) -> Result<(), String> {
    let bounds = Bounds::new(args.deadline);
    let mut rounds = 0;
    loop {
        step = match step {
            Step::Lost {
                gen,
                rank,
                parent,
                lost,
            } => {
                rounds += 1;
                println!(
                    "ELASTIC phase=detect rank={rank} gen={gen} how={} held={} at_unix_us={} waited_ms={} \
                     revoke_ms={} detail={:?}",
                    lost.how,
                    if parent.is_some() { "revoked" } else { "aborted" },
                    lost.at_unix_us,
                    ms(lost.waited),
                    ms(lost.revoked),
                    lost.detail
                );
                if rounds > MAX_ROUNDS {
                    if let Some(p) = parent {
                        comm::release(p, true)?;
                    }
                    return Err(format!(
                        "{MAX_ROUNDS} recovery rounds, and generation {gen} lost again: giving up"
                    ));
                }
                recover(who, &bounds, gen, rank, parent, &lost)?
            }
            Step::Made { now, checks, line } => {
                if let Some(lost) = check_rounds(gpu, &now, checks, who, args.deadline)? {
                    step = Step::lost(&now, lost);
                    continue;
                }
                println!("{line}");
                match grow_back(args, world, who, &bounds, now)? {
                    Some(next) => next,
                    None => return Ok(()),
                }
            }
        }
    }
}

/// One recovery round: report, the plan, the next communicator made (or the failure that lost it). An
/// error when there is no plan: no coordinator, or this rank was left out.
fn recover(
    who: &Membership,
    bounds: &Bounds,
    gen: u64,
    rank: usize,
    parent: Option<NcclComm>,
    lost: &Lost,
) -> Result<Step, String> {
    let held = match parent {
        Some(_) => Held::Revoked,
        None => Held::Aborted,
    };
    let t = Instant::now();
    let mut new_id = || {
        NcclUniqueId::new()
            .map(|id| hex::encode(&id.to_bytes()))
            .map_err(|e| e.to_string())
    };
    let plan = match who.recover(gen, held, bounds, &mut new_id) {
        Ok(plan) => plan,
        Err(e) => {
            if let Some(p) = parent {
                comm::release(p, true)?;
            }
            return Err(format!("rank {rank} of generation {gen}: {e}"));
        }
    };
    let agreed = t.elapsed();
    let (how, dead) = match &plan.how {
        How::Shrink { exclude } => ("shrink", rank_list(exclude)),
        How::Init { .. } => ("init", String::new()),
    };
    println!(
        "ELASTIC phase=plan rank={} gen={} how={how} dead={dead} size={} agree_ms={}",
        plan.rank,
        plan.gen,
        plan.size,
        ms(agreed)
    );
    let t = Instant::now();
    let made = match (&plan.how, parent) {
        (How::Shrink { exclude }, Some(p)) => comm::shrink(p, exclude, bounds.setup, who, plan.gen),
        (How::Shrink { .. }, None) => Err("told to shrink an aborted communicator".to_string()),
        (How::Init { id }, parent) => {
            if let Some(p) = parent {
                if let Err(e) = comm::release(p, true) {
                    eprintln!("warning: {e}");
                }
            }
            id_from_hex(id)
                .and_then(|id| comm::init(plan.size, id, plan.rank, bounds.setup, who, plan.gen))
        }
    };
    let took = t.elapsed();
    Ok(match made {
        Ok(comm) => Step::Made {
            now: Current {
                comm,
                gen: plan.gen,
                rank: plan.rank,
                size: plan.size,
            },
            checks: CHECKS,
            line: format!(
                "ELASTIC phase=shrink rank={} size={} gen={} how={how} revoke_ms={} agree_ms={} shrink_ms={} \
                 allreduce=ok",
                plan.rank,
                plan.size,
                plan.gen,
                ms(lost.revoked),
                ms(agreed),
                ms(took)
            ),
        },
        Err(e) => Step::failed(plan.gen, plan.rank, e, took),
    })
}

/// After the checks on `now`: finish at full size (`world`), or wait for the replacements and grow
/// (the next step), or give `now` up when its generation is lost meanwhile (the next step too).
fn grow_back(
    args: &Args,
    world: usize,
    who: &Membership,
    bounds: &Bounds,
    now: Current,
) -> Result<Option<Step>, String> {
    if now.size >= world {
        comm::release(now.comm, false)?;
        who.finish(bounds.report)?;
        println!("ELASTIC result=ok rank={} size={}", now.rank, now.size);
        return Ok(None);
    }
    println!(
        "ELASTIC phase=waiting rank={} gen={} replacements={}",
        now.rank,
        now.gen,
        world - now.size
    );
    let mut grow_uid = None;
    let t = Instant::now();
    let mut grow_id = || {
        println!("ELASTIC phase=growid rank={} gen={}", now.rank, now.gen);
        std::thread::sleep(args.grow_id_delay);
        let id = comm::grow_id(now.comm, who, now.gen, args.deadline)?;
        grow_uid = Some(id);
        Ok(hex::encode(&id.to_bytes()))
    };
    let order = match who.await_grow(now.gen, STARTUP, &mut grow_id) {
        Ok(order) => order,
        Err(e) => {
            comm::release(now.comm, false)?;
            return Err(e);
        }
    };
    Ok(Some(match order {
        Order::Recover { gen } => {
            Step::lost(&now, comm::give_up_idle(now.comm, who, gen, args.deadline)?)
        }
        // The communicator is gone (aborted, or left to the given-up call's thread).
        Order::NoGrowId { gen, why } => Step::failed(gen, now.rank, why, t.elapsed()),
        Order::Grow { gen, size } => {
            println!(
                "ELASTIC phase=growing rank={} gen={gen} size={size}",
                now.rank
            );
            let t = Instant::now();
            let grown = comm::grow(
                now.comm,
                size,
                grow_uid.as_ref(),
                -1,
                bounds.setup,
                who,
                gen,
            );
            let took = t.elapsed();
            match grown {
                Ok(comm) => Step::Made {
                    now: Current {
                        comm,
                        gen,
                        rank: now.rank,
                        size,
                    },
                    checks: AFTER_GROW,
                    line: grow_line(now.rank, size, gen, took),
                },
                Err(e) => Step::failed(gen, now.rank, e, took),
            }
        }
    }))
}

/// `rounds` checked all-reduces on a new communicator; the loss, if one comes.
fn check_rounds(
    gpu: &mut Gpu,
    now: &Current,
    rounds: usize,
    who: &Membership,
    deadline: Duration,
) -> Result<Option<Lost>, String> {
    for round in 0..rounds {
        if let Outcome::Lost(lost) =
            gpu.all_reduce(now.comm, now.rank, now.size, round, who, now.gen, deadline)?
        {
            return Ok(Some(lost));
        }
    }
    Ok(None)
}

/// The unique id a peer sent as hex; an error, never a panic, for anything else.
fn id_from_hex(text: &str) -> Result<NcclUniqueId, String> {
    hex::decode(text)
        .and_then(|bytes| <[u8; NcclUniqueId::BYTES]>::try_from(bytes).ok())
        .map(NcclUniqueId::from_bytes)
        .ok_or(format!("not a unique id: {text:?}"))
}
