//! Child processes: a test binary runs itself again, as one of the roles its entry point knows, for
//! tests that need separate processes (a rank per process, a peer to kill, an input that may crash) or a
//! fresh NCCL environment (`NCCL_DEBUG`, `NCCL_P2P_DISABLE`, ... are read once per process).
//!
//! Each test binary that starts children defines the entry point, an `#[ignore]`d test named [`ENTRY`]
//! that dispatches on [`role()`]. A child runs with `NCCL_NVLS_ENABLE=0` whatever the parent has.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use metrale_gpu_sys::nccl::NcclUniqueId;

/// The name of the entry-point test every such binary defines.
pub const ENTRY: &str = "child_entry";
/// The variable that tells the entry point which role to play.
pub const ROLE: &str = "METRALE_TEST_CHILD";
/// A child's rank, for roles that have one.
pub const RANK: &str = "METRALE_TEST_RANK";
/// How many ranks, for roles that have ranks.
pub const NRANKS: &str = "METRALE_TEST_NRANKS";
/// Rank 0's unique id (hex), given to the other ranks.
pub const UNIQUE_ID: &str = "METRALE_TEST_UNIQUE_ID";
/// The line on which rank 0 hands its unique id to the parent.
const ID_LINE: &str = "METRALE-UNIQUE-ID=";

/// The role this process was started in, `None` in the parent.
pub fn role() -> Option<String> {
    std::env::var(ROLE).ok()
}

/// A variable of the child's environment.
pub fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("child process without {name}"))
}

/// [`var`] as a number.
pub fn number(name: &str) -> usize {
    let v = var(name);
    v.parse()
        .unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
}

/// Rank 0 makes the unique id and prints it for the parent; the other ranks read it from
/// [`UNIQUE_ID`]. Rank 0's line starts with a newline: libtest prints `test child_entry ... ` unended.
pub fn unique_id(rank: usize) -> NcclUniqueId {
    if rank == 0 {
        let id = NcclUniqueId::new().expect("ncclGetUniqueId");
        println!("\n{ID_LINE}{}", crate::hex::encode(&id.to_bytes()));
        std::io::stdout().flush().expect("flush stdout");
        id
    } else {
        let bytes = crate::hex::decode(&var(UNIQUE_ID)).expect("the unique id in hex");
        let bytes: [u8; NcclUniqueId::BYTES] = bytes
            .try_into()
            .unwrap_or_else(|b: Vec<u8>| panic!("a unique id of {} bytes", b.len()));
        NcclUniqueId::from_bytes(bytes)
    }
}

/// A running child: this test binary running [`ENTRY`] in a role. Its stdout and stderr lines arrive,
/// with the moment they were read, for [`Child::wait_line`], and are all kept for [`Child::output`].
pub struct Child {
    pub name: String,
    process: std::process::Child,
    lines: Receiver<(Instant, String)>,
    log: Arc<Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
}

/// Starts this test binary as `role`, with `env` added.
pub fn spawn(name: &str, role: &str, env: &[(&str, String)]) -> Child {
    start(name, command(role, env))
}

/// This test binary running [`ENTRY`] as `role`, with `env` added: for a child that needs more than
/// [`spawn`] sets (a variable removed, say), started with [`start`].
pub fn command(role: &str, env: &[(&str, String)]) -> Command {
    let mut cmd = test_command(ENTRY, env);
    cmd.env(ROLE, role);
    cmd
}

/// This test binary running only the test named `test` (its full name, `module::function`, ignored or
/// not), with `env` added.
pub fn test_command(test: &str, env: &[(&str, String)]) -> Command {
    let mut cmd = this_binary();
    cmd.args([
        test,
        "--exact",
        "--include-ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// Set in the child [`alone`] starts: the test it runs.
const ALONE: &str = "METRALE_TEST_ALONE";

/// For a test that needs its process to itself (no other test's thread calling NCCL meanwhile, as
/// `check_nccl_with_last_error`'s contract asks): `true` in a child that runs this test alone (one test,
/// one thread: the test's body then runs there), `false` in the caller once that child passed (panics
/// with its output otherwise). `test` is the test's full name, `module::function`.
pub fn alone(test: &str) -> bool {
    if std::env::var(ALONE).as_deref() == Ok(test) {
        return true;
    }
    let text = passed(test, test_command(test, &[(ALONE, test.to_string())]));
    print!("{text}");
    false
}

/// Runs `cmd`, a [`test_command`] for `test`, to its end: its output, once the child passed its one
/// test; panics with that output otherwise.
pub fn passed(test: &str, mut cmd: Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot start {test} in a child: {e}"));
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && text.contains("1 passed"),
        "{test} failed in its child:\n{text}"
    );
    text
}

/// This test binary, as this machine runs it: through the target's cargo runner where one is set
/// (`CARGO_TARGET_<TRIPLE>_RUNNER`, qemu-user when cross-testing: the kernel cannot run it itself).
pub fn this_binary() -> Command {
    let exe = std::env::current_exe().expect("the test binary's path");
    let runner = runner().unwrap_or_default();
    let mut words = runner.split_whitespace();
    match words.next() {
        Some(program) => {
            let mut cmd = Command::new(program);
            cmd.args(words).arg(exe);
            cmd
        }
        None => Command::new(exe),
    }
}

/// The target's cargo runner (`CARGO_TARGET_<TRIPLE>_RUNNER`), where one is set.
pub fn runner() -> Option<String> {
    let var = format!(
        "CARGO_TARGET_{}_RUNNER",
        crate::deps::target().to_uppercase().replace('-', "_")
    );
    std::env::var(var).ok().filter(|r| !r.trim().is_empty())
}

/// Starts `cmd` (from [`command`], or another program such as an example) as the child `name`, with
/// `NCCL_NVLS_ENABLE=0`, its output collected as for every child.
pub fn start(name: &str, cmd: Command) -> Child {
    let shown = format!("{cmd:?}");
    try_start(name, cmd).unwrap_or_else(|e| panic!("cannot start child {name} ({shown}): {e}"))
}

/// [`start`] for a program that may be missing: the error where it cannot be started.
pub fn try_start(name: &str, mut cmd: Command) -> std::io::Result<Child> {
    cmd.env("NCCL_NVLS_ENABLE", "0")
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut process = cmd.spawn()?;
    let (tx, lines) = mpsc::channel();
    let log = Arc::new(Mutex::new(String::new()));
    let stdout = process.stdout.take().expect("piped stdout");
    let stderr = process.stderr.take().expect("piped stderr");
    let pipes: [(Box<dyn Read + Send>, &str); 2] =
        [(Box::new(stdout), ""), (Box::new(stderr), "[stderr] ")];
    let readers = pipes
        .into_iter()
        .map(|(pipe, prefix)| {
            let (tx, log) = (tx.clone(), Arc::clone(&log));
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    let line = format!("{prefix}{line}");
                    if let Ok(mut l) = log.lock() {
                        l.push_str(&line);
                        l.push('\n');
                    }
                    let _ = tx.send((Instant::now(), line));
                }
            })
        })
        .collect();
    Ok(Child {
        name: name.to_string(),
        process,
        lines,
        log,
        readers,
    })
}

