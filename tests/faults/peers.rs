//! Peers that fail, one process per rank: one SIGKILLed mid-collective (again and again), one that never
//! arrives, and an abort from another thread while a collective is stuck.

use std::io::Write;
use std::time::{Duration, Instant};

use metrale_gpu_sys::nccl::*;
use metrale_gpu_testkit::child::Finished;
use metrale_gpu_testkit::placement::Plan;
use metrale_gpu_testkit::ranks::Job;
use metrale_gpu_watchdog::{self as watchdog, WaitError};

use crate::common::*;
use crate::process::{comm_threads, cpu_seconds, threads};

/// The watchdog's deadline in the peer-kill test (the "say 30 s"); the GPU runner shortens it:
/// within one host NCCL never reports a dead peer over P2P/SHM (NVIDIA/nccl#279), so every such kill
/// lasts the whole deadline. Across hosts NCCL's socket transport sees the connection close.
const KILL_WATCHDOG_VAR: &str = "METRALE_FAULT_WATCHDOG_S";
/// How many times the peer-kill test kills a rank, each time in a fresh job of every rank (default 10).
const KILL_REPS_VAR: &str = "METRALE_FAULT_KILL_REPS";
/// Floats per all-reduce in the peer-kill test: 8 MiB, so that a batch takes a small part of the
/// watchdog's deadline even at 8 ranks over loopback sockets on one time-shared GPU, while every rank is
/// inside one when the peer dies.
const KILL_COUNT: usize = (8 << 20) / 4;
/// All-reduces queued per batch (each batch is awaited by the watchdog).
const KILL_DEPTH: usize = 4;
/// How long every rank may take to start its loop of all-reduces (start, init, one checked all-reduce).
const LOOPING_LIMIT: Duration = Duration::from_secs(120);
/// What a bounded wait may take past its deadline: its last poll and NCCL's abort, on a host time-shared
/// by dozens of rank processes (the abort of a pending init took 6.0 s there with NCCL 2.30.7 and some 40
/// of them, 3.9 s with 2.29.7 and 30).
const GIVE_UP_ALLOWANCE: Duration = Duration::from_secs(15);

/// Enqueues on a non-blocking communicator: `ncclInProgress` means "still enqueueing", awaited with the
/// bounded wait (which aborts the communicator if it fails).
enum Enqueue {
    Done,
    /// The call itself failed; the communicator is not aborted.
    CallFailed(GpuError),
    /// The bounded wait failed and aborted the communicator.
    Aborted(WaitError),
}

/// # Safety
/// `comm` and `stream` are live; the buffers are of one size, on the communicator's device.
unsafe fn all_reduce_nb(
    send: &DevBuf,
    recv: &DevBuf,
    comm: NcclComm,
    stream: metrale_gpu_sys::cuda::CUstream,
    timeout: Duration,
) -> Enqueue {
    // SAFETY: guaranteed by the caller.
    let res = unsafe {
        ncclAllReduce(
            send.at(0),
            recv.at(0),
            send.bytes / 4,
            NcclDataType::ncclFloat32,
            NcclRedOp::ncclSum,
            comm,
            stream,
        )
    };
    if res == NcclResult::ncclInProgress {
        // SAFETY: a live communicator.
        return match unsafe { watchdog::wait_comm_ready(comm, timeout) } {
            Ok(()) => Enqueue::Done,
            Err(e) => Enqueue::Aborted(e),
        };
    }
    match check_nccl(res, "ncclAllReduce") {
        Ok(()) => Enqueue::Done,
        Err(e) => Enqueue::CallFailed(e),
    }
}

fn kind(e: &WaitError) -> &'static str {
    if e.is_timeout() {
        "timeout"
    } else if e.is_remote() {
        "remote error"
    } else {
        "other error"
    }
}

