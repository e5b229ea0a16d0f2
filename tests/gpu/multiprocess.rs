//! One process per rank, every rank checking all-reduce, all-gather and send/recv against the host's
//! answer (every rank rebuilds every rank's input from the seeds), with NCCL's log of the transports
//! it chose; again with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1, so that NCCL uses its network
//! transport everywhere; and `examples/multi_process` placed the same way, started with flags and with
//! torchrun's variables (and under mpirun where the host has Open MPI's).

use std::net::TcpListener;
use std::process::Command;

use metrale_gpu_sys::nccl::*;

use metrale_gpu_testkit::child;
use metrale_gpu_testkit::placement::Plan;
use metrale_gpu_testkit::ranks::Job;

use crate::common::*;
use crate::data::{self, Dtype, Rng};

/// A rank: all-reduce, all-gather and send/recv of a few types and sizes on its communicator.
fn mp_rank(me: &Me) {
    let world = me.join();
    let (rank, n, dev) = (me.rank, me.nranks, me.device);
    let (comm, stream) = (world.comms[0], world.streams[0]);
    println!("rank {rank}: ncclCommInitRank done on GPU {dev}");

    let mut tally = Tally::new();
    let mut seed = 10_000;
    let inputs_of = |dt: &Dtype, seed: u64, elems: usize| -> Vec<Vec<u8>> {
        (0..n)
            .map(|k| dt.random(&mut Rng::new(data::seed(seed, k)), elems))
            .collect()
    };
    let cases = [
        (&data::FLOAT32, 1),
        (&data::FLOAT32, 1001),
        (&data::BFLOAT16, 65_539),
        (
            &data::FLOAT32,
            sized(&world, (64 << 20) / 4 + 3, (1 << 20) / 4 + 3),
        ),
        (
            &data::INT64,
            sized(&world, (16 << 20) / 8 + 1, (1 << 20) / 8 + 1),
        ),
    ];
    for (dt, count) in cases {
        seed += 1;
        let es = dt.size;
        // All-reduce, out of place.
        let ins = inputs_of(dt, seed, count);
        let (src, dst) = (DevBuf::cuda(dev, count * es), DevBuf::cuda(dev, count * es));
        src.upload(0, &ins[rank], stream);
        dst.fill(0, dst.bytes, POISON, stream);
        // SAFETY: both buffers hold `count` elements on this device; the stream is this device's.
        let res = unsafe {
            ncclAllReduce(
                src.at(0),
                dst.at(0),
                count,
                dt.nccl,
                Op::Sum.nccl(),
                comm,
                stream,
            )
        };
        check_nccl(res, "ncclAllReduce").expect("enqueue");
        let got = dst.download(0, count * es, stream);
        let refs: Vec<&[u8]> = ins.iter().map(|v| v.as_slice()).collect();
        let v = data::check_reduce(dt, Op::Sum, &refs, &got);
        tally.record(
            &format!("rank {rank}: all-reduce {} count {count}", dt.name),
            v,
        );

        // All-gather, out of place.
        let gathered = DevBuf::cuda(dev, n * count * es);
        gathered.fill(0, gathered.bytes, POISON, stream);
        // SAFETY: src holds `count` elements, gathered n * count.
        let res = unsafe { ncclAllGather(src.at(0), gathered.at(0), count, dt.nccl, comm, stream) };
        check_nccl(res, "ncclAllGather").expect("enqueue");
        let got = gathered.download(0, n * count * es, stream);
        let expected: Vec<u8> = ins.concat();
        let v = data::check_equal(dt, &expected, &got);
        tally.record(
            &format!("rank {rank}: all-gather {} count {count}", dt.name),
            v,
        );

        // Send to rank + 1, receive from rank - 1.
        dst.fill(0, dst.bytes, POISON, stream);
        let (next, prev) = (((rank + 1) % n) as i32, ((rank + n - 1) % n) as i32);
        // SAFETY: group of one send and one receive of `count` elements each.
        unsafe {
            check_nccl(ncclGroupStart(), "ncclGroupStart").expect("group");
            let s = ncclSend(src.at(0), count, dt.nccl, next, comm, stream);
            let r = ncclRecv(dst.at(0), count, dt.nccl, prev, comm, stream);
            let e = ncclGroupEnd();
            check_nccl(s, "ncclSend").expect("send");
            check_nccl(r, "ncclRecv").expect("recv");
            check_nccl(e, "ncclGroupEnd").expect("group end");
        }
        let got = dst.download(0, count * es, stream);
        let v = data::check_equal(dt, &ins[prev as usize], &got);
        tally.record(
            &format!("rank {rank}: send/recv {} count {count}", dt.name),
            v,
        );
    }
    tally.finish(&format!("rank {rank}"));
}

