//! The clock rank 0 reads its members' silence on: the process's monotonic clock, or in the tests one
//! they move by hand, so that a bound is asserted on the time it states, not on how fast the machine is.

use std::time::{Duration, Instant};

/// A monotonic clock: the time since some fixed moment.
pub trait Clock: Send + Sync {
    fn now(&self) -> Duration;
}

/// The process's monotonic clock, from its making.
pub struct Monotonic(Instant);

impl Monotonic {
    pub fn new() -> Monotonic {
        Monotonic(Instant::now())
    }
}

impl Clock for Monotonic {
    fn now(&self) -> Duration {
        self.0.elapsed()
    }
}

/// A clock that stands still until a test moves it.
#[cfg(test)]
#[derive(Default)]
pub struct TestClock(std::sync::Mutex<Duration>);

#[cfg(test)]
impl TestClock {
    /// Moves the clock to `at` (never back).
    pub fn set(&self, at: Duration) {
        let mut now = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *now = (*now).max(at);
    }
}

#[cfg(test)]
impl Clock for TestClock {
    fn now(&self) -> Duration {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
