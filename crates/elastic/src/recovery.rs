//! A rank's life: rounds of work, each checked, until the last (`--iters`). When a
//! generation is lost: the agreement on one plan (shrink, or init from a new id), the new communicator,
//! and training goes on at the size it has, from the round the plan says; it never waits for
//! replacements. Rank 0 grows the world at a round boundary whenever replacements wait (all of them
//! at once, up to the first world's size). A failure at any step (a rank killed during the shrink or the
//! grow) is one more lost generation and one more round of the same recovery, up to [`MAX_ROUNDS`] a
//! recovery (a recovery ends once its communicator passed its checks; the next loss begins a new one);
//! fewer survivors than `--min-size` end the job on every rank. Each phase prints its `ELASTIC` line.

use std::time::{Duration, Instant};

use crate::client::Joined;
use crate::config::{Config, First};
use crate::fabric::{self, Fabric, Lost, Outcome, Place};
use crate::membership::{Bounds, Membership, Order};
use crate::protocol::{rank_list, Held, How};

/// How long the rendezvous, the first init and a replacement's arrival may take.
pub(crate) const STARTUP: Duration = Duration::from_secs(120);
/// After this many rounds a rank says it is in its steady loop (a supervisor may kill it then).
const STEADY_MARK: usize = 100;
/// Rank 0 says how far training has come every this many rounds, so that a watcher tells a slow job
/// (one process per rank time-sharing one GPU) from a stuck one without knowing how long a round takes.
const PROGRESS_EVERY: usize = 100;
/// Rounds on each recovered communicator before it says so (and rank 0 grows it), and on a grown
/// one before it says so.
const CHECKS: usize = 3;
const AFTER_GROW: usize = 20;
/// Rounds of one recovery (lost generations without a communicator that passed its checks between
/// them) a rank goes through before it gives up: each one follows a new failure.
pub const MAX_ROUNDS: usize = 8;

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

/// The communicator a rank works on, and its place in it.
struct Current<C> {
    comm: C,
    at: Place,
}

/// Where a rank's life stands.
enum Step<C> {
    /// It lost generation `gen` (in which it was `rank`) at round `step`, holding its communicator
    /// revoked (`Some`, it can be shrunk) or not at all (aborted). `fresh`: the generation had passed
    /// its checks, so this loss begins a new recovery (its rounds counted from 1).
    Lost {
        gen: u64,
        rank: usize,
        step: usize,
        parent: Option<C>,
        lost: Lost,
        fresh: bool,
    },
    /// A communicator (made by `how`: init, shrink, grow) to train on from round `step`; after
    /// `checks` rounds it prints `line`.
    Made {
        now: Current<C>,
        how: &'static str,
        step: usize,
        checks: usize,
        line: String,
    },
    /// The last round is done: the rank said so.
    Finished,
}

impl<C: Copy> Step<C> {
    /// After a lost wait on `now` at round `step`: what the rank holds of it.
    fn lost(now: &Current<C>, step: usize, lost: Lost, fresh: bool) -> Step<C> {
        let parent = (lost.held == Held::Revoked).then_some(now.comm);
        Step::Lost {
            gen: now.at.gen,
            rank: now.at.rank,
            step,
            parent,
            lost,
            fresh,
        }
    }

    /// A step that failed to make `at`'s generation (its communicators were aborted).
    fn failed(at: Place, step: usize, detail: String, took: Duration, fresh: bool) -> Step<C> {
        let lost = Lost {
            how: "setup",
            detail,
            held: Held::Aborted,
            waited: took,
            at_unix_us: fabric::unix_us(),
            revoked: Duration::ZERO,
        };
        Step::Lost {
            gen: at.gen,
            rank: at.rank,
            step,
            parent: None,
            lost,
            fresh,
        }
    }
}

/// The life of a rank of the first world on `who`, from the first unique id `id` on: init, training,
/// and recovery as it comes.
pub(crate) fn first_life<F: Fabric>(
    args: &Config,
    First { rank, world_size }: First,
    fabric: &mut F,
    who: &dyn Membership,
    id: &str,
) -> Result<(), String> {
    let at = Place {
        gen: 0,
        rank,
        size: world_size,
    };
    let comm = fabric.init(at, id, STARTUP, who)?;
    let line =
        format!("ELASTIC phase=steady rank={rank} size={world_size} iterations={STEADY_MARK}");
    let step = Step::Made {
        now: Current { comm, at },
        how: "init",
        step: 0,
        checks: STEADY_MARK,
        line,
    };
    live(args, fabric, who, step)
}

