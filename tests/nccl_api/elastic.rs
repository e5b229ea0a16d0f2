//! The elastic example (`examples/elastic.rs`, on metrale-gpu-elastic) against NCCL itself: ranks all-reduce in a loop; some are
//! SIGKILLed; the survivors recover (revoke, agree, shrink or re-init) and replacements started with
//! `--join` grow the communicator back to full size, every all-reduce checked against the host's sum
//! (by the example: before, after the recovery and after the grow). Ranks are placed by the testkit's
//! plan: on one GPU each rank is a simulated host of its own (`NCCL_HOSTID`, sockets over `lo`), so NCCL's
//! network transport sees the deaths, as across real hosts.
//!
//! Scenarios (`METRALE_ELASTIC_SCENARIOS`, a comma list; all by default):
//! - `RxD` for (ranks, deaths) in 2x1, 3x1, 4x1, 4x2, 8x1, 8x3: D ranks other than rank 0, chosen at
//!   random, killed together at a random moment of the steady loop; as many replacements join at once;
//! - `8@PHASE`: 8 ranks, one killed in the steady loop, a second when rank 0 enters PHASE of the
//!   recovery: `agree` (its detect line: the survivors report), `make` (its plan: the shrink or init),
//!   `checks` (the new communicator made: its checked all-reduces), `waiting` (training below full
//!   size until replacements come), `growid` (rank 0 about to make the grow id; the victim is the
//!   parent's last rank, and rank 0 is held there by `METRALE_ELASTIC_GROW_ID_DELAY_MS`, past its last
//!   look at the rendezvous, so NCCL's `ncclCommGetUniqueId` retries the dead rank and rank 0 must give
//!   the call up), `grow` (the grow) and `growchecks` (the grown communicator made: its checks);
//! - `shrink`, `grow`, `growid`: the same at 4 ranks (`make`, `grow`, `growid`);
//! - `16r2`, `16r4`: 16 ranks, half the deaths at a random moment of the steady loop, the others
//!   each when rank 0 enters a phase of the recovery chosen at random;
//! - `late`: 8 ranks, 2 killed; the replacements start 3 s after rank 0 says it trains below full size,
//!   and grow the world that kept training;
//! - `never`: 8 ranks, 2 killed, no replacement: the survivors train on at 6 to the last round;
//! - `frozen`: 8 ranks, one stopped with SIGSTOP at a random moment of the steady loop (its process
//!   alive, its connection open and silent): rank 0 hears no heartbeat and treats it as dead, the
//!   survivors train on at 7 and a replacement grows the world back to 8; the plan without it must come
//!   within D + 2 s of the stop (the library's `Bounds::frozen`);
//! - `coordinator`: 4 ranks, rank 0 killed in the steady loop: every other rank must end with the
//!   example's clear error (rank 0 is gone) within twice the deadline;
//! - `strays`: 4x1 with a job token (`METRALE_JOB_TOKEN`) and a stream of stray connections to rank 0's
//!   port from its first line to the end (every 250 ms: garbage, an HTTP request, a connect-and-close,
//!   silence, an 8 MiB line, hellos and JOINs with a forged proof or an old token in clear; the testkit's `strays`),
//!   through the steady loop, the recovery and the grow: the run ends as 4x1 does, rank 0 says it
//!   refused them, and no stray is answered a byte;
//! - `etcd8`, `etcd16`: the membership kept in etcd (the example built with
//!   `--features metrale-gpu-elastic/etcd`, an etcd cluster at `METRALE_ETCD_ENDPOINTS`, a job token of
//!   its own each run), every rank started at once with no rendezvous address. `etcd8`: 8 ranks, rank 0
//!   (the first coordinator) killed at a random moment of the steady loop. `etcd16`: 16 ranks, three
//!   deaths, one at a random moment of the steady loop, the others each when the recovery enters a
//!   phase chosen at random; one of the three is the coordinator's, whoever holds the role then (the
//!   first death in the first run, the second in the second, the third in the third). Another rank
//!   takes the role, the survivors recover and replacements grow the world back; no two ranks made one
//!   generation (the coordinators' `phase=coordinate` lines). Without an etcd (`METRALE_ETCD_ENDPOINTS`
//!   unset) each prints a SKIP line.
//!
//! One test per scenario (the macro `scenarios!` below names them), each within the GPU runner's
//! per-test limit; a scenario the variable leaves out prints a SKIP line. Runs per scenario: `METRALE_ELASTIC_RUNS`, else 5 for the RxD, the 8-rank phase
//! ones and `etcd8`, and 3 for the others. Every process runs `METRALE_ELASTIC_ITERS` rounds (default
//! [`ITERS`]) of `--step-ms 5`: long enough for the replacements to start and grow the world before the
//! end (at least [`LATE_ITERS`] for `late`, [`SMALL_ITERS`] for jobs of at most 4 ranks and
//! [`ETCD_ITERS`] for the etcd scenarios). Every run must end as the scenario says: every process not
//! killed ends well, in one final world, ranks 0 to N-1 of N, N the first world's size (`never`: its
//! survivors'); the times are printed per run and, per scenario, their median and worst (MEASURED
//! lines, which the runner's summary lists).
//! The example is found through `METRALE_ELASTIC_BIN`, else at `<this test binary's dir>/../examples/
//! elastic` (`cargo build --release --example elastic` puts it there).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use metrale_gpu_testkit::child::{self, Child};
use metrale_gpu_testkit::gpu::{gpus, measured};
use metrale_gpu_testkit::placement::{Mode, Plan};
use metrale_gpu_testkit::skip::skip;
use metrale_gpu_testkit::stacks;

/// The reader of the example's lines, and the stray connections the libraries' own CPU tests send.
use metrale_gpu_elastic::lines;
use metrale_gpu_launch::auth;
use metrale_gpu_testkit::strays;

/// The example's `--deadline`: how long a collective may hang before the survivors give up on it.
const DEADLINE_VAR: &str = "METRALE_ELASTIC_DEADLINE";
const RUNS_VAR: &str = "METRALE_ELASTIC_RUNS";
const SCENARIOS_VAR: &str = "METRALE_ELASTIC_SCENARIOS";
/// What holds rank 0 before its `ncclCommGetUniqueId` in the `growid` scenario (the example's
/// test-only variable), and for how long: time enough for the kill and for the rendezvous to see it.
const GROW_ID_DELAY: (&str, &str) = ("METRALE_ELASTIC_GROW_ID_DELAY_MS", "500");
/// A generous bound on each step of a run (startup, a recovery, a replacement's arrival).
const STEP_LIMIT: Duration = Duration::from_secs(90);
/// How often a wait on the lines of every process looks again.
const LOOK: Duration = Duration::from_millis(10);
/// The latest moment of a kill after every rank is steady.
const KILL_WINDOW_MS: u64 = 400;
/// Rounds every process trains (`--iters`), and what each computes first (`--step-ms`).
const ITERS_VAR: &str = "METRALE_ELASTIC_ITERS";
const ITERS: usize = 3000;
const STEP_MS: &str = "5";
/// How long after rank 0 trains below full size the `late` scenario's replacements start.
const LATE: Duration = Duration::from_secs(3);
/// The fewest rounds a `late` job trains, whatever [`ITERS_VAR`] says: room for a second grow when its
/// two replacements come one at a time. The example checks a grown world for 20 rounds before it offers
/// the next grow; on one GPU shared by about 32 rank processes a first late grow came at round 131, and
/// at 150 rounds the second replacement found the job over.
const LATE_ITERS: usize = 300;
/// The fewest rounds a job of at most 4 ranks trains: small jobs train fast. At 150 rounds the
/// replacement of `2x1`, started beside three other jobs, and that of `killed_during_shrink` found the
/// job over; at 1500 the latter grew the world in 3 runs of 3.
const SMALL_ITERS: usize = 1500;

