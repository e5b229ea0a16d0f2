//! A rank's life: rounds of work, each checked, until the last (`--iters`). When a
//! generation is lost: the agreement on one plan (shrink, or init from a new id), the new communicator,
//! and training goes on at the size it has, from the round the plan says; it never waits for
//! replacements. Rank 0 grows the world at a round boundary whenever replacements wait (all of them
//! at once, up to the first world's size). A failure at any step (a rank killed during the shrink or the
//! grow) is one more lost generation and one more round of the same recovery, up to [`MAX_ROUNDS`] a
//! recovery (a recovery ends once its communicator passed its checks; the next loss begins a new one);
//! fewer survivors than `--min-size` end the job on every rank. Each phase prints its `ELASTIC` line.

use std::time::{Duration, Instant};

use crate::client::{Client, Joined};
use crate::config::{Config, First};
use crate::coordinator::Coordinator;
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

/// A rank's life on `fabric`: a rank of the first world ([`Config::first`]) or a replacement. What
/// [`crate::run`] does on NCCL; the CPU tests run it on fake ranks.
pub fn run_with<F: Fabric>(config: &Config, fabric: &mut F) -> Result<(), String> {
    #[cfg(feature = "etcd")]
    if let Some(store) = &config.etcd {
        return crate::etcd::run(config, store, fabric);
    }
    match config.first {
        Some(first) => run_member(config, first, fabric),
        None => run_replacement(config, fabric),
    }
}

