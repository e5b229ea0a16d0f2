//! The communicators one process drives, each with a stream of its device: every GPU from one thread
//! (`ncclCommInitAll`, a group of `ncclCommInitRank`), or the one rank of a process of its own
//! ([`crate::ranks`]); and the group and polling steps that every multi-rank call in the suites goes
//! through. A world knows its communicators' size and each one's rank in it, so that a test written over
//! a world computes every rank's input and checks the ranks it drives, however many that is.

use std::cell::Cell;
use std::time::{Duration, Instant};

use metrale_gpu_sys::cuda::{self, CUstream};
use metrale_gpu_sys::nccl::*;

/// The communicators this thread drives (local index `i`), each with a stream of its device.
pub struct World {
    pub comms: Vec<NcclComm>,
    /// `ncclCommUserRank` of each communicator.
    pub ranks: Vec<usize>,
    pub devs: Vec<i32>,
    pub streams: Vec<CUstream>,
    /// `ncclCommCount` of the communicators (0 for a world of none).
    pub size: usize,
    /// `false` for communicators made with `blocking = 0`: calls may return `ncclInProgress`.
    pub blocking: bool,
    /// How often a call or group returned `ncclInProgress` (non-blocking communicators).
    pub in_progress_seen: Cell<usize>,
}

impl World {
    /// `ncclCommInitAll` over GPUs 0..n.
    pub fn init_all(n: usize) -> World {
        let devs: Vec<i32> = (0..n as i32).collect();
        let mut comms = vec![std::ptr::null_mut(); n];
        // SAFETY: comms has room for n handles; devs lists n ordinals.
        check_nccl(
            unsafe { ncclCommInitAll(comms.as_mut_ptr(), n as i32, devs.as_ptr()) },
            "ncclCommInitAll",
        )
        .unwrap_or_else(|e| panic!("ncclCommInitAll over GPUs 0..{n}: {e}"));
        World::from_comms(comms, true)
    }

    /// `ncclCommInitRank` for each GPU 0..n from this thread, inside `ncclGroupStart/End`.
    pub fn init_rank_group(n: usize) -> World {
        let id = NcclUniqueId::new().expect("ncclGetUniqueId");
        let mut comms = vec![std::ptr::null_mut(); n];
        group("ncclCommInitRank", n, |r| {
            cuda::use_device(r as i32, "init").expect("use_device");
            // SAFETY: writes one handle; rank r of n on the current device r.
            unsafe { ncclCommInitRank(&mut comms[r], n as i32, id, r as i32) }
        })
        .expect("ncclCommInitRank in a group");
        World::from_comms(comms, true)
    }

    /// `ncclCommInitRankConfig` for each GPU 0..n inside a group, with `config(rank)`. For a
    /// non-blocking config, waits until every communicator is ready by polling `ncclCommGetAsyncError`.
    /// Returns the world and what `ncclGroupEnd` returned.
    pub fn init_config(
        n: usize,
        config: impl FnMut(usize) -> NcclConfig,
    ) -> Result<(World, NcclResult), GpuError> {
        let id = NcclUniqueId::new()?;
        let mut comms = vec![std::ptr::null_mut(); n];
        let mut configs: Vec<NcclConfig> = (0..n).map(config).collect();
        let blocking = configs[0].blocking != 0;
        let end = group_with("ncclCommInitRankConfig", n, blocking, |r| {
            cuda::use_device(r as i32, "init").expect("use_device");
            // SAFETY: writes one handle; the config lives until the group ends.
            unsafe {
                ncclCommInitRankConfig(&mut comms[r], n as i32, id, r as i32, &mut configs[r])
            }
        })?;
        wait_comms(&comms, "ncclCommInitRankConfig")?;
        Ok((World::from_comms(comms, blocking), end))
    }

    /// Takes over communicators made elsewhere (e.g. by a split): one new stream per rank, on the device
    /// the communicator reports. They must be communicators of one size (`ncclCommCount`).
    pub fn from_comms(comms: Vec<NcclComm>, blocking: bool) -> World {
        let mut world = World {
            ranks: Vec::new(),
            size: 0,
            devs: Vec::new(),
            streams: Vec::new(),
            comms,
            blocking,
            in_progress_seen: Cell::new(0),
        };
        for r in 0..world.comms.len() {
            let (size, rank) = (
                world.query(r, ncclCommCount, "ncclCommCount"),
                world.query(r, ncclCommUserRank, "ncclCommUserRank"),
            );
            assert!(
                r == 0 || size as usize == world.size,
                "a world of communicators of different sizes ({} and {size})",
                world.size
            );
            world.size = size as usize;
            world.ranks.push(rank as usize);
            let dev = world.device(r);
            world.devs.push(dev);
            world
                .streams
                .push(create_stream(dev).expect("create_stream"));
        }
        world
    }

    /// How many communicators this process drives (all ranks from one thread; 1 in a rank's process).
    pub fn n(&self) -> usize {
        self.comms.len()
    }

    /// `ncclCommCuDevice` of the communicator at local index `i`.
    pub fn device(&self, i: usize) -> i32 {
        self.query(i, ncclCommCuDevice, "ncclCommCuDevice")
    }