/// The fewest rounds an etcd job trains: a dead coordinator's role is taken one lease (5 s) after its
/// last renewal, and the replacements then start, join through etcd and grow the world while the
/// survivors train on. Eight ranks on one GPU train a round in about 0.15 s; there the takeover, the
/// agreement and the grow took about 9 s, some 60 rounds. At 200 rounds every `etcd8` (5) and `etcd16`
/// (3) run grew back to full size.
const ETCD_ITERS: usize = 200;
/// The variable whose presence chooses the etcd membership (metrale-gpu-elastic's
/// `etcd::ENDPOINTS_VAR`, behind its feature `etcd`, which this suite does not compile):
/// `ci/etcd-cluster` sets it, the ranks inherit it.
const ETCD_ENDPOINTS_VAR: &str = "METRALE_ETCD_ENDPOINTS";

/// A phase of a recovery in which a later death lands: when rank 0 enters it (with the etcd
/// membership: when any live rank does).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Agree,
    Make,
    Checks,
    Waiting,
    GrowId,
    Grow,
    GrowChecks,
}

impl Phase {
    const ALL: [Phase; 7] = [
        Phase::Agree,
        Phase::Make,
        Phase::Checks,
        Phase::Waiting,
        Phase::GrowId,
        Phase::Grow,
        Phase::GrowChecks,
    ];

    fn name(self) -> &'static str {
        match self {
            Phase::Agree => "agree",
            Phase::Make => "make",
            Phase::Checks => "checks",
            Phase::Waiting => "waiting",
            Phase::GrowId => "growid",
            Phase::Grow => "grow",
            Phase::GrowChecks => "growchecks",
        }
    }

    /// Whether rank 0's `line` says it enters this phase.
    fn starts(self, line: &str) -> bool {
        let (phase, how) = (word(line, "phase"), word(line, "how"));
        let remade = phase == "made" && field(line, "gen").is_some_and(|g| g > 0.0);
        match self {
            Phase::Agree => phase == "detect",
            Phase::Make => phase == "plan",
            Phase::Checks => remade && how != "grow",
            Phase::Waiting => phase == "waiting",
            Phase::GrowId => phase == "growid",
            Phase::Grow => phase == "growing",
            Phase::GrowChecks => remade && how == "grow",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scenario {
    /// `deaths` killed together in the steady loop.
    Deaths {
        ranks: usize,
        deaths: usize,
    },
    /// One killed in the steady loop, a second when rank 0 enters `phase`.
    Second {
        ranks: usize,
        phase: Phase,
    },
    /// Half the `deaths` in the steady loop, each other one at a phase chosen at random.
    Random {
        ranks: usize,
        deaths: usize,
    },
    /// 2 of 8 killed; the replacements start late.
    Late,
    /// 2 of 8 killed; no replacement.
    Never,
    /// 1 of 8 stopped (SIGSTOP), not killed.
    Frozen,
    Coordinator,
    /// 4x1 among stray connections, with a job token.
    Strays,
    /// The membership in etcd: `deaths` (the coordinator's among them), the first in the steady loop,
    /// each other one at a phase chosen at random.
    Etcd {
        ranks: usize,
        deaths: usize,
    },
}

/// Every scenario, in the order of the tests.
fn all() -> Vec<Scenario> {
    let deaths = [(2, 1), (3, 1), (4, 1), (4, 2), (8, 1), (8, 3)]
        .map(|(ranks, deaths)| Scenario::Deaths { ranks, deaths });
    let four =
        [Phase::Make, Phase::Grow, Phase::GrowId].map(|phase| Scenario::Second { ranks: 4, phase });
    let eight = Phase::ALL.map(|phase| Scenario::Second { ranks: 8, phase });
    let random = [2, 4].map(|deaths| Scenario::Random { ranks: 16, deaths });
    let rest = [
        Scenario::Late,
        Scenario::Never,
        Scenario::Frozen,
        Scenario::Coordinator,
        Scenario::Strays,
        Scenario::Etcd {
            ranks: 8,
            deaths: 1,
        },
        Scenario::Etcd {
            ranks: 16,
            deaths: 3,
        },
    ];
    deaths
        .into_iter()
        .chain(four)
        .chain(eight)
        .chain(random)
        .chain(rest)
        .collect()
}

impl Scenario {
    fn name(self) -> String {
        match self {
            Scenario::Deaths { ranks, deaths } => format!("{ranks}x{deaths}"),
            // The 4-rank ones keep the names of their first GPU runs.
            Scenario::Second { ranks: 4, phase } => match phase {
                Phase::Make => "shrink".into(),
                other => other.name().into(),
            },
            Scenario::Second { ranks, phase } => format!("{ranks}@{}", phase.name()),
            Scenario::Random { ranks, deaths } => format!("{ranks}r{deaths}"),
            Scenario::Late => "late".into(),
            Scenario::Never => "never".into(),
            Scenario::Frozen => "frozen".into(),
            Scenario::Coordinator => "coordinator".into(),
            Scenario::Strays => "strays".into(),
            Scenario::Etcd { ranks, .. } => format!("etcd{ranks}"),
        }
    }

    fn ranks(self) -> usize {
        match self {
            Scenario::Deaths { ranks, .. }
            | Scenario::Second { ranks, .. }
            | Scenario::Random { ranks, .. }
            | Scenario::Etcd { ranks, .. } => ranks,
            Scenario::Late | Scenario::Never | Scenario::Frozen => 8,
            Scenario::Coordinator | Scenario::Strays => 4,
        }
    }

    /// Ranks killed in the steady loop, and the phases of the later ones (during the recovery).
    fn deaths(self) -> (usize, Vec<Phase>) {
        match self {
            Scenario::Deaths { deaths, .. } => (deaths, Vec::new()),
            Scenario::Second { phase, .. } => (1, vec![phase]),
            Scenario::Random { deaths, .. } => (deaths / 2, random_phases(deaths - deaths / 2)),
            Scenario::Etcd { deaths, .. } => (1, random_phases(deaths - 1)),
            Scenario::Late | Scenario::Never => (2, Vec::new()),
            Scenario::Coordinator | Scenario::Strays | Scenario::Frozen => (1, Vec::new()),
        }
    }

    /// The final world's size the rules promise.
    fn final_size(self) -> usize {
        match self {
            Scenario::Never => self.ranks() - self.deaths().0,
            _ => self.ranks(),
        }
    }

    fn default_runs(self) -> usize {
        match self {
            Scenario::Deaths { .. }
            | Scenario::Second { ranks: 8, .. }
            | Scenario::Etcd { ranks: 8, .. } => 5,
            _ => 3,
        }
    }
}

/// `count` phases of a recovery, each chosen at random; not the grow id: its victim must be the
/// parent's last rank (a scenario of its own).
fn random_phases(count: usize) -> Vec<Phase> {
    let phases: Vec<Phase> = Phase::ALL
        .into_iter()
        .filter(|&p| p != Phase::GrowId)
        .collect();
    (0..count)
        .map(|_| phases[random(phases.len() as u64) as usize])
        .collect()
}

/// How many runs of `scenario` to make: 0 where `METRALE_ELASTIC_SCENARIOS` (a comma list; all when
/// unset) does not name it, else `METRALE_ELASTIC_RUNS` or its default.
fn runs_of(scenario: Scenario) -> usize {
    let names = std::env::var(SCENARIOS_VAR).unwrap_or_default();
    let wanted: Vec<&str> = names
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    for name in &wanted {
        assert!(
            all().iter().any(|s| s.name() == *name),
            "{SCENARIOS_VAR} names {name:?}; the scenarios are {}",
            all()
                .into_iter()
                .map(Scenario::name)
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if !wanted.is_empty() && !wanted.contains(&scenario.name().as_str()) {
        return 0;
    }
    match std::env::var(RUNS_VAR) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{RUNS_VAR}={v:?} is not a number of runs")),
        Err(_) => scenario.default_runs(),
    }
}

fn elastic_bin() -> PathBuf {
    let bin = match std::env::var_os("METRALE_ELASTIC_BIN") {
        Some(path) => PathBuf::from(path),
        None => std::env::current_exe()
            .expect("the test binary's path")
            .parent()
            .expect("the test binary's directory")
            .join("../examples/elastic"),
    };
    assert!(
        bin.is_file(),
        "the elastic example is not at {}: build it (cargo build --release --example elastic) or set \
         METRALE_ELASTIC_BIN to its path",
        bin.display()
    );
    bin
}

/// A number below `below`, from std's randomly keyed hasher (a fresh key each call).
fn random(below: u64) -> u64 {
    RandomState::new().build_hasher().finish() % below.max(1)
}

/// `count` distinct picks from `from`, at random.
fn pick(mut from: Vec<usize>, count: usize) -> Vec<usize> {
    let mut picked = Vec::new();
    while picked.len() < count && !from.is_empty() {
        picked.push(from.swap_remove(random(from.len() as u64) as usize));
    }
    picked
}

fn unix_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0)
}

/// The number after `key=` in an `ELASTIC` line.
fn field(line: &str, key: &str) -> Option<f64> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
}

