//! A member's side of the rendezvous (every rank but 0, replacements included): one connection to rank
//! 0 for the process's life, whose messages a thread files in an inbox; the rank reads the inbox.

use std::io::Write;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::coordinator::WRITE_BOUND;
use crate::membership::{lock, shared, wait_until, Bounds, Membership, NewId, Order, Shared};
use crate::protocol::{Held, Message, Plan, BEAT_EVERY, LINE_CAP};
use metrale_gpu_launch::auth::{self, Refused};
use metrale_gpu_launch::backoff::{self, Backoff};
use metrale_gpu_launch::line::Lines;
use metrale_gpu_launch::placement;
use metrale_gpu_launch::token::JobToken;

/// Where a process stands that has no coordinator, and what a production system does instead.
pub const COORDINATOR_GONE: &str = "rank 0 (the coordinator) is gone: its connection closed. With the embedded \
     membership it lives in rank 0, so its death ends the job; a production system keeps it outside the ranks \
     (an external store such as etcd, or torchrun's rendezvous backend) and elects a new coordinator";

/// What the coordinator told this member so far.
#[derive(Default)]
struct Inbox {
    /// The newest generation declared lost, and why.
    lost: Option<(u64, String)>,
    /// The newest plan.
    plan: Option<Plan>,
    /// The newest grow: its generation, size, and the round it follows.
    grow: Option<(u64, usize, usize)>,
    /// Why there is no coordinator any more (its connection ended, it left this rank out, or it ended
    /// the job).
    gone: Option<String>,
}

/// The connection's writing end: the rank's thread and the connection's (`READY`) both write lines.
type Writer = Arc<Mutex<TcpStream>>;

fn send(conn: &Writer, message: &Message) -> Result<(), String> {
    let mut conn = conn.lock().unwrap_or_else(PoisonError::into_inner);
    conn.write_all(format!("{message}\n").as_bytes())
        .map_err(|e| format!("telling rank 0 {message}: {e} ({COORDINATOR_GONE})"))
}

/// An admitted connection to rank 0 and its beat: `BEAT` every [`BEAT_EVERY`] from a thread of its
/// own, from admission on (a replacement waiting for its grow too), so that whatever the rank's own
/// thread does (a long NCCL call, a slow step) rank 0 hears that the process lives; a frozen process
/// says nothing ([`crate::protocol::SILENCE`]). Every write is bounded ([`WRITE_BOUND`]: a coordinator
/// that reads nothing is gone). Dropping it ends the beat and the connection, as the process's death
/// does.
struct Link {
    conn: Writer,
    stopped: Arc<AtomicBool>,
}

impl Link {
    fn start(conn: TcpStream) -> Result<Link, String> {
        conn.set_write_timeout(Some(WRITE_BOUND))
            .map_err(|e| format!("bounding the writes to rank 0: {e}"))?;
        let link = Link {
            conn: Arc::new(Mutex::new(conn)),
            stopped: Arc::new(AtomicBool::new(false)),
        };
        let (conn, stopped) = (Arc::clone(&link.conn), Arc::clone(&link.stopped));
        std::thread::Builder::new()
            .name("rendezvous beat".into())
            .spawn(move || {
                while !stopped.load(Ordering::Acquire) && send(&conn, &Message::Beat).is_ok() {
                    std::thread::sleep(BEAT_EVERY);
                }
            })
            .map_err(|e| format!("no thread for the heartbeat: {e}"))?;
        Ok(link)
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::Release);
        let conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = conn.shutdown(Shutdown::Both);
    }
}

/// A member's side, for the process's life.
pub struct Client {
    link: Link,
    inbox: Shared<Inbox>,
}

/// A replacement's place in the grown communicator.
pub struct Joined {
    pub gen: u64,
    pub rank: usize,
    /// The grown communicator's size.
    pub size: usize,
    /// The round the grow follows: the replacement trains from the next one.
    pub after: usize,
    /// The grow's unique id (hex).
    pub id: String,
}

