//! The stale-copy race. `cuMemcpyHtoD` from pageable memory runs on the legacy
//! default stream and may return once the data is staged, before it has landed on the device; a
//! `CU_STREAM_NON_BLOCKING` stream (what `create_stream` makes) does not wait for the legacy stream. So
//! a collective queued on such a stream right after the copy may read what the buffer held before.
//! The old pattern (what the examples did) is run many times and its stale results are counted and
//! reported; the new pattern (`cuMemcpyHtoDAsync` on the collective's own stream, as the testkit's
//! `DevBuf::upload` does) must never read stale data.

use metrale_gpu_sys::cuda;
use metrale_gpu_sys::nccl::*;
use metrale_gpu_testkit::gpu::measured;

use crate::common::*;

/// The copy: large, so the driver stages it in pieces and the last piece is still in flight when the
/// copy returns.
const BYTES: usize = 64 << 20;
/// What the collective reads: the copy's last bytes, the ones that land last.
const TAIL: usize = 64 << 10;
const TAIL_INTS: usize = TAIL / 4;
/// Rounds per pattern: about 15 ms each on the 2-GPU host (two 64 MiB pageable copies); fewer beyond
/// 2 ranks, where every rank's copies share one GPU.
fn rounds(world: &World) -> usize {
    sized(world, 200, 50)
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Pattern {
    /// `cuMemcpyHtoD_v2` (legacy stream), then the collective on the non-blocking stream.
    SyncCopyThenCollective,
    /// `cuMemcpyHtoDAsync_v2` on the collective's stream, then the collective.
    CopyOnTheCollectivesStream,
}

/// Rank r's value at tail element i in round `round`: different in every round, never -1 (the marker).
fn value(round: usize, rank: usize, i: usize) -> i32 {
    (round * 7919 + rank * 104_729 + i) as i32
}

/// Rounds in which some rank's all-reduce of the tail did not see this round's data.
fn stale_rounds(world: &World, pattern: Pattern) -> usize {
    let (n, size) = (world.n(), world.size);
    let bufs: Vec<DevBuf> = world.devs.iter().map(|&d| DevBuf::cuda(d, BYTES)).collect();
    let outs: Vec<DevBuf> = world.devs.iter().map(|&d| DevBuf::cuda(d, TAIL)).collect();
    // Pageable host memory, touched once so that no round pays for page faults.
    let mut hosts: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; BYTES]).collect();
    let mut stale = 0;
    for round in 0..rounds(world) {
        for (r, host) in hosts.iter_mut().enumerate() {
            for (i, v) in host[BYTES - TAIL..].chunks_exact_mut(4).enumerate() {
                v.copy_from_slice(&value(round, world.ranks[r], i).to_le_bytes());
            }
        }
        // The device's tail holds the marker -1 and the output is poisoned, both done before the copy.
        for r in 0..n {
            bufs[r].fill(BYTES - TAIL, TAIL, 0xff, world.streams[r]);
            outs[r].fill(0, TAIL, POISON, world.streams[r]);
        }
        world.sync_all().expect("sync before the copy");
        for r in 0..n {
            match pattern {
                Pattern::SyncCopyThenCollective => {
                    let api = cuda::use_device(world.devs[r], "stale copy").expect("use_device");
                    // SAFETY: copies BYTES from the host vector into the allocation of BYTES.
                    check_cuda(
                        unsafe {
                            api.cuMemcpyHtoD_v2(bufs[r].ptr, hosts[r].as_ptr().cast(), BYTES)
                        },
                        "cuMemcpyHtoD",
                    )
                    .expect("cuMemcpyHtoD");
                }
                Pattern::CopyOnTheCollectivesStream => {
                    bufs[r].upload(0, &hosts[r], world.streams[r])
                }
            }
        }
        world
            .group("ncclAllReduce of the tail", |r| {
                // SAFETY: the tail and the output hold TAIL_INTS ints on the communicator's device.
                unsafe {
                    ncclAllReduce(
                        bufs[r].at(BYTES - TAIL),
                        outs[r].at(0),
                        TAIL_INTS,
                        NcclDataType::ncclInt32,
                        Op::Sum.nccl(),
                        world.comms[r],
                        world.streams[r],
                    )
                }
            })
            .expect("all-reduce");
        let fresh = (0..n).all(|r| {
            let got = outs[r].download(0, TAIL, world.streams[r]);
            got.chunks_exact(4).enumerate().all(|(i, b)| {
                let want = (0..size)
                    .map(|k| value(round, k, i))
                    .fold(0i32, i32::wrapping_add);
                i32::from_le_bytes([b[0], b[1], b[2], b[3]]) == want
            })
        });
        stale += usize::from(!fresh);
    }
    stale
}

#[test]
#[ignore = "needs a GPU: run through ci/gpu-run.sh"]
fn stale_copy_old_pattern_counted_new_pattern_always_correct() {
    ranks::test("stale_copy::stale_copy_old_pattern_counted_new_pattern_always_correct")
        .run(stale_copy);
}

fn stale_copy(me: &Me, world: &World) {
    let rounds = rounds(world);
    let mut counts = Vec::new();
    for pattern in [
        Pattern::SyncCopyThenCollective,
        Pattern::CopyOnTheCollectivesStream,
    ] {
        let started = std::time::Instant::now();
        let stale = stale_rounds(world, pattern);
        println!(
            "{pattern:?}: {stale} of {rounds} rounds read stale data ({} MiB copy, all-reduce of its last {} KiB; {:.1} s)",
            BYTES >> 20,
            TAIL >> 10,
            started.elapsed().as_secs_f64()
        );
        counts.push(stale);
    }
    measured(&format!(
        "stale copy, rank {} of {}: old pattern (cuMemcpyHtoD, collective on a non-blocking stream) {} of {rounds} rounds stale; \
         new pattern (copy on the collective's stream) {} of {rounds}",
        me.rank, me.nranks, counts[0], counts[1]
    ));
    assert_eq!(
        counts[1], 0,
        "a copy queued on the collective's own stream must always be seen"
    );
}