/// Whether a process that printed `out` is a member of generation `gen` ([`lines::made`]).
fn member_of(out: &str, gen: usize) -> bool {
    out.lines().any(|l| lines::made(l, gen))
}

fn word<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or("?")
}

/// What one recovering run measured (rank 0's lines).
#[derive(Default)]
struct Times {
    /// From the first kill to rank 0's first detection, and how it learnt.
    detect_ms: f64,
    how: String,
    /// With the etcd membership: from the coordinator's death to another rank's taking the role (its
    /// `phase=coordinator` line, as read here).
    takeover_ms: Option<f64>,
    revoke_ms: f64,
    agree_ms: f64,
    /// The last recovery's shrink (or init) and how it was made.
    shrink_ms: f64,
    made_by: String,
    /// The grow back to full size; `None` where the grow was given up (e.g. timed out with every rank
    /// alive, as on a GPU shared by 30 processes) and the full size was re-made by an init.
    grow_ms: Option<f64>,
    /// Lost generations rank 0 recovered from.
    rounds: usize,
    /// Processes killed in the run.
    killed: usize,
}

/// The processes of one run, rank 0 first, then the other ranks, then replacements in start order.
struct Run<'a> {
    bin: &'a Path,
    name: String,
    plan: Plan,
    deadline: Duration,
    ranks: usize,
    /// Rank 0's rendezvous, for the embedded membership; `None` for the one kept in etcd.
    master: Option<String>,
    procs: Vec<Child>,
    /// Which processes were killed.
    killed: Vec<bool>,
    replacements: usize,
    /// Variables for rank 0 alone.
    rank0_env: Vec<(&'static str, &'static str)>,
    /// Variables for every process.
    env: Vec<(&'static str, String)>,
    iters: usize,
}