impl Client {
    /// Connects to the coordinator (retrying until `timeout`: it may start later), proves `token`
    /// with `hello` ([`auth::prove`]: rank 0 proves it first), and returns the connection, its lines
    /// and the first reply. A connection rank 0 closes without a word (it refused it: too many
    /// waiting, or the hello was wrong) is tried again until `timeout` ([`backoff`]).
    fn connect(
        master: &str,
        hello: &Message,
        token: &JobToken,
        timeout: Duration,
    ) -> Result<(Link, Lines, Message), String> {
        let deadline = Instant::now() + timeout;
        let mut backoff = Backoff::until(deadline);
        let mut connect_within = timeout;
        loop {
            let conn = placement::connect(master, connect_within)?;
            let mut lines = Lines::new(conn.try_clone().map_err(|e| e.to_string())?);
            let (link, reply) = match auth::prove(&mut lines, token, &hello.to_string(), deadline) {
                Ok(()) => (
                    Some(Link::start(conn)?),
                    lines.next(LINE_CAP, Some(deadline)),
                ),
                Err(Refused::Closed) => (None, Ok(None)),
                Err(Refused::Failed(why)) => return Err(format!("rank 0 at {master}: {why}")),
            };
            match (link, reply) {
                (Some(link), Ok(Some(reply))) => return Ok((link, lines, Message::parse(&reply)?)),
                (_, Ok(Some(_)) | Ok(None)) => {}
                (_, Err(e)) => {
                    return Err(format!(
                        "no answer from rank 0 at {master} within {timeout:?}: {e}"
                    ))
                }
            }
            if !backoff.wait() {
                return Err(format!(
                    "rank 0 at {master} closed the connection (said {hello}) {}",
                    backoff::REFUSED
                ));
            }
            connect_within = backoff.left();
        }
    }

    /// A rank of the first world: its connection stays open; returns the first unique id's hex. It
    /// proves this job's token ([`JobToken::of_this_job`]).
    pub fn hello(master: &str, rank: usize, timeout: Duration) -> Result<(Client, String), String> {
        let token = JobToken::of_this_job(master, &format!("rank {rank}"))?;
        Client::hello_as(master, rank, &token, timeout)
    }

    /// [`Client::hello`] with `token`.
    pub fn hello_as(
        master: &str,
        rank: usize,
        token: &JobToken,
        timeout: Duration,
    ) -> Result<(Client, String), String> {
        match Client::connect(master, &Message::Hello { rank }, token, timeout)? {
            (link, lines, Message::Id { id }) => Ok((Client::listen(link, lines)?, id)),
            (_, _, other) => Err(format!("rank 0 answered {other}, not an id")),
        }
    }

    /// A replacement: waits (up to `timeout`) for its place in the next grow.
    pub fn join(master: &str, timeout: Duration) -> Result<(Client, Joined), String> {
        let token = JobToken::of_this_job(master, "replacement")?;
        match Client::connect(master, &Message::Join, &token, timeout)? {
            (
                link,
                lines,
                Message::GrowId {
                    gen,
                    rank,
                    size,
                    after,
                    id,
                },
            ) => {
                let joined = Joined {
                    gen,
                    rank,
                    size,
                    after,
                    id,
                };
                Ok((Client::listen(link, lines)?, joined))
            }
            (_, _, Message::End { why }) => Err(format!("rank 0 ended the job: {why}")),
            (_, _, other) => Err(format!("rank 0 answered {other}, not a grow id")),
        }
    }

