//! A training loop on NCCL: [`Training`] is what the caller gives (a round's work, queued on the
//! current communicator and the rank's stream), [`run`] is the rank's whole life on it: the first
//! world or a replacement's grow, every round bounded, recoveries and grows as they come.

use std::time::{Duration, Instant};

use metrale_gpu_sys::cuda::CUstream;
use metrale_gpu_sys::nccl::*;

use crate::config::Config;
use crate::fabric::{Fabric, Lost, Outcome, Place};
use crate::membership::Membership;
use crate::nccl;

/// What a training loop gives [`run`]: each round's work on the communicator of the moment.
///
/// The communicator changes when the world does (a recovery, a grow): never keep one past the call
/// it came with. Rounds are numbered across the job; after a recovery, a round some rank did not
/// finish is run again, so a round's work must be redoable (the step's inputs kept until its
/// [`finish`](Training::finish)).
///
/// ```no_run
/// use std::os::raw::c_void;
///
/// use metrale_gpu_elastic::{Config, Place, Training};
/// use metrale_gpu_sys::cuda::CUstream;
/// use metrale_gpu_sys::nccl::{ncclAllReduce, NcclComm, NcclDataType, NcclRedOp, NcclResult};
///
/// /// Gradients on this rank's GPU, summed over the ranks every round.
/// struct Sgd {
///     grads: *mut c_void,
///     count: usize,
/// }
///
/// impl Training for Sgd {
///     fn step(
///         &mut self,
///         _world: Place,
///         _round: usize,
///         comm: NcclComm,
///         stream: CUstream,
///     ) -> Result<NcclResult, String> {
///         // The forward and backward pass, queued on `stream`, then:
///         let (f32, sum) = (NcclDataType::ncclFloat32, NcclRedOp::ncclSum);
///         // SAFETY: `grads` holds `count` floats on this rank's GPU; the sum is queued on `stream`.
///         Ok(unsafe { ncclAllReduce(self.grads, self.grads, self.count, f32, sum, comm, stream) })
///     }
///
///     fn world_changed(&mut self, world: Place) {
///         // A real job reshards, or rescales its learning rate, here.
///         eprintln!("now rank {} of {}", world.rank, world.size);
///     }
/// }
///
/// fn main() -> Result<(), String> {
///     // `--rank`/`--world-size`/`--master`, torchrun's, Slurm's, Open MPI's or PMI's variables;
///     // `--join` for a replacement; `--deadline`, `--iters`, `--min-size`.
///     let args: Vec<String> = std::env::args().skip(1).collect();
///     let config = Config::from_args(&args, &|name| std::env::var(name).ok())?;
///     let mut sgd = Sgd { grads: std::ptr::null_mut(), count: 0 }; // cuMemAlloc'd in a real job
///     metrale_gpu_elastic::run(&config, &mut sgd)
/// }
/// ```
pub trait Training {
    /// Queues round `round`'s work up to its last NCCL call (for example: copy the gradients in, then
    /// `ncclAllReduce`) on `comm` and `stream`, as rank `world.rank` of `world.size`. Returns the status
    /// of that call (`ncclInProgress` or `ncclSuccess` on the non-blocking communicators this crate
    /// makes); an error status is the loss of the communicator, as a failed wait is, and the survivors
    /// recover. `Err`: this rank cannot go on (it ends with that error).
    ///
    /// Queue nothing after the NCCL call: a call that returned `ncclInProgress` may not be on the
    /// stream yet, so later work could run before it. Read the results in
    /// [`finish`](Training::finish), once the stream has drained.
    fn step(
        &mut self,
        world: Place,
        round: usize,
        comm: NcclComm,
        stream: CUstream,
    ) -> Result<NcclResult, String>;

    /// The stream ran round `round`'s work: the collectives are done and the stream has drained. Copy
    /// out, use or check the results. `Err` ends this rank.
    fn finish(&mut self, world: Place, round: usize) -> Result<(), String> {
        let _ = (world, round);
        Ok(())
    }

    /// The world changed (a recovery or a grow made a new communicator): called before the first
    /// round on it.
    fn world_changed(&mut self, world: Place) {
        let _ = world;
    }

    /// One phase of the rank's life, as its `ELASTIC phase=… key=value …` line ([`crate::lines`]
    /// reads them). By default printed on stdout.
    fn event(&mut self, line: &str) {
        println!("{line}");
    }
}

/// This process's GPU side: its stream, and the caller's training.
struct Gpu<'t, T: Training> {
    stream: CUstream,
    training: &'t mut T,
    /// The world of the last round, to tell the training when it changes.
    world: Option<Place>,
}

