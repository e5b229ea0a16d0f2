//! Fake ranks for the CPU tests: threads that live a rank's real life (`recovery.rs`, the rendezvous
//! over TCP on loopback) on a fake [`Fabric`]. A fake communicator is a set of places in shared memory:
//! making one waits until every rank of it arrived, an all-reduce until every rank contributed to the
//! round, each at most its bound and given up on the rendezvous's news, as NCCL's are. A rank is killed
//! at a chosen moment (after a line someone printed, and a number of its own calls since): its thread
//! stops, and its connection closes, as a killed process's does.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::backend::run_with;
use crate::config::{Config, First};
use crate::fabric::{unix_us, Fabric, Lost, Outcome, Place, Sink};
use crate::lines;
use crate::membership::{lock, shared, Membership, Shared};
use crate::protocol::Held;

/// What a killed rank's calls return: its thread ends with it.
pub const KILLED: &str = "killed by the test";
/// How long a fake all-reduce takes at least: the training lasts long enough for replacements to join.
const ROUND: Duration = Duration::from_millis(1);
/// How often a fake wait looks at its communicator, the news and the kills.
const POLL: Duration = Duration::from_millis(1);

/// The victim of a [`Kill`] that is whoever holds the coordinating role (the etcd membership's) when
/// the kill's line is said: the rank that said the last `phase=coordinator` line.
pub const COORDINATOR: &str = "the coordinator";

/// The victim of a [`Kill`] that is the rank that takes the coordinating role after the
/// [`COORDINATOR`]'s kill, once it holds it: only lines said after that kill trigger its own.
pub const NEXT_COORDINATOR: &str = "the next coordinator";

/// Who a kill's victim is: a process by name, or a holder of the coordinating role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Victim {
    Named,
    Coordinator,
    Next,
}

impl Victim {
    fn of(name: &str) -> Victim {
        match name {
            COORDINATOR => Victim::Coordinator,
            NEXT_COORDINATOR => Victim::Next,
            _ => Victim::Named,
        }
    }
}

/// One of a rank's kills as it watches for it: the line that triggers it (`phase=…`, and who prints
/// it), the calls after, its victim, and the rank's call count when it was triggered.
struct Armed {
    needle: String,
    by: String,
    calls: usize,
    victim: Victim,
    doomed_at: Option<usize>,
}

/// A rank to kill: `victim` (a process's name: `rank 3`, `replacement 1`) dies at its `calls`-th call
/// (0: at once, even in a wait) after a line containing `phase` was printed by `by` (a name; `None`:
/// the victim itself).
#[derive(Clone, Debug)]
pub struct Kill {
    pub victim: String,
    pub phase: String,
    pub by: Option<&'static str>,
    pub calls: usize,
}

impl Kill {
    /// `victim` dies once rank 0 printed `phase`, at once (its wait given up, or its next call).
    pub fn on_rank0(victim: &str, phase: &str) -> Kill {
        Kill {
            victim: victim.into(),
            phase: phase.into(),
            by: Some("rank 0"),
            calls: 0,
        }
    }

    /// `victim` dies at its `calls`-th call after it printed `phase` itself (0: at that line).
    pub fn on_own(victim: &str, phase: &str, calls: usize) -> Kill {
        Kill {
            victim: victim.into(),
            phase: phase.into(),
            by: None,
            calls,
        }
    }
}

/// A fake communicator: the places that arrived at its making (and the parent they made it from), and
/// who contributed to each round.
#[derive(Default)]
struct Group {
    size: usize,
    parent: Option<String>,
    arrived: HashSet<usize>,
    rounds: HashMap<usize, HashSet<usize>>,
}

struct World {
    /// When the test world started: the log's times count from it.
    start: Instant,
    /// Communicators by name (made from an id, or from a parent and a generation).
    groups: HashMap<String, Group>,
    /// Every `ELASTIC` line, with its process's name, in order.
    log: Vec<(String, String)>,
    /// When each line of the log was said, since `start`.
    times: Vec<Duration>,
    ids: u64,
    /// A place given twice in one round or making, sizes or parents that differ: the protocol broke.
    broken: Vec<String>,
    /// The log's length when the [`COORDINATOR`]'s kill happened.
    coordinator_killed_at: Option<usize>,
    /// The [`NEXT_COORDINATOR`]'s kill happened.
    next_killed: bool,
}

impl World {
    fn new() -> World {
        World {
            start: Instant::now(),
            groups: HashMap::new(),
            log: Vec::new(),
            times: Vec::new(),
            ids: 0,
            broken: Vec::new(),
            coordinator_killed_at: None,
            next_killed: false,
        }
    }