/// A rank of the peer-kill test: a non-blocking communicator over every rank, one checked all-reduce,
/// then batches of all-reduces awaited by the watchdog until it fails (a peer was killed) or for at
/// most 2 minutes; then it frees its memory and exits 0. The rank that is killed runs this too.
fn killed_peer_rank(me: &Me) {
    let rank = me.rank;
    let timeout = secs_from_env(KILL_WATCHDOG_VAR, 30);
    let mut config = NcclConfig::default();
    config.blocking = 0;
    let (mut world, _) = me.join_config(config).expect("non-blocking init");
    let (comm, stream, dev) = (world.comms[0], world.streams[0], world.devs[0]);
    let used_before = device_memory::used(&[dev]);
    let send = DevBuf::cuda(dev, KILL_COUNT * 4);
    let recv = DevBuf::cuda(dev, KILL_COUNT * 4);
    send.upload_f32(&inputs(1, rank, KILL_COUNT), stream);

    // One all-reduce checked against the host first: the communicator really works.
    // SAFETY: live handles; buffers of KILL_COUNT floats on this device.
    match unsafe { all_reduce_nb(&send, &recv, comm, stream, timeout) } {
        Enqueue::Done => {}
        Enqueue::CallFailed(e) => panic!("rank {rank}: first all-reduce: {e}"),
        Enqueue::Aborted(e) => panic!("rank {rank}: first all-reduce: {e}"),
    }
    // SAFETY: live handles.
    unsafe { watchdog::wait_stream(comm, stream, timeout) }.expect("first all-reduce completes");
    compare(
        "first all-reduce",
        &recv.download_f32(stream),
        &expected_sum(1, me.nranks, KILL_COUNT),
    )
    .expect("first all-reduce correct");
    println!("rank {rank}: first all-reduce correct");

    let started = Instant::now();
    let mut batches = 0u64;
    let (waited, error) = loop {
        let mut failed = None;
        for _ in 0..KILL_DEPTH {
            // SAFETY: as above.
            match unsafe { all_reduce_nb(&send, &recv, comm, stream, timeout) } {
                Enqueue::Done => {}
                other => {
                    failed = Some(other);
                    break;
                }
            }
        }
        if batches == 0 {
            println!("\nFAULT-LOOPING rank {rank}");
            std::io::stdout().flush().expect("flush");
        }
        let wait_start = Instant::now();
        let result = match failed {
            Some(Enqueue::CallFailed(e)) => {
                // The call failed without aborting: abort here, as the watchdog would.
                // SAFETY: a live communicator, never used again.
                let abort = check_nccl(unsafe { ncclCommAbort(comm) }, "ncclCommAbort");
                Err(format!("enqueue failed: {e}; abort: {abort:?}"))
            }
            Some(Enqueue::Aborted(e)) => Err(format!("enqueue wait: {e} [{}]", kind(&e))),
            _ => {
                // SAFETY: live handles.
                unsafe { watchdog::wait_stream(comm, stream, timeout) }
                    .map_err(|e| format!("{e} [{}]", kind(&e)))
            }
        };
        match result {
            Ok(()) => batches += 1,
            Err(e) => break (wait_start.elapsed(), e),
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "rank {rank}: {batches} batches and no failure in 2 minutes: no peer was killed"
        );
    };
    println!(
        "\nFAULT-DETECTED rank {rank} after {batches} good batches: the wait returned after {:.2} s: {error}",
        waited.as_secs_f64()
    );
    std::io::stdout().flush().expect("flush");
    // The communicator is aborted (never to be destroyed): its kernels have stopped, so the stream drains.
    world.forget_comms();
    // SAFETY: the stream is live; the aborted communicator is not used again.
    let drained = unsafe { sync_stream(stream) };
    println!("rank {rank}: sync_stream after the abort: {drained:?}");
    let buffers = (send.bytes + recv.bytes) as f64 / MIB;
    let used_before_frees = device_memory::used(&[dev]);
    send.free().expect("cuMemFree after the abort");
    recv.free().expect("cuMemFree after the abort");
    drop(world);
    let used_after = device_memory::used(&[dev]);
    let returned = -used_before_frees.grown_mib(&used_after);
    println!(
        "rank {rank}: our buffers ({buffers:.0} MiB) returned {returned:.0} MiB; device memory in use \
         before the buffers {:.0} MiB, after the cleanup {:.0} MiB ({}; NCCL keeps some of an aborted \
         communicator's own)",
        used_before.mib(),
        used_after.mib(),
        used_after.source,
    );
    // Our buffers are back. (GPU-wide, other ranks on this GPU free theirs meanwhile, which only adds.)
    assert!(
        returned > buffers - 4.0,
        "rank {rank}: only {returned:.0} of our {buffers:.0} MiB came back after the abort ({})",
        used_after.source
    );
    println!("FAULT-CLEAN rank {rank}: aborted, memory freed, exiting 0");
}