/// The life of a replacement on `who`, from its place in a grow on: the grow, then as the others.
pub(crate) fn replacement_life<F: Fabric>(
    args: &Config,
    fabric: &mut F,
    who: &dyn Membership,
    joined: &Joined,
) -> Result<(), String> {
    let at = Place {
        gen: joined.gen,
        rank: joined.rank,
        size: joined.size,
    };
    let step = grown(
        args,
        fabric,
        who,
        None,
        at,
        Some(&joined.id),
        joined.after + 1,
    );
    live(args, fabric, who, step)
}

/// From `step` on: train, recover, grow, until the last round or a failure the rank cannot recover from.
fn live<F: Fabric>(
    args: &Config,
    fabric: &mut F,
    who: &dyn Membership,
    mut step: Step<F::Comm>,
) -> Result<(), String> {
    let bounds = Bounds::new(args.deadline);
    let mut rounds = 0;
    loop {
        step = match step {
            Step::Lost {
                gen,
                rank,
                step,
                parent,
                lost,
                fresh,
            } => {
                rounds = if fresh { 1 } else { rounds + 1 };
                fabric.say(format!(
                    "ELASTIC phase=detect rank={rank} gen={gen} how={} held={} at_unix_us={} waited_ms={} \
                     revoke_ms={} detail={:?}",
                    lost.how,
                    if parent.is_some() { "revoked" } else { "aborted" },
                    lost.at_unix_us,
                    ms(lost.waited),
                    ms(lost.revoked),
                    lost.detail
                ))?;
                if rounds > MAX_ROUNDS {
                    if let Some(p) = parent {
                        fabric.release(p, true)?;
                    }
                    return Err(format!(
                        "{MAX_ROUNDS} rounds of one recovery, and generation {gen} lost again: giving up"
                    ));
                }
                recover(fabric, who, &bounds, (gen, rank, step), parent, &lost)?
            }
            Step::Made {
                now,
                how,
                step,
                checks,
                line,
            } => {
                // Before its checks: a supervisor may kill a rank during them.
                fabric.say(format!(
                    "ELASTIC phase=made rank={} size={} gen={} how={how} step={step}",
                    now.at.rank, now.at.size, now.at.gen
                ))?;
                train(args, fabric, who, &bounds, now, step, (checks, line))?
            }
            Step::Finished => return Ok(()),
        }
    }
}

/// One recovery round of generation `gen`, where this rank was `rank` and lost it at round `step`:
/// report, the plan, the next communicator made (or the failure that lost it). An error when there is
/// no plan: no coordinator, this rank was left out, or the job ended below the minimum.
fn recover<F: Fabric>(
    fabric: &mut F,
    who: &dyn Membership,
    bounds: &Bounds,
    (gen, rank, step): (u64, usize, usize),
    parent: Option<F::Comm>,
    lost: &Lost,
) -> Result<Step<F::Comm>, String> {
    let held = match parent {
        Some(_) => Held::Revoked,
        None => Held::Aborted,
    };
    let t = Instant::now();
    let plan = match who.recover((gen, held), step, bounds, &mut || fabric.new_id()) {
        Ok(plan) => plan,
        Err(e) => {
            if let Some(p) = parent {
                fabric.release(p, true)?;
            }
            return Err(format!("rank {rank} of generation {gen}: {e}"));
        }
    };
    let agreed = t.elapsed();
    let (how, dead) = match &plan.how {
        How::Shrink { exclude } => ("shrink", rank_list(exclude)),
        How::Init { .. } => ("init", String::new()),
    };
    fabric.say(format!(
        "ELASTIC phase=plan rank={} gen={} how={how} dead={dead} size={} step={} agree_ms={}",
        plan.rank,
        plan.gen,
        plan.size,
        plan.step,
        ms(agreed)
    ))?;
    let at = Place {
        gen: plan.gen,
        rank: plan.rank,
        size: plan.size,
    };
    let t = Instant::now();
    let made = match (&plan.how, parent) {
        (How::Shrink { exclude }, Some(p)) => fabric.shrink(p, exclude, at, bounds.setup, who),
        (How::Shrink { .. }, None) => Err("told to shrink an aborted communicator".to_string()),
        (How::Init { id }, parent) => {
            if let Some(p) = parent {
                if let Err(e) = fabric.release(p, true) {
                    eprintln!("warning: {e}");
                }
            }
            fabric.init(at, id, bounds.setup, who)
        }
    };
    let took = t.elapsed();
    Ok(match made {
        Ok(comm) => Step::Made {
            now: Current { comm, at },
            how,
            step: plan.step,
            checks: CHECKS,
            line: format!(
                "ELASTIC phase=shrink rank={} size={} gen={} how={how} revoke_ms={} agree_ms={} shrink_ms={} \
                 allreduce=ok",
                at.rank,
                at.size,
                at.gen,
                ms(lost.revoked),
                ms(agreed),
                ms(took)
            ),
        },
        Err(e) => Step::failed(at, plan.step, e, took, false),
    })
}

