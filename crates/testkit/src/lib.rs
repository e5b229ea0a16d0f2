//! What metrale-gpu-sys's GPU suite (`tests/gpu/`) and fault suite (`tests/faults/`) share, and the
//! benchmark's host-side number formats. Not published: it is test support, not API.
//!
//! - [`gpu`]: the preamble every GPU test runs first ([`gpu::gpus`]) and the driver table.
//! - [`device_memory`]: the device memory this process uses (nvidia-smi's per-process rows; GPU-wide,
//!   and saying so, where it lists none), for the leak and cleanup checks.
//! - [`devbuf`]: device buffers whose copies are queued on the caller's stream.
//! - [`world`]: one communicator and one stream per GPU, driven from one thread; groups and polling.
//! - [`ranks`]: one process per rank: a test runs itself once per rank, placed by [`placement`], and
//!   the ranks exchange unique ids through files; every wait bounded.
//! - [`child`]: the test binary run again as a child process (a rank, a peer to kill, a crash to contain).
//! - [`standin`]: a stand-in C library built for the target, and a test run again in a child that loads it.
//! - [`hex`]: bytes as hex and back (unique ids in variables and text protocols): metrale-gpu-launch's.
//! - [`codec`]: fp16, bf16, fp8 e4m3 and e5m2 to and from `f64`, rounded as CUDA rounds.
//! - [`op`]: NCCL's built-in reduction operations and their host-side reference.
//! - [`placement`]: where each rank of a multi-process test runs: R ranks over G GPUs, simulated hosts
//!   where ranks share a GPU (`METRALE_TEST_RANKS`, `METRALE_TEST_PLACEMENT`).
//! - [`deps`]: the libnccl builds `ci/setup` installed for this binary's architecture.
//! - [`stacks`]: every thread's stack of a stuck process, from gdb or cuda-gdb where one is on `PATH`.
//! - [`skip`]: the one line a test prints when it cannot hold where it runs, visible and counted.
//! - [`strays`]: what port scanners, floods and other jobs' ranks send to a rendezvous, and what each saw.
//! - [`peak`]: the process's peak resident memory, for the tests that show a flood costs none.
//! - [`etcd_cluster`]: the members of `ci/etcd-cluster`'s etcd, stopped and started again by a test.

pub mod child;
pub mod codec;
pub mod deps;
pub mod devbuf;
pub mod device_memory;
pub mod etcd_cluster;
pub mod gpu;
pub mod op;
pub mod peak;
pub mod placement;
pub mod ranks;
pub mod skip;
pub mod stacks;
pub mod standin;
pub mod strays;
pub mod world;

pub use metrale_gpu_launch::hex;
