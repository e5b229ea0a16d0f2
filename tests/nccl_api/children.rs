//! Other processes: this test binary run again on `child_process_entry` with a scenario in its
//! environment (a new rank, or a fresh NCCL environment: `NCCL_DEBUG` is read once per process), and
//! the elastic example. Their output lines arrive on a channel and are kept for the report.
// TODO(lead): use testkit. A stand-in for the shared crate's child processes until the merge.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The test that children run, and the variable naming their scenario.
pub const ENTRY: &str = "child_process_entry";
pub const SCENARIO: &str = "METRALE_NCCL_API_CHILD";

pub struct Proc {
    pub name: String,
    child: Child,
    lines: Receiver<String>,
    log: Arc<Mutex<String>>,
}

/// Runs this test binary's `child_process_entry` in `scenario`, with `env` added and `remove` removed
/// (and `NCCL_NVLS_ENABLE=0` always).
pub fn spawn_child(name: &str, scenario: &str, env: &[(&str, String)], remove: &[&str]) -> Proc {
    let exe = std::env::current_exe().expect("the test binary's path");
    let args = [
        ENTRY,
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]
    .map(String::from);
    let mut env = env.to_vec();
    env.push((SCENARIO, scenario.to_string()));
    spawn(name, &exe, &args, &env, remove)
}

/// Runs `program` with `args`, `env` added (and `NCCL_NVLS_ENABLE=0`), `remove` removed.
pub fn spawn(
    name: &str,
    program: &Path,
    args: &[String],
    env: &[(&str, String)],
    remove: &[&str],
) -> Proc {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("NCCL_NVLS_ENABLE", "0")
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    for k in remove {
        cmd.env_remove(k);
    }
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {name} ({}): {e}", program.display()));
    let (tx, lines) = mpsc::channel();
    let log = Arc::new(Mutex::new(String::new()));
    let stdout: Box<dyn Read + Send> = Box::new(child.stdout.take().expect("piped stdout"));
    let stderr: Box<dyn Read + Send> = Box::new(child.stderr.take().expect("piped stderr"));
    for (pipe, prefix) in [(stdout, ""), (stderr, "[stderr] ")] {
        let (tx, log) = (tx.clone(), Arc::clone(&log));
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let line = format!("{prefix}{line}");
                if let Ok(mut log) = log.lock() {
                    log.push_str(&line);
                    log.push('\n');
                }
                let _ = tx.send(line);
            }
        });
    }
    Proc {
        name: name.to_string(),
        child,
        lines,
        log,
    }
}

impl Proc {
    /// The next line containing `needle`, or `None` after `timeout`.
    pub fn wait_line(&self, needle: &str, timeout: Duration) -> Option<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return Some(line),
                Ok(_) => {}
                Err(_) => return None,
            }
        }
    }

    /// SIGKILL (`Child::kill`), then reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Its exit status, or `None` when it was still running after `limit` (then it is killed).
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                std::thread::sleep(Duration::from_millis(100)); // let the readers drain the pipes
                return Some(status);
            }
            if Instant::now() > deadline {
                eprintln!("{} still running after {limit:?}: killing it", self.name);
                self.kill();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Everything it printed so far.
    pub fn output(&self) -> String {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    pub fn dump(&self) {
        println!(
            "===== {} =====\n{}===== end of {} =====",
            self.name,
            self.output(),
            self.name
        );
    }

    /// Waits for the exit; fails the test, with its output, unless it exited with 0.
    pub fn expect_success(&mut self, limit: Duration) {
        let status = self.wait_exit(limit);
        self.dump();
        assert!(
            status.is_some_and(|s| s.success()),
            "{} exited with {status:?} (None: killed after {limit:?})",
            self.name
        );
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // Never leave one behind (it is ours: we started it).
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

/// A variable of a child's environment.
pub fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("child process without {name}"))
}
