//! The elastic example (`examples/elastic/`) against NCCL itself: ranks all-reduce in a loop; some are
//! SIGKILLed; the survivors recover (revoke, agree, shrink or re-init) and replacements started with
//! `--join` grow the communicator back to full size, every all-reduce checked against the host's sum
//! (by the example: before, after the recovery and after the grow). Ranks are placed by the testkit's
//! plan: on one GPU each rank is a simulated host of its own (`NCCL_HOSTID`, sockets over `lo`), so NCCL's
//! network transport sees the deaths, as across real hosts.
//!
//! Scenarios (`METRALE_ELASTIC_SCENARIOS`, a comma list; all by default):
//! - `RxD` for (ranks, deaths) in 2x1, 3x1, 4x1, 4x2, 8x1, 8x3: D ranks other than rank 0, chosen at
//!   random, killed together at a random moment of the steady loop; as many replacements join at once;
//! - `shrink`: 4 ranks, one killed in the steady loop, another when rank 0 announces its plan (during
//!   the shrink or the checks after it): the survivors recover again;
//! - `grow`: 4 ranks, one killed in the steady loop, another (a survivor or a replacement) when rank 0
//!   starts the grow: they recover again, and a further replacement restores the size;
//! - `growid`: 4 ranks, one killed in the steady loop, then the last rank of the survivors' communicator
//!   when rank 0 is about to make the grow id (held there by `METRALE_ELASTIC_GROW_ID_DELAY_MS`, past
//!   its last look at the rendezvous): NCCL's `ncclCommGetUniqueId` retries the dead rank, rank 0 gives
//!   the call up on the rendezvous's news, and they recover again and grow back;
//! - `coordinator`: 4 ranks, rank 0 killed in the steady loop: every other rank must end with the
//!   example's clear error (rank 0 is gone) within twice the deadline.
//!
//! One test per scenario (`two_ranks_one_killed` .. `top_rank_killed_before_the_grow`), each within
//! the GPU runner's per-test limit; a scenario the variable leaves out prints a SKIP line. Runs per scenario:
//! `METRALE_ELASTIC_RUNS`, else 5 for the RxD ones and 3 for the others. Every run must end as the
//! scenario says; the times are printed per run and, per scenario, their median and worst (MEASURED
//! lines, which the runner's summary lists).
//! The example is found through `METRALE_ELASTIC_BIN`, else at `<this test binary's dir>/../examples/
//! elastic` (`cargo build --release --example elastic` puts it there).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use metrale_gpu_testkit::child::{self, Child};
use metrale_gpu_testkit::gpu::{gpus, measured, skip};
use metrale_gpu_testkit::placement::{Mode, Plan};

/// The example's `--deadline`: how long a collective may hang before the survivors give up on it.
const DEADLINE_VAR: &str = "METRALE_ELASTIC_DEADLINE";
const RUNS_VAR: &str = "METRALE_ELASTIC_RUNS";
const SCENARIOS_VAR: &str = "METRALE_ELASTIC_SCENARIOS";
/// What holds rank 0 before its `ncclCommGetUniqueId` in the `growid` scenario (the example's
/// test-only variable), and for how long: time enough for the kill and for the rendezvous to see it.
const GROW_ID_DELAY: (&str, &str) = ("METRALE_ELASTIC_GROW_ID_DELAY_MS", "500");
/// A generous bound on each step of a run (startup, a recovery, a replacement's arrival).
const STEP_LIMIT: Duration = Duration::from_secs(90);
/// The latest moment of a kill after every rank is steady.
const KILL_WINDOW_MS: u64 = 400;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scenario {
    Deaths { ranks: usize, deaths: usize },
    DuringShrink,
    DuringGrow,
    BeforeGrowId,
    Coordinator,
}

const ALL: [Scenario; 10] = [
    Scenario::Deaths {
        ranks: 2,
        deaths: 1,
    },
    Scenario::Deaths {
        ranks: 3,
        deaths: 1,
    },
    Scenario::Deaths {
        ranks: 4,
        deaths: 1,
    },
    Scenario::Deaths {
        ranks: 4,
        deaths: 2,
    },
    Scenario::Deaths {
        ranks: 8,
        deaths: 1,
    },
    Scenario::Deaths {
        ranks: 8,
        deaths: 3,
    },
    Scenario::DuringShrink,
    Scenario::DuringGrow,
    Scenario::BeforeGrowId,
    Scenario::Coordinator,
];