    /// From now on a thread files the coordinator's messages in the inbox.
    fn listen(link: Link, mut lines: Lines) -> Result<Client, String> {
        let answer = Arc::clone(&link.conn);
        let inbox = shared(Inbox::default());
        let filed = Arc::clone(&inbox);
        let reader = std::thread::Builder::new().name("rendezvous inbox".into());
        reader
            .spawn(move || {
                // Each line at most LINE_CAP bytes; an error (a longer one) is the connection's end.
                while let Ok(Some(line)) = lines.next(LINE_CAP, None) {
                    let mut i = lock(&filed);
                    match Message::parse(&line) {
                        Ok(Message::Recover { gen, why }) => {
                            if i.lost.as_ref().is_none_or(|(g, _)| *g < gen) {
                                i.lost = Some((gen, why));
                            }
                        }
                        Ok(Message::Plan(plan)) => i.plan = Some(plan),
                        // Filed before the answer: rank 0 starts the round the grow follows only once
                        // every member answered, so the rank reads the order when it finishes it.
                        Ok(Message::Grow { gen, size, after }) => {
                            i.grow = Some((gen, size, after));
                            // A failure is the connection's end, which this thread reads next.
                            let _ = send(&answer, &Message::Ready { gen });
                        }
                        Ok(Message::Excluded { why }) => {
                            i.gone = Some(format!("rank 0 left this rank out: {why}"))
                        }
                        Ok(Message::End { why }) => {
                            i.gone = Some(format!("rank 0 ended the job: {why}"))
                        }
                        Ok(other) => eprintln!("unexpected message from rank 0: {other}"),
                        Err(e) => eprintln!("from rank 0: {e}"),
                    }
                    drop(i);
                    filed.1.notify_all();
                }
                lock(&filed)
                    .gone
                    .get_or_insert(COORDINATOR_GONE.to_string());
                filed.1.notify_all();
            })
            .map_err(|e| format!("no thread for rank 0's messages: {e}"))?;
        Ok(Client { link, inbox })
    }

    fn send(&self, message: &Message) -> Result<(), String> {
        send(&self.link.conn, message)
    }

    /// Why generation `gen` must be given up on: the coordinator declared it lost, or is gone.
    pub fn lost(&self, gen: u64) -> Option<String> {
        let i = lock(&self.inbox);
        if let Some(gone) = &i.gone {
            return Some(gone.clone());
        }
        i.lost
            .as_ref()
            .filter(|(g, _)| *g >= gen)
            .map(|(_, why)| format!("the rendezvous: {why}"))
    }

    /// Says how this rank holds lost generation `gen`, then waits (up to `timeout`) for the plan.
    pub fn recover(&self, gen: u64, held: Held, timeout: Duration) -> Result<Plan, String> {
        if let Some(gone) = &lock(&self.inbox).gone {
            return Err(gone.clone());
        }
        self.send(&Message::Lost { gen, held })?;
        let (i, _) = wait_until(&self.inbox, Instant::now() + timeout, |i| {
            i.gone.is_some() || i.plan.as_ref().is_some_and(|p| p.gen > gen)
        });
        if let Some(plan) = i.plan.as_ref().filter(|p| p.gen > gen) {
            return Ok(plan.clone());
        }
        Err(match &i.gone {
            Some(gone) => gone.clone(),
            None => format!(
                "rank 0 sent no plan for generation {} within {timeout:?}",
                gen + 1
            ),
        })
    }

    /// The grow rank 0 announced for after round `step` on generation `gen`: its generation and size.
    pub fn grow_after(&self, gen: u64, step: usize) -> Option<(u64, usize)> {
        let i = lock(&self.inbox);
        i.grow
            .filter(|&(g, _, after)| g == gen + 1 && after == step)
            .map(|(g, size, _)| (g, size))
    }

    /// Says `DONE`: the end of this connection is no death.
    pub fn finish(&self) -> Result<(), String> {
        self.send(&Message::Done)
    }
}

impl Membership for Client {
    fn lost(&self, gen: u64) -> Option<String> {
        Client::lost(self, gen)
    }

    fn recover(
        &self,
        (gen, held): (u64, Held),
        _step: usize,
        bounds: &Bounds,
        _new_id: NewId,
    ) -> Result<Plan, String> {
        Client::recover(self, gen, held, bounds.plan)
    }

    fn offer_grow(
        &self,
        _gen: u64,
        _after: usize,
        _bounds: &Bounds,
        _grow_id: NewId,
    ) -> Result<Option<Order>, String> {
        Ok(None)
    }

    fn grow_after(&self, gen: u64, step: usize) -> Option<(u64, usize)> {
        Client::grow_after(self, gen, step)
    }

    fn missing(&self) -> usize {
        0
    }

    fn finish(&self, _timeout: Duration) -> Result<(), String> {
        Client::finish(self)
    }
}
