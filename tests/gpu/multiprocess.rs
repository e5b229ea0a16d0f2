//! One process per GPU, as across hosts: rank 0 makes the unique id and prints its bytes, the parent
//! hands them to the other ranks (out of band), and every rank checks all-reduce, all-gather and
//! send/recv against the host's answer (every rank rebuilds every rank's input from the seeds). Then
//! again with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1, so that NCCL uses its network transport.

use std::time::Duration;

use metrale_gpu_sys::cuda;
use metrale_gpu_sys::nccl::*;

use metrale_gpu_testkit::child;

use crate::common::*;
use crate::data::{self, Dtype, Rng};

/// The child: rank `child::RANK` of `child::NRANKS` on GPU `rank`.
pub fn mp_child() {
    let rank = child::number(child::RANK);
    let n = child::number(child::NRANKS);
    let id = child::unique_id(rank);
    let dev = rank as i32;
    let stream = create_stream(dev).expect("create_stream");
    cuda::use_device(dev, "child").expect("use_device");
    let mut comm: NcclComm = std::ptr::null_mut();
    // SAFETY: writes one handle; rank `rank` of n on the current device.
    check_nccl(
        unsafe { ncclCommInitRank(&mut comm, n as i32, id, rank as i32) },
        "ncclCommInitRank",
    )
    .expect("ncclCommInitRank in a child process");
    println!("rank {rank}: ncclCommInitRank done on GPU {dev}");

    let mut tally = Tally::new();
    let mut seed = 10_000;
    let inputs_of = |dt: &Dtype, seed: u64, elems: usize| -> Vec<Vec<u8>> {
        (0..n)
            .map(|k| dt.random(&mut Rng::new(data::seed(seed, k)), elems))
            .collect()
    };
    for (dt, count) in [
        (&data::FLOAT32, 1),
        (&data::FLOAT32, 1001),
        (&data::BFLOAT16, 65_539),
        (&data::FLOAT32, (64 << 20) / 4 + 3),
        (&data::INT64, (16 << 20) / 8 + 1),
    ] {
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
    sync(stream).expect("sync");
    // SAFETY: idle communicator, destroyed once.
    check_nccl(unsafe { ncclCommDestroy(comm) }, "ncclCommDestroy").expect("destroy");
    drop_stream(stream).expect("destroy stream");
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

/// Runs one process per GPU with NCCL's INIT log (and `extra` variables); the transports NCCL chose
/// for its connections, and the networks it used.
fn run_processes(
    what: &str,
    subsystems: &str,
    extra: &[(&str, &str)],
) -> (Vec<String>, Vec<String>) {
    let n = gpus();
    let mut env = vec![
        ("NCCL_DEBUG", "INFO".to_string()),
        ("NCCL_DEBUG_SUBSYS", subsystems.to_string()),
    ];
    env.extend(extra.iter().map(|&(k, v)| (k, v.to_string())));
    let done = child::run_ranks("mp", n, &env, Duration::from_secs(300));
    child::expect_success(what, &done);
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
#[ignore = "needs 2 GPUs: run through ci/gpu-run.sh"]
fn multi_process_one_gpu_each() {
    run_processes("multi-process", "INIT", &[]);
}

#[test]
#[ignore = "needs 2 GPUs: run through ci/gpu-run.sh"]
fn multi_process_network_transport() {
    let (t, _) = run_processes(
        "multi-process over the network transport",
        "INIT,NET",
        &[("NCCL_P2P_DISABLE", "1"), ("NCCL_SHM_DISABLE", "1")],
    );
    assert!(
        !t.is_empty() && t.iter().all(|x| x.starts_with("NET/")),
        "with P2P and SHM disabled every connection must go through NET, NCCL logged {t:?}"
    );
}
