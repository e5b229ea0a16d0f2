//! Who is alive: the rendezvous that hands out the unique ids and tells the survivors who died.
//!
//! Rank 0 is the coordinator: it listens on the master port and keeps, in comm-rank order, who is a
//! member. Every other process connects once and keeps that connection open for its whole life. The
//! kernel closes the sockets of a process that dies, even by SIGKILL, so the coordinator reads
//! end-of-file on its connection within milliseconds: that marks the member dead, and the coordinator
//! sends every live member the dead set. That holds on every transport NCCL uses; over NVLink NCCL
//! itself never notices a dead peer. The coordinator must outlive the others (it is never the one
//! killed in the demo): its own death ends the job.
//!
//! One line of text per message:
//! - member to coordinator: `HELLO <rank>` (a rank of the first world) or `JOIN` (a replacement);
//! - coordinator to member: `ID <hex>` (the first unique id, to `HELLO`), `DEAD <r>,<r>…` (the current
//!   ranks that died: shrink them out), `GROW <size>` (a survivor: call `ncclCommGrow` without an id),
//!   `GROWID <rank> <size> <hex>` (a replacement: its rank in the grown communicator, and the id).
//!
//! One failure at a time: the survivors shrink and grow back before another death is handled.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use metrale_gpu_testkit::launcher;

type Shared<T> = Arc<(Mutex<T>, Condvar)>;

/// One member of the communicator, in rank order; the coordinator itself has no connection.
struct Member {
    conn: Option<TcpStream>,
    /// Which connection it is (to match the end-of-file a watcher reads).
    key: u64,
    alive: bool,
}

#[derive(Default)]
struct Roster {
    members: Vec<Member>,
    /// Replacements that said `JOIN`, waiting for the next grow.
    joiners: Vec<(u64, TcpStream)>,
}

impl Roster {
    fn dead(&self) -> Vec<usize> {
        (0..self.members.len())
            .filter(|&r| !self.members[r].alive)
            .collect()
    }

    /// A watcher read end-of-file on connection `key`.
    fn lost(&mut self, key: u64) {
        self.joiners.retain(|(k, _)| *k != key);
        let Some(member) = self.members.iter_mut().find(|m| m.key == key) else {
            return;
        };
        member.alive = false;
        let line = format!("DEAD {}\n", join(&self.dead()));
        for m in self.members.iter_mut().filter(|m| m.alive) {
            if let Some(conn) = m.conn.as_mut() {
                let _ = conn.write_all(line.as_bytes()); // a failure is that member's own death
            }
        }
    }
}

/// Rank 0's side.
pub struct Coordinator {
    roster: Shared<Roster>,
}

impl Coordinator {
    /// Listens on the port of `master` (every interface, as torchrun does), hands `id` to the other
    /// `world_size - 1` ranks and returns once all have connected, within `timeout`.
    pub fn start(
        master: &str,
        world_size: usize,
        id: &str,
        timeout: Duration,
    ) -> Result<Coordinator, String> {
        let port = master
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse::<u16>().ok())
            .ok_or(format!("--master '{master}' has no port"))?;
        let listener = TcpListener::bind(("0.0.0.0", port))
            .map_err(|e| format!("rank 0 cannot listen on port {port}: {e}"))?;
        let me = Member {
            conn: None,
            key: 0,
            alive: true,
        };
        let roster: Shared<Roster> = Arc::new((
            Mutex::new(Roster {
                members: vec![me],
                joiners: Vec::new(),
            }),
            Condvar::new(),
        ));
        for _ in 1..world_size {
            roster
                .0
                .lock()
                .map_err(|_| "poisoned")?
                .members
                .push(Member {
                    conn: None,
                    key: u64::MAX,
                    alive: true,
                });
        }
        let (shared, id) = (Arc::clone(&roster), id.to_string());
        std::thread::spawn(move || accept_loop(listener, shared, world_size, id));
        let coordinator = Coordinator { roster };
        coordinator.wait_for(timeout, "every rank to connect", |r| {
            r.members.iter().all(|m| m.key != u64::MAX)
        })?;
        Ok(coordinator)
    }

    /// The current ranks that died.
    pub fn dead(&self) -> Vec<usize> {
        self.roster.0.lock().map(|r| r.dead()).unwrap_or_default()
    }

    /// After the shrink: the dead leave the roster, so ranks match the shrunk communicator.
    fn forget_dead(&self) {
        if let Ok(mut r) = self.roster.0.lock() {
            r.members.retain(|m| m.alive);
        }
    }

    /// Waits for `count` replacements, then tells the survivors to grow and each replacement its rank
    /// and `id`; the grown size.
    pub fn grow(&self, count: usize, id: &str, timeout: Duration) -> Result<usize, String> {
        self.wait_for(timeout, &format!("{count} replacement(s) to --join"), |r| {
            r.joiners.len() >= count
        })?;
        let mut r = self.roster.0.lock().map_err(|_| "poisoned")?;
        let size = r.members.len() + count;
        for m in r.members.iter_mut() {
            if let Some(conn) = m.conn.as_mut() {
                conn.write_all(format!("GROW {size}\n").as_bytes())
                    .map_err(|e| format!("telling a survivor to grow: {e}"))?;
            }
        }
        let joiners: Vec<(u64, TcpStream)> = r.joiners.drain(..count).collect();
        for (key, mut conn) in joiners {
            let rank = r.members.len();
            conn.write_all(format!("GROWID {rank} {size} {id}\n").as_bytes())
                .map_err(|e| format!("sending the grow id to the replacement: {e}"))?;
            r.members.push(Member {
                conn: Some(conn),
                key,
                alive: true,
            });
        }
        Ok(size)
    }

    fn wait_for(
        &self,
        timeout: Duration,
        what: &str,
        done: impl Fn(&Roster) -> bool,
    ) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        let (lock, changed) = &*self.roster;
        let mut r = lock.lock().map_err(|_| "poisoned")?;
        while !done(&r) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!("rank 0 waited {timeout:?} for {what}"));
            }
            r = changed.wait_timeout(r, left).map_err(|_| "poisoned")?.0;
        }
        Ok(())
    }
}