/// Rounds `from..` on `now`, each checked, until the last: the rank finishes. Its `line` after
/// `checks` of them (or the last); from then on rank 0 offers a grow at each boundary, and every rank
/// grows after the round the grow follows. A loss ends the training on `now`: the next step.
fn train<F: Fabric>(
    args: &Config,
    fabric: &mut F,
    who: &dyn Membership,
    bounds: &Bounds,
    now: Current<F::Comm>,
    from: usize,
    (checks, line): (usize, String),
) -> Result<Step<F::Comm>, String> {
    let checked = (from + checks).min(args.iters);
    let at = now.at;
    let mut grow_uid = None;
    // Where the last progress line was said: its time and round, for the mean round time since.
    let mut said = (Instant::now(), from);
    for round in from..args.iters {
        // A grow needs a round after it to check the grown communicator on.
        if round >= checked && round + 1 < args.iters {
            let t = Instant::now();
            let mut grow_id = || {
                fabric.say(format!(
                    "ELASTIC phase=growid rank={} gen={}",
                    at.rank, at.gen
                ))?;
                std::thread::sleep(args.grow_id_delay);
                let id = fabric.grow_id(now.comm, who, at.gen, args.deadline)?;
                grow_uid = Some(id.clone());
                Ok(id)
            };
            match who.offer_grow(at.gen, round, bounds, &mut grow_id)? {
                None | Some(Order::Grow { .. }) => {}
                Some(Order::Recover { gen }) => {
                    let lost = fabric.give_up_idle(now.comm, who, gen, args.deadline)?;
                    return Ok(Step::lost(&now, round, lost, true));
                }
                // The communicator is gone (aborted, or left to the given-up call's thread).
                Some(Order::NoGrowId { why, .. }) => {
                    return Ok(Step::failed(at, round, why, t.elapsed(), true))
                }
            }
        }
        match fabric.round(now.comm, at, round, who, args.deadline)? {
            Outcome::Done => {}
            Outcome::Lost(lost) => return Ok(Step::lost(&now, round, lost, round >= checked)),
        }
        if at.rank == 0 && (round + 1) % PROGRESS_EVERY == 0 && round + 1 != checked {
            let rounds = (round + 1 - said.1) as u32;
            fabric.say(format!(
                "ELASTIC phase=training rank=0 gen={} size={} step={} round_ms={}",
                at.gen,
                at.size,
                round + 1,
                ms(said.0.elapsed() / rounds)
            ))?;
            said = (Instant::now(), round + 1);
        }
        if round + 1 == checked {
            fabric.say(line.clone())?;
            let missing = who.missing();
            if missing > 0 {
                fabric.say(format!(
                    "ELASTIC phase=waiting rank={} gen={} size={} replacements={missing}",
                    at.rank, at.gen, at.size
                ))?;
            }
        }
        if let Some((gen, size)) = who.grow_after(at.gen, round) {
            fabric.say(format!(
                "ELASTIC phase=growing rank={} gen={gen} size={size}",
                at.rank
            ))?;
            let to = Place {
                gen,
                rank: at.rank,
                size,
            };
            let id = grow_uid.as_deref();
            return Ok(grown(args, fabric, who, Some(now.comm), to, id, round + 1));
        }
    }
    fabric.release(now.comm, false)?;
    who.finish(bounds.report)?;
    fabric.say(format!(
        "ELASTIC result=ok rank={} size={} gen={}",
        at.rank, at.size, at.gen
    ))?;
    Ok(Step::Finished)
}

/// The grow to `at` (from `parent`, or a replacement's from `id`), trained on from round `step`.
fn grown<F: Fabric>(
    args: &Config,
    fabric: &mut F,
    who: &dyn Membership,
    parent: Option<F::Comm>,
    at: Place,
    id: Option<&str>,
    step: usize,
) -> Step<F::Comm> {
    let t = Instant::now();
    let setup = Bounds::new(args.deadline).setup;
    let made = fabric.grow(parent, at, id, setup, who);
    let took = t.elapsed();
    match made {
        Ok(comm) => Step::Made {
            now: Current { comm, at },
            how: "grow",
            step,
            checks: AFTER_GROW,
            line: format!(
                "ELASTIC phase=grow rank={} size={} gen={} grow_ms={} allreduce=ok",
                at.rank,
                at.size,
                at.gen,
                ms(took)
            ),
        },
        // A grow follows a world that passed its checks: its failure begins a new recovery.
        Err(e) => Step::failed(at, step, e, took, true),
    }
}
