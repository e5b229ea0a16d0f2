//! Rank 0's side of the rendezvous: who is a member (in the current generation's rank order), who
//! died, how each survivor holds a lost generation, the plan they all follow, and the grows.
//!
//! A generation is lost when a member's connection ends without `DONE` (the kernel closes a dead
//! process's sockets, even after SIGKILL), when a member reports losing it (or an older one: a rank that
//! gave up on its parent cannot be in the grown generation either), or when rank 0 does: the
//! coordinator then tells every live member (`RECOVER`). Agreement: rank 0 waits until every live
//! member has said how it holds a generation up to the lost one, at most the report bound. A member that
//! reports is a survivor, whatever generation it was still on (checking the one before a grow, say):
//! only a closed connection or silence past the bound makes a rank dead (a silent one is told
//! `EXCLUDED`, its connection closed), so a survivor never waits on a rank that fails during recovery
//! and no live rank that answers is left out. One dead set follows, and one plan for all: shrink when
//! every survivor holds the lost communicator itself revoked and someone died, else a new communicator
//! from a new unique id; or, with fewer survivors than the minimum, the end (`END`) for every one.
//!
//! Grows happen while the world trains: at a round boundary rank 0 takes every waiting replacement
//! (up to the first world's size), makes the grow id, tells the members to grow after the next round
//! and waits until each has the order (`READY`) before it starts that round: no member can finish the
//! round without rank 0, so every member holds the order when it does.

use std::collections::HashMap;
use std::io::Write;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrale_gpu_launch::door::{self, Door, Ticket};
use metrale_gpu_launch::line::Lines;
use metrale_gpu_launch::token::JobToken;

use crate::clock::{Clock, Monotonic};
use crate::membership::{
    below_minimum, lock, shared, wait_until, Bounds, Membership, NewId, Order, Shared,
};
use crate::protocol::{rank_list, Held, How, Message, Plan, BEAT_CHECK, LINE_CAP, SILENCE};

/// A member of the current generation, in rank order; rank 0 itself has no connection.
struct Member {
    conn: Option<TcpStream>,
    /// Which connection it is (to match the end a watcher reads); `None` until a first-world rank says
    /// `HELLO`.
    key: Option<u64>,
    /// The first generation it is in (0 for the first world, its grow's for a replacement): a loss it
    /// reports of an older one is none of its business.
    since: u64,
    alive: bool,
    /// The generation it last reported lost, and how it holds it.
    held: Option<(u64, Held)>,
    /// It has the announced grow's order (`READY`), or needs none (rank 0, a replacement).
    ready: bool,
    done: bool,
}

impl Member {
    fn new(conn: Option<TcpStream>, key: Option<u64>, since: u64) -> Member {
        Member {
            conn,
            key,
            since,
            alive: true,
            held: None,
            ready: true,
            done: false,
        }
    }

    /// Sends `message`, within [`WRITE_BOUND`] (set on every connection it admits). A failure is that
    /// member's death: its connection is shut (a line cut short would leave the rest unreadable), and
    /// its watcher reads the end and reports it.
    fn send(&mut self, message: &Message) {
        if let Some(conn) = self.conn.as_mut() {
            if conn.write_all(format!("{message}\n").as_bytes()).is_err() {
                let _ = conn.shutdown(Shutdown::Both);
                self.conn = None;
            }
        }
    }

    /// Tells it `message` (why it is left out, or why the job ends) and closes its connection.
    fn dismiss(&mut self, message: &Message) {
        self.send(message);
        if let Some(conn) = self.conn.take() {
            let _ = conn.shutdown(Shutdown::Both);
        }
        self.alive = false;
    }
}

/// A grow told to the members: after round `after` they grow to `size`, generation `gen`.
#[derive(Clone, Copy)]
struct Announced {
    gen: u64,
    size: usize,
    after: usize,
}

