//! `examples/elastic.rs` five times in a row on 2 GPUs: ranks 0 and 1 all-reduce; once rank 1 is in
//! its steady loop it is SIGKILLed; rank 0 detects it, revokes, shrinks to itself and checks an
//! all-reduce; a replacement started with `--join` grows the communicator back to 2 ranks and the
//! full-size all-reduce is checked again. Every run must end correct on both processes, detection within
//! the watchdog's deadline + 1 s, revoke + shrink and grow each within 5 s. The times are printed.
//!
//! The example is found through `METRALE_ELASTIC_BIN`, else at `<this test binary's dir>/../examples/
//! elastic` (`cargo build --release --example elastic` puts it there).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use metrale_gpu_testkit::child::{self, Child};

use crate::support::gpus;

const RUNS: usize = 5;
/// The example's `--deadline`: how long a collective may hang before the survivors give up on it.
const DEADLINE: Duration = Duration::from_secs(5);
const DETECT_BOUND: Duration = Duration::from_secs(6);
const SHRINK_BOUND: Duration = Duration::from_secs(5);
const GROW_BOUND: Duration = Duration::from_secs(5);
/// Generous bounds on each step of a run: a run that passes them but misses the targets is reported.
const STEP_LIMIT: Duration = Duration::from_secs(120);

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

/// What one run measured.
struct Times {
    detect: Duration,
    how: String,
    shrink: Duration,
    grow: Duration,
}

#[test]
#[ignore = "needs 2 GPUs and the elastic example"]
fn elastic_recovers_from_a_killed_rank_five_times() {
    gpus();
    let bin = elastic_bin();
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for run in 1..=RUNS {
        match one_run(&bin, run) {
            Ok(times) => {
                let misses: Vec<String> = [
                    ("detect", times.detect, DETECT_BOUND),
                    ("revoke + shrink", times.shrink, SHRINK_BOUND),
                    ("grow", times.grow, GROW_BOUND),
                ]
                .iter()
                .filter(|(_, took, bound)| took > bound)
                .map(|(what, took, bound)| {
                    format!("run {run}: {what} took {took:?}, over {bound:?}")
                })
                .collect();
                failures.extend(misses);
                rows.push((run, times));
            }
            Err(e) => failures.push(format!("run {run}: {e}")),
        }
    }
    println!("\nrun | detect (ms) | by         | revoke + shrink (ms) | grow (ms)");
    for (run, t) in &rows {
        println!(
            "{run:>3} | {:>11.1} | {:<10} | {:>20.1} | {:>9.1}",
            t.detect.as_secs_f64() * 1e3,
            t.how,
            t.shrink.as_secs_f64() * 1e3,
            t.grow.as_secs_f64() * 1e3
        );
    }
    println!(
        "bounds: detect {DETECT_BOUND:?} (deadline {DEADLINE:?} + 1 s), shrink {SHRINK_BOUND:?}, grow {GROW_BOUND:?}"
    );
    assert!(failures.is_empty(), "elastic:\n{}", failures.join("\n"));
}

fn one_run(bin: &Path, run: usize) -> Result<Times, String> {
    let master = format!("127.0.0.1:{}", free_port());
    let args = |role: &[&str]| -> Vec<String> {
        let deadline = DEADLINE.as_secs().to_string();
        let common = [
            "--world-size",
            "2",
            "--master",
            &master,
            "--deadline",
            &deadline,
        ];
        role.iter()
            .chain(common.iter())
            .map(|s| s.to_string())
            .collect()
    };
    let start = |name: &str, role: &[&str]| {
        let mut cmd = Command::new(bin);
        cmd.args(args(role));
        child::start(&format!("run {run} {name}"), cmd)
    };
    let mut rank0 = start("rank 0", &["--rank", "0", "--local-rank", "0"]);
    let mut rank1 = start("rank 1", &["--rank", "1", "--local-rank", "1"]);
    let mut joiner: Option<Child> = None;
    let result = (|| {
        rank1
            .wait_line("ELASTIC phase=steady", STEP_LIMIT)
            .ok_or("rank 1 never reached its steady all-reduce loop")?;
        let killed_at = unix_us(SystemTime::now());
        rank1.kill();
        rank0
            .wait_line("ELASTIC phase=shrink", STEP_LIMIT)
            .ok_or("rank 0 did not shrink after rank 1 was killed")?;
        let replacement = joiner.insert(start("replacement", &["--join", "--local-rank", "1"]));
        for p in [&mut rank0, replacement] {
            match p.wait_exit(STEP_LIMIT) {
                Some(status) if status.success() => {}
                status => return Err(format!("{} exited with {status:?} (None: killed)", p.name)),
            }
        }
        measured(&rank0.output(), killed_at)
    })();
    if result.is_err() {
        for p in [Some(&rank0), Some(&rank1), joiner.as_ref()]
            .into_iter()
            .flatten()
        {
            p.dump();
        }
    }
    result
}

/// The times from rank 0's `ELASTIC` lines; `killed_at` is when rank 1 was killed (µs since the epoch).
fn measured(output: &str, killed_at: u128) -> Result<Times, String> {
    let line = |phase: &str| {
        output
            .lines()
            .find(|l| l.starts_with("ELASTIC") && l.contains(&format!("phase={phase} ")))
            .ok_or(format!("rank 0 printed no phase={phase} line"))
    };
    let field = |line: &str, key: &str| -> Result<f64, String> {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .ok_or(format!("no number {key}= in {line:?}"))
    };
    let ms = |v: f64| Duration::from_secs_f64(v / 1e3);
    let detect = line("detect")?;
    let (shrink, grow) = (line("shrink")?, line("grow")?);
    for l in [shrink, grow] {
        if !l.contains("allreduce=ok") {
            return Err(format!("an all-reduce was wrong: {l}"));
        }
    }
    let detected_at = field(detect, "at_unix_us")? as u128;
    Ok(Times {
        detect: Duration::from_micros(detected_at.saturating_sub(killed_at) as u64),
        how: detect
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix("how="))
            .unwrap_or("?")
            .to_string(),
        shrink: ms(field(shrink, "revoke_ms")? + field(shrink, "shrink_ms")?),
        grow: ms(field(grow, "grow_ms")?),
    })
}

fn unix_us(t: SystemTime) -> u128 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0)
}

/// A port nobody listens on now (the example binds it a moment later).
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address").port()
}