impl Run<'_> {
    /// Starts process `index` of the plan (rank `index`, or a replacement past the first world).
    fn start(&mut self, role: &[String]) {
        let index = self.procs.len();
        let place = self.plan.place(index);
        let mut cmd = Command::new(self.bin);
        cmd.args(role)
            .args(["--local-rank", &place.device.to_string()])
            .args(self.master.iter().flat_map(|m| ["--master", m]))
            .args(["--deadline", &self.deadline.as_secs().to_string()])
            .args(["--iters", &self.iters.to_string()])
            .args(["--step-ms", STEP_MS]);
        for (k, v) in self.plan.nccl_env(index) {
            cmd.env(k, v);
        }
        if self.master.is_some() {
            // The embedded membership: an etcd-capable example would choose the etcd one where the
            // runner's cluster left its endpoints in the environment.
            cmd.env_remove(ETCD_ENDPOINTS_VAR);
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        if index == 0 {
            cmd.envs(self.rank0_env.iter().copied());
        }
        let who = match index < self.ranks {
            true => format!("rank {index}"),
            false => format!("replacement {}", index - self.ranks + 1),
        };
        self.procs
            .push(child::start(&format!("{} {who}", self.name), cmd));
        self.killed.push(false);
    }

    fn start_replacement(&mut self) -> Result<(), String> {
        if self.replacements == self.plan.ranks() - self.ranks {
            return Err("more replacements asked for than the scenario allows".into());
        }
        self.replacements += 1;
        self.start(&["--join".to_string()]);
        Ok(())
    }

    /// SIGSTOPs process `index` (it stays, stopped, until the run ends: dropped, it is killed); the
    /// moment, in µs since the epoch.
    fn freeze(&mut self, index: usize) -> u128 {
        let at = unix_us();
        let pid = self.procs[index].pid().to_string();
        let stopped = Command::new("kill").args(["-STOP", &pid]).status();
        assert!(
            stopped.as_ref().is_ok_and(|s| s.success()),
            "kill -STOP {pid}: {stopped:?}"
        );
        self.killed[index] = true;
        println!("{}: stopped {}", self.name, self.procs[index].name);
        at
    }

    /// SIGKILLs process `index`; the moment, in µs since the epoch.
    fn kill(&mut self, index: usize) -> u128 {
        let at = unix_us();
        self.procs[index].kill();
        self.killed[index] = true;
        println!("{}: killed {}", self.name, self.procs[index].name);
        at
    }

    /// The live processes other than rank 0.
    fn live_members(&self) -> Vec<usize> {
        (1..self.procs.len()).filter(|&i| !self.killed[i]).collect()
    }

    /// Live replacements that are not members of generation `gen`: not joined yet, or joined a grow
    /// that was lost and not yet in a world again. (Not "printed nothing yet": a replacement whose grow
    /// was lost says so and waits for the next plan; counted as joined, it was replaced a second time.)
    fn pending(&self, gen: usize) -> usize {
        (self.ranks..self.procs.len())
            .filter(|&i| !self.killed[i] && !member_of(&self.procs[i].output(), gen))
            .count()
    }

    /// Starts rank `rank` of the first world.
    fn start_rank(&mut self, rank: usize) {
        let ranks = self.ranks.to_string();
        self.start(&[
            "--rank".into(),
            rank.to_string(),
            "--world-size".into(),
            ranks,
        ]);
    }

    /// Waits until every process started so far trains in its steady loop.
    fn wait_steady(&self) -> Result<(), String> {
        for p in &self.procs {
            p.wait_line("ELASTIC phase=steady", STEP_LIMIT)
                .ok_or(format!(
                    "{} never reached its steady all-reduce loop",
                    p.name
                ))?;
        }
        Ok(())
    }

    /// On a `phase=waiting` line: starts the replacements it asks for, less those pending.
    fn replace(&mut self, line: &str) -> Result<(), String> {
        let need = lines::number(line, "replacements").unwrap_or(0);
        let gen = lines::number(line, "gen").unwrap_or(0);
        for _ in self.pending(gen)..need {
            self.start_replacement()?;
        }
        Ok(())
    }

    /// The next `ELASTIC` line of any live process, and when it was read; an error after `silence`
    /// without one.
    fn next_line(&self, silence: Duration) -> Result<(Instant, String), String> {
        let deadline = Instant::now() + silence;
        loop {
            let live = (0..self.procs.len()).filter(|&i| !self.killed[i]);
            let mut lines =
                live.filter_map(|i| self.procs[i].wait_line("ELASTIC ", Duration::ZERO));
            if let Some(found) = lines.next() {
                return Ok(found);
            }
            if Instant::now() >= deadline {
                return Err(format!("no rank said anything more within {silence:?}"));
            }
            std::thread::sleep(LOOK);
        }
    }

    /// Every process's output so far, in start order.
    fn outputs(&self) -> Vec<String> {
        self.procs.iter().map(Child::output).collect()
    }

    /// The process that holds the coordinating role of the etcd membership, and its term ([`holder`]).
    fn coordinator(&self) -> Option<(usize, usize)> {
        holder(&self.outputs())
    }

    /// SIGKILLs the live coordinator, noted in `dead`; the moment, in µs since the epoch.
    fn kill_coordinator(&mut self, dead: &mut Option<DeadCoordinator>) -> Result<u128, String> {
        let (i, term) = self
            .coordinator()
            .filter(|&(i, _)| !self.killed[i])
            .ok_or("no live rank holds the coordinating role")?;
        let at = Instant::now();
        let unix = self.kill(i);
        let name = self.procs[i].name.clone();
        println!(
            "{}: {name} held the coordinating role (term {term})",
            self.name
        );
        *dead = Some(DeadCoordinator { name, term, at });
        Ok(unix)
    }

    /// A live member of the world other than the coordinator, at random: a process that made a
    /// generation (a replacement that has not joined yet is none).
    fn other_member(&self) -> Option<usize> {
        let holder = self.coordinator().map(|(i, _)| i);
        let members = (0..self.procs.len())
            .filter(|&i| !self.killed[i] && Some(i) != holder)
            .filter(|&i| self.procs[i].output().contains("ELASTIC phase=made"))
            .collect();
        pick(members, 1).pop()
    }

    /// Waits until every process not killed ends: each must end well, and together they are the final
    /// world, ranks 0 to `size` - 1 of `size`. A replacement that never joined (the job ended first)
    /// says so, and fails the run. The processes' indices with their final ranks.
    fn final_world(&mut self, size: usize) -> Result<Vec<(usize, usize)>, String> {
        let mut finals = Vec::new();
        for i in 0..self.procs.len() {
            if self.killed[i] {
                continue;
            }
            let p = &mut self.procs[i];
            let status = p.wait_exit(STEP_LIMIT);
            if i >= self.ranks
                && p.output()
                    .contains("the job finished before this replacement could join")
            {
                return Err(format!(
                    "{} never joined: the job ended first (raise {ITERS_VAR})",
                    p.name
                ));
            }
            match status {
                Some(status) if status.success() => {}
                status => return Err(format!("{} exited with {status:?} (None: killed)", p.name)),
            }
            let out = p.output();
            let done = out
                .lines()
                .find(|l| l.starts_with("ELASTIC result=ok"))
                .ok_or(format!("{} printed no result=ok", p.name))?;
            finals.push((i, lines::number(done, "rank"), lines::number(done, "size")));
        }
        let mut got: Vec<usize> = finals.iter().filter_map(|&(_, rank, _)| rank).collect();
        got.sort_unstable();
        if got != (0..size).collect::<Vec<_>>() || finals.iter().any(|&(_, _, s)| s != Some(size)) {
            let found: Vec<_> = finals.iter().map(|&(_, rank, size)| (rank, size)).collect();
            return Err(format!(
                "the final world is not ranks 0..{size} of {size}: (rank, size) {found:?}"
            ));
        }
        Ok(finals
            .into_iter()
            .filter_map(|(i, rank, _)| Some((i, rank?)))
            .collect())
    }

    /// Every process's output, then the stacks of those still running (a stuck run names the frames it
    /// is stuck in; they are killed when the run is dropped).
    fn dump(&mut self) {
        for p in &self.procs {
            p.dump();
        }
        let live: Vec<usize> = (0..self.procs.len())
            .filter(|&i| self.procs[i].poll().is_none())
            .collect();
        let pids: Vec<u32> = live.iter().map(|&i| self.procs[i].pid()).collect();
        for (i, text) in live.into_iter().zip(stacks::capture(&pids)) {
            println!("{} is still running: {text}", self.procs[i].name);
        }
    }
}

fn one_run(
    bin: &Path,
    scenario: Scenario,
    run: usize,
    plan_gpus: usize,
) -> Result<Option<Times>, String> {
    let ranks = scenario.ranks();
    let (first, later) = scenario.deaths();
    let later = later.len();
    let deadline = Duration::from_secs(
        std::env::var(DEADLINE_VAR)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(5),
    );
    let library = metrale_gpu_sys::version::library_version().map_err(|e| e.to_string())?;
    // Room for a replacement per death: each gets a place (GPU, simulated host) of its own.
    let plan = Plan::new(ranks + first + later, plan_gpus, Mode::Hosts, library)
        .map_err(|e| e.to_string())?;
    let iters = std::env::var(ITERS_VAR)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(ITERS);
    let mut r = Run {
        bin,
        name: format!("{} run {run}", scenario.name()),
        plan,
        deadline,
        ranks,
        // Rank 0 picks its port and says which (no race for a free one). The etcd membership needs
        // none: every rank and replacement finds the job in etcd.
        master: match scenario {
            Scenario::Etcd { .. } => None,
            _ => Some("127.0.0.1:0".into()),
        },
        procs: Vec::new(),
        killed: Vec::new(),
        replacements: 0,
        rank0_env: match scenario {
            Scenario::Second {
                phase: Phase::GrowId,
                ..
            } => vec![GROW_ID_DELAY],
            _ => Vec::new(),
        },
        // Among strays the job has a token, as it should wherever strangers reach the port: without
        // one a forged JOIN would be queued as a replacement.
        // With the etcd membership, the token of this run's own job: its keys never mix with another
        // run's.
        env: match scenario {
            Scenario::Strays | Scenario::Etcd { .. } => {
                vec![(TOKEN_VAR, format!("elastic-test-{:016x}", random(u64::MAX)))]
            }
            _ => Vec::new(),
        },
        iters: match scenario {
            Scenario::Late => iters.max(LATE_ITERS),
            Scenario::Etcd { .. } => iters.max(ETCD_ITERS),
            s if s.ranks() <= 4 => iters.max(SMALL_ITERS),
            _ => iters,
        },
    };
    let result = match scenario {
        Scenario::Etcd { .. } => drive_etcd(&mut r, scenario, run),
        _ => drive(&mut r, scenario),
    };
    if result.is_err() {
        r.dump();
    }
    result
}

