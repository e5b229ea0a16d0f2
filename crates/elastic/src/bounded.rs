//! A blocking call waited for with a bound. Two steps of the grow ignore the communicators' non-blocking
//! config: NCCL 2.29.7 makes them on the calling thread before it returns (src/init.cc, src/bootstrap.cc).
//! - `ncclCommGetUniqueId` on rank 0 sends the grow id to ranks 0 and N-1 of the parent. To a rank that
//!   died just before (the rendezvous had not yet said so), the connection is refused and retried
//!   (`NCCL_SOCKET_RETRY_CNT`, 34 times, each sleep 0.1 s longer: about a minute on one host; to a host
//!   that is gone each try may itself take minutes).
//! - `ncclCommGrow` on ranks 0 and N-1 of the parent first receives that id, in a loop that ends only
//!   when it arrives (or the parent's abort flag is raised, which only a second call on the same
//!   communicator could do). Rank 0 tells them to grow after its `ncclCommGetUniqueId` returned, so the
//!   id is already in their socket's queue, even if rank 0 died since; only a lost host or network can
//!   keep it away.
//!
//! So the example makes each of them on a thread of its own and waits until it returns, the rendezvous
//! says the generation is lost, or the bound passes. A call given up on keeps its thread, and what it
//! holds (the parent, a grown communicator) is that thread's from then on: `late` releases it if NCCL
//! returns. The rank holds that generation as aborted and never touches it again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::membership::{lock, shared, wait_until};

/// How often the news is read while the call runs.
const POLL: Duration = Duration::from_millis(2);

/// The call's value, once it returned; `GivenUp` once the caller stopped waiting (or took the value).
enum Slot<T> {
    Running,
    Done(T),
    GivenUp,
}

/// Runs `call` (named `what`) on a thread of its own and waits for its value, at most `limit`, reading
/// `news` (why the generation is lost) every 2 ms. Given up on, for the news or the bound, the call's
/// value goes to `late` on that thread when it comes; the error says why and that it was given up.
pub fn call<T: Send + 'static>(
    what: &str,
    limit: Duration,
    news: &dyn Fn() -> Option<String>,
    call: impl FnOnce() -> T + Send + 'static,
    late: impl FnOnce(T) + Send + 'static,
) -> Result<T, String> {
    let slot = shared(Slot::Running);
    let theirs = Arc::clone(&slot);
    std::thread::Builder::new()
        .name(format!("elastic {what}"))
        .spawn(move || {
            let value = call();
            let mut s = lock(&theirs);
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
        .map_err(|e| format!("{what}: no thread to make it on: {e}"))?;
    let deadline = Instant::now() + limit;
    loop {
        let wake = (Instant::now() + POLL).min(deadline);
        let (mut s, done) = wait_until(&slot, wake, |s| matches!(s, Slot::Done(_)));
        if done {
            if let Slot::Done(value) = std::mem::replace(&mut *s, Slot::GivenUp) {
                return Ok(value);
            }
        }
        drop(s);
        let why = match news() {
            Some(news) => format!("given up while it ran: {news}"),
            None if Instant::now() >= deadline => {
                format!("given up: it had not returned after {limit:?}")
            }
            None => continue,
        };
        let mut s = lock(&slot);
        // It may have returned meanwhile: then its value is the caller's after all.
        if let Slot::Done(value) = std::mem::replace(&mut *s, Slot::GivenUp) {
            return Ok(value);
        }
        return Err(format!(
            "{what}: {why} (its thread keeps what it holds and releases it if NCCL returns)"
        ));
    }
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
    ) -> (Result<u32, String>, Gated) {
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
        assert!(
            released.recv_timeout(Duration::from_millis(100)).is_err(),
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
        assert!(
            err.starts_with("ncclCommGetUniqueId: given up: it had not returned after 100ms"),
            "{err}"
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
        let start = Instant::now();
        let (got, (open, released)) = gated("ncclCommGrow", T, &news, 9);
        let err = got.expect_err("given up on the news");
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "not the 10 s bound"
        );
        assert!(
            err.starts_with(
                "ncclCommGrow: given up while it ran: the rendezvous: rank 3 of generation 1 died"
            ),
            "{err}"
        );
        drop(open);
        assert_eq!(released.recv_timeout(T), Ok(9));
    }
}