    /// One of NCCL's int queries (`ncclCommCount`, `ncclCommCuDevice`, `ncclCommUserRank`) of the
    /// communicator at local index `i`.
    fn query(
        &self,
        i: usize,
        call: unsafe extern "C" fn(NcclComm, *mut i32) -> NcclResult,
        name: &str,
    ) -> i32 {
        let mut value = -1;
        // SAFETY: a live communicator this world holds; the query writes one int.
        check_nccl(unsafe { call(self.comms[i], &mut value) }, name)
            .unwrap_or_else(|e| panic!("{name} of a live communicator: {e}"));
        value
    }

    /// For non-blocking communicators: polls `ncclCommGetAsyncError` until no rank is in progress.
    pub fn wait_ready(&self, what: &str) -> Result<(), GpuError> {
        wait_comms(&self.comms, what)
    }

    /// Calls `f(rank)` for every rank inside one `ncclGroupStart/End` and, for non-blocking
    /// communicators, waits until the group's work is enqueued.
    pub fn group(&self, what: &str, f: impl FnMut(usize) -> NcclResult) -> Result<(), GpuError> {
        let end = group_with(what, self.n(), self.blocking, f)?;
        if end == NcclResult::ncclInProgress {
            self.in_progress_seen.set(self.in_progress_seen.get() + 1);
            self.wait_ready(what)?;
        }
        Ok(())
    }

    /// Each communicator with its stream: what a watchdog's wait over the world polls.
    pub fn work(&self) -> Vec<(NcclComm, CUstream)> {
        self.comms
            .iter()
            .copied()
            .zip(self.streams.iter().copied())
            .collect()
    }

    /// Waits for every rank's stream.
    pub fn sync_all(&self) -> Result<(), GpuError> {
        self.streams.iter().try_for_each(|&s| {
            // SAFETY: a stream this world created and has not destroyed.
            unsafe { sync_stream(s) }
        })
    }

    /// Gives the communicators up without destroying them (a test finalized, destroyed or aborted them).
    pub fn forget_comms(&mut self) {
        self.comms.clear();
        self.ranks.clear();
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if let Err(e) = self.sync_all() {
            eprintln!("warning: sync before teardown: {e}");
        }
        for &comm in &self.comms {
            // SAFETY: a communicator this world owns, idle, destroyed once.
            if let Err(e) = check_nccl(unsafe { ncclCommDestroy(comm) }, "ncclCommDestroy") {
                eprintln!("warning: {e}");
            }
        }
        for &s in &self.streams {
            // SAFETY: a stream this world created, idle, destroyed once.
            if let Err(e) = unsafe { destroy_stream(s) } {
                eprintln!("warning: {e}");
            }
        }
    }
}

/// How long [`wait_comms`] polls before it fails the test.
const READY_LIMIT: Duration = Duration::from_secs(120);

/// Polls `ncclCommGetAsyncError` on every communicator until none is `ncclInProgress`; an error state
/// is returned as the error.
pub fn wait_comms(comms: &[NcclComm], what: &str) -> Result<(), GpuError> {
    let deadline = Instant::now() + READY_LIMIT;
    for &comm in comms {
        loop {
            let mut state = NcclResult::ncclInProgress;
            // SAFETY: a live communicator; writes one value.
            let result = unsafe { ncclCommGetAsyncError(comm, &mut state) };
            check_nccl(result, "ncclCommGetAsyncError")?;
            if state != NcclResult::ncclInProgress {
                check_nccl(state, &format!("{what} (async state)"))?;
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: still ncclInProgress after {READY_LIMIT:?}"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    Ok(())
}

/// `ncclGroupStart`, `f(r)` for r in 0..n, `ncclGroupEnd` (always, even after a failed call). Blocking:
/// every status must be success. Non-blocking: `ncclInProgress` is accepted too. Returns ncclGroupEnd's.
pub fn group_with(
    what: &str,
    n: usize,
    blocking: bool,
    mut f: impl FnMut(usize) -> NcclResult,
) -> Result<NcclResult, GpuError> {
    let ok = |res: NcclResult| {
        res == NcclResult::ncclSuccess || (!blocking && res == NcclResult::ncclInProgress)
    };
    // SAFETY: no arguments.
    check_nccl(unsafe { ncclGroupStart() }, "ncclGroupStart")?;
    let mut first_error = None;
    for r in 0..n {
        let res = f(r);
        if !ok(res) && first_error.is_none() {
            first_error = Some((r, res));
        }
    }
    // SAFETY: closes the group opened above.
    let end = unsafe { ncclGroupEnd() };
    if let Some((r, res)) = first_error {
        check_nccl(res, &format!("{what} (rank {r})"))?;
    }
    if !ok(end) {
        check_nccl(end, &format!("ncclGroupEnd after {what}"))?;
    }
    Ok(end)
}

/// A group over n ranks of blocking communicators.
pub fn group(what: &str, n: usize, f: impl FnMut(usize) -> NcclResult) -> Result<(), GpuError> {
    group_with(what, n, true, f).map(|_| ())
}