fn drive(r: &mut Run, scenario: Scenario) -> Result<Option<Times>, String> {
    let ranks = r.ranks;
    r.start_rank(0);
    let (_, line) = r.procs[0]
        .wait_line("ELASTIC phase=listening", STEP_LIMIT)
        .ok_or("rank 0 never listened")?;
    let master = format!("127.0.0.1:{}", word(&line, "port"));
    let stream = (scenario == Scenario::Strays).then(|| StrayStream::start(master.clone()));
    r.master = Some(master);
    for rank in 1..ranks {
        r.start_rank(rank);
    }
    r.wait_steady()?;
    std::thread::sleep(Duration::from_millis(random(KILL_WINDOW_MS)));
    if scenario == Scenario::Coordinator {
        return coordinator_dies(r).map(|()| None);
    }
    let (first, mut later) = scenario.deaths();
    let killed_at = pick((1..ranks).collect(), first)
        .into_iter()
        .map(|i| match scenario {
            Scenario::Frozen => r.freeze(i),
            _ => r.kill(i),
        })
        .min()
        .unwrap_or(0);
    // Rank 0's lines steer the rest: replacements when it trains below full size, the later kills.
    // Between them it trains, saying so every 100 rounds (`phase=training`): a slow job goes on, a stuck
    // one is caught within the step bound. (The GPU run at 8d490da, with the bound 150 ms a round over
    // the whole training, could not tell the two apart: rank 0 was silent 90 s after a correct grow.)
    let silence = STEP_LIMIT;
    loop {
        let (_, line) = r.procs[0]
            .wait_line("ELASTIC ", silence)
            .ok_or(format!("rank 0 said nothing more within {silence:?}"))?;
        if let Some(at) = later.iter().position(|p| p.starts(&line)) {
            let victim = match later.remove(at) {
                // The parent's last rank (the one ncclCommGetUniqueId sends to besides rank 0): the
                // highest live member of the world that grows (none of the replacements joined yet).
                Phase::GrowId => r
                    .live_members()
                    .into_iter()
                    .filter(|&i| i < ranks || r.procs[i].output().contains("ELASTIC "))
                    .max()
                    .into_iter()
                    .collect(),
                _ => pick(r.live_members(), 1),
            };
            victim.into_iter().for_each(|i| {
                r.kill(i);
            });
        }
        if word(&line, "phase") == "waiting" && scenario != Scenario::Never {
            if scenario == Scenario::Late {
                std::thread::sleep(LATE);
            }
            r.replace(&line)?;
        }
        if line.contains("ELASTIC result=") {
            break;
        }
    }
    let size = scenario.final_size();
    r.final_world(size)?;
    let rank0 = r.procs[0].output();
    let growid = matches!(
        scenario,
        Scenario::Second {
            phase: Phase::GrowId,
            ..
        }
    );
    if growid && !rank0.contains("ncclCommGetUniqueId: given up") {
        return Err("the kill missed rank 0's ncclCommGetUniqueId: rank 0 gave no call up".into());
    }
    never_entered(&later)?;
    if let Some(stream) = stream {
        let tally = stream.stop();
        println!("{}: {tally}", r.name);
        if !tally.harmless() || !rank0.contains("rendezvous: refused") {
            return Err(format!(
                "the strays were not all refused unanswered, or rank 0 did not say so: {tally}"
            ));
        }
    }
    let resumed = rank0.find("phase=shrink");
    if scenario == Scenario::Late && (resumed.is_none() || resumed > rank0.find("phase=growing")) {
        return Err("rank 0 did not train on before the late replacements came".into());
    }
    let killed = r.killed.iter().filter(|&&k| k).count();
    let times = measure(&rank0, killed_at, size)?;
    // The plan without the frozen rank: rank 0 gave up (detect), revoked, agreed.
    let excluded_ms = times.detect_ms + times.revoke_ms + times.agree_ms;
    let bound_ms = (r.deadline + Duration::from_secs(2)).as_secs_f64() * 1e3;
    if scenario == Scenario::Frozen && excluded_ms > bound_ms {
        return Err(format!(
            "the frozen rank was left out {excluded_ms:.1} ms after its stop, over D + 2 s ({bound_ms:.0} ms)"
        ));
    }
    Ok(Some(Times { killed, ..times }))
}

/// An error naming the phases no kill landed in (the recovery never entered them).
fn never_entered(later: &[Phase]) -> Result<(), String> {
    if later.is_empty() {
        return Ok(());
    }
    Err(format!(
        "the recovery never entered {:?}, where a death was to land",
        later.iter().map(|p| p.name()).collect::<Vec<_>>()
    ))
}

/// A death of an etcd run still to come: the phase it lands in, and whether its victim is the
/// coordinator (else another member).
struct Later {
    phase: Phase,
    coordinator: bool,
}

/// The coordinator's death: who held the role, in which term, and when it was killed.
struct DeadCoordinator {
    name: String,
    term: usize,
    at: Instant,
}

/// A run with the membership in etcd: every rank started at once, with no rendezvous address. The
/// lines of every live process steer it: the coordinator is whoever printed the `phase=coordinator`
/// line of the highest term; the later deaths land when any rank enters their phase (once per phase
/// and generation); replacements start when the coordinator says the world is below full size.
fn drive_etcd(r: &mut Run, scenario: Scenario, run: usize) -> Result<Option<Times>, String> {
    let ranks = r.ranks;
    for rank in 0..ranks {
        r.start_rank(rank);
    }
    if let Err(e) = r.wait_steady() {
        if r.procs[0].output().contains("ELASTIC phase=listening") {
            return Err(format!(
                "rank 0 listens for a rendezvous: the elastic example was built without the etcd \
                 membership (build it with --features metrale-gpu-elastic/etcd); {e}"
            ));
        }
        return Err(e);
    }
    std::thread::sleep(Duration::from_millis(random(KILL_WINDOW_MS)));
    let (_, phases) = scenario.deaths();
    // Which death is the coordinator's: the first in the first run, the second in the second, ...
    let theirs = (run - 1) % (phases.len() + 1);
    let mut later: Vec<Later> = phases
        .into_iter()
        .enumerate()
        .map(|(k, phase)| Later {
            phase,
            coordinator: k + 1 == theirs,
        })
        .collect();
    let (first, _) = r
        .coordinator()
        .ok_or("every rank trains, and no rank took the coordinating role")?;
    if first != 0 {
        return Err(format!(
            "the first coordinator is {}, not rank 0 (the lowest rank of the first world)",
            r.procs[first].name
        ));
    }
    let mut dead = None;
    let killed_at = match theirs {
        0 => r.kill_coordinator(&mut dead)?,
        _ => {
            let victim = r.other_member().ok_or("no member to kill")?;
            r.kill(victim)
        }
    };
    let mut fired: Vec<(Phase, Option<usize>)> = Vec::new();
    let mut takeover = None;
    loop {
        let (at, line) = r.next_line(STEP_LIMIT)?;
        if let Some(d) = &dead {
            let term = lines::number(&line, "term");
            if takeover.is_none() && line.contains("phase=coordinator ") && term > Some(d.term) {
                takeover = Some(at.saturating_duration_since(d.at));
            }
        }
        let gen = lines::number(&line, "gen");
        let due = later
            .iter()
            .position(|l| l.phase.starts(&line) && !fired.contains(&(l.phase, gen)));
        if let Some(k) = due {
            let victim = match later[k].coordinator {
                true => r.coordinator().map(|(i, _)| i).filter(|&i| !r.killed[i]),
                false => r.other_member(),
            };
            // None (the role between two holders, or no member left): the phase's next line.
            if let Some(i) = victim {
                let death = later.remove(k);
                fired.push((death.phase, gen));
                if death.coordinator {
                    r.kill_coordinator(&mut dead)?;
                } else {
                    r.kill(i);
                }
            }
        }
        if word(&line, "phase") == "waiting" {
            r.replace(&line)?;
        }
        if line.contains("ELASTIC result=") {
            break;
        }
    }
    let size = scenario.final_size();
    let finals = r.final_world(size)?;
    never_entered(&later.iter().map(|l| l.phase).collect::<Vec<_>>())?;
    let made = one_coordinator_per_generation(&r.outputs())?;
    let dead = dead.ok_or("the coordinator was never killed")?;
    let takeover = takeover.ok_or(format!(
        "no rank took the coordinating role after {} died (term {})",
        dead.name, dead.term
    ))?;
    println!(
        "{}: generations made by {made} (in order of their making)",
        r.name
    );
    let rank0 = finals
        .iter()
        .find(|(_, rank)| *rank == 0)
        .map(|&(i, _)| r.procs[i].output())
        .ok_or("no rank 0 in the final world")?;
    let times = measure(&rank0, killed_at, size)?;
    Ok(Some(Times {
        killed: r.killed.iter().filter(|&&k| k).count(),
        takeover_ms: Some(takeover.as_secs_f64() * 1e3),
        ..times
    }))
}