/// Lines of NCCL's log naming the transports of the connections ("... via P2P/IPC", "via NET/Socket/0").
fn transports(output: &str) -> Vec<String> {
    let mut seen: Vec<String> = output
        .lines()
        .filter(|l| l.contains("Channel"))
        .filter_map(|l| l.split(" via ").nth(1))
        .map(|t| t.split_whitespace().next().unwrap_or("").to_string())
        .collect();
    seen.sort();
    seen.dedup();
    seen
}

/// Runs the ranks of `test` (in a rank: [`mp_rank`]) with NCCL's INIT log and `extra` variables; the
/// transports NCCL chose for its connections, and the networks it used.
fn run_processes(
    test: &str,
    subsystems: &str,
    extra: &[(&'static str, &str)],
) -> (Vec<String>, Vec<String>) {
    let mut env = vec![
        ("NCCL_DEBUG", "INFO".to_string()),
        ("NCCL_DEBUG_SUBSYS", subsystems.to_string()),
    ];
    env.extend(extra.iter().map(|&(k, v)| (k, v.to_string())));
    let plan = ranks::plan();
    let done = Job::start(test, plan, &env).wait(ranks::limit());
    ranks::expect_ranks_ok(test, &plan, &done);
    let what = test;
    let transports: Vec<String> = done.iter().flat_map(|f| transports(&f.output)).collect();
    let networks: Vec<String> = done
        .iter()
        .flat_map(|f| {
            f.output
                .lines()
                .filter_map(|l| l.split("Using network ").nth(1))
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect();
    println!("{what}: transports NCCL chose: {transports:?}; networks: {networks:?}");
    (transports, networks)
}

#[test]
#[ignore = "needs a GPU: run through ci/gpu-run.sh"]
fn multi_process_one_rank_each() {
    const TEST: &str = "multiprocess::multi_process_one_rank_each";
    if let Some(me) = Me::get(TEST) {
        mp_rank(&me);
        return me.done();
    }
    let (t, _) = run_processes(TEST, "INIT", &[]);
    // Ranks on simulated hosts reach each other through the network transport only.
    if ranks::plan().hosts() > 1 {
        assert!(
            t.iter().any(|x| x.starts_with("NET/")),
            "ranks on several hosts must use NET between them, NCCL logged {t:?}"
        );
    }
}

#[test]
#[ignore = "needs a GPU: run through ci/gpu-run.sh"]
fn multi_process_network_transport() {
    const TEST: &str = "multiprocess::multi_process_network_transport";
    if let Some(me) = Me::get(TEST) {
        mp_rank(&me);
        return me.done();
    }
    let (t, _) = run_processes(
        TEST,
        "INIT,NET",
        &[("NCCL_P2P_DISABLE", "1"), ("NCCL_SHM_DISABLE", "1")],
    );
    assert!(
        !t.is_empty() && t.iter().all(|x| x.starts_with("NET/")),
        "with P2P and SHM disabled every connection must go through NET, NCCL logged {t:?}"
    );
}

/// The staged `examples/multi_process` binary the runner names.
const EXAMPLE_VAR: &str = "METRALE_MULTI_PROCESS_BIN";

/// The host's GPU count, for the processes mpirun starts (they place themselves without CUDA).
const GPUS_VAR: &str = "METRALE_TEST_GPUS";

/// A free TCP port on this host for rank 0's rendezvous.
fn free_port() -> u16 {
    let listener = TcpListener::bind(("127.0.0.1", 0)).expect("bind a free port");
    listener.local_addr().expect("local address").port()
}

/// `examples/multi_process` at the plan's ranks, each process with its place's NCCL variables: rank 0
/// with flags, the others with torchrun's variables (`LOCAL_RANK` = the device).
#[test]
#[ignore = "needs a GPU and the staged example: run through ci/gpu-run.sh"]
fn multi_process_example_placed() {
    let Ok(bin) = std::env::var(EXAMPLE_VAR) else {
        return skip_named(
            "multiprocess::multi_process_example_placed",
            format_args!("{EXAMPLE_VAR} is not set (the GPU runner sets it to the staged example)"),
        );
    };
    let plan = ranks::plan();
    println!("multiprocess::multi_process_example_placed: {plan}");
    let port = free_port().to_string();
    let n = plan.ranks().to_string();
    let children: Vec<child::Child> = (0..plan.ranks())
        .map(|r| {
            let place = plan.place(r);
            let mut cmd = Command::new(&bin);
            cmd.envs(plan.nccl_env(r));
            if r == 0 {
                cmd.args(["--rank", "0", "--world-size", &n]);
                cmd.args(["--local-rank", &place.device.to_string()]);
                cmd.args(["--master", &format!("127.0.0.1:{port}")]);
            } else {
                cmd.envs([
                    ("RANK", r.to_string()),
                    ("WORLD_SIZE", n.clone()),
                    ("LOCAL_RANK", place.device.to_string()),
                    ("MASTER_ADDR", "127.0.0.1".to_string()),
                    ("MASTER_PORT", port.clone()),
                ]);
            }
            child::start(&format!("multi_process rank {r}"), cmd)
        })
        .collect();
    expect_example_correct(&plan, child::wait_all(children, ranks::limit()));
}

/// Open MPI's `mpirun` where this host has it: the example at the plan's ranks, each started through
/// this test binary ([`mpirun_rank`]), which adds its place's variables and `--local-rank`.
#[test]
#[ignore = "needs a GPU, the staged example and Open MPI: run through ci/gpu-run.sh"]
fn multi_process_example_under_mpirun() {
    const TEST: &str = "multiprocess::multi_process_example_under_mpirun";
    if std::env::var(ranks::TEST).as_deref() == Ok(TEST) {
        return mpirun_rank();
    }
    let Ok(bin) = std::env::var(EXAMPLE_VAR) else {
        return skip_named(TEST, format_args!("{EXAMPLE_VAR} is not set"));
    };
    let open_mpi = Command::new("mpirun")
        .arg("--version")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("Open MPI"));
    if !open_mpi {
        return skip_named(TEST, "no Open MPI mpirun on this host");
    }
    let plan = ranks::plan();
    println!("{TEST}: {plan}");
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut cmd = Command::new("mpirun");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        cmd.arg("--allow-run-as-root");
    }
    cmd.args(["-np", &plan.ranks().to_string(), "--oversubscribe"]);
    let vars = [
        ("MASTER_ADDR", "127.0.0.1".to_string()),
        ("MASTER_PORT", free_port().to_string()),
        (EXAMPLE_VAR, bin),
        (ranks::TEST, TEST.to_string()),
        (GPUS_VAR, plan.gpus().to_string()),
        (
            metrale_gpu_testkit::placement::RANKS,
            plan.ranks().to_string(),
        ),
        (
            metrale_gpu_testkit::placement::MODE,
            plan.mode().name().to_string(),
        ),
    ];
    for (k, v) in &vars {
        cmd.env(k, v).args(["-x", k]);
    }
    for k in [
        "METRALE_NCCL_LIBRARY",
        "LD_LIBRARY_PATH",
        "NCCL_NVLS_ENABLE",
        "NCCL_DEBUG",
    ] {
        if std::env::var_os(k).is_some() {
            cmd.args(["-x", k]);
        }
    }
    cmd.arg(exe)
        .args([TEST, "--exact", "--include-ignored", "--nocapture"]);
    let done = child::wait_all(vec![child::start("mpirun", cmd)], ranks::limit());
    expect_example_correct(&plan, done);
}

/// One process under mpirun: its rank from Open MPI's variables, its place from the plan (the GPU
/// count passed in [`GPUS_VAR`]: no CUDA here), then the example in its stead.
fn mpirun_rank() {
    use std::os::unix::process::CommandExt;
    let rank = child::number("OMPI_COMM_WORLD_RANK");
    let library = metrale_gpu_sys::version::library_version().expect("ncclGetVersion");
    let plan = Plan::from_env(child::number(GPUS_VAR), library).unwrap_or_else(|e| panic!("{e}"));
    let device = plan.place(rank).device.to_string();
    let err = Command::new(child::var(EXAMPLE_VAR))
        .envs(plan.nccl_env(rank))
        .args(["--local-rank", &device])
        .exec();
    panic!("cannot run the example under mpirun: {err}");
}

/// Every one of the plan's ranks printed the example's verdict.
fn expect_example_correct(plan: &Plan, done: Vec<child::Finished>) {
    child::expect_success("examples/multi_process", &done);
    let correct: usize = done
        .iter()
        .map(|f| f.output.matches("processes correct").count())
        .sum();
    assert_eq!(
        correct,
        plan.ranks(),
        "every rank of examples/multi_process must report a correct all-reduce ({plan})"
    );
}