    /// Adds `line`, said by `who`, to the log, with its time.
    fn say(&mut self, who: &str, line: String) {
        self.times.push(self.start.elapsed());
        self.log.push((who.to_string(), line));
    }
}

/// One fake rank's side: its name and the shared world.
struct FakeRank {
    name: String,
    world: Shared<World>,
    /// The kills this rank may die of (a coordinator's dies only if it holds the role then).
    kills: Vec<Armed>,
    /// Lines of the log already looked at for the triggers.
    seen: usize,
    /// Calls made.
    calls: usize,
}

impl FakeRank {
    /// An error once this rank is to die now.
    fn alive(&mut self) -> Result<(), String> {
        if self.kills.is_empty() {
            return Ok(());
        }
        let mut w = lock(&self.world);
        let holder = {
            let mut said = w.log.iter().rev();
            said.find(|(_, line)| line.contains("phase=coordinator "))
                .is_some_and(|(who, _)| *who == self.name)
        };
        for kill in self.kills.iter_mut().filter(|k| k.doomed_at.is_none()) {
            // The next coordinator's kill looks only at lines said after the coordinator's kill.
            let from = match kill.victim {
                Victim::Next => w
                    .coordinator_killed_at
                    .map_or(w.log.len(), |at| at.max(self.seen)),
                _ => self.seen,
            };
            let due = w.log[from..]
                .iter()
                .any(|(who, line)| *who == kill.by && line.contains(kill.needle.as_str()));
            // A coordinator's kill is one death: of the rank that holds the role the first time the
            // line is said by a holder.
            let mine = match kill.victim {
                Victim::Named => true,
                Victim::Coordinator => holder && w.coordinator_killed_at.is_none(),
                Victim::Next => holder && !w.next_killed,
            };
            if due && mine {
                match kill.victim {
                    Victim::Coordinator => w.coordinator_killed_at = Some(w.log.len()),
                    Victim::Next => w.next_killed = true,
                    Victim::Named => {}
                }
                kill.doomed_at = Some(self.calls);
            }
        }
        self.seen = w.log.len();
        let dead = self.kills.iter().any(|k| {
            k.doomed_at
                .is_some_and(|since| self.calls - since >= k.calls)
        });
        match dead {
            true => Err(KILLED.into()),
            false => Ok(()),
        }
    }

    /// A new call: an error once this rank is to die.
    fn call(&mut self) -> Result<(), String> {
        self.calls += 1;
        self.alive()
    }