/// A rank's life on GPU `config.local_rank` (this thread's current device from then on): the job from
/// the launcher's variables ([`Config::from_args`]), `training`'s rounds to `config.iters`, every loss
/// recovered and every replacement grown in, as the crate's docs say. `Ok` once the job's last round
/// is done; an error when this rank cannot go on (the job ended below its minimum size, the coordinator
/// is gone, this rank was left out, or the rounds of one recovery ran out).
pub fn run<T: Training>(config: &Config, training: &mut T) -> Result<(), String> {
    metrale_gpu_sys::version::check_library_version().map_err(|e| e.to_string())?;
    let stream = create_stream(config.local_rank).map_err(|e| e.to_string())?;
    let mut gpu = Gpu {
        stream,
        training,
        world: None,
    };
    let lived = crate::backend::run_with(config, &mut gpu);
    // SAFETY: the stream from create_stream, idle (every wait drained it, or the communicator using it
    // was revoked or aborted, which ends its kernels), destroyed once.
    let destroyed = unsafe { destroy_stream(stream) };
    lived.and(destroyed.map_err(|e| e.to_string()))
}

/// The unique id a peer sent as hex; an error, never a panic, for anything else.
fn id_from_hex(text: &str) -> Result<NcclUniqueId, String> {
    metrale_gpu_launch::hex::decode(text)
        .and_then(|bytes| <[u8; NcclUniqueId::BYTES]>::try_from(bytes).ok())
        .map(NcclUniqueId::from_bytes)
        .ok_or(format!("not a unique id: {text:?}"))
}

fn hex_of(id: &NcclUniqueId) -> String {
    metrale_gpu_launch::hex::encode(&id.to_bytes())
}

impl<T: Training> Fabric for Gpu<'_, T> {
    type Comm = NcclComm;

    fn say(&mut self, line: String) -> Result<(), String> {
        self.training.event(&line);
        Ok(())
    }

    fn new_id(&mut self) -> Result<String, String> {
        NcclUniqueId::new()
            .map(|id| hex_of(&id))
            .map_err(|e| e.to_string())
    }

    fn round(
        &mut self,
        comm: NcclComm,
        at: Place,
        round: usize,
        who: &dyn Membership,
        deadline: Duration,
    ) -> Result<Outcome, String> {
        let start = Instant::now();
        if self.world != Some(at) {
            self.world = Some(at);
            self.training.world_changed(at);
        }
        let res = self.training.step(at, round, comm, self.stream)?;
        let outcome = nccl::wait_round((comm, self.stream), res, who, at.gen, deadline, start)?;
        if let Outcome::Done = outcome {
            self.training.finish(at, round)?;
        }
        Ok(outcome)
    }

    fn init(
        &mut self,
        at: Place,
        id: &str,
        limit: Duration,
        who: &dyn Membership,
    ) -> Result<NcclComm, String> {
        nccl::init(at.size, id_from_hex(id)?, at.rank, limit, who, at.gen)
    }

    fn shrink(
        &mut self,
        parent: NcclComm,
        exclude: &[usize],
        at: Place,
        limit: Duration,
        who: &dyn Membership,
    ) -> Result<NcclComm, String> {
        nccl::shrink(parent, exclude, limit, who, at.gen)
    }

    fn grow_id(
        &mut self,
        comm: NcclComm,
        who: &dyn Membership,
        gen: u64,
        limit: Duration,
    ) -> Result<String, String> {
        nccl::grow_id(comm, who, gen, limit).map(|id| hex_of(&id))
    }

    fn grow(
        &mut self,
        parent: Option<NcclComm>,
        at: Place,
        id: Option<&str>,
        limit: Duration,
        who: &dyn Membership,
    ) -> Result<NcclComm, String> {
        let parent = parent.unwrap_or(std::ptr::null_mut());
        let id = match id.map(id_from_hex).transpose() {
            Ok(id) => id,
            Err(e) => {
                if !parent.is_null() {
                    nccl::release(parent, true)?;
                }
                return Err(e);
            }
        };
        // A replacement gives its rank; a member -1 (NCCL keeps its rank).
        let rank = match parent.is_null() {
            true => at.rank as i32,
            false => -1,
        };
        nccl::grow(parent, at.size, id.as_ref(), rank, limit, who, at.gen)
    }

    fn release(&mut self, comm: NcclComm, abort: bool) -> Result<(), String> {
        nccl::release(comm, abort)
    }

    fn give_up_idle(
        &mut self,
        comm: NcclComm,
        who: &dyn Membership,
        gen: u64,
        deadline: Duration,
    ) -> Result<Lost, String> {
        nccl::give_up_idle(comm, who, gen, deadline)
    }
}
