//! One process per rank, as in production: a GPU test runs itself once per rank, as child processes
//! placed by [`crate::placement`], and passes when every rank's body passed.
//!
//! A test is one function that plays both parts:
//!
//! ```ignore
//! #[test]
//! #[ignore = "needs a GPU: run through ci/gpu-run.sh"]
//! fn all_reduce() {
//!     ranks::test("collectives::all_reduce").run(|me, world| {
//!         // In each rank's process: `world` holds this rank's communicator (`world.size` ranks).
//!     });
//! }
//! ```
//!
//! - **In the parent** (the test as cargo or nextest runs it): the GPU preamble ([`crate::gpu::gpus`]),
//!   the plan ([`Plan::from_env`]: `METRALE_TEST_RANKS`, default 2, and `METRALE_TEST_PLACEMENT`, over
//!   the GPUs the driver reports), then one child per rank running this same test by its full name
//!   (`module::function`: the name libtest prints), each with its rank, its device and the plan's NCCL
//!   variables. Every wait is bounded: the ranks together get [`LIMIT_VAR`] seconds (default
//!   [`DEFAULT_LIMIT`]); once one rank fails, the others get [`GRACE`] to report what they saw, then
//!   are killed, each after its every thread's stack ([`crate::stacks`]) is added to its output. The
//!   parent prints every rank's output, and fails naming the first rank that failed.
//!   A rank that exits 0 without having run the body (a wrong name) is a failure too.
//! - **In a child** ([`Me::get`] is `Some`): [`Test::run`] joins the communicator of every rank
//!   (`ncclCommInitRank`, rank 0's unique id) on its device and runs the body with a [`World`] of this
//!   one rank; [`Test::run_raw`] runs the body alone, for tests that make their communicators
//!   themselves (configs, several unique ids, new processes that join later).
//!
//! The ranks exchange bytes through files in a directory of the parent's ([`Me::publish`],
//! [`Me::fetch`], [`Me::share_id`], [`Me::barrier`]), every wait bounded by [`EXCHANGE_LIMIT`]. Bodies
//! check against values computed on the host: every rank can compute every rank's input from a seed.
//! [`Job`] is the parent's side for tests that steer the ranks themselves (kill one, wait for a line).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use metrale_gpu_sys::cuda;
use metrale_gpu_sys::nccl::*;

use crate::child::{self, Child, Finished};
use crate::placement::Plan;
use crate::stacks;
use crate::world::{wait_comms, World};

/// The device ordinal of a rank's process.
pub const DEVICE: &str = "METRALE_TEST_DEVICE";
/// How many hosts (simulated ones included) the plan has.
pub const HOSTS: &str = "METRALE_TEST_HOSTS";
/// The directory the ranks exchange files in.
pub const RENDEZVOUS: &str = "METRALE_TEST_RENDEZVOUS";
/// The full name of the test a rank's process runs.
pub const TEST: &str = "METRALE_TEST_NAME";
/// Seconds the ranks of one test get together, overriding [`DEFAULT_LIMIT`].
pub const LIMIT_VAR: &str = "METRALE_TEST_LIMIT_S";
/// With [`stacks::LIMIT`], below the GPU runner's per-test kill (`gpu-nextest.toml`: 300 s), so
/// that the parent reports the rank that hung and where.
pub const DEFAULT_LIMIT: Duration = Duration::from_secs(200);
/// How long the other ranks may run on once one has failed.
pub const GRACE: Duration = Duration::from_secs(15);
/// How long a rank waits for what another rank publishes.
pub const EXCHANGE_LIMIT: Duration = Duration::from_secs(120);
/// The line a rank prints once its body has returned.
const DONE: &str = "METRALE-RANK-DONE";

/// This process as a rank of a multi-process test (from the variables its parent set).
#[derive(Clone, Debug)]
pub struct Me {
    pub rank: usize,
    pub nranks: usize,
    pub device: i32,
    /// Hosts in the plan: more than 1 means the ranks talk through NCCL's network transport.
    pub hosts: usize,
    dir: PathBuf,
}

