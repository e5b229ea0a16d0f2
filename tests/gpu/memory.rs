//! NCCL's allocator and buffer registration: nccl_mem_alloc up to GiBs on every GPU (one process), and
//! ncclCommRegister and ncclCommWindowRegister buffers used in collectives (one process per rank).

use std::os::raw::c_void;

use metrale_gpu_sys::cuda;
use metrale_gpu_sys::nccl::*;

use metrale_gpu_testkit::device_memory;

use crate::common::*;
use crate::data;

const MiB: usize = 1 << 20;
const GiB: usize = 1 << 30;

#[test]
#[ignore = "needs a GPU: run through ci/gpu-run.sh"]
fn nccl_mem_alloc_sizes() {
    let n = gpus();
    for dev in 0..n as i32 {
        let api = cuda::use_device(dev, "memory test").expect("use_device");
        for (i, size) in [1, 4096 + 3, 64 * MiB + 3, GiB, 4 * GiB + 5]
            .into_iter()
            .enumerate()
        {
            // This process's device memory, in whole MiB: fine beside the 2 MiB slack below.
            let before = device_memory::used(&[dev]);
            let buf = DevBuf::nccl(dev, size);
            let after = device_memory::used(&[dev]);
            let pattern = 0x11 * (i as u8 + 1) + dev as u8;
            cuda::use_device(dev, "memory test").expect("use_device");
            // SAFETY: the whole allocation, with the device's context current.
            check_cuda(
                unsafe { api.cuMemsetD8_v2(buf.ptr, pattern, size) },
                "cuMemsetD8",
            )
            .expect("memset");
            let edge = size.min(4096);
            for offset in [0, size - edge] {
                let mut host = vec![0u8; edge];
                // SAFETY: reads `edge` bytes inside the allocation into `host`.
                check_cuda(
                    unsafe {
                        api.cuMemcpyDtoH_v2(host.as_mut_ptr().cast(), buf.ptr + offset as u64, edge)
                    },
                    "cuMemcpyDtoH",
                )
                .expect("read back");
                assert!(
                    host.iter().all(|&b| b == pattern),
                    "GPU {dev}: {size} bytes from nccl_mem_alloc do not hold the pattern at offset {offset}"
                );
            }
            println!(
                "GPU {dev}: nccl_mem_alloc({size}) at {:#x}: written and read back; device memory in use {:.0} -> {:.0} MiB ({})",
                buf.ptr,
                before.mib(),
                after.mib(),
                after.source
            );
            let taken = after.bytes.saturating_sub(before.bytes);
            assert!(
                taken >= size.saturating_sub(2 * MiB) as u64,
                "GPU {dev}: allocating {size} bytes took only {taken} bytes of device memory ({})",
                after.source
            );
            drop(buf); // nccl_mem_free
        }
    }
}

/// Buffers of `cap` bytes per rank from ncclMemAlloc, (input, output).
fn nccl_buffers(world: &World, cap: usize) -> Vec<(DevBuf, DevBuf)> {
    (0..world.n())
        .map(|r| {
            (
                DevBuf::nccl(world.devs[r], cap),
                DevBuf::nccl(world.devs[r], cap),
            )
        })
        .collect()
}

/// Bytes per rank of the registered buffers: 128 MiB, 1 MiB beyond 2 ranks (many ranks on one GPU
/// over sockets).
fn registered_bytes(world: &World) -> usize {
    sized(world, 128 * MiB, MiB)
}

/// The cases run on registered buffers of `cap` bytes per rank.
fn registered_cases(
    world: &World,
    tally: &mut Tally,
    given: &[(&DevBuf, &DevBuf)],
    cap: usize,
    seed: u64,
) {
    let n = world.size;
    let f32 = &data::FLOAT32;
    let cases: Vec<(Coll, &data::Dtype, usize, bool)> = vec![
        (Coll::AllReduce(Op::Sum), f32, 1, false),
        (Coll::AllReduce(Op::Sum), f32, 65_539, false),
        (Coll::AllReduce(Op::Sum), f32, cap / 4 - 3, false),
        (Coll::AllReduce(Op::Sum), f32, cap / 4 - 3, true),
        (Coll::AllReduce(Op::Max), &data::BFLOAT16, cap / 2 - 1, true),
        (Coll::AllGather, &data::UINT8, cap / n - 5, false),
        (Coll::AllGather, &data::UINT8, cap / n - 5, true),
        (Coll::ReduceScatter(Op::Sum), f32, cap / 4 / n - 1, false),
        (Coll::ReduceScatter(Op::Sum), f32, cap / 4 / n - 1, true),
        (Coll::Broadcast(0), &data::FLOAT16, cap / 2 - 7, false),
        (Coll::SendRecv, f32, cap / 4 - 1, false),
    ];
    for (i, (coll, dt, count, in_place)) in cases.into_iter().enumerate() {
        tally.run(
            world,
            Case::new(coll, dt, count, in_place, seed + i as u64),
            Buffers::Given(given),
            None,
        );
    }
}