/// Which of `outputs` (every process's, in start order) holds the coordinating role of the etcd
/// membership, and its term: the one whose `phase=coordinator` line has the highest term (a new holder's
/// term is higher than any before).
fn holder(outputs: &[String]) -> Option<(usize, usize)> {
    let mut holder: Option<(usize, usize)> = None;
    for (i, out) in outputs.iter().enumerate() {
        let took = out
            .lines()
            .filter(|l| l.starts_with("ELASTIC phase=coordinator "));
        for term in took.filter_map(|l| lines::number(l, "term")) {
            if holder.is_none_or(|(_, t)| term > t) {
                holder = Some((i, term));
            }
        }
    }
    holder
}

/// Who made each generation, from the `phase=coordinate` lines of `outputs` (every process's, the
/// killed ones' too), in the order of the generations: one coordinator in one term each, generation 0
/// among them; an error naming a generation made twice.
fn one_coordinator_per_generation(outputs: &[String]) -> Result<String, String> {
    let mut made: Vec<(usize, String)> = Vec::new();
    for line in outputs.iter().flat_map(|out| out.lines()) {
        if !line.starts_with("ELASTIC phase=coordinate ") {
            continue;
        }
        let gen = lines::number(line, "gen").ok_or(format!("no generation in {line:?}"))?;
        let term = lines::number(line, "term").ok_or(format!("no term in {line:?}"))?;
        let by = format!("{} (term {term})", word(line, "name"));
        if let Some((_, first)) = made.iter().find(|(g, _)| *g == gen) {
            return Err(format!(
                "generation {gen} made twice: by {first} and by {by}"
            ));
        }
        made.push((gen, by));
    }
    made.sort();
    if made.first().map(|(g, _)| *g) != Some(0) {
        return Err("no coordinator made generation 0".into());
    }
    Ok(made
        .iter()
        .map(|(g, by)| format!("{g}: {by}"))
        .collect::<Vec<_>>()
        .join(", "))
}

/// The job token's variable (metrale-gpu-launch's `token`).
const TOKEN_VAR: &str = "METRALE_JOB_TOKEN";
/// How often the stream sends a round of strays.
const STRAY_ROUND: Duration = Duration::from_millis(250);

/// A round of strays every [`STRAY_ROUND`] to rank 0's port, from a thread of its own, until stopped
/// (or dropped: a run that failed early).
struct StrayStream {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Tally>>,
}

/// What the strays of a stream saw.
#[derive(Default)]
struct Tally {
    sent: usize,
    /// Strays rank 0 sent a byte to, or did not close: each a failure.
    wrong: Vec<String>,
}

impl Tally {
    fn harmless(&self) -> bool {
        self.sent > 0 && self.wrong.is_empty()
    }

    fn add(&mut self, stray: JoinHandle<strays::Stray>) {
        self.sent += 1;
        if let Err(e) = strays::refused(stray) {
            self.wrong.push(e);
        }
    }
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} stray connections, {} answered or left open",
            self.sent,
            self.wrong.len()
        )?;
        self.wrong.iter().try_for_each(|w| write!(f, "; {w}"))
    }
}

impl StrayStream {
    fn start(master: String) -> StrayStream {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let hellos = [
                ("a forged hello", auth::forged("HELLO 1")),
                ("a forged JOIN", auth::forged("JOIN")),
                (
                    "an old hello with a token in clear",
                    "HELLO 1 token=6a6f622d61\n".to_string(),
                ),
                ("an old JOIN without a token", "JOIN token=\n".to_string()),
            ];
            let (mut tally, mut running) = (Tally::default(), Vec::new());
            while !stopped.load(Ordering::Acquire) {
                running.extend(strays::send(
                    &master,
                    strays::kinds(&hellos, true),
                    STEP_LIMIT,
                ));
                let (done, left) = running.into_iter().partition(JoinHandle::is_finished);
                running = left;
                done.into_iter().for_each(|s| tally.add(s));
                std::thread::sleep(STRAY_ROUND);
            }
            running.into_iter().for_each(|s| tally.add(s));
            tally
        });
        StrayStream {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops the stream; what its strays saw, once each has ended.
    fn stop(mut self) -> Tally {
        self.stop.store(true, Ordering::Release);
        let thread = self.thread.take().map(JoinHandle::join);
        let mut tally = Tally::default();
        match thread {
            Some(Ok(t)) => tally = t,
            _ => tally.wrong.push("the stream's thread panicked".into()),
        }
        tally
    }
}

impl Drop for StrayStream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// Rank 0 killed: every other rank must end with the example's error, within twice the deadline (its
/// revoke's quiescence bound, then the process's exit).
fn coordinator_dies(r: &mut Run) -> Result<(), String> {
    r.kill(0);
    let start = Instant::now();
    let bound = 2 * r.deadline;
    for i in r.live_members() {
        let p = &mut r.procs[i];
        let status = p.wait_exit(STEP_LIMIT);
        let took = start.elapsed();
        let out = p.output();
        if status.is_none_or(|s| s.success()) || !out.contains("rank 0 (the coordinator) is gone") {
            return Err(format!(
                "{} exited with {status:?} without the coordinator's error",
                p.name
            ));
        }
        if took > bound {
            return Err(format!("{} took {took:?} to end, over {bound:?}", p.name));
        }
        measured(&format!(
            "elastic coordinator death: {} ended with the clear error after {:.0} ms",
            p.name,
            took.as_secs_f64() * 1e3
        ));
    }
    Ok(())
}

