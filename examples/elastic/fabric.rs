//! What a rank's life (`recovery.rs`) asks of the GPU side: its lines, unique ids, checked all-reduces,
//! and making, growing and giving up communicators. [`Gpu`] does it with NCCL; the CPU tests do it
//! with fake ranks (`fake.rs`), so that the same life, agreement included, runs without a GPU.

use std::time::Duration;

use metrale_gpu_sys::nccl::{NcclComm, NcclUniqueId};
use metrale_gpu_testkit::hex;

use crate::comm::{self, Gpu, Lost, Outcome};
use crate::membership::Membership;

/// Where a rank stands in a communicator: generation `gen`, rank `rank` of `size`.
#[derive(Clone, Copy, Debug)]
pub struct Place {
    pub gen: u64,
    pub rank: usize,
    pub size: usize,
}

/// The GPU side of a rank. Unique ids travel as hex, as over the rendezvous. Every call that waits is
/// bounded (its `limit` or `deadline`) and gives up on the rendezvous's news that its generation is lost.
pub trait Fabric {
    /// A communicator handle.
    type Comm: Copy;

    /// Prints one `ELASTIC` line.
    fn say(&mut self, line: String) -> Result<(), String>;

    /// A new unique id, for the first world or a new communicator after a loss.
    fn new_id(&mut self) -> Result<String, String>;

    /// One all-reduce of round `round` on `comm` at `at`, checked against the host's sum.
    fn all_reduce(
        &mut self,
        comm: Self::Comm,
        at: Place,
        round: usize,
        who: &Membership,
        deadline: Duration,
    ) -> Result<Outcome, String>;

    /// A new communicator from `id`, `at` its place.
    fn init(
        &mut self,
        at: Place,
        id: &str,
        limit: Duration,
        who: &Membership,
    ) -> Result<Self::Comm, String>;

    /// The revoked `parent` without `exclude`, to be `at` (NCCL works the place out itself); the parent
    /// is released either way.
    fn shrink(
        &mut self,
        parent: Self::Comm,
        exclude: &[usize],
        at: Place,
        limit: Duration,
        who: &Membership,
    ) -> Result<Self::Comm, String>;

    /// Rank 0's grow id on its idle communicator of generation `gen`; an error: the communicator is gone.
    fn grow_id(
        &mut self,
        comm: Self::Comm,
        who: &Membership,
        gen: u64,
        limit: Duration,
    ) -> Result<String, String>;

    /// The grow to `at` (`at.size` ranks, generation `at.gen`): a member passes its communicator (and
    /// rank 0 the id it made) and keeps its rank, a replacement no communicator, the id and its rank. Either way the parent
    /// is released; an error: the generation is lost.
    fn grow(
        &mut self,
        parent: Option<Self::Comm>,
        at: Place,
        id: Option<&str>,
        limit: Duration,
        who: &Membership,
    ) -> Result<Self::Comm, String>;

    /// Destroys (a healthy, idle one) or aborts `comm`.
    fn release(&mut self, comm: Self::Comm, abort: bool) -> Result<(), String>;

    /// Gives up on idle generation `gen` (lost while no collective ran), as a collective's wait would.
    fn give_up_idle(
        &mut self,
        comm: Self::Comm,
        who: &Membership,
        gen: u64,
        deadline: Duration,
    ) -> Result<Lost, String>;
}

/// The unique id a peer sent as hex; an error, never a panic, for anything else.
fn id_from_hex(text: &str) -> Result<NcclUniqueId, String> {
    hex::decode(text)
        .and_then(|bytes| <[u8; NcclUniqueId::BYTES]>::try_from(bytes).ok())
        .map(NcclUniqueId::from_bytes)
        .ok_or(format!("not a unique id: {text:?}"))
}

fn hex_of(id: &NcclUniqueId) -> String {
    hex::encode(&id.to_bytes())
}

impl Fabric for Gpu {
    type Comm = NcclComm;

    fn say(&mut self, line: String) -> Result<(), String> {
        println!("{line}");
        Ok(())
    }

    fn new_id(&mut self) -> Result<String, String> {
        NcclUniqueId::new()
            .map(|id| hex_of(&id))
            .map_err(|e| e.to_string())
    }

    fn all_reduce(
        &mut self,
        comm: NcclComm,
        at: Place,
        round: usize,
        who: &Membership,
        deadline: Duration,
    ) -> Result<Outcome, String> {
        Gpu::all_reduce(self, comm, at.rank, at.size, round, who, at.gen, deadline)
    }

    fn init(
        &mut self,
        at: Place,
        id: &str,
        limit: Duration,
        who: &Membership,
    ) -> Result<NcclComm, String> {
        comm::init(at.size, id_from_hex(id)?, at.rank, limit, who, at.gen)
    }

    fn shrink(
        &mut self,
        parent: NcclComm,
        exclude: &[usize],
        at: Place,
        limit: Duration,
        who: &Membership,
    ) -> Result<NcclComm, String> {
        comm::shrink(parent, exclude, limit, who, at.gen)
    }

    fn grow_id(
        &mut self,
        comm: NcclComm,
        who: &Membership,
        gen: u64,
        limit: Duration,
    ) -> Result<String, String> {
        comm::grow_id(comm, who, gen, limit).map(|id| hex_of(&id))
    }

    fn grow(
        &mut self,
        parent: Option<NcclComm>,
        at: Place,
        id: Option<&str>,
        limit: Duration,
        who: &Membership,
    ) -> Result<NcclComm, String> {
        let parent = parent.unwrap_or(std::ptr::null_mut());
        let id = match id.map(id_from_hex).transpose() {
            Ok(id) => id,
            Err(e) => {
                if !parent.is_null() {
                    comm::release(parent, true)?;
                }
                return Err(e);
            }
        };
        // A replacement gives its rank; a member -1 (NCCL keeps its rank).
        let rank = match parent.is_null() {
            true => at.rank as i32,
            false => -1,
        };
        comm::grow(parent, at.size, id.as_ref(), rank, limit, who, at.gen)
    }

    fn release(&mut self, comm: NcclComm, abort: bool) -> Result<(), String> {
        comm::release(comm, abort)
    }

    fn give_up_idle(
        &mut self,
        comm: NcclComm,
        who: &Membership,
        gen: u64,
        deadline: Duration,
    ) -> Result<Lost, String> {
        comm::give_up_idle(comm, who, gen, deadline)
    }
}
