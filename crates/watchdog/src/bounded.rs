//! A call made on a thread of its own and waited for with a bound: for the NCCL calls that may not
//! return (an abort or a revoke that joins a job held in the driver, a grow whose peer died), so that
//! the caller gets an answer within the bound whatever NCCL does. A call given up on keeps its thread,
//! and what it holds is that thread's from then on: `late` releases it if the call returns.

use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::MAX_POLL_INTERVAL;

/// Why [`call`] stopped waiting.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum GivenUp {
    /// The caller's news (`news` answered `Some`) while the call ran.
    News {
        /// What was called.
        what: String,
        /// The news.
        news: String,
    },
    /// The call had not returned when the bound passed.
    Bound {
        /// What was called.
        what: String,
        /// The bound.
        limit: Duration,
    },
    /// No thread could be made for it: the call was not made.
    NoThread {
        /// What was to be called.
        what: String,
        /// The system's answer.
        error: String,
    },
}

impl fmt::Display for GivenUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let left = "its thread keeps what it holds and releases it if NCCL returns";
        match self {
            GivenUp::News { what, news } => {
                write!(f, "{what}: given up while it ran: {news} ({left})")
            }
            GivenUp::Bound { what, limit } => {
                write!(
                    f,
                    "{what}: given up: it had not returned after {limit:?} ({left})"
                )
            }
            GivenUp::NoThread { what, error } => {
                write!(
                    f,
                    "{what}: no thread to make it on: {error}; it was not made"
                )
            }
        }
    }
}

impl std::error::Error for GivenUp {}

/// The call's value, once it returned; `GivenUp` once the caller stopped waiting (or took the value).
enum Slot<T> {
    Running,
    Done(T),
    GivenUp,
}

/// Runs `call` (named `what`) on a thread of its own and waits for its value, at most `limit`, reading
/// `news` (a reason to stop waiting, such as a rendezvous that saw a peer die) at least every
/// [`MAX_POLL_INTERVAL`]. Given up on, for the news or the bound, the call's value goes to `late` on
/// that thread when it comes; the error says why. A call that returns meanwhile is the caller's after
/// all: its value is returned, and `late` never runs.
pub fn call<T: Send + 'static>(
    what: &str,
    limit: Duration,
    news: &dyn Fn() -> Option<String>,
    call: impl FnOnce() -> T + Send + 'static,
    late: impl FnOnce(T) + Send + 'static,
) -> Result<T, GivenUp> {
    let slot = Arc::new((Mutex::new(Slot::Running), Condvar::new()));
    let theirs = Arc::clone(&slot);
    std::thread::Builder::new()
        .name(format!("bounded {what}"))
        .spawn(move || {
            let value = call();
            let mut s = lock(&theirs.0);
            match *s {
                Slot::GivenUp => {
                    drop(s);
                    late(value);
                }
                _ => {
                    *s = Slot::Done(value);
                    drop(s);
                    theirs.1.notify_all();
                }
            }
        })
        .map_err(|e| GivenUp::NoThread {
            what: what.to_string(),
            error: e.to_string(),
        })?;
    let deadline = Instant::now() + limit;
    let (cell, done) = &*slot;
    loop {
        let why = match news() {
            Some(news) => Some(GivenUp::News {
                what: what.to_string(),
                news,
            }),
            None if Instant::now() >= deadline => Some(GivenUp::Bound {
                what: what.to_string(),
                limit,
            }),
            None => None,
        };
        let mut s = lock(cell);
        if why.is_none() {
            // Until the value comes, or the next look at the news and the bound.
            let wake = MAX_POLL_INTERVAL.min(deadline.saturating_duration_since(Instant::now()));
            s = done
                .wait_timeout_while(s, wake, |s| matches!(s, Slot::Running))
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .0;
        }
        // Taken (and the call left to `late` if it has not returned): a value that came meanwhile is the
        // caller's after all.
        match (std::mem::replace(&mut *s, Slot::GivenUp), why) {
            (Slot::Done(value), _) => return Ok(value),
            (_, Some(why)) => return Err(why),
            (running, None) => *s = running,
        }
    }
}

/// The lock, whatever a panicking holder left: the slot holds no invariant a panic could break.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    const T: Duration = Duration::from_secs(10);

    /// A call that returns `value` once the gate opens (its sender is sent or dropped), and the channel
    /// on which `late` hands on what it got.
    type Gated = (mpsc::Sender<()>, mpsc::Receiver<u32>);

    fn gated(
        what: &str,
        limit: Duration,
        news: &dyn Fn() -> Option<String>,
        value: u32,
    ) -> (Result<u32, GivenUp>, Gated) {
        let (open, gate) = mpsc::channel::<()>();
        let (hand_on, released) = mpsc::channel();
        let got = call(
            what,
            limit,
            news,
            move || {
                let _ = gate.recv();
                value
            },
            move |v| {
                let _ = hand_on.send(v);
            },
        );
        (got, (open, released))
    }

    #[test]
    fn a_call_that_returns_in_time_gives_its_value_and_nothing_is_released() {
        let (hand_on, released) = mpsc::channel();
        let got = call(
            "quick",
            T,
            &|| None,
            || 7u32,
            move |v| {
                let _ = hand_on.send(v);
            },
        );
        assert_eq!(got, Ok(7));
        // The call's thread has ended (the value came from it); had `late` run, it would have sent.
        assert!(
            released.try_recv().is_err(),
            "late ran for a value the caller took"
        );
    }

    #[test]
    fn a_call_past_its_bound_is_given_up_within_it_and_released_when_it_returns() {
        let limit = Duration::from_millis(100);
        let start = Instant::now();
        let (got, (open, released)) = gated("ncclCommGetUniqueId", limit, &|| None, 5);
        let took = start.elapsed();
        let err = got.expect_err("never returned in time");
        assert_eq!(
            err.to_string(),
            "ncclCommGetUniqueId: given up: it had not returned after 100ms (its thread keeps what it \
             holds and releases it if NCCL returns)"
        );
        // The bound plus one poll; a loaded machine may oversleep, hence 1 s.
        assert!(
            took >= limit && took < limit + Duration::from_secs(1),
            "{took:?}"
        );
        open.send(()).expect("the call still waits");
        assert_eq!(
            released.recv_timeout(T),
            Ok(5),
            "what the late call made is released"
        );
    }

    #[test]
    fn the_news_gives_a_running_call_up_at_once() {
        let news = || Some("the rendezvous: rank 3 of generation 1 died".to_string());
        let (got, (open, released)) = gated("ncclCommGrow", T, &news, 9);
        let err = got.expect_err("given up on the news");
        assert_eq!(
            err,
            GivenUp::News {
                what: "ncclCommGrow".into(),
                news: news().expect("news"),
            }
        );
        assert!(
            err.to_string().starts_with(
                "ncclCommGrow: given up while it ran: the rendezvous: rank 3 of generation 1 died"
            ),
            "{err}"
        );
        drop(open);
        assert_eq!(released.recv_timeout(T), Ok(9));
    }
}
