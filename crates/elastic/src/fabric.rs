//! What a rank's life ([`crate::run_with`]) asks of the GPU side: its lines, unique ids, the rounds,
//! and making, growing and giving up communicators. NCCL does it in [`crate::run`] (NCCL 2.29+); the
//! CPU tests do it with fake ranks, so that the same life, agreement included, runs without a GPU.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::membership::Membership;
use crate::protocol::Held;

/// Where a thread of the membership (not the rank's own) says its `ELASTIC` lines.
pub type Sink = Arc<dyn Fn(String) + Send + Sync>;

/// How a rank learnt that a collective of generation `gen` will never finish, and what it holds.
#[derive(Clone, Debug)]
pub struct Lost {
    /// `rendezvous` (the membership's news), `nccl` (an error NCCL reported), `timeout`, or `setup`
    /// (making the generation failed).
    pub how: &'static str,
    pub detail: String,
    /// Revoked (quiescent with no error: can be shrunk) or aborted.
    pub held: Held,
    /// From the start of the wait to the moment the rank gave up.
    pub waited: Duration,
    /// That moment, in µs since the Unix epoch.
    pub at_unix_us: u128,
    /// From then until the rank was done giving up (`ncclCommRevoke` and its quiescence).
    pub revoked: Duration,
}

/// How a round ended.
#[derive(Clone, Debug)]
pub enum Outcome {
    /// Its work finished, and was right.
    Done,
    Lost(Lost),
}

/// Now, in µs since the Unix epoch.
pub fn unix_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0)
}

/// Where a rank stands in a communicator: generation `gen`, rank `rank` of `size`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    pub gen: u64,
    pub rank: usize,
    pub size: usize,
}

/// The GPU side of a rank. Unique ids travel as hex, as over the rendezvous. Every call that waits is
/// bounded (its `limit` or `deadline`) and gives up on the membership's news that its generation is
/// lost.
pub trait Fabric {
    /// A communicator handle.
    type Comm: Copy;

    /// Prints one `ELASTIC` line.
    fn say(&mut self, line: String) -> Result<(), String>;

    /// Where the membership's own threads say their lines (the etcd coordinator's): stdout unless the
    /// fabric keeps its lines elsewhere.
    fn sink(&self) -> Sink {
        Arc::new(|line| println!("{line}"))
    }

    /// A new unique id, for the first world or a new communicator after a loss.
    fn new_id(&mut self) -> Result<String, String>;

    /// Round `round` on `comm` at `at`: its work, waited for and checked.
    fn round(
        &mut self,
        comm: Self::Comm,
        at: Place,
        round: usize,
        who: &dyn Membership,
        deadline: Duration,
    ) -> Result<Outcome, String>;

    /// A new communicator from `id`, `at` its place.
    fn init(
        &mut self,
        at: Place,
        id: &str,
        limit: Duration,
        who: &dyn Membership,
    ) -> Result<Self::Comm, String>;

    /// The revoked `parent` without `exclude`, to be `at` (NCCL works the place out itself); the parent
    /// is released either way.
    fn shrink(
        &mut self,
        parent: Self::Comm,
        exclude: &[usize],
        at: Place,
        limit: Duration,
        who: &dyn Membership,
    ) -> Result<Self::Comm, String>;

    /// Rank 0's grow id on its idle communicator of generation `gen`; an error: the communicator is gone.
    fn grow_id(
        &mut self,
        comm: Self::Comm,
        who: &dyn Membership,
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
        who: &dyn Membership,
    ) -> Result<Self::Comm, String>;

    /// Destroys (a healthy, idle one) or aborts `comm`.
    fn release(&mut self, comm: Self::Comm, abort: bool) -> Result<(), String>;

    /// Gives up on idle generation `gen` (lost while no collective ran), as a collective's wait would.
    fn give_up_idle(
        &mut self,
        comm: Self::Comm,
        who: &dyn Membership,
        gen: u64,
        deadline: Duration,
    ) -> Result<Lost, String>;
}
