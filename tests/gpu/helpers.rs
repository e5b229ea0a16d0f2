//! The crate's stream and event helpers, in one process per rank (each its own communicator, made with
//! ncclCommInitRank).

use metrale_gpu_sys::cuda;
use metrale_gpu_sys::nccl::*;

use crate::common::*;
use crate::data::{self, Rng};

/// Floats of the checked all-reduce.
const COUNT: usize = (4 << 20) / 4 + 3;
/// Floats of each of the all-reduces that keep the stream busy (not checked: any data will do).
const BUSY_COUNT: usize = (64 << 20) / 4;

fn per_rank(me: &Me) -> Result<Vec<String>, String> {
    let (rank, n, dev) = (me.rank, me.nranks, me.device);
    let id = me.share_id("helpers-id", 0);
    let mut notes = Vec::new();
    // Many streams and events, created and destroyed.
    for _ in 0..32 {
        let s = create_stream(dev).map_err(|e| e.to_string())?;
        let e = create_event(dev).map_err(|e| e.to_string())?;
        record(e, s).map_err(|e| e.to_string())?;
        sync(s).map_err(|e| e.to_string())?;
        drop_event(e).map_err(|e| e.to_string())?;
        drop_stream(s).map_err(|e| e.to_string())?;
    }
    notes.push("32 streams and events created, recorded, synchronised, destroyed".to_string());

    let producer = create_stream(dev).map_err(|e| e.to_string())?;
    let consumer = create_stream(dev).map_err(|e| e.to_string())?;
    let event = create_event(dev).map_err(|e| e.to_string())?;
    let mut comm: NcclComm = std::ptr::null_mut();
    cuda::use_device(dev, "helpers test").map_err(|e| e.to_string())?;
    check_nccl(
        // SAFETY: writes one handle; rank `rank` of n on the current device.
        unsafe { ncclCommInitRank(&mut comm, n as i32, id, rank as i32) },
        "ncclCommInitRank",
    )
    .map_err(|e| e.to_string())?;

    let dt = &data::FLOAT32;
    let inputs: Vec<Vec<u8>> = (0..n)
        .map(|k| dt.random(&mut Rng::new(data::seed(9000, k)), COUNT))
        .collect();
    let x = DevBuf::cuda(dev, COUNT * 4);
    let y = DevBuf::cuda(dev, COUNT * 4);
    y.fill(0, y.bytes, POISON, consumer);
    sync(consumer).map_err(|e| e.to_string())?;

    // An all-reduce of `buf` in place on the producer stream.
    let all_reduce = |buf: &DevBuf, op: Op| {
        // SAFETY: buf holds bytes / 4 floats on this device; the stream is this device's.
        let res = unsafe {
            ncclAllReduce(
                buf.at(0),
                buf.at(0),
                buf.bytes / 4,
                dt.nccl,
                op.nccl(),
                comm,
                producer,
            )
        };
        check_nccl(res, "ncclAllReduce").map_err(|e| e.to_string())
    };
    // Producer: upload, all-reduce in place; event; consumer waits for it, then copies x to y.
    x.upload(0, &inputs[rank], producer);
    all_reduce(&x, Op::Sum)?;
    record(event, producer).map_err(|e| e.to_string())?;
    wait_event(consumer, event).map_err(|e| e.to_string())?;
    check_cuda(
        // SAFETY: both buffers hold COUNT * 4 bytes; the consumer stream is live.
        unsafe { api().cuMemcpyDtoDAsync_v2(y.ptr, x.ptr, COUNT * 4, consumer) },
        "cuMemcpyDtoDAsync",
    )
    .map_err(|e| e.to_string())?;
    // Only the consumer is synchronised: what it copied must be the reduced data.
    let got = y.download(0, COUNT * 4, consumer);
    let ins: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
    data::check_reduce(dt, Op::Sum, &ins, &got)
        .map_err(|e| format!("consumer stream after stream_wait_event: {e}"))?;
    notes.push(format!(
        "record_event + stream_wait_event: the consumer's copy of a {} MiB all-reduce is the reduced data",
        (COUNT * 4) >> 20
    ));

    // stream_ready: false while 16 large all-reduces run, true after sync_stream.
    let busy_buf = DevBuf::cuda(dev, BUSY_COUNT * 4);
    busy_buf.fill(0, busy_buf.bytes, 0, producer);
    for _ in 0..16 {
        all_reduce(&busy_buf, Op::Max)?;
    }
    let busy = ready(producer).map_err(|e| e.to_string())?;
    sync(producer).map_err(|e| e.to_string())?;
    let idle = ready(producer).map_err(|e| e.to_string())?;
    notes.push(format!(
        "stream_ready during 16 all-reduces: {busy}, after sync_stream: {idle}"
    ));
    if busy || !idle {
        return Err(format!(
            "stream_ready was {busy} while collectives were queued (expected false) and {idle} after sync_stream (expected true)"
        ));
    }

    drop(busy_buf);
    drop(x);
    drop(y);
    // SAFETY: idle communicator, destroyed once.
    check_nccl(unsafe { ncclCommDestroy(comm) }, "ncclCommDestroy").map_err(|e| e.to_string())?;
    drop_event(event).map_err(|e| e.to_string())?;
    drop_stream(producer).map_err(|e| e.to_string())?;
    drop_stream(consumer).map_err(|e| e.to_string())?;
    Ok(notes)
}

#[test]
#[ignore = "needs a GPU: run through ci/gpu-run.sh"]
fn helpers_streams_and_events() {
    ranks::test("helpers::helpers_streams_and_events").run_raw(|me| match per_rank(me) {
        Ok(notes) => {
            for note in notes {
                println!("rank {}: {note}", me.rank);
            }
        }
        Err(e) => panic!("rank {}: {e}", me.rank),
    });
}