/// Prints every rank's output, then fails with `what`.
fn fail(done: &[Finished], what: &str) -> ! {
    for f in done {
        println!(
            "===== {} exited with {:?} =====\n{}===== end of {} =====",
            f.name, f.status, f.output, f.name
        );
    }
    panic!("{what}");
}

/// One kill: a fresh job of every rank of `test`; once each is inside its loop of all-reduces, rank
/// `victim` is SIGKILLed. Every survivor must report an error within `bound`, then clean up and exit 0.
/// Returns each survivor's time from the kill to its error, and the error's kind.
fn kill_once(
    test: &str,
    plan: Plan,
    env: &[(&'static str, String)],
    victim: usize,
    bound: Duration,
) -> Vec<(Duration, &'static str)> {
    let mut job = Job::start(test, plan, env);
    for r in 0..plan.ranks() {
        if job.children[r]
            .wait_line("FAULT-LOOPING", LOOPING_LIMIT)
            .is_none()
        {
            let done = job.wait(Duration::ZERO);
            fail(
                &done,
                &format!("rank {r} did not start its loop of all-reduces within {LOOPING_LIMIT:?}"),
            );
        }
    }
    // Every rank is inside the stream now; let them run a little.
    std::thread::sleep(Duration::from_millis(300));
    let killed_at = Instant::now();
    job.children[victim].kill();
    let mut errors = Vec::new();
    for r in (0..plan.ranks()).filter(|&r| r != victim) {
        let left = (bound + Duration::from_secs(30)).saturating_sub(killed_at.elapsed());
        let Some((at, line)) = job.children[r].wait_line("FAULT-DETECTED", left) else {
            let done = job.wait(Duration::ZERO);
            fail(
                &done,
                &format!(
                    "rank {r} reported no error within {bound:?} of rank {victim}'s kill: it hung"
                ),
            );
        };
        if at < killed_at {
            let done = job.wait(Duration::ZERO);
            fail(&done, &format!("rank {r} reported an error before rank {victim} was killed (a batch of all-reduces outlasted the watchdog?)"));
        }
        let after = at - killed_at;
        let kind = ["timeout", "remote error"]
            .into_iter()
            .find(|k| line.contains(&format!("[{k}]")))
            .unwrap_or("other error");
        errors.push((r, after, kind));
    }
    // The killed rank counts as failed: the survivors get as long again to clean up and exit.
    let done = job.wait_grace(Duration::from_secs(60), Duration::from_secs(60));
    let mut wrong = Vec::new();
    for &(r, after, kind) in &errors {
        if after > bound {
            wrong.push(format!(
                "rank {r}'s error ({kind}) came {after:?} after the kill: over the bound {bound:?}"
            ));
        }
        if !done[r].ok() || !done[r].output.contains(&format!("FAULT-CLEAN rank {r}")) {
            wrong.push(format!(
                "rank {r} must abort, free its memory and exit 0: it ended with {:?}",
                done[r].status
            ));
        }
    }
    if !wrong.is_empty() {
        fail(&done, &wrong.join("; "));
    }
    errors
        .into_iter()
        .map(|(_, after, kind)| (after, kind))
        .collect()
}

const NAME_KILL: &str = "peers::peer_killed_mid_collective";

/// A rank is SIGKILLed while every rank is inside a stream of all-reduces, [`KILL_REPS_VAR`] times (10
/// by default; the killed rank changes each time): every survivor's watchdog returns an error (NCCL's
/// remote error, or the deadline: NCCL does not notice a dead peer on the same host over P2P/SHM)
/// within the stated bound, aborts, frees its memory and exits 0. Over simulated hosts (ranks sharing a
/// GPU) the ranks talk through NCCL's socket transport, as across the hosts of a cluster.
#[test]
#[ignore = "needs a GPU: run through ci/gpu-run.sh"]
fn peer_killed_mid_collective() {
    if Me::get(NAME_KILL).is_some() {
        return ranks::test(NAME_KILL).run_raw(killed_peer_rank);
    }
    let plan = ranks::test(NAME_KILL).plan();
    assert!(
        plan.ranks() >= 2,
        "a peer to kill needs 2 ranks or more: set {} to 2 or more",
        metrale_gpu_testkit::placement::RANKS
    );
    let timeout = secs_from_env(KILL_WATCHDOG_VAR, 30);
    let bound = timeout + GIVE_UP_ALLOWANCE;
    let reps: usize = std::env::var(KILL_REPS_VAR)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let transport = match std::env::var("NCCL_P2P_DISABLE").as_deref() {
        Ok("1") => format!("{plan}; P2P and SHM disabled"),
        _ => plan.to_string(),
    };
    let env = [
        (KILL_WATCHDOG_VAR, timeout.as_secs().to_string()),
        (
            "NCCL_DEBUG",
            std::env::var("NCCL_DEBUG").unwrap_or_else(|_| "WARN".into()),
        ),
    ];
    let mut all = Vec::new();
    for rep in 0..reps {
        let victim = (rep + 1) % plan.ranks();
        let errors = kill_once(NAME_KILL, plan, &env, victim, bound);
        let worst = errors.iter().map(|e| e.0).max().unwrap_or_default();
        println!(
            "kill {}/{reps}: rank {victim} SIGKILLed; every survivor's error within {:.1} s ({})",
            rep + 1,
            worst.as_secs_f64(),
            errors.iter().map(|e| e.1).collect::<Vec<_>>().join(", ")
        );
        all.extend(errors);
    }
    let worst = all.iter().map(|e| e.0).max().unwrap_or_default();
    let count = |kind: &str| all.iter().filter(|e| e.1 == kind).count();
    measured(&format!(
        "{reps} peer kills ({transport}): every survivor's error within {:.1} s of the kill (watchdog {} s, \
         bound {} s): {} remote errors, {} timeouts, {} other; each aborted, freed and exited 0",
        worst.as_secs_f64(),
        timeout.as_secs(),
        bound.as_secs(),
        count("remote error"),
        count("timeout"),
        count("other error"),
    ));
}

const NAME_NEVER: &str = "peers::peer_never_arrives";

/// A rank of the never-arrives test but the last: a non-blocking init over every rank, which the last
/// one never joins. The bounded wait times out within its bound and aborts, and nothing of the
/// communicator keeps running or spinning. Returns what it measured.
fn time_out_alone(me: &Me) -> String {
    let timeout = secs_from_env("METRALE_FAULT_INIT_TIMEOUT_S", 10);
    let bound = timeout + GIVE_UP_ALLOWANCE;
    let before = threads();
    let id = me.share_id("never-id", 0);
    metrale_gpu_sys::cuda::use_device(me.device, "never arrives").expect("use_device");
    let mut comm: NcclComm = std::ptr::null_mut();
    let mut config = NcclConfig::default();
    config.blocking = 0;
    // SAFETY: comm and config are valid for the call; rank `rank` of `nranks` on the current device.
    let res = unsafe {
        ncclCommInitRankConfig(&mut comm, me.nranks as i32, id, me.rank as i32, &mut config)
    };
    assert_eq!(
        res,
        NcclResult::ncclInProgress,
        "a non-blocking init without its last rank must be in progress: {:?}",
        check_nccl(res, "ncclCommInitRankConfig")
    );
    assert!(!comm.is_null(), "the non-blocking init returned no handle");
    let start = Instant::now();
    // SAFETY: the handle the non-blocking init returned; aborted on failure, never used again.
    let err = unsafe { watchdog::wait_comm_ready(comm, timeout) }
        .expect_err("the last rank never arrives: the init cannot complete");
    let took = start.elapsed();
    println!(
        "rank {}: wait_comm_ready returned after {:.2} s: {err}",
        me.rank,
        took.as_secs_f64()
    );
    assert!(err.is_timeout(), "expected a timeout: {err}");
    assert!(
        err.to_string().contains("timed out after") && err.to_string().contains("aborted"),
        "{err}"
    );
    if let WaitError::Timeout {
        give_up_error: Some(e),
        ..
    } = &err
    {
        println!("ncclCommAbort reported: {e}");
    }
    assert!(
        took >= timeout && took <= bound,
        "took {took:?}, bound {bound:?}"
    );

    // Nothing of the communicator left running, and the process is idle.
    let settle = Instant::now();
    while !comm_threads(&threads()).is_empty() && settle.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let after = threads();
    let new: Vec<&String> = after.iter().filter(|n| !before.contains(n)).collect();
    println!(
        "threads before the init: {before:?}\nthreads after the abort: {after:?}\nnew: {new:?}"
    );
    assert!(
        comm_threads(&after).is_empty(),
        "communicator threads still running: {:?}",
        comm_threads(&after)
    );
    let ((root0, cpu0), t0) = (cpu_seconds(), Instant::now());
    std::thread::sleep(Duration::from_secs(2));
    let (root1, cpu1) = cpu_seconds();
    let wall = t0.elapsed().as_secs_f64();
    let (busy, root_busy) = ((cpu1 - cpu0) / wall, (root1 - root0) / wall);
    println!(
        "CPU use over 2 s after the abort: {:.0}% of one core; NCCL's bootstrap root thread (of the \
         unique id, not of the communicator): {:.0}%",
        busy * 100.0,
        root_busy * 100.0
    );
    assert!(
        busy < 0.5,
        "something still spins after the abort: {:.0}% of a core",
        busy * 100.0
    );
    format!(
        "timeout after {:.1} s (deadline {} s, bound {} s); {} new threads left ({}), {:.0}% CPU after \
         (+{:.0}% in the id's root thread)",
        took.as_secs_f64(),
        timeout.as_secs(),
        bound.as_secs(),
        new.len(),
        new.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "),
        busy * 100.0,
        root_busy * 100.0
    )
}

/// Every rank but the last inits (non-blocking) a communicator of all ranks, which the last one never
/// joins: each one's bounded wait times out within its bound, aborts, and leaves no communicator thread
/// running or spinning. Then every process is fine: a new communicator over all ranks, the one that
/// never came included, all-reduces correctly.
#[test]
#[ignore = "needs a GPU: run through ci/gpu-run.sh"]
fn peer_never_arrives() {
    ranks::test(NAME_NEVER).run_raw(|me| {
        assert!(
            me.nranks >= 2,
            "a peer that never arrives needs 2 ranks or more"
        );
        if me.rank + 1 < me.nranks {
            let line = time_out_alone(me);
            if me.rank == 0 {
                measured(&format!(
                    "{} ranks, the last never arrives: {line}",
                    me.nranks
                ));
            }
        }
        me.barrier("timed-out");
        let mut after = Summed::new(me.join(), 1 << 18);
        after
            .check_all_reduce(7)
            .expect("a new communicator after the abort");
    });
}

/// Rank 0's part of the abort test: an all-reduce the other ranks never join; a thread blocked in
/// `sync_stream` on it returns once this thread calls `ncclCommAbort`.
fn abort_stuck_all_reduce(summed: &mut Summed) {
    let bound = Duration::from_secs(30);
    let w = &summed.world;
    let (comm, stream) = (w.comms[0], w.streams[0]);
    // SAFETY: live handles; buffers of `count` floats on the communicator's device; the other ranks
    // never join, so this all-reduce cannot finish.
    let res = unsafe {
        ncclAllReduce(
            summed.send[0].at(0),
            summed.recv[0].at(0),
            summed.count,
            NcclDataType::ncclFloat32,
            NcclRedOp::ncclSum,
            comm,
            stream,
        )
    };
    if res == NcclResult::ncclInProgress {
        // SAFETY: a live communicator (enqueueing only: the kernel's wait for the peers is on the GPU).
        unsafe { watchdog::wait_comm_ready(comm, Duration::from_secs(30)) }.expect("enqueued");
    } else {
        check_nccl(res, "ncclAllReduce on rank 0 alone").expect("enqueued");
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let stuck = Handle(stream);
    let waiter = std::thread::spawn(move || {
        let stream = stuck;
        // SAFETY: the stream stays alive until this thread is joined.
        let result = unsafe { sync_stream(stream.0) };
        let _ = tx.send((Instant::now(), result));
    });
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        rx.try_recv().is_err(),
        "the lone all-reduce finished without the other ranks"
    );
    assert!(
        // SAFETY: a live stream.
        !unsafe { stream_ready(stream) }.expect("cuStreamQuery"),
        "rank 0's stream is idle"
    );
    println!("sync_stream has been stuck for 2 s; calling ncclCommAbort from the main thread");
    let abort_start = Instant::now();
    // SAFETY: a live communicator, aborted once and never used again (the world forgets it); another
    // thread waits on its stream, which NCCL allows (abort is how a watchdog thread unsticks a
    // collective).
    let abort = check_nccl(unsafe { ncclCommAbort(comm) }, "ncclCommAbort");
    summed.world.forget_comms();
    let abort_took = abort_start.elapsed();
    let returned = rx.recv_timeout(bound);
    waiter.join().expect("the waiting thread");
    let Ok((at, synced)) = returned else {
        panic!("the stuck sync_stream did not return within {bound:?} of ncclCommAbort");
    };
    let after = at.saturating_duration_since(abort_start);
    println!(
        "ncclCommAbort: {abort:?} after {:.2} s; the stuck sync_stream returned {:.2} s after the abort began: {synced:?}",
        abort_took.as_secs_f64(),
        after.as_secs_f64()
    );
    abort.expect("ncclCommAbort on a stuck communicator");
    measured(&format!(
        "stuck wait returned {:.2} s after ncclCommAbort began (abort took {:.2} s; bound {} s)",
        after.as_secs_f64(),
        abort_took.as_secs_f64(),
        bound.as_secs()
    ));
}

/// Every rank makes a non-blocking communicator; after a correct all-reduce, only rank 0 issues the next
/// one, which waits forever for the others, and a thread of rank 0 blocked in `sync_stream` on it
/// returns once its main thread calls `ncclCommAbort`. The other ranks abort theirs; then a new
/// communicator over every rank runs a correct all-reduce.
#[test]
#[ignore = "needs a GPU: run through ci/gpu-run.sh"]
fn abort_from_another_thread_unsticks_a_collective() {
    ranks::test("peers::abort_from_another_thread_unsticks_a_collective").run_raw(|me| {
        assert!(
            me.nranks >= 2,
            "a collective that waits for a peer needs 2 ranks or more"
        );
        let mut config = NcclConfig::default();
        config.blocking = 0;
        let (world, _) = me
            .join_config_id("stuck-id", config)
            .expect("non-blocking init");
        let mut summed = Summed::new(world, 1 << 20);
        summed
            .check_all_reduce(3)
            .expect("a correct all-reduce before the fault");
        me.barrier("checked");
        if me.rank == 0 {
            abort_stuck_all_reduce(&mut summed);
        }
        me.barrier("aborted");
        if me.rank != 0 {
            // Rank 0's communicator is gone: abort this idle one too (abort never talks to peers).
            // SAFETY: a live, idle communicator, aborted once and then forgotten.
            check_nccl(
                unsafe { ncclCommAbort(summed.world.comms[0]) },
                "ncclCommAbort",
            )
            .expect("abort");
            summed.world.forget_comms();
        }
        drop(summed);
        let mut after = Summed::new(me.join(), 1 << 18);
        after
            .check_all_reduce(11)
            .expect("a new communicator after the abort runs a correct all-reduce");
    });
}

const NAME_FAKE: &str = "peers::fake_killed_rank";

/// A rank of the CPU test below, without a GPU: it publishes its process id, "loops" until some rank's
/// process is gone, and reports that as the peer-kill ranks do.
#[test]
#[ignore = "a rank of kill_once_without_a_gpu's jobs; does nothing by itself"]
fn fake_killed_rank() {
    // Alone (`--ignored`, the GPU runner's `--run-ignored all`) there is no job to be a rank of.
    if Me::get(NAME_FAKE).is_none() {
        println!("{NAME_FAKE}: not a test by itself (a rank of kill_once_without_a_gpu's jobs): nothing to do");
        return;
    }
    ranks::test(NAME_FAKE).run_raw(|me| {
        let pid = std::process::id().to_string();
        me.publish(&format!("pid.{}", me.rank), pid.as_bytes());
        let pids: Vec<libc::pid_t> = (0..me.nranks)
            .map(|k| {
                let text = String::from_utf8(me.fetch(&format!("pid.{k}"))).expect("a pid");
                text.parse().expect("a pid")
            })
            .collect();
        println!("\nFAULT-LOOPING rank {}", me.rank);
        std::io::stdout().flush().expect("flush");
        let start = Instant::now();
        // SAFETY: signal 0 only asks whether the process exists (the parent reaps the one it kills).
        let gone = |pid: libc::pid_t| unsafe { libc::kill(pid, 0) } != 0;
        while !pids.iter().any(|&p| gone(p)) {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "no rank was killed"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        println!(
            "\nFAULT-DETECTED rank {}: a peer is gone [remote error]",
            me.rank
        );
        std::io::stdout().flush().expect("flush");
        if std::env::var_os(FAKE_UNCLEAN).is_none() || me.rank != 2 {
            println!("FAULT-CLEAN rank {}", me.rank);
        }
    });
}

/// Set for the fake ranks: rank 2 reports its error but not its cleanup.
const FAKE_UNCLEAN: &str = "METRALE_FAKE_UNCLEAN";

/// The peer-kill test's parent side, on fake ranks: the victim is killed once every rank loops, every
/// survivor's report is read with its time, and each must exit 0 having cleaned up.
#[test]
fn kill_once_without_a_gpu() {
    use metrale_gpu_sys::version::NcclVersion;
    use metrale_gpu_testkit::placement::Mode;
    let plan = Plan::new(3, 1, Mode::Hosts, NcclVersion::HEADERS).expect("a plan");
    let bound = Duration::from_secs(30);
    let errors = kill_once(NAME_FAKE, plan, &[], 1, bound);
    assert_eq!(errors.len(), 2, "one report per survivor: {errors:?}");
    for (after, kind) in errors {
        assert_eq!(kind, "remote error");
        assert!(after <= bound, "{after:?}");
    }
    // A survivor that did not clean up fails the kill, naming it.
    let env = [(FAKE_UNCLEAN, "1".to_string())];
    let failed = std::panic::catch_unwind(|| kill_once(NAME_FAKE, plan, &env, 0, bound))
        .expect_err("a survivor that did not clean up");
    let msg = failed.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        msg.contains("rank 2 must abort, free its memory and exit 0"),
        "{msg}"
    );
    assert!(!msg.contains("rank 1 must"), "{msg}");
}