/// The times from rank 0's `ELASTIC` lines; `killed_at` is when the first rank was killed.
fn measure(output: &str, killed_at: u128, ranks: usize) -> Result<Times, String> {
    let lines: Vec<&str> = output
        .lines()
        .filter(|l| l.starts_with("ELASTIC"))
        .collect();
    let phase = |p: &'static str| lines.iter().filter(move |l| word(l, "phase") == p).copied();
    let detect = phase("detect")
        .next()
        .ok_or("rank 0 printed no detect line")?;
    let shrink = phase("shrink")
        .last()
        .ok_or("rank 0 printed no shrink line")?;
    let num = |l: &str, k: &str| field(l, k).ok_or(format!("no number {k}= in {l:?}"));
    // The final size comes from the grow, or, where the grow was given up (or none was to come), by
    // the last shrink or init.
    let grow = match phase("grow").last() {
        Some(grow) => Some(grow),
        None if field(shrink, "size") == Some(ranks as f64) => None,
        None => {
            return Err(format!(
                "rank 0 printed no grow line and no shrink or init to {ranks}"
            ))
        }
    };
    for l in std::iter::once(shrink).chain(grow) {
        if !l.contains("allreduce=ok") {
            return Err(format!("an all-reduce was wrong: {l}"));
        }
    }
    let detected_at = num(detect, "at_unix_us")? as u128;
    Ok(Times {
        detect_ms: detected_at.saturating_sub(killed_at) as f64 / 1e3,
        how: word(detect, "how").to_string(),
        takeover_ms: None,
        revoke_ms: num(shrink, "revoke_ms")?,
        agree_ms: num(shrink, "agree_ms")?,
        shrink_ms: num(shrink, "shrink_ms")?,
        made_by: word(shrink, "how").to_string(),
        grow_ms: grow.map(|g| num(g, "grow_ms")).transpose()?,
        rounds: phase("detect").count(),
        killed: 0,
    })
}

/// `median / worst` of `values`, in ms.
fn spread(mut values: Vec<f64>) -> String {
    values.sort_by(f64::total_cmp);
    match values.last() {
        Some(worst) => format!("{:.1} / {:.1}", values[values.len() / 2], worst),
        None => "-".into(),
    }
}

/// `scenario`'s runs, one after another: each must end as the scenario says; the times per run (the
/// runner's MEASURED lines) and their median and worst.
fn run_scenario(scenario: Scenario) {
    let test = format!("elastic {}", scenario.name());
    let runs = runs_of(scenario);
    if runs == 0 {
        // Under the test's own name (its thread's), which the GPU runner turns into a SKIP row.
        return skip(format_args!(
            "{SCENARIOS_VAR} does not name {}",
            scenario.name()
        ));
    }
    let etcd = std::env::var_os(ETCD_ENDPOINTS_VAR).is_some_and(|v| !v.is_empty());
    if matches!(scenario, Scenario::Etcd { .. }) && !etcd {
        return skip(format_args!(
            "no etcd cluster: {ETCD_ENDPOINTS_VAR} is unset (run under ci/etcd-cluster; the GPU runner \
             does where etcd is on PATH or staged)"
        ));
    }
    let gpus = gpus();
    let bin = elastic_bin();
    let mut failures = Vec::new();
    let mut rows: Vec<Times> = Vec::new();
    for run in 1..=runs {
        let start = Instant::now();
        match one_run(&bin, scenario, run, gpus) {
            Ok(Some(t)) => {
                measured(&format!(
                    "{test} run {run}: detect {:.1} ms ({}){}, revoke {:.1} ms, agree {:.1} ms, {} {:.1} ms, {}, \
                     {} round(s), {} killed, {:.1} s in all",
                    t.detect_ms,
                    t.how,
                    t.takeover_ms
                        .map_or(String::new(), |ms| format!(", takeover {ms:.1} ms")),
                    t.revoke_ms,
                    t.agree_ms,
                    t.made_by,
                    t.shrink_ms,
                    t.grow_ms.map_or("no grow: the last shrink or init made the final size".into(), |g| format!(
                        "grow {g:.1} ms"
                    )),
                    t.rounds,
                    t.killed,
                    start.elapsed().as_secs_f64()
                ));
                rows.push(t);
            }
            Ok(None) => println!("{test} run {run}: ok"),
            Err(e) => failures.push(format!("run {run}: {e}")),
        }
    }
    let ok = runs - failures.len();
    measured(&format!("{test}: {ok} of {runs} runs as promised"));
    if !rows.is_empty() {
        let joined = |f: fn(&Times) -> &str| rows.iter().map(f).collect::<Vec<_>>().join(",");
        let takeovers: Vec<f64> = rows.iter().filter_map(|t| t.takeover_ms).collect();
        measured(&format!(
            "{test} median / worst: detect {} ms (by {}){}, revoke {} ms, agree {} ms, shrink {} ms (by {}), grow {} ms",
            spread(rows.iter().map(|t| t.detect_ms).collect()),
            joined(|t| &t.how),
            match takeovers.is_empty() {
                true => String::new(),
                false => format!(", takeover {} ms", spread(takeovers)),
            },
            spread(rows.iter().map(|t| t.revoke_ms).collect()),
            spread(rows.iter().map(|t| t.agree_ms).collect()),
            spread(rows.iter().map(|t| t.shrink_ms).collect()),
            joined(|t| &t.made_by),
            spread(rows.iter().filter_map(|t| t.grow_ms).collect()),
        ));
    }
    assert!(failures.is_empty(), "{test}:\n{}", failures.join("\n"));
}

macro_rules! scenarios {
    ($($name:ident: $scenario:expr;)*) => {$(
        #[test]
        #[ignore = "needs a GPU and the elastic example"]
        fn $name() {
            run_scenario($scenario);
        }
    )*};
}

scenarios! {
    two_ranks_one_killed: Scenario::Deaths { ranks: 2, deaths: 1 };
    three_ranks_one_killed: Scenario::Deaths { ranks: 3, deaths: 1 };
    four_ranks_one_killed: Scenario::Deaths { ranks: 4, deaths: 1 };
    four_ranks_two_killed: Scenario::Deaths { ranks: 4, deaths: 2 };
    eight_ranks_one_killed: Scenario::Deaths { ranks: 8, deaths: 1 };
    eight_ranks_three_killed: Scenario::Deaths { ranks: 8, deaths: 3 };
    killed_during_shrink: Scenario::Second { ranks: 4, phase: Phase::Make };
    killed_during_grow: Scenario::Second { ranks: 4, phase: Phase::Grow };
    top_rank_killed_before_the_grow: Scenario::Second { ranks: 4, phase: Phase::GrowId };
    eight_ranks_second_death_agreeing: Scenario::Second { ranks: 8, phase: Phase::Agree };
    eight_ranks_second_death_making: Scenario::Second { ranks: 8, phase: Phase::Make };
    eight_ranks_second_death_checking: Scenario::Second { ranks: 8, phase: Phase::Checks };
    eight_ranks_second_death_below_full_size: Scenario::Second { ranks: 8, phase: Phase::Waiting };
    eight_ranks_second_death_before_the_grow_id: Scenario::Second { ranks: 8, phase: Phase::GrowId };
    eight_ranks_second_death_growing: Scenario::Second { ranks: 8, phase: Phase::Grow };
    eight_ranks_second_death_checking_the_grow: Scenario::Second { ranks: 8, phase: Phase::GrowChecks };
    sixteen_ranks_two_deaths_at_random: Scenario::Random { ranks: 16, deaths: 2 };
    sixteen_ranks_four_deaths_at_random: Scenario::Random { ranks: 16, deaths: 4 };
    replacements_arriving_late: Scenario::Late;
    replacements_never_arriving: Scenario::Never;
    eight_ranks_one_frozen: Scenario::Frozen;
    coordinator_killed: Scenario::Coordinator;
    four_ranks_one_killed_among_strays: Scenario::Strays;
    eight_ranks_in_etcd_the_coordinator_killed: Scenario::Etcd { ranks: 8, deaths: 1 };
    sixteen_ranks_in_etcd_the_coordinator_and_two_others_killed: Scenario::Etcd { ranks: 16, deaths: 3 };
}