struct Roster {
    members: Vec<Member>,
    /// The newest generation: the one the members are on, or making, or growing to.
    gen: u64,
    /// The newest generation declared lost, and why.
    lost: Option<(u64, String)>,
    /// Replacements that said `JOIN`, in order, waiting for the next grow.
    joiners: Vec<(u64, TcpStream)>,
    /// The first world's size: the most a grow restores.
    world: usize,
    /// The fewest survivors the job goes on with (`--min-size`).
    min: usize,
    /// The grow announced for `gen`, if any.
    grow: Option<Announced>,
    /// The first unique id, for `HELLO`.
    id: String,
    /// When rank 0 last heard from each admitted connection (any line, `BEAT` most often), on
    /// `clock`.
    heard: HashMap<u64, Duration>,
    clock: Arc<dyn Clock>,
}

impl Roster {
    /// Connection `key` said something now.
    fn heard(&mut self, key: u64) {
        let now = self.clock.now();
        self.heard.insert(key, now);
    }

    /// Every member and waiting replacement silent for more than [`SILENCE`] on the clock is dead: a
    /// member is told `EXCLUDED` and its generation is lost, as a death's; a replacement leaves the
    /// queue. One that still beats, however slow its training, never is.
    fn check_beats(&mut self) {
        let now = self.clock.now();
        let heard = &self.heard;
        let silent = |key: u64| {
            heard
                .get(&key)
                .is_some_and(|&t| now.saturating_sub(t) > SILENCE)
        };
        let quiet: Vec<usize> = (0..self.members.len())
            .filter(|&i| {
                let m = &self.members[i];
                m.alive && !m.done && m.conn.is_some() && m.key.is_some_and(silent)
            })
            .collect();
        let (gone, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.joiners)
            .into_iter()
            .partition(|(key, _)| silent(*key));
        self.joiners = waiting;
        for (_, conn) in gone {
            eprintln!(
                "rank 0: rendezvous: a waiting replacement said nothing for {SILENCE:?}: let go"
            );
            let _ = conn.shutdown(Shutdown::Both);
        }
        let gen = self.gen;
        for rank in quiet {
            let why = format!(
                "rank {rank} of generation {gen} said nothing for {SILENCE:?} (frozen, or cut off)"
            );
            self.members[rank].dismiss(&Message::Excluded {
                why: format!("{why}: treated as dead"),
            });
            self.declare_lost(gen, why);
        }
    }

    fn rank_of(&self, key: u64) -> Option<usize> {
        self.members.iter().position(|m| m.key == Some(key))
    }

    fn is_lost(&self, gen: u64) -> bool {
        self.lost.as_ref().is_some_and(|(g, _)| *g >= gen)
    }