impl Scenario {
    fn name(self) -> String {
        match self {
            Scenario::Deaths { ranks, deaths } => format!("{ranks}x{deaths}"),
            Scenario::DuringShrink => "shrink".into(),
            Scenario::DuringGrow => "grow".into(),
            Scenario::BeforeGrowId => "growid".into(),
            Scenario::Coordinator => "coordinator".into(),
        }
    }

    fn ranks(self) -> usize {
        match self {
            Scenario::Deaths { ranks, .. } => ranks,
            _ => 4,
        }
    }

    /// Ranks killed in the steady loop, and later ones (during the recovery).
    fn deaths(self) -> (usize, usize) {
        match self {
            Scenario::Deaths { deaths, .. } => (deaths, 0),
            Scenario::DuringShrink | Scenario::DuringGrow | Scenario::BeforeGrowId => (1, 1),
            Scenario::Coordinator => (1, 0),
        }
    }

    fn default_runs(self) -> usize {
        match self {
            Scenario::Deaths { .. } => 5,
            _ => 3,
        }
    }
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
            ALL.iter().any(|s| s.name() == *name),
            "{SCENARIOS_VAR} names {name:?}; the scenarios are {}",
            ALL.map(Scenario::name).join(", ")
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
}

/// The processes of one run, rank 0 first, then the other ranks, then replacements in start order.
struct Run<'a> {
    bin: &'a Path,
    name: String,
    plan: Plan,
    deadline: Duration,
    ranks: usize,
    master: String,
    procs: Vec<Child>,
    /// Which processes were killed.
    killed: Vec<bool>,
    replacements: usize,
    /// Variables for rank 0 alone.
    rank0_env: Vec<(&'static str, &'static str)>,
}

