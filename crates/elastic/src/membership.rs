//! Who is alive: the rendezvous that hands out the unique ids, tells the survivors who died and makes
//! them agree on what comes next ([`Membership`]). In the embedded backend rank 0 coordinates
//! (`coordinator.rs`); every other process keeps one connection to it (`client.rs`); the messages are in
//! `protocol.rs`.
//!
//! The kernel closes the sockets of a process that dies, even by SIGKILL, so rank 0 reads the end of a
//! dead member's connection within milliseconds: that holds on every transport NCCL uses (over NVLink
//! NCCL itself never notices a dead peer). Rank 0's own death closes every member's connection: each
//! ends with a clear error (`COORDINATOR_GONE`) within the time its revoke takes; this example
//! elects no new coordinator.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::protocol::{Held, Plan};

/// State a connection's thread and the rank share, with the condition variable that says it changed.
pub type Shared<T> = Arc<(Mutex<T>, Condvar)>;

pub fn shared<T>(value: T) -> Shared<T> {
    Arc::new((Mutex::new(value), Condvar::new()))
}

/// The state, even if a thread panicked holding it (every update leaves it whole).
pub fn lock<T>(shared: &Shared<T>) -> MutexGuard<'_, T> {
    shared.0.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Waits until `done` holds or `deadline` passes: the state, and whether `done` holds.
pub fn wait_until<T>(
    shared: &Shared<T>,
    deadline: Instant,
    done: impl Fn(&T) -> bool,
) -> (MutexGuard<'_, T>, bool) {
    let mut state = lock(shared);
    loop {
        if done(&state) {
            return (state, true);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return (state, false);
        }
        state = match shared.1.wait_timeout(state, left) {
            Ok((state, _)) => state,
            Err(poisoned) => poisoned.into_inner().0,
        };
    }
}

/// Makes a unique id (hex) for a new communicator or a grow: rank 0's NCCL, a fake in the tests.
pub type NewId<'a> = &'a mut dyn FnMut() -> Result<String, String>;

/// What a grow offer came to (rank 0) or what a member does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Order {
    /// Grow to `size` ranks after round `after`, making generation `gen`.
    Grow { gen: u64, size: usize, after: usize },
    /// Generation `gen` was lost meanwhile: give up on it and recover.
    Recover { gen: u64 },
    /// Rank 0 could not make the grow id (NCCL failed, or the call was given up on: `why`): it no
    /// longer holds generation `gen`, which is lost for all.
    NoGrowId { gen: u64, why: String },
}

/// Who is alive and what comes next, as one rank sees it: the seam between a rank's life
/// ([`crate::run_with`]) and where the membership is kept. The embedded backend keeps it in rank 0
/// (a coordinator on rank 0, a client of it on every other rank); another backend (an external
/// store) implements the same calls. Every call is bounded by its argument or by [`Bounds`].
pub trait Membership {
    /// Why the communicator of generation `gen` must be given up on, once the membership says so.
    fn lost(&self, gen: u64) -> Option<String>;

    /// This rank gave up on generation `gen` at round `step` and holds it as `held`: the plan every
    /// survivor follows (rank 0 makes it within `bounds.report`, with `new_id` for a new communicator
    /// and its own `step` for all; the others wait for it up to `bounds.plan`).
    fn recover(
        &self,
        lost: (u64, Held),
        step: usize,
        bounds: &Bounds,
        new_id: NewId,
    ) -> Result<Plan, String>;

    /// At the boundary before round `after` on generation `gen`: rank 0 grows the world with the
    /// replacements waiting, if any (within `bounds.ready` and the id's own bound); a member has
    /// nothing to offer (`None`).
    fn offer_grow(
        &self,
        gen: u64,
        after: usize,
        bounds: &Bounds,
        grow_id: NewId,
    ) -> Result<Option<Order>, String>;

    /// The grow announced for after round `step` of generation `gen`: its generation and size.
    fn grow_after(&self, gen: u64, step: usize) -> Option<(u64, usize)>;

    /// How many replacements the world could take (rank 0); a member does not know (0).
    fn missing(&self) -> usize;

    /// The rank is done: a member says so, rank 0 waits (up to `timeout`) for the others to.
    fn finish(&self, timeout: Duration) -> Result<(), String>;
}

/// Why the job ends where generation `gen` left `live` ranks, fewer than `min` (`dead`: its ranks that
/// died): the same words from either membership.
pub fn below_minimum(gen: u64, live: usize, min: usize, dead: &[usize]) -> String {
    format!(
        "generation {gen} left {live} live rank(s), fewer than --min-size {min}: the job cannot go on \
         (dead: ranks {} of generation {gen})",
        crate::protocol::rank_list(dead)
    )
}

/// How long each step of a recovery may take, from the deadline D ([`crate::Config::deadline`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// 2D + 1 s: how long rank 0 waits for every live member's report on a lost generation before it
    /// treats the silent as dead. A member gives up on a lost collective within D of the news (its
    /// revoke's quiescence wait).
    pub report: Duration,
    /// 4D + 2 s: how long a member waits for the plan (rank 0's own give-up, up to 2D, then its
    /// report wait).
    pub plan: Duration,
    /// 4D: making the next communicator (shrink, init, grow).
    pub setup: Duration,
    /// D/2: how long rank 0 waits for the members to confirm a grow (they wait for rank 0 in the round
    /// before it, at most D).
    pub ready: Duration,
    /// D + 1.75 s: from a frozen member's last line (its process stopped: SIGSTOP, a hung host, its
    /// connection open and silent) to the plan without it. Rank 0 treats it as dead after
    /// [`crate::protocol::SILENCE`] without a line, looking every 250 ms, and tells the others at
    /// once; they give up within D and agree without waiting for it.
    pub frozen: Duration,
}

impl Bounds {
    /// The bounds for deadline D (at most [`crate::config::MAX_DEADLINE`], so that none overflows).
    pub fn new(deadline: Duration) -> Bounds {
        let deadline = deadline.min(crate::config::MAX_DEADLINE);
        let second = Duration::from_secs(1);
        Bounds {
            report: 2 * deadline + second,
            plan: 4 * deadline + 2 * second,
            setup: 4 * deadline,
            ready: deadline / 2,
            frozen: crate::protocol::SILENCE + crate::protocol::BEAT_CHECK + deadline,
        }
    }
}