/// A rank of the first world: rendezvous, init, training, and recovery as it comes.
fn run_member<F: Fabric>(args: &Config, first: First, fabric: &mut F) -> Result<(), String> {
    let First { rank, world_size } = first;
    let (who, id) = if rank == 0 {
        let id = fabric.new_id()?;
        let coordinator = Coordinator::listen(&args.master, world_size, args.min_size, &id)?;
        fabric.say(format!(
            "ELASTIC phase=listening port={}",
            coordinator.port()
        ))?;
        coordinator.wait_members(STARTUP)?;
        (Box::new(coordinator) as Box<dyn Membership>, id)
    } else {
        let (client, id) = Client::hello(&args.master, rank, STARTUP)?;
        (Box::new(client) as Box<dyn Membership>, id)
    };
    first_life(args, first, fabric, who.as_ref(), &id)
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

/// A replacement: joins through the rendezvous and the grow, then lives as the others do.
fn run_replacement<F: Fabric>(args: &Config, fabric: &mut F) -> Result<(), String> {
    let (who, joined) = Client::join(&args.master, STARTUP)?;
    replacement_life(args, fabric, &who, &joined)
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

#[cfg(test)]
mod tests {
    //! Whole lives of fake ranks (`fake.rs`): the real training, agreement and grows, on threads, a
    //! second death at each phase of a recovery; each test asserts that every rank not killed ends
    //! in the final world, and its size.

    use std::time::Duration;

    use super::MAX_ROUNDS;
    use crate::fake::{run, Kill, Script};

    /// 8 ranks; rank 3 killed in the steady loop, then `second`; replacements as asked for: the
    /// world ends at 8, every live rank in it.
    fn second_death(second: Kill) {
        let first = Kill::on_rank0("rank 3", "steady");
        let end = run(Script::new(8, vec![first, second]));
        assert_eq!(end.deaths(), 2);
        end.assert_world(8);
    }

    #[test]
    fn a_second_death_during_the_agreement() {
        second_death(Kill::on_own("rank 6", "detect", 0));
    }

    #[test]
    fn a_second_death_during_the_shrink() {
        second_death(Kill::on_own("rank 6", "plan", 1));
    }

    #[test]
    fn a_second_death_during_the_checks_after_the_shrink() {
        second_death(Kill::on_own("rank 6", "plan", 2));
    }

    #[test]
    fn a_second_death_while_training_below_full_size() {
        second_death(Kill::on_rank0("rank 6", "waiting"));
    }

    #[test]
    fn a_second_death_while_rank_0_makes_the_grow_id() {
        second_death(Kill::on_rank0("rank 6", "growid"));
    }

    #[test]
    fn a_second_death_during_the_grow() {
        second_death(Kill::on_rank0("rank 6", "growing"));
    }

    #[test]
    fn a_second_death_during_the_checks_after_the_grow() {
        second_death(Kill::on_own("rank 6", "growing", 2));
    }

    #[test]
    fn a_replacement_killed_during_its_grow() {
        second_death(Kill::on_rank0("replacement 1", "growing"));
    }

    #[test]
    fn sixteen_ranks_four_deaths_in_three_phases() {
        let kills = vec![
            Kill::on_rank0("rank 5", "steady"),
            Kill::on_rank0("rank 11", "steady"),
            Kill::on_own("rank 2", "detect", 0),
            Kill::on_rank0("rank 14", "growing"),
        ];
        let end = run(Script::new(16, kills));
        assert_eq!(end.deaths(), 4);
        end.assert_world(16);
    }

    /// No replacement ever comes: training goes on at the smaller size to the last round.
    #[test]
    fn without_replacements_the_survivors_train_to_the_end() {
        let kills = vec![
            Kill::on_rank0("rank 2", "steady"),
            Kill::on_rank0("rank 7", "steady"),
        ];
        let end = run(Script {
            replacements: 0,
            ..Script::new(8, kills)
        });
        end.assert_world(6);
    }

    /// Of three missing ranks one replacement comes, late: the world trains at 5 meanwhile, grows to 6
    /// when it comes and ends there.
    #[test]
    fn a_late_replacement_grows_the_world_that_kept_training() {
        let kills = vec![
            Kill::on_rank0("rank 1", "steady"),
            Kill::on_rank0("rank 4", "steady"),
            Kill::on_rank0("rank 6", "steady"),
        ];
        let end = run(Script {
            replacements: 1,
            late: Duration::from_millis(300),
            ..Script::new(8, kills)
        });
        end.assert_world(6);
        let rank0: Vec<&str> = end
            .log
            .iter()
            .filter(|(who, _)| who == "rank 0")
            .map(|(_, line)| line.as_str())
            .collect();
        let at = |phase: &str| rank0.iter().position(|l| l.contains(phase));
        assert!(
            at("phase=shrink").is_some() && at("phase=shrink") < at("phase=growing"),
            "resumed before the replacement came: {rank0:#?}"
        );
    }

    /// Ten deaths, one after another, each once the world recovered from the last (rank 0's shrink
    /// line, after the new communicator's checks): ten recoveries of one round each, which the old
    /// count (never reset) ended at the ninth. The survivors finish at 2.
    #[test]
    fn the_round_limit_counts_per_recovery() {
        let mut kills = vec![Kill::on_rank0("rank 11", "steady")];
        kills.extend((1..10).map(|gen| {
            let size = 12 - gen;
            let victim = format!("rank {}", 11 - gen);
            Kill::on_rank0(&victim, &format!("shrink rank=0 size={size} gen={gen} "))
        }));
        let end = run(Script {
            replacements: 0,
            ..Script::new(12, kills)
        });
        assert_eq!(end.deaths(), 10);
        end.assert_world(2);
    }

    /// One recovery whose every round loses its new generation (a death at each of rank 0's plans):
    /// after MAX_ROUNDS rounds every live rank gives up, saying so.
    #[test]
    fn more_rounds_than_the_limit_in_one_recovery_end_every_rank() {
        let mut kills = vec![Kill::on_rank0("rank 11", "steady")];
        kills.extend((1..=MAX_ROUNDS as u64).map(|gen| {
            let victim = format!("rank {}", 11 - gen);
            Kill::on_rank0(&victim, &format!("plan rank=0 gen={gen} "))
        }));
        let end = run(Script {
            replacements: 0,
            ..Script::new(12, kills)
        });
        let live = end.live();
        assert_eq!(live.len(), 12 - 1 - MAX_ROUNDS);
        for (name, result) in live {
            let err = result.as_ref().expect_err("given up");
            assert!(err.contains("8 rounds of one recovery"), "{name}: {err}");
        }
    }

    #[test]
    fn below_the_minimum_every_live_rank_ends_with_the_reason() {
        let kills = vec![
            Kill::on_rank0("rank 2", "steady"),
            Kill::on_rank0("rank 5", "steady"),
        ];
        let end = run(Script {
            min_size: 7,
            ..Script::new(8, kills)
        });
        let live = end.live();
        assert_eq!(live.len(), 6);
        for (name, result) in live {
            let err = result.as_ref().expect_err("the job ended");
            assert!(err.contains("fewer than --min-size 7"), "{name}: {err}");
        }
    }
}
