//! How a rank tries again when rank 0 closed its connection without a word (it refused it: too many
//! connections waiting, or a hello it could not admit): after 100 ms, then twice as long each time up
//! to 2 s, until its own deadline. A rank refused for good (the wrong token) so costs rank 0 a
//! connection every 2 s, not a flood, and ends at its deadline with the reason rank 0's log gives.

use std::time::{Duration, Instant};

const FIRST: Duration = Duration::from_millis(100);
const LONGEST: Duration = Duration::from_secs(2);

pub struct Backoff {
    next: Duration,
    deadline: Instant,
}

impl Backoff {
    pub fn until(deadline: Instant) -> Backoff {
        Backoff {
            next: FIRST,
            deadline,
        }
    }

    /// Waits before the next try; `false`, at once, when the deadline leaves no room for one.
    pub fn wait(&mut self) -> bool {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left <= self.next {
            return false;
        }
        std::thread::sleep(self.next);
        self.next = (self.next * 2).min(LONGEST);
        true
    }

    /// The time left for the next try.
    pub fn left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }
}

/// What a process says when rank 0 closed every try: the usual reasons, and where to read the one.
pub const REFUSED: &str =
    "each time until the deadline: rank 0 refused this process (its log says why, \
     e.g. the wrong job token or a rank taken twice), or it is gone";