impl Run<'_> {
    /// Starts process `index` of the plan (rank `index`, or a replacement past the first world).
    fn start(&mut self, role: &[String]) {
        let index = self.procs.len();
        let place = self.plan.place(index);
        let mut cmd = Command::new(self.bin);
        cmd.args(role)
            .args(["--local-rank", &place.device.to_string()])
            .args(["--master", &self.master])
            .args(["--deadline", &self.deadline.as_secs().to_string()]);
        for (k, v) in self.plan.nccl_env(index) {
            cmd.env(k, v);
        }
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

    /// Replacements started that have not joined yet (they print nothing before their grow).
    fn pending(&self) -> usize {
        (self.ranks..self.procs.len())
            .filter(|&i| !self.killed[i] && !self.procs[i].output().contains("ELASTIC "))
            .count()
    }

    fn dump(&self) {
        for p in &self.procs {
            p.dump();
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
    let mut r = Run {
        bin,
        name: format!("{} run {run}", scenario.name()),
        plan,
        deadline,
        ranks,
        // Rank 0 picks its port and says which (no race for a free one).
        master: "127.0.0.1:0".into(),
        procs: Vec::new(),
        killed: Vec::new(),
        replacements: 0,
        rank0_env: match scenario {
            Scenario::BeforeGrowId => vec![GROW_ID_DELAY],
            _ => Vec::new(),
        },
    };
    let result = drive(&mut r, scenario);
    if result.is_err() {
        r.dump();
    }
    result
}

fn drive(r: &mut Run, scenario: Scenario) -> Result<Option<Times>, String> {
    let ranks = r.ranks;
    let arg = |a: &str| a.to_string();
    r.start(&[
        arg("--rank"),
        arg("0"),
        arg("--world-size"),
        ranks.to_string(),
    ]);
    let (_, line) = r.procs[0]
        .wait_line("ELASTIC phase=listening", STEP_LIMIT)
        .ok_or("rank 0 never listened")?;
    r.master = format!("127.0.0.1:{}", word(&line, "port"));
    for rank in 1..ranks {
        r.start(&[
            arg("--rank"),
            rank.to_string(),
            arg("--world-size"),
            ranks.to_string(),
        ]);
    }
    for p in &r.procs {
        p.wait_line("ELASTIC phase=steady", STEP_LIMIT)
            .ok_or(format!(
                "{} never reached its steady all-reduce loop",
                p.name
            ))?;
    }
    std::thread::sleep(Duration::from_millis(random(KILL_WINDOW_MS)));
    if scenario == Scenario::Coordinator {
        return coordinator_dies(r).map(|()| None);
    }
    let (first, later) = scenario.deaths();
    let killed_at = pick((1..ranks).collect(), first)
        .into_iter()
        .map(|i| r.kill(i))
        .min()
        .unwrap_or(0);
    let mut later_left = later;
    // Rank 0's lines steer the rest: replacements when it waits for them, the later kill.
    loop {
        let (_, line) = r.procs[0]
            .wait_line("ELASTIC ", STEP_LIMIT)
            .ok_or(format!("rank 0 said nothing more within {STEP_LIMIT:?}"))?;
        let phase = word(&line, "phase");
        let kill_now = match scenario {
            Scenario::DuringShrink => phase == "plan",
            Scenario::DuringGrow => phase == "growing",
            Scenario::BeforeGrowId => phase == "growid",
            _ => false,
        };
        if kill_now && later_left > 0 {
            later_left -= 1;
            let victim = match scenario {
                // The parent's last rank (the one ncclCommGetUniqueId sends to besides rank 0): the
                // first world's highest survivor, as nobody has joined yet.
                Scenario::BeforeGrowId => r
                    .live_members()
                    .into_iter()
                    .filter(|&i| i < ranks)
                    .max()
                    .into_iter()
                    .collect(),
                _ => pick(r.live_members(), 1),
            };
            victim.into_iter().for_each(|i| {
                r.kill(i);
            });
        }
        if phase == "waiting" {
            let need = field(&line, "replacements").unwrap_or(0.0) as usize;
            for _ in r.pending()..need {
                r.start_replacement()?;
            }
        }
        if line.contains("ELASTIC result=") {
            break;
        }
    }
    // Every live process ends well, and together they are the full world, ranks in order.
    let mut finals = Vec::new();
    for i in 0..r.procs.len() {
        if r.killed[i] {
            continue;
        }
        let p = &mut r.procs[i];
        match p.wait_exit(STEP_LIMIT) {
            Some(status) if status.success() => {}
            status => return Err(format!("{} exited with {status:?} (None: killed)", p.name)),
        }
        let out = p.output();
        let done = out
            .lines()
            .find(|l| l.starts_with("ELASTIC result=ok"))
            .ok_or(format!("{} printed no result=ok", p.name))?;
        finals.push((field(done, "rank"), field(done, "size")));
    }
    let mut got: Vec<usize> = finals
        .iter()
        .filter_map(|(r, _)| r.map(|r| r as usize))
        .collect();
    got.sort_unstable();
    if got != (0..ranks).collect::<Vec<_>>() || finals.iter().any(|(_, s)| *s != Some(ranks as f64))
    {
        return Err(format!(
            "the final world is not ranks 0..{ranks} of {ranks}: {finals:?}"
        ));
    }
    let rank0 = r.procs[0].output();
    if scenario == Scenario::BeforeGrowId && !rank0.contains("ncclCommGetUniqueId: given up") {
        return Err("the kill missed rank 0's ncclCommGetUniqueId: rank 0 gave no call up".into());
    }
    measure(&rank0, killed_at, ranks).map(Some)
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
    // The full size comes back by the grow, or, where the grow was given up, by the last init.
    let grow = match phase("grow").last() {
        Some(grow) => Some(grow),
        None if field(shrink, "size") == Some(ranks as f64) => None,
        None => return Err("rank 0 printed no grow line and no init at full size".into()),
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
        revoke_ms: num(shrink, "revoke_ms")?,
        agree_ms: num(shrink, "agree_ms")?,
        shrink_ms: num(shrink, "shrink_ms")?,
        made_by: word(shrink, "how").to_string(),
        grow_ms: grow.map(|g| num(g, "grow_ms")).transpose()?,
        rounds: phase("detect").count(),
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
        skip(
            &test,
            &format!("{SCENARIOS_VAR} does not name {}", scenario.name()),
        );
        return;
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
                    "{test} run {run}: detect {:.1} ms ({}), revoke {:.1} ms, agree {:.1} ms, {} {:.1} ms, {}, \
                     {} round(s), {:.1} s in all",
                    t.detect_ms,
                    t.how,
                    t.revoke_ms,
                    t.agree_ms,
                    t.made_by,
                    t.shrink_ms,
                    t.grow_ms.map_or("grow given up, full size by init".into(), |g| format!(
                        "grow {g:.1} ms"
                    )),
                    t.rounds,
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
        measured(&format!(
            "{test} median / worst: detect {} ms (by {}), revoke {} ms, agree {} ms, shrink {} ms (by {}), grow {} ms",
            spread(rows.iter().map(|t| t.detect_ms).collect()),
            joined(|t| &t.how),
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
    killed_during_shrink: Scenario::DuringShrink;
    killed_during_grow: Scenario::DuringGrow;
    top_rank_killed_before_the_grow: Scenario::BeforeGrowId;
    coordinator_killed: Scenario::Coordinator;
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