/// Rank 0's lines of a GPU run (4 ranks, one killed; the grow timed out with every rank alive on a GPU
/// shared by 30 processes, then an init made the full size again): a recovery, without grow time; the
/// same lines ending at 3 ranks are none.
#[test]
fn a_given_up_grow_then_an_init_at_full_size_is_a_recovery() {
    let lines = |final_size: usize| {
        format!(
            "ELASTIC phase=steady rank=0 size=4 iterations=100\n\
             ELASTIC phase=detect rank=0 gen=0 how=rendezvous held=revoked at_unix_us=1000500 waited_ms=107.2 revoke_ms=397.4\n\
             ELASTIC phase=shrink rank=0 size=3 gen=1 how=shrink revoke_ms=397.4 agree_ms=409.9 shrink_ms=205.5 allreduce=ok\n\
             ELASTIC phase=growing rank=0 gen=2 size=4\n\
             ELASTIC phase=detect rank=0 gen=2 how=setup held=aborted at_unix_us=1021000 waited_ms=20946.3 revoke_ms=0.0\n\
             ELASTIC phase=shrink rank=0 size={final_size} gen=3 how=init revoke_ms=0.0 agree_ms=1079.0 shrink_ms=1683.6 allreduce=ok\n\
             ELASTIC result=ok rank=0 size={final_size}\n"
        )
    };
    let t = measure(&lines(4), 1_000_000, 4).expect("a recovery");
    assert_eq!(t.grow_ms, None);
    assert_eq!(
        (t.detect_ms, t.rounds, t.made_by.as_str()),
        (0.5, 2, "init")
    );
    assert!(measure(&lines(3), 1_000_000, 4).is_err());
}

/// A replacement is a member of the generations it printed `phase=made` for, and of no other. One whose
/// grow was lost said so (`phase=detect`) and awaits a world still: counted as joined (in a 16r4 run),
/// a scenario of four deaths was asked for a fifth replacement.
#[test]
fn a_replacement_whose_grow_was_lost_is_still_pending() {
    let lost = "[stderr] replacement: no job token\n\
                ELASTIC phase=detect rank=14 gen=3 how=setup held=aborted at_unix_us=1 waited_ms=2.1\n";
    assert!(!member_of("", 2));
    assert!(!member_of(lost, 2) && !member_of(lost, 3));
    let grown = "ELASTIC phase=made rank=6 size=7 gen=2 how=grow step=131\n\
                 ELASTIC phase=grow rank=6 size=7 gen=2 grow_ms=17236.3 allreduce=ok\n\
                 ELASTIC phase=detect rank=6 gen=2 how=rendezvous held=revoked at_unix_us=2 waited_ms=1.0\n";
    assert!(member_of(grown, 2));
    assert!(!member_of(grown, 1) && !member_of(grown, 3));
}

/// Each phase's kill fires on the line rank 0 prints when it enters that phase, and on no other of a
/// recovery's lines (the example's formats).
#[test]
fn each_phase_starts_on_its_own_line_of_rank_0() {
    let lines = [
        (None, "ELASTIC phase=made rank=0 size=8 gen=0 how=init step=0"),
        (None, "ELASTIC phase=steady rank=0 size=8 iterations=100"),
        (
            Some(Phase::Agree),
            "ELASTIC phase=detect rank=0 gen=0 how=rendezvous held=revoked at_unix_us=1 waited_ms=1.0",
        ),
        (
            Some(Phase::Make),
            "ELASTIC phase=plan rank=0 gen=1 how=shrink dead=3 size=7 step=140 agree_ms=0.3",
        ),
        (
            Some(Phase::Checks),
            "ELASTIC phase=made rank=0 size=7 gen=1 how=shrink step=140",
        ),
        (
            None,
            "ELASTIC phase=shrink rank=0 size=7 gen=1 how=shrink revoke_ms=0.5 agree_ms=0.3 shrink_ms=9.1 allreduce=ok",
        ),
        (
            Some(Phase::Waiting),
            "ELASTIC phase=waiting rank=0 gen=1 size=7 replacements=1",
        ),
        (
            None,
            "ELASTIC phase=training rank=0 gen=1 size=7 step=200 round_ms=52.1",
        ),
        (Some(Phase::GrowId), "ELASTIC phase=growid rank=0 gen=1"),
        (Some(Phase::Grow), "ELASTIC phase=growing rank=0 gen=2 size=8"),
        (
            Some(Phase::GrowChecks),
            "ELASTIC phase=made rank=0 size=8 gen=2 how=grow step=170",
        ),
        (
            None,
            "ELASTIC phase=grow rank=0 size=8 gen=2 grow_ms=311.0 allreduce=ok",
        ),
        (None, "ELASTIC result=ok rank=0 size=8 gen=2"),
    ];
    for (phase, line) in lines {
        let starts: Vec<Phase> = Phase::ALL.into_iter().filter(|p| p.starts(line)).collect();
        assert_eq!(starts, Vec::from_iter(phase), "{line}");
    }
}

/// With the etcd membership: the coordinator is whoever took the role in the highest term, and a
/// generation made by two coordinators fails the run, naming both (the membership's line formats).
#[test]
fn the_coordinator_and_who_made_each_generation_are_read_from_the_lines() {
    let first = "ELASTIC phase=coordinator name=rank-0 term=7\n\
                 ELASTIC phase=coordinate name=rank-0 term=7 gen=0 how=init size=4\n\
                 ELASTIC phase=steady rank=0 size=4 iterations=100\n";
    let second = "ELASTIC phase=steady rank=1 size=4 iterations=100\n\
                  ELASTIC phase=coordinator name=rank-1 term=31\n\
                  ELASTIC phase=coordinate name=rank-1 term=31 gen=1 how=shrink size=3\n";
    let twice = "ELASTIC phase=coordinate name=rank-2 term=12 gen=1 how=shrink size=3\n";
    let outputs = |texts: &[&str]| texts.iter().map(|t| t.to_string()).collect::<Vec<_>>();
    assert_eq!(holder(&outputs(&[first, second])), Some((1, 31)));
    assert_eq!(holder(&outputs(&[second, first])), Some((0, 31)));
    assert_eq!(holder(&outputs(&[twice])), None);
    assert_eq!(
        one_coordinator_per_generation(&outputs(&[first, second])).as_deref(),
        Ok("0: rank-0 (term 7), 1: rank-1 (term 31)")
    );
    let err = one_coordinator_per_generation(&outputs(&[first, second, twice])).expect_err("twice");
    assert!(
        err.contains("generation 1 made twice: by rank-1 (term 31) and by rank-2 (term 12)"),
        "{err}"
    );
    let err = one_coordinator_per_generation(&outputs(&[second])).expect_err("no generation 0");
    assert!(err.contains("generation 0"), "{err}");
}
