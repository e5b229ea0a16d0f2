//! Rank 0's side of the rendezvous: who is a member (in the current generation's rank order), who
//! died, how each survivor holds a lost generation, and the plan they all follow.
//!
//! A generation is lost when a member's connection ends without `DONE` (the kernel closes a dead
//! process's sockets, even after SIGKILL), when a member says `DONE` below full size, when a member
//! reports losing it, or when rank 0 does: the coordinator then tells every live member (`RECOVER`).
//! Agreement: rank 0 waits until every live member has said how it holds the lost generation, at most
//! the report bound; a member silent past it is treated as dead (told `EXCLUDED`, its connection
//! closed), so a survivor never waits on a rank that fails during recovery. One dead set follows, and
//! one plan for all: shrink when every survivor holds the lost communicator revoked and someone died,
//! else a new communicator from a new unique id.

use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::membership::{lock, shared, wait_until, NewId, Order, Shared};
use crate::protocol::{rank_list, Held, How, Message, Plan};

/// A member of the current generation, in rank order; rank 0 itself has no connection.
struct Member {
    conn: Option<TcpStream>,
    /// Which connection it is (to match the end a watcher reads); `None` until a first-world rank says
    /// `HELLO`.
    key: Option<u64>,
    alive: bool,
    /// How it holds the generation it last reported lost.
    held: Option<(u64, Held)>,
    done: bool,
}

impl Member {
    fn new(conn: Option<TcpStream>, key: Option<u64>) -> Member {
        Member {
            conn,
            key,
            alive: true,
            held: None,
            done: false,
        }
    }

    /// Sends `message`; a failure is that member's own death, which its watcher reports.
    fn send(&mut self, message: &Message) {
        if let Some(conn) = self.conn.as_mut() {
            let _ = conn.write_all(format!("{message}\n").as_bytes());
        }
    }

    /// Leaves it out: tells it why and closes its connection.
    fn exclude(&mut self, why: &str) {
        self.send(&Message::Excluded { why: why.into() });
        if let Some(conn) = self.conn.take() {
            let _ = conn.shutdown(Shutdown::Both);
        }
        self.alive = false;
    }
}

struct Roster {
    members: Vec<Member>,
    /// The generation the members are on, or making.
    gen: u64,
    /// The newest generation declared lost, and why.
    lost: Option<(u64, String)>,
    /// Replacements that said `JOIN`, in order, waiting for the next grow.
    joiners: Vec<(u64, TcpStream)>,
    /// The first world's size: what grows restore.
    world: usize,
    /// The first unique id, for `HELLO`.
    id: String,
}

impl Roster {
    fn rank_of(&self, key: u64) -> Option<usize> {
        self.members.iter().position(|m| m.key == Some(key))
    }

    /// Declares generation `gen` lost (once) and tells every live member.
    fn declare_lost(&mut self, gen: u64, why: String) {
        if self.lost.as_ref().is_some_and(|(g, _)| *g >= gen) {
            return;
        }
        let message = Message::Recover {
            gen,
            why: why.clone(),
        };
        for m in self.members.iter_mut().filter(|m| m.alive) {
            m.send(&message);
        }
        self.lost = Some((gen, why));
    }

    /// A watcher read the end of connection `key`.
    fn ended(&mut self, key: u64) {
        self.joiners.retain(|(k, _)| *k != key);
        let Some(rank) = self.rank_of(key) else {
            return;
        };
        let member = &mut self.members[rank];
        if !member.alive || member.done {
            return;
        }
        member.alive = false;
        let gen = self.gen;
        self.declare_lost(gen, format!("rank {rank} of generation {gen} died"));
    }

    fn received(&mut self, key: u64, message: Message) -> Result<(), String> {
        let rank = self
            .rank_of(key)
            .ok_or(format!("{message} from a connection that is no member"))?;
        match message {
            Message::Lost { gen, held } => {
                self.members[rank].held = Some((gen, held));
                if gen == self.gen {
                    self.declare_lost(gen, format!("rank {rank} lost generation {gen}"));
                }
            }
            // Below full size a rank's end leaves the communicator short all the same: a death, told
            // at once (the generation is lost; rank 0's grow id would send to it in vain), not a
            // silence the report window finds.
            Message::Done if self.members.len() < self.world => {
                let gen = self.gen;
                let why = format!(
                    "rank {rank} of generation {gen} finished below the full size ({} of {} ranks)",
                    self.members.len(),
                    self.world
                );
                self.members[rank].exclude(&format!("{why}: treated as dead"));
                self.declare_lost(gen, why);
            }
            Message::Done => self.members[rank].done = true,
            other => {
                return Err(format!(
                    "rank {rank} sent {other}, which members never send"
                ))
            }
        }
        Ok(())
    }
}

/// Rank 0's side.
pub struct Coordinator {
    roster: Shared<Roster>,
    port: u16,
}