    /// Waits until `done` holds of the world (`Ok(Ok(()))`), the news says `gen` is lost or `limit`
    /// passes (`Ok(Err(why))`); an error once this rank is to die.
    fn wait(
        &mut self,
        who: &dyn Membership,
        gen: u64,
        limit: Duration,
        done: impl Fn(&World) -> bool,
    ) -> Result<Result<(), String>, String> {
        let start = Instant::now();
        loop {
            self.alive()?;
            if done(&lock(&self.world)) {
                return Ok(Ok(()));
            }
            if let Some(why) = who.lost(gen) {
                return Ok(Err(why));
            }
            if start.elapsed() > limit {
                return Ok(Err(format!("timed out after {limit:?}")));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Arrives at group `name` (made from `parent`, if any) at `at` and waits for the others.
    fn make(
        &mut self,
        (name, parent): (String, Option<String>),
        at: Place,
        limit: Duration,
        who: &dyn Membership,
    ) -> Result<String, String> {
        self.call()?;
        {
            let mut w = lock(&self.world);
            let group = w.groups.entry(name.clone()).or_default();
            let first = group.arrived.is_empty();
            let agreed = first || (group.size == at.size && group.parent == parent);
            group.size = at.size;
            group.parent = parent;
            if !group.arrived.insert(at.rank) || !agreed || at.rank >= at.size {
                let broken = format!(
                    "{}: place {} of {} in {name}: taken, or another size or parent",
                    self.name, at.rank, at.size
                );
                w.broken.push(broken);
            }
        }
        let size = at.size;
        let made = self.wait(who, at.gen, limit, |w| {
            w.groups[&name].arrived.len() >= size
        })?;
        made.map(|()| name)
    }
}

/// A fake communicator handle: its group's name, leaked so that it is `Copy` (a few per test).
pub type FakeComm = &'static str;

fn leak(name: String) -> FakeComm {
    Box::leak(name.into_boxed_str())
}

impl Fabric for FakeRank {
    type Comm = FakeComm;

    fn say(&mut self, line: String) -> Result<(), String> {
        lock(&self.world).say(&self.name, line);
        self.alive()
    }

    fn sink(&self) -> Sink {
        let (world, name) = (Arc::clone(&self.world), self.name.clone());
        Arc::new(move |line| lock(&world).say(&name, line))
    }

    fn new_id(&mut self) -> Result<String, String> {
        let mut w = lock(&self.world);
        w.ids += 1;
        Ok(format!("id{}", w.ids))
    }

    fn round(
        &mut self,
        comm: FakeComm,
        at: Place,
        round: usize,
        who: &dyn Membership,
        deadline: Duration,
    ) -> Result<Outcome, String> {
        self.call()?;
        std::thread::sleep(ROUND);
        let start = Instant::now();
        {
            let mut w = lock(&self.world);
            let group = w.groups.get_mut(comm).ok_or("no such communicator")?;
            if !group.rounds.entry(round).or_default().insert(at.rank) {
                let broken = format!(
                    "{}: rank {} twice in round {round} of {comm}",
                    self.name, at.rank
                );
                w.broken.push(broken);
            }
        }
        let waited = self.wait(who, at.gen, deadline, |w| {
            w.groups[comm].rounds[&round].len() >= w.groups[comm].size
        })?;
        Ok(match waited {
            Ok(()) => Outcome::Done,
            Err(detail) => Outcome::Lost(Lost {
                how: "rendezvous",
                detail,
                held: Held::Revoked,
                waited: start.elapsed(),
                at_unix_us: unix_us(),
                revoked: Duration::ZERO,
            }),
        })
    }

    fn init(
        &mut self,
        at: Place,
        id: &str,
        limit: Duration,
        who: &dyn Membership,
    ) -> Result<FakeComm, String> {
        self.make((format!("init.{id}"), None), at, limit, who)
            .map(leak)
    }

    fn shrink(
        &mut self,
        parent: FakeComm,
        _exclude: &[usize],
        at: Place,
        limit: Duration,
        who: &dyn Membership,
    ) -> Result<FakeComm, String> {
        let made = (format!("shrink.{}", at.gen), Some(parent.to_string()));
        self.make(made, at, limit, who).map(leak)
    }

    fn grow_id(
        &mut self,
        comm: FakeComm,
        _who: &dyn Membership,
        gen: u64,
        _limit: Duration,
    ) -> Result<String, String> {
        self.call()?;
        // It names the parent: a replacement's grow finds the group by it.
        Ok(format!("grow.{comm}@{gen}"))
    }

    fn grow(
        &mut self,
        parent: Option<FakeComm>,
        at: Place,
        id: Option<&str>,
        limit: Duration,
        who: &dyn Membership,
    ) -> Result<FakeComm, String> {
        // Every rank names the group by its parent: a member's own, a replacement's by the id.
        let parent = match (parent, id) {
            (Some(p), _) => p.to_string(),
            (None, Some(id)) => id
                .strip_prefix("grow.")
                .and_then(|rest| rest.rsplit_once('@'))
                .map(|(p, _)| p.to_string())
                .ok_or(format!("not a grow id: {id}"))?,
            (None, None) => return Err("a grow with neither parent nor id".into()),
        };
        self.make((format!("grow.{}", at.gen), Some(parent)), at, limit, who)
            .map(leak)
    }

    fn release(&mut self, _comm: FakeComm, _abort: bool) -> Result<(), String> {
        self.call()
    }

    /// As NCCL's: waits for the news that `gen` is lost, and gives the communicator up at the deadline
    /// without it.
    fn give_up_idle(
        &mut self,
        _comm: FakeComm,
        who: &dyn Membership,
        gen: u64,
        deadline: Duration,
    ) -> Result<Lost, String> {
        self.call()?;
        let start = Instant::now();
        let Err(detail) = self.wait(who, gen, deadline, |_| false)? else {
            return Err("the wait for the news of the loss ended without it".into());
        };
        Ok(Lost {
            how: "rendezvous",
            detail,
            held: Held::Revoked,
            waited: start.elapsed(),
            at_unix_us: unix_us(),
            revoked: Duration::ZERO,
        })
    }
}

/// What a test does at a line of the world ([`Script::at_line`]).
pub type Act = Box<dyn FnOnce() + Send + Sync>;

/// How a test's world goes: `world` ranks training `iters` rounds at `--deadline` `deadline`, the job
/// going on down to `min_size`; `kills`; as many replacements as rank 0 asks for (its `waiting` lines),
/// `replacements` in all, each joining `late` after it is asked for.
pub struct Script {
    pub world: usize,
    pub min_size: usize,
    pub iters: usize,
    pub deadline: Duration,
    pub kills: Vec<Kill>,
    pub replacements: usize,
    pub late: Duration,
    /// What the test does once a line containing the text is said (by anyone): once, in the driver.
    pub at_line: Option<(&'static str, Act)>,
    /// Where the membership lives: etcd, or (`None`) rank 0.
    #[cfg(feature = "etcd")]
    pub etcd: Option<crate::store::Store>,
}

impl Script {
    /// `world` ranks, 1200 rounds at a 2 s deadline, down to one rank, with `kills` and as many
    /// replacements as asked for, at once.
    pub fn new(world: usize, kills: Vec<Kill>) -> Script {
        Script {
            world,
            min_size: 1,
            iters: 1200,
            deadline: Duration::from_secs(2),
            kills,
            replacements: usize::MAX,
            late: Duration::ZERO,
            at_line: None,
            #[cfg(feature = "etcd")]
            etcd: None,
        }
    }
}

/// How every process ended.
pub struct Ending {
    /// Each process's name and its life's end, in start order.
    pub results: Vec<(String, Result<(), String>)>,
    pub log: Vec<(String, String)>,
    /// When each line of `log` was said, since the world started.
    pub times: Vec<Duration>,
    pub broken: Vec<String>,
}

/// A bound on a whole test world: far past any recovery's.
const WORLD_LIMIT: Duration = Duration::from_secs(120);

fn config(script: &Script, first: Option<First>, master: Option<&str>) -> Config {
    Config {
        first,
        placed: None,
        local_rank: 0,
        master: master.map(str::to_string),
        deadline: script.deadline,
        iters: script.iters,
        min_size: script.min_size,
        grow_id_delay: Duration::ZERO,
        #[cfg(feature = "etcd")]
        etcd: script.etcd.clone(),
    }
}

/// Runs `script` to its end: every process's thread ends (or the test fails at [`WORLD_LIMIT`]).
pub fn run(script: Script) -> Ending {
    let world = shared(World::new());
    let mut script = script;
    let mut at_line = script.at_line.take();
    let script = Arc::new(script);
    let spawn = |name: String, master: Option<String>, first: Option<First>, delay: Duration| {
        let (world, script) = (Arc::clone(&world), Arc::clone(&script));
        std::thread::spawn(move || {
            std::thread::sleep(delay);
            let kills = script
                .kills
                .iter()
                .map(|k| (k, Victim::of(&k.victim)))
                .filter(|(k, victim)| k.victim == name || *victim != Victim::Named)
                .map(|(k, victim)| Armed {
                    needle: format!("phase={}", k.phase),
                    by: k.by.map_or(name.clone(), str::to_string),
                    calls: k.calls,
                    victim,
                    doomed_at: None,
                })
                .collect();
            let mut rank = FakeRank {
                name,
                world,
                kills,
                seen: 0,
                calls: 0,
            };
            run_with(&config(&script, first, master.as_deref()), &mut rank)
        })
    };
    let first = |rank| {
        Some(First {
            rank,
            world_size: script.world,
        })
    };
    let start = Instant::now();
    // With the membership in etcd no rank listens, and none is given rank 0's address: every rank
    // starts at once, and the coordinator's lines (whoever holds the role) steer the replacements.
    #[cfg(feature = "etcd")]
    let etcd = script.etcd.is_some();
    #[cfg(not(feature = "etcd"))]
    let etcd = false;
    let listen = (!etcd).then(|| "127.0.0.1:0".to_string());
    let mut procs: Vec<(String, JoinHandle<Result<(), String>>)> = vec![(
        "rank 0".into(),
        spawn("rank 0".into(), listen, first(0), Duration::ZERO),
    )];
    let master = match etcd {
        true => None,
        false => loop {
            let said = lock(&world).log.iter().find_map(|(_, line)| {
                line.strip_prefix("ELASTIC phase=listening port=")
                    .map(|port| format!("127.0.0.1:{port}"))
            });
            match said {
                Some(master) => break Some(master),
                None => assert!(start.elapsed() < WORLD_LIMIT, "rank 0 never listened"),
            }
            std::thread::sleep(POLL);
        },
    };
    for rank in 1..script.world {
        let name = format!("rank {rank}");
        procs.push((
            name.clone(),
            spawn(name, master.clone(), first(rank), Duration::ZERO),
        ));
    }
    // Rank 0's lines steer the replacements, as the GPU test's driver does.
    let (mut read, mut started) = (0, 0);
    while !procs.iter().all(|(_, p)| p.is_finished()) {
        if start.elapsed() >= WORLD_LIMIT {
            // The ends of those that ended, and who still runs: the lines alone do not say.
            let results = procs
                .into_iter()
                .map(|(name, p)| match p.is_finished() {
                    true => (name, p.join().unwrap_or_else(|_| Err("panicked".into()))),
                    false => (name, Err("STILL RUNNING".into())),
                })
                .collect();
            let w = lock(&world);
            let end = Ending {
                results,
                log: w.log.clone(),
                times: w.times.clone(),
                broken: w.broken.clone(),
            };
            panic!("the world did not end within {WORLD_LIMIT:?}\n{end}");
        }
        let hook = at_line.take_if(|(needle, _)| {
            let w = lock(&world);
            w.log[read..].iter().any(|(_, l)| l.contains(*needle))
        });
        if let Some((needle, act)) = hook {
            act();
            let done = format!("TEST did what it does at {needle:?}");
            lock(&world).say("test", done);
        }
        let lines: Vec<String> = {
            let w = lock(&world);
            let new = w.log[read..]
                .iter()
                .filter(|(who, _)| etcd || who == "rank 0")
                .map(|(_, line)| line.clone())
                .collect();
            read = w.log.len();
            new
        };
        for line in lines.iter().filter(|l| l.contains("phase=waiting")) {
            let asked = lines::number(line, "replacements").unwrap_or(0);
            let gen = lines::number(line, "gen").unwrap_or(0);
            // Replacements still running that are not in rank 0's generation: not joined yet, or
            // joined a grow that was lost (saying so does not make one a member).
            let pending = {
                let w = lock(&world);
                let members: HashSet<&String> = w
                    .log
                    .iter()
                    .filter(|(who, l)| who.starts_with("replacement") && lines::made(l, gen))
                    .map(|(who, _)| who)
                    .collect();
                procs
                    .iter()
                    .filter(|(n, p)| n.starts_with("replacement") && !p.is_finished())
                    .filter(|(n, _)| !members.contains(n))
                    .count()
            };
            let more = asked.saturating_sub(pending);
            for _ in 0..more.min(script.replacements.saturating_sub(started)) {
                started += 1;
                let name = format!("replacement {started}");
                procs.push((name.clone(), spawn(name, master.clone(), None, script.late)));
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let results = procs
        .into_iter()
        .map(|(name, p)| {
            let end = p.join().unwrap_or_else(|_| Err("panicked".into()));
            (name, end)
        })
        .collect();
    let w = lock(&world);
    Ending {
        results,
        log: w.log.clone(),
        times: w.times.clone(),
        broken: w.broken.clone(),
    }
}

/// Every process's end, then the log with each line's time: what a failed test prints.
impl std::fmt::Display for Ending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "how each process ended:")?;
        for (name, end) in &self.results {
            writeln!(f, "  {name}: {end:?}")?;
        }
        for broken in &self.broken {
            writeln!(f, "broken: {broken}")?;
        }
        writeln!(f, "the log (seconds since the start):")?;
        for (i, (who, line)) in self.log.iter().enumerate() {
            let at = self.times.get(i).map_or(f64::NAN, Duration::as_secs_f64);
            writeln!(f, "  {at:8.3} {who}: {line}")?;
        }
        Ok(())
    }
}

impl Ending {
    /// Whether `name` was killed.
    pub fn killed(&self, name: &str) -> bool {
        self.results
            .iter()
            .any(|(n, end)| n == name && end.as_ref().err().is_some_and(|e| e == KILLED))
    }

    /// The processes that lived to the end.
    pub fn live(&self) -> Vec<&(String, Result<(), String>)> {
        self.results
            .iter()
            .filter(|(n, _)| !self.killed(n))
            .collect()
    }

    /// Every process that was not killed ended well, in one world of `size` ranks, 0 to `size - 1`,
    /// and no fake communicator saw a place twice.
    pub fn assert_world(&self, size: usize) {
        let dump = || self.to_string();
        assert!(self.broken.is_empty(), "{:?}\n{}", self.broken, dump());
        let mut finals = Vec::new();
        for (name, end) in self.live() {
            assert_eq!(end, &Ok(()), "{name} did not end well\n{}", dump());
            let result = self
                .log
                .iter()
                .rev()
                .find(|(who, line)| who == name && line.starts_with("ELASTIC result=ok"))
                .unwrap_or_else(|| panic!("{name} said no result\n{}", dump()));
            let num = |key| lines::number(&result.1, key).unwrap_or(usize::MAX);
            finals.push((num("rank"), num("size")));
        }
        finals.sort_unstable();
        let want: Vec<(usize, usize)> = (0..size).map(|r| (r, size)).collect();
        assert_eq!(finals, want, "the final world\n{}", dump());
    }

    /// How many processes were killed.
    pub fn deaths(&self) -> usize {
        self.results.len() - self.live().len()
    }
}
