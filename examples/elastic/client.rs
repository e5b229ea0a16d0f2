//! A member's side of the rendezvous (every rank but 0, replacements included): one connection to rank
//! 0 for the process's life, whose messages a thread files in an inbox; the rank reads the inbox.

use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrale_gpu_testkit::launcher;

use crate::membership::{lock, shared, wait_until, Order, Shared};
use crate::protocol::{Held, Message, Plan};

/// Where a process stands that has no coordinator, and what a production system does instead.
pub const COORDINATOR_GONE: &str = "rank 0 (the coordinator) is gone: its connection closed. In this example \
     membership lives in rank 0, so its death ends the job; a production system keeps it outside the ranks \
     (an external store such as etcd, or torchrun's rendezvous backend) and elects a new coordinator";

/// What the coordinator told this member so far.
#[derive(Default)]
struct Inbox {
    /// The newest generation declared lost, and why.
    lost: Option<(u64, String)>,
    /// The newest plan.
    plan: Option<Plan>,
    /// The newest grow: its generation and size.
    grow: Option<(u64, usize)>,
    /// Why there is no coordinator any more (its connection ended, or it left this rank out).
    gone: Option<String>,
}

/// Dropping it ends the connection, as the process's death does.
pub struct Client {
    conn: TcpStream,
    inbox: Shared<Inbox>,
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.conn.shutdown(Shutdown::Both);
    }
}

/// A replacement's place in the grown communicator.
pub struct Joined {
    pub gen: u64,
    pub rank: usize,
    /// The grown communicator's size: the first world's (a grow restores it), which a replacement
    /// grows back to after a later loss.
    pub size: usize,
    /// The grow's unique id (hex).
    pub id: String,
}

impl Client {
    /// Connects to the coordinator (retrying until `timeout`: it may start later), says `hello`, and
    /// returns the connection's reader with the first reply.
    fn connect(
        master: &str,
        hello: &Message,
        timeout: Duration,
    ) -> Result<(BufReader<TcpStream>, Message), String> {
        let deadline = Instant::now() + timeout;
        let mut conn = launcher::connect(master, timeout)?;
        conn.write_all(format!("{hello}\n").as_bytes())
            .map_err(|e| format!("{master}: {e}"))?;
        let left = deadline.saturating_duration_since(Instant::now());
        conn.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .map_err(|e| e.to_string())?;
        let mut reader = BufReader::new(conn);
        let mut reply = String::new();
        match reader.read_line(&mut reply) {
            Ok(n) if n > 0 => Ok((reader, Message::parse(&reply)?)),
            Ok(_) => Err(format!(
                "rank 0 at {master} closed the connection (said {hello})"
            )),
            Err(e) => Err(format!(
                "no answer from rank 0 at {master} within {timeout:?}: {e}"
            )),
        }
    }

    /// A rank of the first world: its connection stays open; returns the first unique id's hex.
    pub fn hello(master: &str, rank: usize, timeout: Duration) -> Result<(Client, String), String> {
        match Client::connect(master, &Message::Hello { rank }, timeout)? {
            (reader, Message::Id { id }) => Ok((Client::listen(reader)?, id)),
            (_, other) => Err(format!("rank 0 answered {other}, not an id")),
        }
    }

    /// A replacement: waits (up to `timeout`) for its place in the next grow.
    pub fn join(master: &str, timeout: Duration) -> Result<(Client, Joined), String> {
        match Client::connect(master, &Message::Join, timeout)? {
            (
                reader,
                Message::GrowId {
                    gen,
                    rank,
                    size,
                    id,
                },
            ) => {
                let joined = Joined {
                    gen,
                    rank,
                    size,
                    id,
                };
                Ok((Client::listen(reader)?, joined))
            }
            (_, other) => Err(format!("rank 0 answered {other}, not a grow id")),
        }
    }

    /// From now on a thread files the coordinator's messages in the inbox.
    fn listen(reader: BufReader<TcpStream>) -> Result<Client, String> {
        let conn = reader.get_ref().try_clone().map_err(|e| e.to_string())?;
        conn.set_read_timeout(None).map_err(|e| e.to_string())?;
        let inbox = shared(Inbox::default());
        let filed = Arc::clone(&inbox);
        std::thread::spawn(move || {
            for line in reader.lines().map_while(Result::ok) {
                let mut i = lock(&filed);
                match Message::parse(&line) {
                    Ok(Message::Recover { gen, why }) => {
                        if i.lost.as_ref().is_none_or(|(g, _)| *g < gen) {
                            i.lost = Some((gen, why));
                        }
                    }
                    Ok(Message::Plan(plan)) => i.plan = Some(plan),
                    Ok(Message::Grow { gen, size }) => i.grow = Some((gen, size)),
                    Ok(Message::Excluded { why }) => {
                        i.gone = Some(format!("rank 0 left this rank out: {why}"))
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
        });
        Ok(Client { conn, inbox })
    }

    fn send(&self, message: &Message) -> Result<(), String> {
        (&self.conn)
            .write_all(format!("{message}\n").as_bytes())
            .map_err(|e| format!("telling rank 0 {message}: {e} ({COORDINATOR_GONE})"))
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

    /// On generation `gen` below full size: waits (up to `timeout`) for the grow, or the news that
    /// `gen` is lost.
    pub fn await_grow(&self, gen: u64, timeout: Duration) -> Result<Order, String> {
        let lost = |i: &Inbox| i.lost.as_ref().is_some_and(|(g, _)| *g >= gen);
        let grown = |i: &Inbox| i.grow.is_some_and(|(g, _)| g > gen);
        let (i, _) = wait_until(&self.inbox, Instant::now() + timeout, |i| {
            i.gone.is_some() || lost(i) || grown(i)
        });
        match (i.grow, &i.gone) {
            (Some((g, size)), _) if g > gen => Ok(Order::Grow { gen: g, size }),
            _ if lost(&i) => Ok(Order::Recover { gen }),
            (_, Some(gone)) => Err(gone.clone()),
            _ => Err(format!("rank 0 sent no grow within {timeout:?}")),
        }
    }

    /// Says `DONE`: the end of this connection is no death.
    pub fn finish(&self) -> Result<(), String> {
        self.send(&Message::Done)
    }
}