impl Coordinator {
    /// Listens on the port of `master` (every interface, as torchrun does; port 0 picks one) for the
    /// other `world - 1` ranks of the first world, to be handed `id`, and for replacements.
    pub fn listen(master: &str, world: usize, id: &str) -> Result<Coordinator, String> {
        let port = master
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse::<u16>().ok())
            .ok_or(format!("--master '{master}' has no port"))?;
        let listener = TcpListener::bind(("0.0.0.0", port))
            .map_err(|e| format!("rank 0 cannot listen on port {port}: {e}"))?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let mut members = vec![Member::new(None, Some(0))];
        members.extend((1..world).map(|_| Member::new(None, None)));
        let roster = shared(Roster {
            members,
            gen: 0,
            lost: None,
            joiners: Vec::new(),
            world,
            id: id.to_string(),
        });
        let accepted = Arc::clone(&roster);
        std::thread::spawn(move || accept_loop(listener, accepted));
        Ok(Coordinator { roster, port })
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Waits until every rank of the first world has connected, within `timeout`.
    pub fn wait_members(&self, timeout: Duration) -> Result<(), String> {
        let connected = |r: &Roster| r.members.iter().all(|m| m.key.is_some());
        let ok = wait_until(&self.roster, Instant::now() + timeout, connected).1;
        ok.then_some(()).ok_or(format!(
            "rank 0 waited {timeout:?} for every rank to connect"
        ))
    }

    /// Why generation `gen` must be given up on, once it is lost.
    pub fn lost(&self, gen: u64) -> Option<String> {
        let r = lock(&self.roster);
        r.lost
            .as_ref()
            .filter(|(g, _)| *g >= gen)
            .map(|(_, why)| format!("the rendezvous: {why}"))
    }

    /// Rank 0 lost generation `gen` and holds it as `mine`: agreement (see the module's docs), then the
    /// plan, sent to every survivor; rank 0's own part of it.
    pub fn recover(
        &self,
        gen: u64,
        mine: Held,
        report_bound: Duration,
        new_id: NewId,
    ) -> Result<Plan, String> {
        let deadline = Instant::now() + report_bound;
        {
            let mut r = lock(&self.roster);
            if r.gen != gen {
                return Err(format!(
                    "rank 0 recovers generation {gen}, but the members are on {}",
                    r.gen
                ));
            }
            r.declare_lost(gen, format!("rank 0 lost generation {gen}"));
            r.members[0].held = Some((gen, mine));
        }
        let reported = |r: &Roster| {
            r.members
                .iter()
                .all(|m| !m.alive || m.held.is_some_and(|(g, _)| g == gen))
        };
        let (mut r, _) = wait_until(&self.roster, deadline, reported);
        let why = format!("no report on generation {gen} within {report_bound:?}: treated as dead");
        for m in r.members.iter_mut().filter(|m| m.alive) {
            if m.held.is_none_or(|(g, _)| g != gen) {
                m.exclude(&why);
            }
        }
        let dead: Vec<usize> = (0..r.members.len())
            .filter(|&i| !r.members[i].alive)
            .collect();
        let survivors: Vec<usize> = (0..r.members.len())
            .filter(|&i| r.members[i].alive)
            .collect();
        let all_revoked = survivors
            .iter()
            .all(|&i| r.members[i].held == Some((gen, Held::Revoked)));
        // Shrink needs a revoked parent on every survivor and someone to leave out; anything else gets
        // a new unique id (made with the lock released: rank 0's NCCL, not the rendezvous).
        let how = match all_revoked && !dead.is_empty() {
            true => How::Shrink { exclude: dead },
            false => {
                drop(r);
                let id = new_id()?;
                r = lock(&self.roster);
                How::Init { id }
            }
        };
        let size = survivors.len();
        let mut own = None;
        for (rank, &old) in survivors.iter().enumerate() {
            let plan = Plan {
                gen: gen + 1,
                rank,
                size,
                how: how.clone(),
            };
            match old {
                0 => own = Some(plan),
                _ => r.members[old].send(&Message::Plan(plan)),
            }
        }
        // The survivors, in their new rank order. One that died since the dead set was fixed stays, as
        // dead, so that its rank is left out next time; the new generation is then lost already.
        let mut members = std::mem::take(&mut r.members);
        r.members = survivors
            .iter()
            .map(|&i| std::mem::replace(&mut members[i], Member::new(None, None)))
            .collect();
        for m in r.members.iter_mut() {
            m.held = None;
        }
        r.gen = gen + 1;
        if let Some(rank) = r.members.iter().position(|m| !m.alive) {
            r.declare_lost(
                gen + 1,
                format!("rank {rank} of generation {} died", gen + 1),
            );
        }
        own.ok_or("rank 0 is no survivor of its own plan".to_string())
    }