impl Me {
    /// `Some` in a rank's process of the test `test`, `None` in the parent.
    pub fn get(test: &str) -> Option<Me> {
        let running = std::env::var(TEST).ok()?;
        assert_eq!(
            running, test,
            "a rank's process of test {running:?} is running test {test:?}"
        );
        let num = |name: &str| child::number(name);
        Some(Me {
            rank: num(child::RANK),
            nranks: num(child::NRANKS),
            device: num(DEVICE) as i32,
            hosts: num(HOSTS),
            dir: PathBuf::from(child::var(RENDEZVOUS)),
        })
    }

    /// Makes `bytes` available to every rank under `key` (once per key; written whole, then renamed).
    pub fn publish(&self, key: &str, bytes: &[u8]) {
        let path = self.dir.join(key);
        let part = self.dir.join(format!(".{key}.{}", self.rank));
        std::fs::write(&part, bytes)
            .and_then(|()| std::fs::rename(&part, &path))
            .unwrap_or_else(|e| panic!("rank {}: cannot publish {path:?}: {e}", self.rank));
    }

    /// What some rank published under `key`, waiting up to [`EXCHANGE_LIMIT`].
    pub fn fetch(&self, key: &str) -> Vec<u8> {
        let path = self.dir.join(key);
        let deadline = Instant::now() + EXCHANGE_LIMIT;
        loop {
            if let Ok(bytes) = std::fs::read(&path) {
                return bytes;
            }
            assert!(
                Instant::now() < deadline,
                "rank {}: nothing published as {key:?} within {EXCHANGE_LIMIT:?}: the rank that \
                 publishes it failed or hung (its output is above)",
                self.rank
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A unique id made by rank `root` (`ncclGetUniqueId`) and shared under `key` with every rank that
    /// asks for it.
    pub fn share_id(&self, key: &str, root: usize) -> NcclUniqueId {
        if self.rank == root {
            let id = NcclUniqueId::new().expect("ncclGetUniqueId");
            self.publish(key, &id.to_bytes());
            id
        } else {
            self.fetch_id(key)
        }
    }

    /// A unique id some rank published under `key` (one of [`Me::share_id`]'s, or one from
    /// `ncclCommGetUniqueId`), waiting as [`Me::fetch`] does.
    pub fn fetch_id(&self, key: &str) -> NcclUniqueId {
        let bytes: [u8; NcclUniqueId::BYTES] =
            self.fetch(key).try_into().unwrap_or_else(|b: Vec<u8>| {
                panic!(
                    "{key}: a unique id of {} bytes, expected {}",
                    b.len(),
                    NcclUniqueId::BYTES
                )
            });
        NcclUniqueId::from_bytes(bytes)
    }

    /// Returns once every rank has reached the barrier `name` (each name used once per test).
    pub fn barrier(&self, name: &str) {
        self.publish(&format!("{name}.{}", self.rank), &[]);
        for k in 0..self.nranks {
            self.fetch(&format!("{name}.{k}"));
        }
    }

    /// This rank's communicator over all ranks: blocking `ncclCommInitRank` on its device, with rank 0's
    /// unique id.
    pub fn join(&self) -> World {
        self.join_id("world-id")
    }

    /// [`Me::join`] with the unique id shared under `key`: a second communicator over all ranks needs
    /// an id (and a key) of its own.
    pub fn join_id(&self, key: &str) -> World {
        let id = self.share_id(key, 0);
        cuda::use_device(self.device, "join").expect("use_device");
        let mut comm: NcclComm = std::ptr::null_mut();
        // SAFETY: writes one handle; rank `rank` of `nranks` on the current device.
        let res = unsafe { ncclCommInitRank(&mut comm, self.nranks as i32, id, self.rank as i32) };
        check_nccl(res, "ncclCommInitRank").unwrap_or_else(|e| {
            panic!(
                "rank {} of {} on GPU {}: {e}",
                self.rank, self.nranks, self.device
            )
        });
        World::from_comms(vec![comm], true)
    }

    /// [`Me::join`] with `ncclCommInitRankConfig` and `config`; a non-blocking config is polled until
    /// ready (bounded). Returns what the init call returned too (`ncclInProgress` when non-blocking).
    pub fn join_config(&self, config: NcclConfig) -> Result<(World, NcclResult), GpuError> {
        self.join_config_id("world-id", config)
    }

    /// [`Me::join_config`] with the unique id shared under `key` (see [`Me::join_id`]).
    pub fn join_config_id(
        &self,
        key: &str,
        mut config: NcclConfig,
    ) -> Result<(World, NcclResult), GpuError> {
        let id = self.share_id(key, 0);
        cuda::use_device(self.device, "join").expect("use_device");
        let blocking = config.blocking != 0;
        let mut comm: NcclComm = std::ptr::null_mut();
        // SAFETY: writes one handle; the config lives across the call.
        let res = unsafe {
            ncclCommInitRankConfig(
                &mut comm,
                self.nranks as i32,
                id,
                self.rank as i32,
                &mut config,
            )
        };
        if blocking || res != NcclResult::ncclInProgress {
            check_nccl(res, "ncclCommInitRankConfig")?;
        }
        wait_comms(&[comm], "ncclCommInitRankConfig")?;
        Ok((World::from_comms(vec![comm], blocking), res))
    }

    /// Prints the line [`expect_ranks_ok`] looks for: the body ran to its end. [`Test::run_raw`]
    /// prints it; a test that steers its ranks with [`Job`] calls it at the end of a rank's body.
    pub fn done(&self) {
        println!("\n{DONE} rank {}", self.rank);
    }
}

/// A multi-process test, built up then run (see the module's docs).
pub struct Test {
    name: String,
    ranks: Option<usize>,
    env: Vec<(&'static str, String)>,
}

/// The test of this full name (`module::function`, as libtest names it).
pub fn test(name: &str) -> Test {
    Test {
        name: name.to_string(),
        ranks: None,
        env: Vec::new(),
    }
}

impl Test {
    /// Exactly `n` ranks, whatever `METRALE_TEST_RANKS` says (a case of a fixed size).
    pub fn ranks(mut self, n: usize) -> Test {
        self.ranks = Some(n);
        self
    }

    /// A variable for every rank's process.
    pub fn env(mut self, name: &'static str, value: impl Into<String>) -> Test {
        self.env.push((name, value.into()));
        self
    }

    /// The plan this test runs under, in the parent: the environment's, with [`Test::ranks`] applied.
    pub fn plan(&self) -> Plan {
        let plan = plan();
        match self.ranks {
            Some(n) => plan
                .with_ranks(n)
                .unwrap_or_else(|e| panic!("{}: {e}", self.name)),
            None => plan,
        }
    }

    /// In a child: joins ([`Me::join`]) and runs `body` with this rank's world. In the parent: runs
    /// the ranks and fails unless every one passed.
    pub fn run(self, body: impl FnOnce(&Me, &World)) {
        self.run_raw(|me| {
            let world = me.join();
            body(me, &world);
        });
    }

    /// As [`Test::run`], but the body makes its own communicators.
    pub fn run_raw(self, body: impl FnOnce(&Me)) {
        if let Some(me) = Me::get(&self.name) {
            println!(
                "rank {} of {}: GPU {}, {} host(s), {}",
                me.rank,
                me.nranks,
                me.device,
                me.hosts,
                [
                    "NCCL_HOSTID",
                    "NCCL_SOCKET_IFNAME",
                    "NCCL_MULTI_RANK_GPU_ENABLE"
                ]
                .map(|v| format!("{v}={}", std::env::var(v).unwrap_or_default()))
                .join(" ")
            );
            body(&me);
            me.done();
            return;
        }
        let plan = self.plan();
        let job = Job::start(&self.name, plan, &self.env);
        let done = job.wait(limit());
        expect_ranks_ok(&self.name, &plan, &done);
    }
}

/// The plan of the environment over this host's GPUs, after the GPU preamble; a request no placement
/// can meet fails the test with what to change.
pub fn plan() -> Plan {
    let gpus = crate::gpu::gpus();
    let library = metrale_gpu_sys::version::library_version().expect("ncclGetVersion");
    Plan::from_env(gpus, library).unwrap_or_else(|e| panic!("{e}"))
}

/// [`LIMIT_VAR`] seconds, else [`DEFAULT_LIMIT`].
pub fn limit() -> Duration {
    std::env::var(LIMIT_VAR)
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(DEFAULT_LIMIT, Duration::from_secs)
}

/// The ranks of one test, running: the parent's side.
pub struct Job {
    pub plan: Plan,
    /// Rank r's process at index r.
    pub children: Vec<Child>,
    dir: PathBuf,
}

impl Job {
    /// Starts one process per rank of `plan`, each running the test `test` with `env` added.
    pub fn start(test: &str, plan: Plan, env: &[(&'static str, String)]) -> Job {
        let dir = rendezvous_dir(test);
        println!("{test}: {plan}");
        let children = (0..plan.ranks())
            .map(|rank| {
                let place = plan.place(rank);
                let mut vars = plan.nccl_env(rank);
                vars.extend([
                    (child::RANK, rank.to_string()),
                    (child::NRANKS, plan.ranks().to_string()),
                    (DEVICE, place.device.to_string()),
                    (HOSTS, plan.hosts().to_string()),
                    (RENDEZVOUS, dir.display().to_string()),
                    (TEST, test.to_string()),
                ]);
                vars.extend(env.iter().cloned());
                let name = format!("rank {rank} (GPU {}, host {})", place.device, place.host);
                child::start(&name, child::test_command(test, &vars))
            })
            .collect();
        Job {
            plan,
            children,
            dir,
        }
    }

    /// The directory the ranks exchange files in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Waits for every rank until `limit`; once one has failed (a non-zero status, or killed), the
    /// others get [`GRACE`], then are killed. Rank r's result at index r.
    pub fn wait(self, limit: Duration) -> Vec<Finished> {
        self.wait_grace(limit, GRACE)
    }

    /// [`Job::wait`] with another grace: a test whose survivors wait out a deadline of their own.
    pub fn wait_grace(mut self, limit: Duration, grace: Duration) -> Vec<Finished> {
        let deadline = Instant::now() + limit;
        let mut cut = deadline;
        let mut ended: Vec<Option<std::process::ExitStatus>> = vec![None; self.children.len()];
        loop {
            for (r, c) in self.children.iter_mut().enumerate() {
                if ended[r].is_none() {
                    ended[r] = c.poll();
                    if ended[r].is_some_and(|s| !s.success()) && cut == deadline {
                        println!("{} failed: the other ranks get {grace:?} more", c.name);
                        cut = deadline.min(Instant::now() + grace);
                    }
                }
            }
            if ended.iter().all(Option::is_some) || Instant::now() >= cut {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let reason = if cut == deadline {
            format!("still running after the limit of {limit:?}")
        } else {
            "still running after another rank failed".to_string()
        };
        // Where each rank still running is stuck, taken from all of them at once, before the kill.
        let stuck: Vec<usize> = (0..self.children.len())
            .filter(|&r| self.children[r].poll().is_none())
            .collect();
        for &r in &stuck {
            println!(
                "{} {reason}: its stacks, then killing it",
                self.children[r].name
            );
        }
        let pids: Vec<u32> = stuck.iter().map(|&r| self.children[r].pid()).collect();
        let mut stacks = vec![String::new(); self.children.len()];
        for (r, text) in stuck.into_iter().zip(stacks::capture(&pids)) {
            stacks[r] = text;
        }
        self.children
            .drain(..)
            .zip(stacks)
            .map(|(mut c, stacks)| {
                let status = c.wait_exit(Duration::ZERO);
                let output = c.output() + &stacks;
                Finished {
                    name: c.name.clone(),
                    status,
                    output,
                }
            })
            .collect()
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        // Children still running are killed by their own drop; the exchanged files go.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A fresh directory for the ranks of `test` to exchange files in.
fn rendezvous_dir(test: &str) -> PathBuf {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let name: String = test
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let dir = std::env::temp_dir().join(format!(
        "metrale-ranks-{}-{stamp}-{name}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {dir:?}: {e}"));
    dir
}

/// Prints every rank's output, then fails unless every rank exited 0 having run the body; the message
/// names the ranks that failed and ends with the first one's last lines.
pub fn expect_ranks_ok(test: &str, plan: &Plan, done: &[Finished]) {
    for f in done {
        println!(
            "===== {test}: {} exited with {:?} =====\n{}===== end of {} =====",
            f.name, f.status, f.output, f.name
        );
    }
    let bad: Vec<&Finished> = done
        .iter()
        .filter(|f| !f.ok() || !f.output.contains(DONE))
        .collect();
    // The rank to show: one that failed by itself rather than one killed while it waited for it.
    let Some(first) = bad.iter().find(|f| f.status.is_some()).or(bad.first()) else {
        println!("{test}: every rank passed ({plan})");
        return;
    };
    let verdict = |f: &Finished| match f.status {
        Some(s) if s.success() => format!(
            "{} exited 0 without running the body (is {test:?} this test's full name?)",
            f.name
        ),
        Some(s) => format!("{} exited with {s}", f.name),
        None => format!(
            "{} was killed (it hung, or waited for a failed rank)",
            f.name
        ),
    };
    let tail: Vec<&str> = first.output.lines().rev().take(30).collect();
    panic!(
        "{test} ({plan}): {}\nlast lines of {}:\n{}",
        bad.iter()
            .map(|f| verdict(f))
            .collect::<Vec<_>>()
            .join("; "),
        first.name,
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::Mode;
    use metrale_gpu_sys::version::NcclVersion;

    fn plan(ranks: usize) -> Plan {
        Plan::new(ranks, 1, Mode::Hosts, NcclVersion::HEADERS).unwrap()
    }

    /// The ranks' side of the tests below (nothing outside a rank's process): every rank publishes its
    /// number and reads every other's.
    #[test]
    fn ranks_exchange() {
        let Some(me) = Me::get("ranks::tests::ranks_exchange") else {
            return;
        };
        me.publish(
            &format!("hello.{}", me.rank),
            me.rank.to_string().as_bytes(),
        );
        for k in 0..me.nranks {
            assert_eq!(me.fetch(&format!("hello.{k}")), k.to_string().as_bytes());
        }
        me.barrier("end");
        println!("rank {} read every rank's number", me.rank);
        me.done();
    }

    /// A rank's side: rank 1 fails, the others wait for what it never publishes.
    #[test]
    fn rank_one_fails() {
        let Some(me) = Me::get("ranks::tests::rank_one_fails") else {
            return;
        };
        assert_ne!(me.rank, 1, "rank 1 fails on purpose");
        me.fetch("never");
    }

    #[test]
    fn a_job_passes_when_every_rank_passes() {
        let job = Job::start("ranks::tests::ranks_exchange", plan(4), &[]);
        let done = job.wait(Duration::from_secs(60));
        expect_ranks_ok("ranks_exchange", &plan(4), &done);
        for (r, f) in done.iter().enumerate() {
            assert!(
                f.output
                    .contains(&format!("rank {r} read every rank's number")),
                "{}",
                f.output
            );
        }
    }

    fn failure(test: &str, done: &[Finished]) -> String {
        let err = std::panic::catch_unwind(|| expect_ranks_ok(test, &plan(done.len()), done))
            .expect_err("the job must fail");
        err.downcast_ref::<String>().cloned().unwrap_or_default()
    }

    #[test]
    fn a_failing_rank_fails_the_job_within_the_grace() {
        let job = Job::start("ranks::tests::rank_one_fails", plan(3), &[]);
        let started = Instant::now();
        let grace = Duration::from_secs(1);
        let done = job.wait_grace(Duration::from_secs(100), grace);
        // Rank 1's own exit (a process start and a panic), the grace and the stacks of the two waiting
        // ranks: far below the limit.
        assert!(started.elapsed() < grace + stacks::LIMIT + Duration::from_secs(30));
        assert!(done[1].status.is_some_and(|s| !s.success()));
        assert!(
            done[0].status.is_none() && done[2].status.is_none(),
            "the waiting ranks are killed"
        );
        let msg = failure("rank_one_fails", &done);
        assert!(msg.contains("rank 1 (GPU 0, host 1) exited with"), "{msg}");
        assert!(msg.contains("rank 0 (GPU 0, host 0) was killed"), "{msg}");
        assert!(
            msg.contains("last lines of rank 1 (GPU 0, host 1)"),
            "{msg}"
        );
        // The failure shows the last lines only; where the panic's own line falls among them depends on
        // how the child's stdout and stderr interleave (a backtrace follows it), so it is looked for in
        // the whole output.
        assert!(
            done[1].output.contains("rank 1 fails on purpose"),
            "{}",
            done[1].output
        );
    }

    #[test]
    fn a_rank_that_runs_no_body_is_a_failure() {
        let job = Job::start("ranks::tests::no_such_test", plan(2), &[]);
        let done = job.wait(Duration::from_secs(60));
        assert!(
            done.iter().all(Finished::ok),
            "libtest runs no test and exits 0"
        );
        let msg = failure("ranks::tests::no_such_test", &done);
        assert!(msg.contains("exited 0 without running the body"), "{msg}");
    }

    /// A rank's side: sleeps until it is killed.
    #[test]
    fn rank_sleeps() {
        let Some(me) = Me::get("ranks::tests::rank_sleeps") else {
            return;
        };
        println!("SLEEPING rank {}", me.rank);
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }

    #[test]
    fn a_stuck_rank_shows_its_stacks() {
        if let Err(why) = stacks::available() {
            crate::skip::skip(format!(
                "no debugger that sees the ranks' own frames: {why}"
            ));
            return;
        }
        let job = Job::start("ranks::tests::rank_sleeps", plan(2), &[]);
        for c in &job.children {
            let started = c.wait_line("SLEEPING", Duration::from_secs(60));
            assert!(started.is_some(), "{} did not start", c.name);
        }
        let done = job.wait(Duration::ZERO);
        for f in &done {
            assert!(f.status.is_none(), "{} is killed", f.name);
            // Each rank's output holds its own stacks: the sleeping thread's frames by name.
            for frame in ["nanosleep", "ranks::tests::rank_sleeps"] {
                assert!(
                    f.output.contains(frame),
                    "{}: no {frame}:\n{}",
                    f.name,
                    f.output
                );
            }
        }
    }

    /// The GPU runner's nextest kill (period x terminate-after of gpu-nextest.toml's first
    /// slow-timeout, the one of every test but the peer-kill test) comes after this harness's limit and
    /// the stacks, with time to spare for the kill and the printing.
    #[test]
    fn the_runners_kill_comes_after_the_limit_and_the_stacks() {
        let toml = include_str!("../gpu-nextest.toml");
        let line = toml
            .lines()
            .find(|l| l.starts_with("slow-timeout"))
            .expect("a slow-timeout in gpu-nextest.toml");
        let number = |key: &str| -> u64 {
            let rest =
                &line[line.find(key).unwrap_or_else(|| panic!("{key} in {line}")) + key.len()..];
            let digits: String = rest
                .trim_start_matches([' ', '=', '"'])
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().unwrap_or_else(|_| panic!("{key} in {line}"))
        };
        let kill = Duration::from_secs(number("period") * number("terminate-after"));
        let ours = DEFAULT_LIMIT + stacks::LIMIT + Duration::from_secs(30);
        assert!(
            ours <= kill,
            "{ours:?} (limit, stacks, 30 s to kill and print) > nextest's {kill:?}: {line}"
        );
    }

    /// A rank's side: prints what its parent set.
    #[test]
    fn rank_prints_its_place() {
        let Some(me) = Me::get("ranks::tests::rank_prints_its_place") else {
            return;
        };
        let var = |name: &str| std::env::var(name).unwrap_or_default();
        println!(
            "PLACE rank={} nranks={} device={} hosts={} hostid={} ifname={} extra={}",
            me.rank,
            me.nranks,
            me.device,
            me.hosts,
            var("NCCL_HOSTID"),
            var("NCCL_SOCKET_IFNAME"),
            var("EXTRA")
        );
        me.done();
    }

    #[test]
    fn the_placement_reaches_each_rank() {
        let plan = Plan::new(3, 2, Mode::Hosts, NcclVersion::HEADERS).unwrap();
        let job = Job::start(
            "ranks::tests::rank_prints_its_place",
            plan,
            &[("EXTRA", "x".into())],
        );
        let dir = job.dir().to_path_buf();
        assert!(dir.is_dir());
        let done = job.wait(Duration::from_secs(60));
        expect_ranks_ok("rank_prints_its_place", &plan, &done);
        assert!(!dir.exists(), "the exchange directory goes with the job");
        // 3 ranks on 2 GPUs: hosts of 2 GPUs, rank 2 alone on the second.
        for (r, (device, host)) in [(0, 0), (1, 0), (0, 1)].into_iter().enumerate() {
            let want = format!(
                "PLACE rank={r} nranks=3 device={device} hosts=2 hostid=metrale-simulated-host-{host} \
                 ifname=lo extra=x"
            );
            assert!(done[r].output.contains(&want), "{want}\n{}", done[r].output);
        }
    }
}
