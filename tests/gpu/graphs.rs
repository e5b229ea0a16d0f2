//! A collective captured into a CUDA graph on streams from the crate's helper, then replayed, one
//! process per rank.

use metrale_gpu_sys::cuda::{self, CUgraph, CUgraphExec, CUstreamCaptureMode};
use metrale_gpu_sys::nccl::*;

use crate::common::*;
use crate::data::{self, Rng};

#[test]
#[ignore = "needs a GPU: run through ci/gpu-run.sh"]
fn cuda_graph_capture_and_replay() {
    ranks::test("graphs::cuda_graph_capture_and_replay").run(|_, world| capture_and_replay(world));
}

fn capture_and_replay(world: &World) {
    let n = world.n();
    let api = api();
    let dt = &data::FLOAT32;
    // Elements per rank: 32 MiB of floats and 3, a few MiB beyond 2 ranks.
    let count = sized(world, (32 << 20) / 4 + 3, (2 << 20) / 4 + 3);
    let send: Vec<DevBuf> = (0..n)
        .map(|r| DevBuf::cuda(world.devs[r], count * 4))
        .collect();
    let recv: Vec<DevBuf> = (0..n)
        .map(|r| DevBuf::cuda(world.devs[r], count * 4))
        .collect();

    // Warm-up outside the capture: connections are made.
    let mut tally = Tally::new();
    tally.case(
        world,
        Case::new(Coll::AllReduce(Op::Sum), dt, 1001, false, 12_000),
    );

    // Capture: every rank's stream, one group of all-reduces (send -> recv). Every capture begun is
    // ended before anything can fail the test: a stream left capturing would hang the teardown.
    let mut begun = Vec::new();
    let mut errors: Vec<String> = Vec::new();
    for r in 0..n {
        cuda::use_device(world.devs[r], "capture").expect("use_device");
        // SAFETY: a live stream, not capturing yet.
        let res = check_cuda(
            unsafe {
                api.cuStreamBeginCapture_v2(
                    world.streams[r],
                    CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
                )
            },
            "cuStreamBeginCapture",
        );
        match res {
            Ok(()) => begun.push(r),
            Err(e) => errors.push(e.to_string()),
        }
    }
    if errors.is_empty() {
        let res = group("ncclAllReduce (captured)", n, |r| {
            // SAFETY: both buffers hold count floats on the communicator's device; the stream is capturing.
            unsafe {
                ncclAllReduce(
                    send[r].at(0),
                    recv[r].at(0),
                    count,
                    dt.nccl,
                    Op::Sum.nccl(),
                    world.comms[r],
                    world.streams[r],
                )
            }
        });
        if let Err(e) = res {
            errors.push(e.to_string());
        }
    }
    let mut graphs: Vec<CUgraph> = vec![std::ptr::null_mut(); n];
    for &r in &begun {
        cuda::use_device(world.devs[r], "capture").expect("use_device");
        // SAFETY: ends the capture begun above on this stream; writes one graph.
        let res = check_cuda(
            unsafe { api.cuStreamEndCapture(world.streams[r], &mut graphs[r]) },
            "cuStreamEndCapture",
        );
        if let Err(e) = res {
            errors.push(e.to_string());
        }
    }
    assert!(errors.is_empty(), "capture: {}", errors.join("; "));
    // Instantiate only once no stream captures any more (global capture mode forbids it meanwhile).
    let mut execs: Vec<CUgraphExec> = vec![std::ptr::null_mut(); n];
    for r in 0..n {
        cuda::use_device(world.devs[r], "instantiate").expect("use_device");
        // SAFETY: a graph from the capture above, instantiated in its device's (current) context.
        check_cuda(
            unsafe { api.cuGraphInstantiateWithFlags(&mut execs[r], graphs[r], 0) },
            "cuGraphInstantiateWithFlags",
        )
        .expect("instantiate");
    }
    println!("captured one all-reduce per GPU into a CUDA graph and instantiated it");

    // Replays: new input each time, output poisoned each time.
    for replay in 0..3u64 {
        let inputs: Vec<Vec<u8>> = (0..world.size)
            .map(|k| dt.random(&mut Rng::new(data::seed(12_100 + replay, k)), count))
            .collect();
        for r in 0..n {
            send[r].upload(0, &inputs[world.ranks[r]], world.streams[r]);
            recv[r].fill(0, recv[r].bytes, POISON, world.streams[r]);
        }
        for r in 0..n {
            cuda::use_device(world.devs[r], "replay").expect("use_device");
            // SAFETY: an instantiated graph of this device, launched on this device's stream.
            check_cuda(
                unsafe { api.cuGraphLaunch(execs[r], world.streams[r]) },
                "cuGraphLaunch",
            )
            .expect("launch");
        }
        world.sync_all().expect("sync every stream");
        let ins: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
        for r in 0..n {
            let got = recv[r].download(0, count * 4, world.streams[r]);
            let v = data::check_reduce(dt, Op::Sum, &ins, &got);
            tally.record(
                &format!(
                    "graph replay {replay} rank {}: {count} floats",
                    world.ranks[r]
                ),
                v,
            );
        }
    }
    for r in 0..n {
        // SAFETY: idle (synchronised above), destroyed once.
        unsafe {
            check_cuda(api.cuGraphExecDestroy(execs[r]), "cuGraphExecDestroy")
                .expect("destroy exec");
            check_cuda(api.cuGraphDestroy(graphs[r]), "cuGraphDestroy").expect("destroy graph");
        }
    }
    tally.finish("cuda_graph_capture_and_replay");
}