#[test]
#[ignore = "needs a GPU: run through ci/gpu-run.sh"]
fn registered_buffers_in_collectives() {
    ranks::test("memory::registered_buffers_in_collectives").run(|_, world| {
        let cap = registered_bytes(world);
        let bufs = nccl_buffers(world, cap);
        let mut handles: Vec<*mut c_void> = Vec::new();
        for (r, (a, b)) in bufs.iter().enumerate() {
            for buf in [a, b] {
                let mut handle = std::ptr::null_mut();
                // SAFETY: a live communicator; the buffer holds `cap` bytes on its device; writes one handle.
                check_nccl(
                    unsafe { ncclCommRegister(world.comms[r], buf.at(0), cap, &mut handle) },
                    "ncclCommRegister",
                )
                .expect("ncclCommRegister");
                handles.push(handle);
            }
        }
        let given: Vec<(&DevBuf, &DevBuf)> = bufs.iter().map(|(a, b)| (a, b)).collect();
        let mut tally = Tally::new();
        registered_cases(world, &mut tally, &given, cap, 8000);
        world.sync_all().expect("sync every stream");
        for (i, &handle) in handles.iter().enumerate() {
            // SAFETY: a handle from ncclCommRegister on this rank's communicator, deregistered once.
            let res = check_nccl(
                unsafe { ncclCommDeregister(world.comms[i / 2], handle) },
                "ncclCommDeregister",
            );
            tally.record(
                &format!(
                    "ncclCommDeregister rank {} buffer {}",
                    world.ranks[i / 2],
                    i % 2
                ),
                res.map_err(|e| e.to_string()),
            );
        }
        tally.finish("registered_buffers_in_collectives");
    });
}

#[test]
#[ignore = "needs a GPU: run through ci/gpu-run.sh"]
fn window_registered_buffers_in_collectives() {
    ranks::test("memory::window_registered_buffers_in_collectives").run(|_, world| {
        let n = world.n();
        let cap = registered_bytes(world);
        let bufs = nccl_buffers(world, cap);
        let mut windows: Vec<Vec<ncclWindow_t>> = vec![Vec::new(); 2];
        for (which, list) in windows.iter_mut().enumerate() {
            *list = vec![std::ptr::null_mut(); n];
            group("ncclCommWindowRegister", n, |r| {
                let buf = if which == 0 { &bufs[r].0 } else { &bufs[r].1 };
                // SAFETY: a live communicator; the ncclMemAlloc buffer holds `cap` bytes; writes one handle.
                unsafe {
                    ncclCommWindowRegister(
                        world.comms[r],
                        buf.at(0),
                        cap,
                        &mut list[r],
                        NCCL_WIN_COLL_SYMMETRIC as i32,
                    )
                }
            })
            .expect("ncclCommWindowRegister (symmetric) on every rank");
        }
        let given: Vec<(&DevBuf, &DevBuf)> = bufs.iter().map(|(a, b)| (a, b)).collect();
        let mut tally = Tally::new();
        registered_cases(world, &mut tally, &given, cap, 8100);
        world.sync_all().expect("sync every stream");
        for list in &windows {
            let res = group("ncclCommWindowDeregister", n, |r| {
                // SAFETY: a window from ncclCommWindowRegister on this communicator, deregistered once.
                unsafe { ncclCommWindowDeregister(world.comms[r], list[r]) }
            });
            tally.record(
                "ncclCommWindowDeregister on every rank",
                res.map_err(|e| e.to_string()),
            );
        }
        tally.finish("window_registered_buffers_in_collectives");
    });
}
