//! Child processes: the test binary runs itself again (`child_process_entry`), with the scenario and
//! the rank in its environment, for tests that need separate processes or a fresh NCCL environment
//! (`NCCL_DEBUG`, `NCCL_P2P_DISABLE`, ... are read once per process).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The test that children run: its name in the test binary.
pub const ENTRY: &str = "child_process_entry";
/// Environment of a child: which scenario, its rank, how many ranks, and (ranks > 0) the unique id.
pub const SCENARIO: &str = "METRALE_GPU_CHILD";
pub const RANK: &str = "METRALE_GPU_RANK";
pub const NRANKS: &str = "METRALE_GPU_NRANKS";
pub const UNIQUE_ID: &str = "METRALE_GPU_UNIQUE_ID";
/// The line on which rank 0 hands its unique id to the parent, which passes it on to the other ranks.
pub const ID_LINE: &str = "METRALE_UNIQUE_ID=";

pub struct Running {
    rank: usize,
    child: Child,
    output: JoinHandle<String>,
}

pub struct Finished {
    pub rank: usize,
    pub status: Option<ExitStatus>,
    pub output: String,
}

impl Finished {
    pub fn ok(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
}

/// Starts the test binary as rank `rank` of `nranks` in `scenario`, with `env` added (and
/// `NCCL_NVLS_ENABLE=0` always). Its stdout and stderr are collected; `id_tx` receives the unique id
/// when the child prints it.
pub fn spawn(
    scenario: &str,
    rank: usize,
    nranks: usize,
    env: &[(&str, String)],
    id_tx: Option<mpsc::Sender<String>>,
) -> Running {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut cmd = Command::new(exe);
    cmd.args([
        ENTRY,
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(SCENARIO, scenario)
    .env(RANK, rank.to_string())
    .env(NRANKS, nranks.to_string())
    .env("NCCL_NVLS_ENABLE", "0")
    .env("RUST_BACKTRACE", "1")
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start child {scenario} rank {rank}: {e}"));
    let stdout = child.stdout.take().expect("piped stdout");
    let stderr = child.stderr.take().expect("piped stderr");
    let err_reader = std::thread::spawn(move || {
        let mut text = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            text.push_str(&line);
            text.push('\n');
        }
        text
    });
    let output = std::thread::spawn(move || {
        let mut text = String::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            // libtest prints "test child_process_entry ... " without a newline first: the id may
            // follow it on the same line.
            if let (Some(hex), Some(tx)) = (line.split(ID_LINE).nth(1), id_tx.as_ref()) {
                let _ = tx.send(hex.trim().to_string());
            }
            text.push_str(&line);
            text.push('\n');
        }
        let err = err_reader.join().unwrap_or_default();
        if !err.is_empty() {
            text.push_str("--- stderr ---\n");
            text.push_str(&err);
        }
        text
    });
    Running {
        rank,
        child,
        output,
    }
}

/// Waits for every child until `limit`; kills (its own children only) whatever is still running then.
pub fn wait_all(mut running: Vec<Running>, limit: Duration) -> Vec<Finished> {
    let deadline = Instant::now() + limit;
    let mut statuses: Vec<Option<ExitStatus>> = vec![None; running.len()];
    loop {
        for (i, r) in running.iter_mut().enumerate() {
            if statuses[i].is_none() {
                statuses[i] = r.child.try_wait().ok().flatten();
            }
        }
        if statuses.iter().all(Option::is_some) {
            break;
        }
        if Instant::now() > deadline {
            for (i, r) in running.iter_mut().enumerate() {
                if statuses[i].is_none() {
                    eprintln!(
                        "child rank {} still running after {limit:?}: killing it",
                        r.rank
                    );
                    let _ = r.child.kill();
                    let _ = r.child.wait();
                }
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    running
        .into_iter()
        .zip(statuses)
        .map(|(r, status)| Finished {
            rank: r.rank,
            status,
            output: r.output.join().unwrap_or_else(|_| "(output lost)".into()),
        })
        .collect()
}

/// One process per rank: rank 0 first; once it prints its unique id, the others with the id.
pub fn run_ranks(
    scenario: &str,
    nranks: usize,
    env: &[(&str, String)],
    limit: Duration,
) -> Vec<Finished> {
    let (tx, rx) = mpsc::channel();
    let first = spawn(scenario, 0, nranks, env, Some(tx));
    let id = match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(id) => id,
        Err(_) => {
            let done = wait_all(vec![first], Duration::from_secs(1));
            panic!(
                "rank 0 printed no unique id within 60 s; its output:\n{}",
                done[0].output
            );
        }
    };
    let mut running = vec![first];
    for rank in 1..nranks {
        let mut env: Vec<(&str, String)> = env.to_vec();
        env.push((UNIQUE_ID, id.clone()));
        running.push(spawn(scenario, rank, nranks, &env, None));
    }
    wait_all(running, limit)
}

/// Prints every child's output and fails unless all exited with status 0.
pub fn expect_success(what: &str, done: &[Finished]) {
    for f in done {
        println!(
            "===== {what}: rank {} exited with {:?} =====\n{}",
            f.rank, f.status, f.output
        );
    }
    let failed: Vec<String> = done
        .iter()
        .filter(|f| !f.ok())
        .map(|f| format!("rank {} ({:?})", f.rank, f.status))
        .collect();
    assert!(failed.is_empty(), "{what}: {} failed", failed.join(", "));
}

pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn from_hex(hex: &str) -> Vec<u8> {
    assert!(hex.len() % 2 == 0, "odd-length hex {hex:?}");
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex digits"))
        .collect()
}

/// A variable of the child's environment.
pub fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("child process without {name}"))
}