impl Child {
    /// The first line (from now on) containing `needle`, and when it was read; `None` after `timeout`.
    pub fn wait_line(&self, needle: &str, timeout: Duration) -> Option<(Instant, String)> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((at, line)) if line.contains(needle) => return Some((at, line)),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return None,
            }
        }
    }

    /// The unique id rank 0 printed (see [`unique_id`]), in hex; `None` after `timeout`.
    pub fn wait_unique_id(&self, timeout: Duration) -> Option<String> {
        let (_, line) = self.wait_line(ID_LINE, timeout)?;
        line.split(ID_LINE).nth(1).map(|hex| hex.trim().to_string())
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.process.id()
    }

    /// Its exit status if it has exited, without waiting.
    pub fn poll(&mut self) -> Option<ExitStatus> {
        self.process.try_wait().ok().flatten()
    }

    /// SIGKILL, then reaps it.
    pub fn kill(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }

    /// Waits until it exits or `limit` passes (then kills it): its status, `None` if it was killed.
    /// Once it has exited, everything it wrote is in [`Child::output`].
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.process.try_wait() {
                for reader in self.readers.drain(..) {
                    let _ = reader.join();
                }
                return Some(status);
            }
            if Instant::now() > deadline {
                eprintln!(
                    "child {} still running after {limit:?}: killing it",
                    self.name
                );
                self.kill();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn output(&self) -> String {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// Prints everything it wrote, framed by its name.
    pub fn dump(&self) {
        println!(
            "===== child {} =====\n{}===== end of {} =====",
            self.name,
            self.output(),
            self.name
        );
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        // Never leave one behind (it is ours: we started it).
        if let Ok(None) = self.process.try_wait() {
            self.kill();
        }
    }
}

/// A child that has ended: its status (`None`: killed at the time limit) and everything it wrote.
pub struct Finished {
    pub name: String,
    pub status: Option<ExitStatus>,
    pub output: String,
}

impl Finished {
    pub fn ok(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
}

/// Waits for every child until `limit` from now; kills whatever is still running then.
pub fn wait_all(children: Vec<Child>, limit: Duration) -> Vec<Finished> {
    let deadline = Instant::now() + limit;
    children
        .into_iter()
        .map(|mut c| {
            let status = c.wait_exit(deadline.saturating_duration_since(Instant::now()));
            Finished {
                name: c.name.clone(),
                status,
                output: c.output(),
            }
        })
        .collect()
}

/// One process per rank in `role`: rank 0 first; once it prints its unique id, the others with the id.
/// Every child gets [`RANK`], [`NRANKS`] and `env`.
pub fn run_ranks(
    role: &str,
    nranks: usize,
    env: &[(&str, String)],
    limit: Duration,
) -> Vec<Finished> {
    let start = |rank: usize, extra: Option<(&'static str, String)>| {
        let mut env = env.to_vec();
        env.push((RANK, rank.to_string()));
        env.push((NRANKS, nranks.to_string()));
        env.extend(extra);
        spawn(&format!("{role} rank {rank}"), role, &env)
    };
    let first = start(0, None);
    let Some(id) = first.wait_unique_id(Duration::from_secs(60)) else {
        let done = wait_all(vec![first], Duration::from_secs(1));
        panic!(
            "rank 0 printed no unique id within 60 s; its output:\n{}",
            done[0].output
        );
    };
    let mut running = vec![first];
    running.extend((1..nranks).map(|rank| start(rank, Some((UNIQUE_ID, id.clone())))));
    wait_all(running, limit)
}

/// Prints every child's output and fails unless all exited with status 0.
pub fn expect_success(what: &str, done: &[Finished]) {
    for f in done {
        println!(
            "===== {what}: {} exited with {:?} =====\n{}",
            f.name, f.status, f.output
        );
    }
    let failed: Vec<String> = done
        .iter()
        .filter(|f| !f.ok())
        .map(|f| format!("{} ({:?})", f.name, f.status))
        .collect();
    assert!(failed.is_empty(), "{what}: {} failed", failed.join(", "));
}