/// Accepts members for the life of the process: `HELLO` fills a rank of the first world, `JOIN` queues
/// a replacement; each connection then has a watcher that reports its end.
fn accept_loop(listener: TcpListener, roster: Shared<Roster>, world_size: usize, id: String) {
    for (key, conn) in (1u64..).zip(listener.incoming()) {
        let Ok(conn) = conn else { continue };
        let (roster, id) = (Arc::clone(&roster), id.clone());
        std::thread::spawn(move || {
            if let Err(e) = admit(conn, key, &roster, world_size, &id) {
                eprintln!("rank 0: rendezvous: {e}");
            }
        });
    }
}

fn admit(
    conn: TcpStream,
    key: u64,
    roster: &Shared<Roster>,
    world_size: usize,
    id: &str,
) -> Result<(), String> {
    let peer = conn.peer_addr().map_err(|e| e.to_string())?;
    let mut reader = BufReader::new(conn.try_clone().map_err(|e| e.to_string())?);
    let mut hello = String::new();
    reader
        .read_line(&mut hello)
        .map_err(|e| format!("{peer}: {e}"))?;
    {
        let (lock, changed) = &**roster;
        let mut r = lock.lock().map_err(|_| "poisoned")?;
        match hello.split_whitespace().collect::<Vec<_>>()[..] {
            ["HELLO", rank] => {
                let rank: usize = rank
                    .parse()
                    .map_err(|_| format!("{peer}: bad rank in {hello:?}"))?;
                let slot = r
                    .members
                    .get_mut(rank)
                    .filter(|m| rank > 0 && rank < world_size && m.key == u64::MAX);
                let slot = slot.ok_or(format!("{peer} claims rank {rank}: invalid or taken"))?;
                let mut conn = conn;
                conn.write_all(format!("ID {id}\n").as_bytes())
                    .map_err(|e| format!("{peer}: {e}"))?;
                *slot = Member {
                    conn: Some(conn),
                    key,
                    alive: true,
                };
            }
            ["JOIN"] => r.joiners.push((key, conn)),
            _ => {
                return Err(format!(
                    "{peer} is not a member of this job (said {hello:?})"
                ))
            }
        }
        changed.notify_all();
    }
    // Members say nothing more: the next thing read is the end of the connection.
    let mut rest = String::new();
    while matches!(reader.read_line(&mut rest), Ok(n) if n > 0) {}
    let (lock, changed) = &**roster;
    lock.lock().map_err(|_| "poisoned")?.lost(key);
    changed.notify_all();
    Ok(())
}

/// What the coordinator told a member so far.
#[derive(Default)]
struct Inbox {
    dead: Vec<usize>,
    grow: Option<usize>,
}

/// Any other rank's side (and a replacement's).
pub struct Client {
    inbox: Shared<Inbox>,
}