    /// Declares generation `gen` lost (once) and tells every live member.
    fn declare_lost(&mut self, gen: u64, why: String) {
        if self.is_lost(gen) {
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
        self.heard.remove(&key);
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
        // A waiting replacement beats too: heard (by the caller), nothing to file.
        if message == Message::Beat {
            return Ok(());
        }
        let rank = self
            .rank_of(key)
            .ok_or(format!("{message} from a connection that is no member"))?;
        match message {
            // The newest generation, or the parent of an announced grow (a member still on it that
            // gave it up cannot grow, so the newest is lost as well); never one the member is not in,
            // nor an older one, whose loss is over: those are ignored, so that no member can lose a
            // generation it has no part in.
            Message::Lost { gen, held } if gen <= self.gen => {
                let on_parent = self.grow.is_some_and(|g| g.gen == self.gen) && gen + 1 == self.gen;
                if gen < self.members[rank].since || (gen != self.gen && !on_parent) {
                    eprintln!(
                        "rank 0: rendezvous: ignored rank {rank}'s loss of generation {gen}: it is in \
                         generations {} to {} (now {})",
                        self.members[rank].since, self.gen, self.gen
                    );
                    return Ok(());
                }
                self.members[rank].held = Some((gen, held));
                let newest = self.gen;
                self.declare_lost(newest, format!("rank {rank} lost generation {gen}"));
            }
            Message::Ready { gen } if gen == self.gen => self.members[rank].ready = true,
            // The order of a grow already lost: nothing waits for it.
            Message::Ready { .. } => {}
            Message::Done => self.members[rank].done = true,
            other => {
                return Err(format!(
                    "rank {rank} sent {other}, which members never send (on generation {})",
                    self.gen
                ))
            }
        }
        Ok(())
    }

    /// The job ends for every live member and waiting replacement, with `why`.
    fn end(&mut self, why: &str) {
        let message = Message::End { why: why.into() };
        for m in self.members.iter_mut().filter(|m| m.alive) {
            m.dismiss(&message);
        }
        self.end_joiners(why);
    }

    /// Every waiting replacement is told `why` there is nothing to join, and let go.
    fn end_joiners(&mut self, why: &str) {
        let message = Message::End { why: why.into() };
        for (_, mut conn) in self.joiners.drain(..) {
            let _ = conn.write_all(format!("{message}\n").as_bytes());
            let _ = conn.shutdown(Shutdown::Both);
        }
    }
}

/// How long rank 0 may take to write a line to a member or a waiting replacement: far above what a
/// live one's reader (a thread that does nothing else) needs, so that a member that reads nothing
/// (frozen, its socket's buffer full) costs rank 0 at most this, once; it is then dead.
pub const WRITE_BOUND: Duration = Duration::from_secs(1);

/// The most connection threads (and so connections) rank 0 holds at once in a world of `world`: one
/// for each connection waiting for its hello ([`door::pending_cap`]), each member (`world - 1` at
/// most) and each waiting replacement ([`joiner_cap`]).
pub fn thread_cap(world: usize) -> usize {
    door::pending_cap(world) + (world - 1) + joiner_cap(world)
}

/// The most replacements that wait for a grow at once: the first world's size. Over it the newest is
/// refused (closed, with a line on rank 0's stderr), and tries again within its own bound.
pub fn joiner_cap(world: usize) -> usize {
    world
}

/// Rank 0's side.
pub struct Coordinator {
    roster: Shared<Roster>,
    port: u16,
    /// Who may connect, and whom it refused.
    door: Arc<Door>,
    /// Connection threads running, for the tests.
    #[cfg(test)]
    threads: Arc<AtomicUsize>,
    /// Set when it is dropped: the heartbeats' thread ends.
    closed: Arc<AtomicBool>,
}

impl Drop for Coordinator {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::Release);
    }
}