    /// After a recovery below full size: waits (up to `timeout`) for as many replacements as the first
    /// world lacks, then tells the members to grow and each replacement its rank, in order; or, if
    /// generation `gen` is lost meanwhile, says so. `grow_id` makes the grow's unique id; its failure
    /// loses `gen` (the members are told to recover; the replacements wait for the next grow).
    pub fn await_grow(&self, gen: u64, timeout: Duration, grow_id: NewId) -> Result<Order, String> {
        let need = {
            let r = lock(&self.roster);
            r.world.saturating_sub(r.members.len())
        };
        let lost = |r: &Roster| r.lost.as_ref().is_some_and(|(g, _)| *g >= gen);
        let (r, _) = wait_until(&self.roster, Instant::now() + timeout, |r| {
            lost(r) || r.joiners.len() >= need
        });
        if lost(&r) {
            return Ok(Order::Recover { gen });
        }
        if r.joiners.len() < need {
            return Err(format!(
                "rank 0 waited {timeout:?} for {need} replacement(s) to --join (has {})",
                r.joiners.len()
            ));
        }
        drop(r);
        let made = grow_id();
        let mut r = lock(&self.roster);
        let id = match made {
            Ok(id) => id,
            Err(why) => {
                r.declare_lost(gen, format!("rank 0 could not make the grow id: {why}"));
                return Ok(Order::NoGrowId { gen, why });
            }
        };
        if lost(&r) {
            return Ok(Order::Recover { gen });
        }
        let size = r.members.len() + need;
        let next = gen + 1;
        for m in r.members.iter_mut() {
            m.send(&Message::Grow { gen: next, size });
        }
        let joiners: Vec<(u64, TcpStream)> = r.joiners.drain(..need).collect();
        for (key, conn) in joiners {
            let mut member = Member::new(Some(conn), Some(key));
            member.send(&Message::GrowId {
                gen: next,
                rank: r.members.len(),
                size,
                id: id.clone(),
            });
            r.members.push(member);
        }
        r.gen = next;
        Ok(Order::Grow { gen: next, size })
    }

    /// Waits (up to `timeout`) until every other member said `DONE` or ended, so that none of them reads
    /// rank 0's end as a death.
    pub fn finish(&self, timeout: Duration) -> Result<(), String> {
        let (r, ok) = wait_until(&self.roster, Instant::now() + timeout, |r| {
            r.members[1..].iter().all(|m| m.done || !m.alive)
        });
        match ok {
            true => Ok(()),
            false => {
                let late: Vec<usize> = (1..r.members.len())
                    .filter(|&i| !r.members[i].done)
                    .collect();
                Err(format!(
                    "ranks {} did not finish within {timeout:?}",
                    rank_list(&late)
                ))
            }
        }
    }

    /// What a crash does to the rendezvous, for the tests: every connection closes at once.
    #[cfg(test)]
    pub fn crash(&self) {
        let mut r = lock(&self.roster);
        for m in r.members.iter_mut() {
            if let Some(conn) = m.conn.take() {
                let _ = conn.shutdown(Shutdown::Both);
            }
        }
        for (_, conn) in r.joiners.drain(..) {
            let _ = conn.shutdown(Shutdown::Both);
        }
    }
}

/// Accepts members for the life of the process; each connection gets a thread that files its messages
/// and reports its end.
fn accept_loop(listener: TcpListener, roster: Shared<Roster>) {
    for (key, conn) in (1u64..).zip(listener.incoming()) {
        let Ok(conn) = conn else { continue };
        let roster = Arc::clone(&roster);
        std::thread::spawn(move || {
            if let Err(e) = serve(conn, key, &roster) {
                eprintln!("rank 0: rendezvous: {e}");
            }
        });
    }
}

fn serve(conn: TcpStream, key: u64, roster: &Shared<Roster>) -> Result<(), String> {
    let peer = conn.peer_addr().map_err(|e| e.to_string())?;
    let mut reader = BufReader::new(conn.try_clone().map_err(|e| e.to_string())?);
    let mut line = String::new();
    reader
        .read_line(&mut line)
        .map_err(|e| format!("{peer}: {e}"))?;
    admit(conn, key, Message::parse(&line), roster).map_err(|e| format!("{peer}: {e}"))?;
    let mut outcome = Ok(());
    for line in reader.lines().map_while(Result::ok) {
        let filed = Message::parse(&line).and_then(|m| {
            let filed = lock(roster).received(key, m);
            roster.1.notify_all();
            filed
        });
        if let Err(e) = filed {
            outcome = Err(e);
            break;
        }
    }
    lock(roster).ended(key);
    roster.1.notify_all();
    outcome
}

/// `HELLO` fills a rank of the first world (answered with the first id); `JOIN` queues a replacement.
fn admit(
    mut conn: TcpStream,
    key: u64,
    hello: Result<Message, String>,
    roster: &Shared<Roster>,
) -> Result<(), String> {
    let mut r = lock(roster);
    match hello? {
        Message::Hello { rank } => {
            let id = r.id.clone();
            let free =
                r.gen == 0 && rank > 0 && r.members.get(rank).is_some_and(|m| m.key.is_none());
            if !free {
                return Err(format!("claims rank {rank}: invalid or taken"));
            }
            conn.write_all(format!("{}\n", Message::Id { id }).as_bytes())
                .map_err(|e| e.to_string())?;
            r.members[rank] = Member::new(Some(conn), Some(key));
        }
        Message::Join => r.joiners.push((key, conn)),
        other => return Err(format!("is not a member of this job (said {other})")),
    }
    roster.1.notify_all();
    Ok(())
}