impl Client {
    /// Connects to the coordinator (retrying until `timeout`: it may start later), says `hello`, and
    /// returns the connection's reader with the first reply line.
    fn connect(
        master: &str,
        hello: &str,
        timeout: Duration,
    ) -> Result<(BufReader<TcpStream>, String), String> {
        let deadline = Instant::now() + timeout;
        let mut conn = launcher::connect(master, timeout)?;
        conn.write_all(format!("{hello}\n").as_bytes())
            .map_err(|e| format!("{master}: {e}"))?;
        conn.set_read_timeout(Some(
            deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1)),
        ))
        .map_err(|e| e.to_string())?;
        let mut reader = BufReader::new(conn);
        let mut reply = String::new();
        match reader.read_line(&mut reply) {
            Ok(n) if n > 0 => Ok((reader, reply)),
            Ok(_) => Err(format!(
                "rank 0 at {master} closed the connection (said {hello:?})"
            )),
            Err(e) => Err(format!(
                "no answer from rank 0 at {master} within {timeout:?}: {e}"
            )),
        }
    }

    /// A rank of the first world: its connection stays open; returns the unique id's hex.
    pub fn hello(master: &str, rank: u32, timeout: Duration) -> Result<(Client, String), String> {
        let (reader, reply) = Client::connect(master, &format!("HELLO {rank}"), timeout)?;
        let id = reply
            .strip_prefix("ID ")
            .ok_or(format!("rank 0 answered {reply:?}, not an id"))?;
        Ok((Client::listen(reader)?, id.trim().to_string()))
    }

    /// A replacement: waits (up to `timeout`) for its rank, the grown size and the grow id's hex.
    pub fn join(master: &str, timeout: Duration) -> Result<(Client, usize, usize, String), String> {
        let (reader, reply) = Client::connect(master, "JOIN", timeout)?;
        match reply.split_whitespace().collect::<Vec<_>>()[..] {
            ["GROWID", rank, size, id] => {
                let num = |s: &str| {
                    s.parse::<usize>()
                        .map_err(|_| format!("bad GROWID line {reply:?}"))
                };
                Ok((
                    Client::listen(reader)?,
                    num(rank)?,
                    num(size)?,
                    id.to_string(),
                ))
            }
            _ => Err(format!("rank 0 answered {reply:?}, not a grow id")),
        }
    }

    /// From now on a thread files the coordinator's messages in the inbox.
    fn listen(reader: BufReader<TcpStream>) -> Result<Client, String> {
        reader
            .get_ref()
            .set_read_timeout(None)
            .map_err(|e| e.to_string())?;
        let inbox: Shared<Inbox> = Arc::default();
        let shared = Arc::clone(&inbox);
        std::thread::spawn(move || {
            for line in reader.lines().map_while(Result::ok) {
                let (lock, changed) = &*shared;
                let Ok(mut inbox) = lock.lock() else { return };
                match line.split_whitespace().collect::<Vec<_>>()[..] {
                    ["DEAD", list] => {
                        inbox.dead = list.split(',').filter_map(|r| r.parse().ok()).collect()
                    }
                    ["GROW", size] => inbox.grow = size.parse().ok(),
                    _ => eprintln!("unexpected message from rank 0: {line:?}"),
                }
                changed.notify_all();
            }
            // Rank 0 closed the connection: it finished, or died (which this design does not survive:
            // the next collective then times out with nobody known dead, and the rank stops).
        });
        Ok(Client { inbox })
    }

    pub fn dead(&self) -> Vec<usize> {
        self.inbox
            .0
            .lock()
            .map(|i| i.dead.clone())
            .unwrap_or_default()
    }

    /// Waits (up to `timeout`) for `GROW`: the grown size.
    pub fn wait_grow(&self, timeout: Duration) -> Result<usize, String> {
        let (lock, changed) = &*self.inbox;
        let inbox = lock.lock().map_err(|_| "poisoned")?;
        let (mut inbox, _) = changed
            .wait_timeout_while(inbox, timeout, |i| i.grow.is_none())
            .map_err(|_| "poisoned")?;
        inbox
            .grow
            .take()
            .ok_or(format!("rank 0 sent no GROW within {timeout:?}"))
    }
}

/// Either side, for the rank loop.
pub enum Membership {
    Coordinator(Coordinator),
    Member(Client),
}

impl Membership {
    /// The current ranks that died, as far as the rendezvous knows.
    pub fn dead(&self) -> Vec<usize> {
        match self {
            Membership::Coordinator(c) => c.dead(),
            Membership::Member(m) => m.dead(),
        }
    }

    /// After the shrink: ranks are renumbered, the dead forgotten.
    pub fn forget_dead(&self) {
        match self {
            Membership::Coordinator(c) => c.forget_dead(),
            Membership::Member(m) => {
                if let Ok(mut inbox) = m.inbox.0.lock() {
                    inbox.dead.clear();
                }
            }
        }
    }
}

fn join(ranks: &[usize]) -> String {
    ranks
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
}