/// A connection thread's place in the count; dropping it (the thread ends, or never started) frees it.
struct Running(Arc<AtomicUsize>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Coordinator {
    /// Listens at `master` ([`door::bind`]: loopback alone for a loopback address, else every
    /// interface; port 0 picks one) for the other `world - 1` ranks of the first world, to be handed
    /// `id`, and for replacements: those that prove this job's token ([`JobToken::of_this_job`]). The
    /// job goes on as long as at least `min` ranks survive.
    pub fn listen(master: &str, world: usize, min: usize, id: &str) -> Result<Coordinator, String> {
        let token = JobToken::of_this_job(master, "rank 0")?;
        Coordinator::listen_for(master, world, min, id, token)
    }

    /// [`Coordinator::listen`], admitting those that prove `token`.
    pub fn listen_for(
        master: &str,
        world: usize,
        min: usize,
        id: &str,
        token: JobToken,
    ) -> Result<Coordinator, String> {
        Coordinator::listen_with(master, (world, min), id, token, Arc::new(Monotonic::new()))
    }

    /// [`Coordinator::listen_for`] for a world of `world` ranks going on down to `min`, reading its
    /// members' silence on `clock`: a thread looks every [`BEAT_CHECK`].
    pub fn listen_with(
        master: &str,
        (world, min): (usize, usize),
        id: &str,
        token: JobToken,
        clock: Arc<dyn Clock>,
    ) -> Result<Coordinator, String> {
        let listener = door::bind(master)?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let mut members = vec![Member::new(None, Some(0), 0)];
        members.extend((1..world).map(|_| Member::new(None, None, 0)));
        let roster = shared(Roster {
            members,
            gen: 0,
            lost: None,
            joiners: Vec::new(),
            world,
            min,
            grow: None,
            id: id.to_string(),
            heard: HashMap::new(),
            clock,
        });
        let closed = Arc::new(AtomicBool::new(false));
        let (checked, watching) = (Arc::clone(&roster), Arc::clone(&closed));
        std::thread::Builder::new()
            .name("rank 0 heartbeats".into())
            .spawn(move || {
                while !watching.load(Ordering::Acquire) {
                    std::thread::sleep(BEAT_CHECK);
                    lock(&checked).check_beats();
                    checked.1.notify_all();
                }
            })
            .map_err(|e| format!("rank 0: no thread for the heartbeats: {e}"))?;
        let door = Door::new("rank 0", token, door::pending_cap(world));
        let threads = Arc::new(AtomicUsize::new(0));
        let accepting = (Arc::clone(&roster), Arc::clone(&door), Arc::clone(&threads));
        std::thread::Builder::new()
            .name("rank 0 rendezvous".into())
            .spawn(move || accept_loop(listener, accepting, thread_cap(world)))
            .map_err(|e| format!("rank 0: no thread for the rendezvous: {e}"))?;
        Ok(Coordinator {
            roster,
            port,
            door,
            closed,
            #[cfg(test)]
            threads,
        })
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
            "rank 0 waited {timeout:?} for every rank to connect{}",
            self.door.refusals()
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

    /// How many ranks the world lacks of the first world's size.
    pub fn missing(&self) -> usize {
        let r = lock(&self.roster);
        r.world.saturating_sub(r.members.len())
    }

    /// Rank 0 lost generation `gen` (its own; the members' newest may be the grow after it) and holds it
    /// as `mine`, at round `step`: agreement (see the module's docs), then the plan, sent to every
    /// survivor; rank 0's own part of it. Below the minimum, the end for all, and its reason.
    pub fn recover(
        &self,
        (gen, mine): (u64, Held),
        step: usize,
        report_bound: Duration,
        new_id: NewId,
    ) -> Result<Plan, String> {
        let deadline = Instant::now() + report_bound;
        let lost = {
            let mut r = lock(&self.roster);
            if gen > r.gen {
                return Err(format!(
                    "rank 0 recovers generation {gen}, but the members are on {}",
                    r.gen
                ));
            }
            let lost = r.gen;
            r.declare_lost(lost, format!("rank 0 lost generation {gen}"));
            r.members[0].held = Some((gen, mine));
            lost
        };
        // A report on any generation up to the lost one: a member on the parent of a grow has none
        // other to give.
        let reported = |m: &Member| m.held.is_some_and(|(g, _)| g <= lost);
        // One that said `DONE` (it finished the last round before the loss reached it) will not
        // report: it is dead to the new generation at once.
        let (mut r, _) = wait_until(&self.roster, deadline, |r| {
            r.members.iter().all(|m| !m.alive || m.done || reported(m))
        });
        let why =
            format!("no report on generation {lost} within {report_bound:?}: treated as dead");
        for m in r.members.iter_mut().filter(|m| m.alive && !reported(m)) {
            m.dismiss(&Message::Excluded { why: why.clone() });
        }
        let dead: Vec<usize> = (0..r.members.len())
            .filter(|&i| !r.members[i].alive)
            .collect();
        let survivors: Vec<usize> = (0..r.members.len())
            .filter(|&i| r.members[i].alive)
            .collect();
        if survivors.len() < r.min {
            let why = below_minimum(lost, survivors.len(), r.min, &dead);
            r.end(&why);
            return Err(why);
        }
        // Shrink needs the lost communicator itself, revoked, on every survivor, and someone to leave
        // out; anything else gets a new unique id (made with the lock released: rank 0's NCCL, not
        // the rendezvous).
        let all_revoked = survivors
            .iter()
            .all(|&i| r.members[i].held == Some((lost, Held::Revoked)));
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
                gen: lost + 1,
                rank,
                size,
                step,
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
            .map(|&i| std::mem::replace(&mut members[i], Member::new(None, None, 0)))
            .collect();
        for m in r.members.iter_mut() {
            m.held = None;
            m.ready = true;
        }
        r.gen = lost + 1;
        r.grow = None;
        if let Some(rank) = r.members.iter().position(|m| !m.alive) {
            r.declare_lost(
                lost + 1,
                format!("rank {rank} of generation {} died", lost + 1),
            );
        }
        own.ok_or("rank 0 is no survivor of its own plan".to_string())
    }

    /// At the boundary before round `after` on generation `gen`: if replacements wait (and the world
    /// lacks ranks), takes all of them that fit, makes the grow id with `grow_id`, tells the members to
    /// grow after round `after` and each replacement its rank, in order, and waits (up to
    /// `ready_bound`) until every member has the order. `None`: no grow (nobody waits, or one was
    /// announced already). `Order::Grow`: announced, made after round `after`. `Order::Recover`: `gen`
    /// was lost meanwhile, or a member did not answer in time. `Order::NoGrowId`: the id failed.
    pub fn offer_grow(
        &self,
        gen: u64,
        after: usize,
        ready_bound: Duration,
        grow_id: NewId,
    ) -> Result<Option<Order>, String> {
        {
            let r = lock(&self.roster);
            if r.is_lost(gen) {
                return Ok(Some(Order::Recover { gen }));
            }
            let fit = r.world.saturating_sub(r.members.len());
            if r.gen != gen || r.joiners.is_empty() || fit == 0 {
                return Ok(None);
            }
        }
        let made = grow_id();
        let mut r = lock(&self.roster);
        let id = match made {
            Ok(id) => id,
            Err(why) => {
                r.declare_lost(gen, format!("rank 0 could not make the grow id: {why}"));
                return Ok(Some(Order::NoGrowId { gen, why }));
            }
        };
        if r.is_lost(gen) {
            return Ok(Some(Order::Recover { gen }));
        }
        let take = r.joiners.len().min(r.world.saturating_sub(r.members.len()));
        if take == 0 {
            // The replacements left while the id was made, which NCCL sent already: a grow with it
            // would read a stale id later, so the members make a new communicator instead.
            let why = "every replacement left while rank 0 made the grow id".to_string();
            r.declare_lost(gen, why.clone());
            return Ok(Some(Order::Recover { gen }));
        }
        let size = r.members.len() + take;
        let next = gen + 1;
        let grow = Message::Grow {
            gen: next,
            size,
            after,
        };
        for m in r.members.iter_mut().skip(1).filter(|m| m.alive) {
            m.ready = false;
            m.send(&grow);
        }
        let joiners: Vec<(u64, TcpStream)> = r.joiners.drain(..take).collect();
        for (key, conn) in joiners {
            let mut member = Member::new(Some(conn), Some(key), next);
            member.send(&Message::GrowId {
                gen: next,
                rank: r.members.len(),
                size,
                after,
                id: id.clone(),
            });
            r.members.push(member);
        }
        r.gen = next;
        r.grow = Some(Announced {
            gen: next,
            size,
            after,
        });
        drop(r);
        let (mut r, ready) = wait_until(&self.roster, Instant::now() + ready_bound, |r| {
            r.is_lost(next) || r.members.iter().all(|m| !m.alive || m.ready)
        });
        if !ready {
            let late: Vec<usize> = (0..r.members.len())
                .filter(|&i| r.members[i].alive && !r.members[i].ready)
                .collect();
            let why = format!(
                "ranks {} did not confirm the grow to generation {next} within {ready_bound:?}",
                rank_list(&late)
            );
            r.declare_lost(next, why);
        }
        Ok(Some(match r.is_lost(next) {
            true => Order::Recover { gen },
            false => Order::Grow {
                gen: next,
                size,
                after,
            },
        }))
    }

    /// The grow announced for after round `step` on generation `gen`: its generation and size.
    pub fn grow_after(&self, gen: u64, step: usize) -> Option<(u64, usize)> {
        let r = lock(&self.roster);
        r.grow
            .filter(|g| g.gen == gen + 1 && g.after == step)
            .map(|g| (g.gen, g.size))
    }

    /// Waits (up to `timeout`) until every other member said `DONE` or ended, so that none of them reads
    /// rank 0's end as a death; replacements still waiting are told the job is over.
    pub fn finish(&self, timeout: Duration) -> Result<(), String> {
        lock(&self.roster).end_joiners("the job finished before this replacement could join");
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

    /// Replacements waiting for a grow, for the tests.
    #[cfg(test)]
    pub fn waiting(&self) -> usize {
        lock(&self.roster).joiners.len()
    }

    /// When rank 0 last heard from each admitted connection, on its clock, for the tests.
    #[cfg(test)]
    pub fn heard_all(&self) -> Vec<Duration> {
        lock(&self.roster).heard.values().copied().collect()
    }

    /// One look for silent members now, as the heartbeats' thread makes every [`BEAT_CHECK`], for
    /// the tests.
    #[cfg(test)]
    pub fn check_beats(&self) {
        lock(&self.roster).check_beats();
        self.roster.1.notify_all();
    }

    /// Connection threads running, for the tests.
    #[cfg(test)]
    pub fn threads(&self) -> usize {
        self.threads.load(Ordering::Acquire)
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

/// What the accept loop shares with the connections: the roster, the door, the thread count.
type Accepting = (Shared<Roster>, Arc<Door>, Arc<AtomicUsize>);

/// Accepts members for the life of the process; each connection gets a thread (at most `cap` at once:
/// over it, or where no thread can be made, the connection is refused with a line, and the loop goes
/// on) that reads its hello (within the door's bounds: a stray is refused there), then files its
/// messages and reports its end.
fn accept_loop(listener: TcpListener, (roster, door, threads): Accepting, cap: usize) {
    for (key, conn) in (1u64..).zip(listener.incoming()) {
        // Out of descriptors, or a connection aborted in the queue: a moment, then the next.
        let Ok(conn) = conn else {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        };
        let Ok(peer) = conn.peer_addr() else { continue };
        let Some(ticket) = door.enter(peer) else {
            continue;
        };
        if threads.fetch_add(1, Ordering::AcqRel) >= cap {
            threads.fetch_sub(1, Ordering::AcqRel);
            door.refuse(peer, &format!("rank 0 holds {cap} connections already"));
            continue;
        }
        let running = Running(Arc::clone(&threads));
        let (roster, door_of) = (Arc::clone(&roster), Arc::clone(&door));
        let spawned = std::thread::Builder::new()
            .name("rank 0 connection".into())
            .spawn(move || {
                let _running = running;
                if let Err(e) = serve(conn, key, &roster, &door_of, ticket) {
                    eprintln!("rank 0: rendezvous: {e}");
                }
            });
        // The closure, and with it the connection, its ticket and its place, is dropped unrun.
        if let Err(e) = spawned {
            door.refuse(peer, &format!("no thread to serve it: {e}"));
        }
    }
}

/// One connection: its hello (refused through the door if it is a stray), then an admitted member's
/// lines, each at most [`LINE_CAP`] bytes (a longer one ends the connection, read as its end), for as
/// long as it stays open.
fn serve(
    conn: TcpStream,
    key: u64,
    roster: &Shared<Roster>,
    door: &Door,
    ticket: Ticket,
) -> Result<(), String> {
    let peer = conn.peer_addr().map_err(|e| e.to_string())?;
    // Accepted from a blocking listener; every write to it from now on is bounded.
    conn.set_write_timeout(Some(WRITE_BOUND))
        .map_err(|e| e.to_string())?;
    let mut lines = Lines::new(conn.try_clone().map_err(|e| e.to_string())?);
    let hello = door
        .hello(&mut lines, Instant::now() + door::HELLO_BOUND)
        .and_then(|payload| Message::parse(&payload));
    if let Err(why) = admit(conn, key, hello, roster) {
        door.refuse(peer, &why);
        return Ok(());
    }
    drop(ticket);
    let mut outcome = Ok(());
    loop {
        let filed = match lines.next(LINE_CAP, None) {
            Ok(None) => break,
            Ok(Some(line)) => Message::parse(&line).and_then(|m| {
                let mut r = lock(roster);
                r.heard(key);
                let filed = r.received(key, m);
                drop(r);
                roster.1.notify_all();
                filed
            }),
            Err(e) => Err(e),
        };
        if let Err(e) = filed {
            outcome = Err(format!("{peer}: {e}"));
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
            r.members[rank] = Member::new(Some(conn), Some(key), 0);
        }
        Message::Join if r.joiners.len() >= joiner_cap(r.world) => {
            return Err(format!(
                "{} replacements wait already, the most ({}, the first world's size)",
                r.joiners.len(),
                joiner_cap(r.world)
            ))
        }
        Message::Join => r.joiners.push((key, conn)),
        other => return Err(format!("is not a member of this job (said {other})")),
    }
    r.heard(key);
    roster.1.notify_all();
    Ok(())
}

impl Membership for Coordinator {
    fn lost(&self, gen: u64) -> Option<String> {
        Coordinator::lost(self, gen)
    }

    fn recover(
        &self,
        lost: (u64, Held),
        step: usize,
        bounds: &Bounds,
        new_id: NewId,
    ) -> Result<Plan, String> {
        Coordinator::recover(self, lost, step, bounds.report, new_id)
    }

    fn offer_grow(
        &self,
        gen: u64,
        after: usize,
        bounds: &Bounds,
        grow_id: NewId,
    ) -> Result<Option<Order>, String> {
        Coordinator::offer_grow(self, gen, after, bounds.ready, grow_id)
    }

    fn grow_after(&self, gen: u64, step: usize) -> Option<(u64, usize)> {
        Coordinator::grow_after(self, gen, step)
    }

    fn missing(&self) -> usize {
        Coordinator::missing(self)
    }

    fn finish(&self, timeout: Duration) -> Result<(), String> {
        Coordinator::finish(self, timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// A member that reads nothing (a frozen process) costs rank 0 at most [`WRITE_BOUND`] a write:
    /// once its socket's buffers are full the write gives up and the member's connection is shut,
    /// which its peer reads as the end.
    #[test]
    fn a_member_that_reads_nothing_is_shut_after_one_bounded_write() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let mut frozen = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let conn = l.accept().expect("accept").0;
        conn.set_write_timeout(Some(WRITE_BOUND)).expect("bound");
        let mut member = Member::new(Some(conn), Some(1), 0);
        let why = "x".repeat(LINE_CAP - 64);
        let message = Message::Recover { gen: 0, why };
        // Loopback's buffers hold a few MiB: far fewer writes than this fill them.
        let mut sent = 0;
        while sent < 100_000 && member.conn.is_some() {
            member.send(&message);
            sent += 1;
        }
        assert!(sent < 100_000, "every write went through: no bound");
        let mut rest = Vec::new();
        let _ = frozen.read_to_end(&mut rest);
        assert!(
            rest.len() < sent * LINE_CAP,
            "the frozen member read the end"
        );
    }
}
