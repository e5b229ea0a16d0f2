//! Who is alive: the rendezvous that hands out the unique ids, tells the survivors who died and makes
//! them agree on what comes next. Rank 0 coordinates (`coordinator.rs`); every other process keeps one
//! connection to it (`client.rs`); the messages are in `protocol.rs`.
//!
//! The kernel closes the sockets of a process that dies, even by SIGKILL, so rank 0 reads the end of a
//! dead member's connection within milliseconds: that holds on every transport NCCL uses (over NVLink
//! NCCL itself never notices a dead peer). Rank 0's own death closes every member's connection: each
//! ends with a clear error (`client::COORDINATOR_GONE`) within the time its revoke takes; this example
//! elects no new coordinator.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::client::Client;
use crate::coordinator::Coordinator;
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

/// What a rank below full size does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Order {
    /// Grow to `size` ranks, making generation `gen`.
    Grow { gen: u64, size: usize },
    /// Generation `gen` was lost while waiting: give up on it and recover.
    Recover { gen: u64 },
    /// Rank 0 could not make the grow id (NCCL failed, or the call was given up on: `why`): it no
    /// longer holds generation `gen`, which is lost for all.
    NoGrowId { gen: u64, why: String },
}

/// Either side, for the rank's life.
pub enum Membership {
    Coordinator(Coordinator),
    Member(Client),
}

impl Membership {
    /// Why the communicator of generation `gen` must be given up on, once the rendezvous says so.
    pub fn lost(&self, gen: u64) -> Option<String> {
        match self {
            Membership::Coordinator(c) => c.lost(gen),
            Membership::Member(m) => m.lost(gen),
        }
    }

    /// This rank gave up on generation `gen` and holds it as `held`: the plan every survivor follows
    /// (rank 0 makes it within `bounds.report`, with `new_id` for a new communicator; the others wait
    /// for it up to `bounds.plan`).
    pub fn recover(
        &self,
        gen: u64,
        held: Held,
        bounds: &Bounds,
        new_id: NewId,
    ) -> Result<Plan, String> {
        match self {
            Membership::Coordinator(c) => c.recover(gen, held, bounds.report, new_id),
            Membership::Member(m) => m.recover(gen, held, bounds.plan),
        }
    }

    /// On generation `gen` below full size: the grow (rank 0 waits up to `timeout` for replacements and
    /// makes the grow id with `grow_id`), or the news that `gen` was lost meanwhile (or, at rank 0, in
    /// `grow_id`).
    pub fn await_grow(&self, gen: u64, timeout: Duration, grow_id: NewId) -> Result<Order, String> {
        match self {
            Membership::Coordinator(c) => c.await_grow(gen, timeout, grow_id),
            Membership::Member(m) => m.await_grow(gen, timeout),
        }
    }

    /// The rank is done: a member says so, rank 0 waits (up to `timeout`) for the others to.
    pub fn finish(&self, timeout: Duration) -> Result<(), String> {
        match self {
            Membership::Coordinator(c) => c.finish(timeout),
            Membership::Member(m) => m.finish(),
        }
    }
}

/// How long each step of a recovery may take, from the example's `--deadline` D. A member gives up on a
/// lost collective within D of the rendezvous's news (its revoke's quiescence wait), so rank 0 waits
/// `report` = 2D + 1 s for reports before it treats the silent as dead; a member waits for the plan
/// `plan` = 4D + 2 s (rank 0's own give-up, up to 2D, then its report wait); making the next
/// communicator (shrink, init, grow) may take `setup` = 4D.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    pub report: Duration,
    pub plan: Duration,
    pub setup: Duration,
}

impl Bounds {
    pub fn new(deadline: Duration) -> Bounds {
        let second = Duration::from_secs(1);
        Bounds {
            report: 2 * deadline + second,
            plan: 4 * deadline + 2 * second,
            setup: 4 * deadline,
        }
    }
}

#[cfg(test)]
mod tests {
    //! The agreement over TCP on loopback, with threads for ranks: no GPU, no NCCL.

    use super::*;
    use crate::client::Joined;
    use crate::protocol::How;
    use crate::{bounded, client};
    use std::sync::mpsc;

    const T: Duration = Duration::from_secs(10);

    fn bounds(deadline_ms: u64) -> Bounds {
        Bounds::new(Duration::from_millis(deadline_ms))
    }

    /// A coordinator on a free port and `world - 1` members connected to it.
    fn world(world: usize) -> (Coordinator, Vec<Client>, String) {
        let coordinator = Coordinator::listen("127.0.0.1:0", world, "f00d").expect("listens");
        let master = format!("127.0.0.1:{}", coordinator.port());
        let members: Vec<Client> = (1..world)
            .map(|rank| {
                let (client, id) = Client::hello(&master, rank, T).expect("hello");
                assert_eq!(id, "f00d");
                client
            })
            .collect();
        coordinator.wait_members(T).expect("every rank connects");
        (coordinator, members, master)
    }

    fn no_id() -> Result<String, String> {
        Err("no new id expected".into())
    }

    /// Rank 0 (holding `own`) and `members` (holding `held`, each in a thread of its own) recover
    /// generation `gen` together: rank 0's plan, then the members' plans in rank order.
    fn recover_all(
        c: &Coordinator,
        (gen, own): (u64, Held),
        members: &[Client],
        held: &[Held],
        b: Bounds,
        new_id: NewId,
    ) -> (Result<Plan, String>, Vec<Result<Plan, String>>) {
        std::thread::scope(|s| {
            let handles: Vec<_> = members
                .iter()
                .zip(held)
                .map(|(m, &h)| s.spawn(move || m.recover(gen, h, b.plan)))
                .collect();
            let own = c.recover(gen, own, b.report, new_id);
            let theirs = handles
                .into_iter()
                .map(|h| h.join().expect("no panic"))
                .collect();
            (own, theirs)
        })
    }

    /// A world of `size` ranks in which ranks `dead` (highest first) died, recovered together to
    /// generation 1 by a shrink: the coordinator, the survivors, the address and rank 0's plan.
    fn recovered(
        size: usize,
        dead: &[usize],
        b: Bounds,
    ) -> (Coordinator, Vec<Client>, String, Plan) {
        let (c, mut members, master) = world(size);
        for &rank in dead {
            drop(members.remove(rank - 1));
        }
        let held = vec![Held::Revoked; members.len()];
        let (own, _) = recover_all(&c, (0, Held::Revoked), &members, &held, b, &mut no_id);
        (c, members, master, own.expect("rank 0's plan"))
    }

    /// Generation 1 lost with rank 0's communicator aborted: rank 0 and `members` (holding `held`)
    /// recover together, from the new id `cafe`.
    fn reinit(
        c: &Coordinator,
        members: &[Client],
        held: &[Held],
        b: Bounds,
    ) -> (Result<Plan, String>, Vec<Result<Plan, String>>) {
        recover_all(c, (1, Held::Aborted), members, held, b, &mut || {
            Ok("cafe".to_string())
        })
    }

    fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + T;
        loop {
            if let Some(v) = f() {
                return v;
            }
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_death_is_news_to_all_and_the_survivors_agree_to_shrink_without_it() {
        let (c, mut members, _) = world(4);
        assert_eq!(c.lost(0), None);
        let dead = members.remove(1); // rank 2
        drop(dead);
        for m in &members {
            let why = wait_for("every survivor hears of it", || m.lost(0));
            assert!(why.contains("rank 2 of generation 0 died"), "{why}");
            assert_eq!(m.lost(1), None, "only generation 0 is lost");
        }
        assert!(c.lost(0).is_some());
        let b = bounds(200);
        let (own, theirs) = recover_all(
            &c,
            (0, Held::Revoked),
            &members,
            &[Held::Revoked; 2],
            b,
            &mut no_id,
        );
        let shrink = How::Shrink { exclude: vec![2] };
        let plan = |rank| Plan {
            gen: 1,
            rank,
            size: 3,
            how: shrink.clone(),
        };
        assert_eq!(own, Ok(plan(0)));
        assert_eq!(
            theirs,
            vec![Ok(plan(1)), Ok(plan(2))],
            "ranks 1 and 3 become 1 and 2"
        );
        // The new generation is not lost.
        assert_eq!(c.lost(1), None);
        assert!(members.iter().all(|m| m.lost(1).is_none()));
    }

    #[test]
    fn one_aborted_survivor_makes_all_of_them_init_from_one_new_id() {
        let (c, mut members, _) = world(3);
        drop(members.pop()); // rank 2
        let b = bounds(200);
        let mut ids = 0;
        let mut new_id = || {
            ids += 1;
            Ok("beef".to_string())
        };
        // Rank 1 heard of the death from NCCL first: its communicator was aborted.
        let (own, theirs) = recover_all(
            &c,
            (0, Held::Revoked),
            &members,
            &[Held::Aborted],
            b,
            &mut new_id,
        );
        assert_eq!(ids, 1, "one id for all");
        let init = How::Init { id: "beef".into() };
        assert_eq!(
            own,
            Ok(Plan {
                gen: 1,
                rank: 0,
                size: 2,
                how: init.clone()
            })
        );
        assert_eq!(
            theirs,
            vec![Ok(Plan {
                gen: 1,
                rank: 1,
                size: 2,
                how: init
            })]
        );
    }

    #[test]
    fn a_survivor_silent_past_the_report_bound_is_treated_as_dead_and_told() {
        let (c, mut members, _) = world(4);
        drop(members.remove(0)); // rank 1 dies
        let b = bounds(100); // report bound: 1.2 s
        let start = Instant::now();
        // Rank 2 reports; rank 3 never does (hung in a call, say).
        let (own, theirs) = recover_all(
            &c,
            (0, Held::Revoked),
            &members[..1],
            &[Held::Revoked],
            b,
            &mut no_id,
        );
        let took = start.elapsed();
        assert!(
            took >= b.report && took < b.report + Duration::from_secs(2),
            "{took:?}"
        );
        let shrink = How::Shrink {
            exclude: vec![1, 3],
        };
        assert_eq!(own.map(|p| (p.size, p.how)), Ok((2, shrink.clone())));
        assert_eq!(
            theirs,
            vec![Ok(Plan {
                gen: 1,
                rank: 1,
                size: 2,
                how: shrink
            })]
        );
        // The silent one learns it was left out: its next wait ends with that, not a hang. (The news of
        // the lost generation may be read first: the exclusion follows it on the same connection.)
        let why = wait_for("rank 3 is told it was left out", || {
            members[1]
                .lost(0)
                .filter(|w| w.contains("left this rank out"))
        });
        assert!(
            why.contains("left this rank out") && why.contains("treated as dead"),
            "{why}"
        );
        let err = members[1]
            .recover(0, Held::Revoked, T)
            .expect_err("excluded");
        assert!(err.contains("left this rank out"), "{err}");
    }

    #[test]
    fn a_death_during_recovery_loses_the_new_generation_and_the_next_round_excludes_it() {
        let b = bounds(200);
        let (c, mut members, _, own) = recovered(4, &[3], b);
        assert_eq!(own.gen, 1);
        // Rank 1 dies during the shrink to generation 1: generation 1 is lost, for everyone.
        drop(members.remove(0));
        let why = wait_for("the survivor hears of it", || members[0].lost(1));
        assert!(why.contains("rank 1 of generation 1 died"), "{why}");
        // The survivors' shrink was aborted: a new id this time, rank 1 of generation 1 left out.
        let (own, theirs) = reinit(&c, &members, &[Held::Aborted], b);
        let init = How::Init { id: "cafe".into() };
        assert_eq!(
            own.map(|p| (p.gen, p.size, p.how)),
            Ok((2, 2, init.clone()))
        );
        assert_eq!(theirs[0].as_ref().map(|p| (p.rank, &p.how)), Ok((1, &init)));
    }

    /// Ranks `members` and rank 0 wait for the grow of generation `gen`, `joining` replacements join
    /// at once: the order all of them got, and the replacements' places (gen, rank, size), sorted.
    fn grow_all(
        c: &Coordinator,
        gen: u64,
        members: &[Client],
        joining: usize,
        master: &str,
    ) -> (Order, Vec<Client>, Vec<(u64, usize, usize)>) {
        std::thread::scope(|s| {
            let joiners: Vec<_> = (0..joining)
                .map(|_| s.spawn(|| Client::join(master, T).expect("joined")))
                .collect();
            let waiting: Vec<_> = members
                .iter()
                .map(|m| s.spawn(move || m.await_grow(gen, T)))
                .collect();
            let order = c.await_grow(gen, T, &mut || Ok("a11".to_string()));
            let order = order.expect("rank 0 grows");
            for w in waiting {
                assert_eq!(w.join().expect("no panic"), Ok(order.clone()), "same order");
            }
            let mut joined: Vec<(Client, Joined)> = joiners
                .into_iter()
                .map(|j| j.join().expect("no panic"))
                .collect();
            joined.sort_by_key(|(_, j)| j.rank);
            let places = joined
                .iter()
                .map(|(_, j)| (j.gen, j.rank, j.size))
                .collect();
            (order, joined.into_iter().map(|(c, _)| c).collect(), places)
        })
    }

    #[test]
    fn replacements_joining_at_once_restore_full_size_in_order() {
        let (c, members, master, own) = recovered(4, &[3, 1], bounds(200));
        assert_eq!(own.size, 2);
        // Two replacements at once; rank 0 and the survivor wait for the grow.
        let (order, _, places) = grow_all(&c, 1, &members, 2, &master);
        assert_eq!(order, Order::Grow { gen: 2, size: 4 });
        assert_eq!(
            places,
            vec![(2, 2, 4), (2, 3, 4)],
            "ranks 2 and 3, after the survivors"
        );
    }

    /// The GPU run's failed `grow`: a survivor killed while the others and a replacement grow. The
    /// replacement hears of it from the rendezvous as soon as rank 0 does (the 6.8 s it took there
    /// were its grow's failure path, not the news).
    #[test]
    fn a_death_during_the_grow_is_news_to_the_replacement_at_once() {
        let (c, mut members, master, _) = recovered(4, &[3], bounds(200));
        let (order, mut joined, places) = grow_all(&c, 1, &members, 1, &master);
        assert_eq!(order, Order::Grow { gen: 2, size: 4 });
        assert_eq!(places, vec![(2, 3, 4)]);
        let replacement = joined.remove(0);
        assert_eq!(replacement.lost(2), None);
        drop(members.remove(1)); // old rank 2 dies during the grow
        let told = Instant::now();
        let why = wait_for("the replacement hears of it", || replacement.lost(2));
        assert!(why.contains("rank 2 of generation 2 died"), "{why}");
        let heard = wait_for("rank 0 hears of it", || c.lost(2));
        assert_eq!(heard, why, "the same news");
        assert!(
            told.elapsed() < Duration::from_secs(1),
            "{:?}",
            told.elapsed()
        );
        let other = wait_for("and the other survivor", || members[0].lost(2));
        assert_eq!(other, why, "the same news");
    }

    /// The GPU run's `grow` to its end (0 of 3 on NCCL 2.29.7 before): rank 3 dies; ranks 0-2 and a
    /// replacement grow; rank 2 dies during it; the survivors (0, 1, the replacement) make generation
    /// 3 of 3 ranks. The replacement's full size is its grow's, 4 (there it took the command line's,
    /// which a `--join` has none of, finished at 3, and rank 0's grow id then sent to a process that
    /// was gone); the next grow takes exactly one more replacement, ranks in order.
    #[test]
    fn a_death_during_the_grow_ends_at_full_size_with_one_replacement_more() {
        let b = bounds(200);
        let (c, mut members, master, _) = recovered(4, &[3], b);
        let (order, mut first, places) = grow_all(&c, 1, &members, 1, &master);
        assert_eq!(order, Order::Grow { gen: 2, size: 4 });
        assert_eq!(places, vec![(2, 3, 4)], "a grow's size is the full world's");
        drop(members.remove(1)); // old rank 2 dies during the grow
        let replacement = first.remove(0);
        wait_for("the replacement hears of it", || replacement.lost(2));
        // Every survivor gave its grow up, aborted: a new id for 0, 1 and the replacement.
        let survivors = vec![members.remove(0), replacement];
        let (own, theirs) = recover_all(
            &c,
            (2, Held::Aborted),
            &survivors,
            &[Held::Aborted; 2],
            b,
            &mut || Ok("cafe".to_string()),
        );
        let init = How::Init { id: "cafe".into() };
        assert_eq!(own.map(|p| (p.gen, p.size, p.how)), Ok((3, 3, init)));
        let ranks: Vec<_> = theirs.iter().map(|p| p.as_ref().map(|p| p.rank)).collect();
        assert_eq!(ranks, vec![Ok(1), Ok(2)], "the replacement is rank 2");
        // Below its full size the replacement waits for the grow like the others: one more joins.
        let (order, second, places) = grow_all(&c, 3, &survivors, 1, &master);
        assert_eq!(order, Order::Grow { gen: 4, size: 4 });
        assert_eq!(
            places,
            vec![(4, 3, 4)],
            "the new one is rank 3, after the survivors"
        );
        for m in survivors.iter().chain(&second) {
            m.finish().expect("DONE");
        }
        c.finish(T).expect("every rank finished at full size");
        assert_eq!(c.lost(4), None);
    }

    /// A rank that says `DONE` below full size (a bug, or a process that gave up) leaves the
    /// communicator short: rank 0 declares the generation lost at once and leaves the rank out,
    /// rather than send it a grow id in vain and wait out the report window.
    #[test]
    fn a_rank_finishing_below_full_size_is_a_death_at_once() {
        let b = bounds(200);
        let (c, members, _, own) = recovered(3, &[2], b);
        assert_eq!((own.gen, own.size), (1, 2));
        members[0].finish().expect("DONE");
        let why = wait_for("rank 0 hears of it", || c.lost(1));
        assert!(
            why.contains("rank 1 of generation 1 finished below the full size (2 of 3 ranks)"),
            "{why}"
        );
        let told = wait_for("the rank is told it was left out", || {
            members[0]
                .lost(1)
                .filter(|w| w.contains("left this rank out"))
        });
        assert!(told.contains("treated as dead"), "{told}");
        let start = Instant::now();
        let plan = c.recover(1, Held::Revoked, b.report, &mut no_id);
        assert!(start.elapsed() < b.report, "{:?}", start.elapsed());
        let shrink = How::Shrink { exclude: vec![1] };
        assert_eq!(plan.map(|p| (p.gen, p.size, p.how)), Ok((2, 1, shrink)));
    }

    #[test]
    fn a_death_while_waiting_for_replacements_is_a_recovery_not_a_hang() {
        let (c, mut members, _, _) = recovered(3, &[2], bounds(200));
        let order = std::thread::scope(|s| {
            let waiting = s.spawn(|| c.await_grow(1, T, &mut || Err("no grow expected".into())));
            std::thread::sleep(Duration::from_millis(100));
            drop(members.remove(0)); // rank 1 dies before any replacement comes
            waiting.join().expect("no panic")
        });
        assert_eq!(order, Ok(Order::Recover { gen: 1 }));
    }

    #[test]
    fn a_failed_grow_id_loses_the_generation_for_all() {
        let (c, members, master, _) = recovered(3, &[2], bounds(200));
        let (order, member_order) = std::thread::scope(|s| {
            let _joiner = s.spawn(|| Client::join(&master, Duration::from_millis(500)));
            let member = s.spawn(|| members[0].await_grow(1, T));
            let mut failed = || Err("ncclCommGetUniqueId failed: NCCL error 3".to_string());
            let order = c.await_grow(1, T, &mut failed);
            (order, member.join().expect("no panic"))
        });
        assert_eq!(
            order,
            Ok(Order::NoGrowId {
                gen: 1,
                why: "ncclCommGetUniqueId failed: NCCL error 3".into()
            })
        );
        assert_eq!(member_order, Ok(Order::Recover { gen: 1 }));
        let why = members[0].lost(1).expect("told");
        assert!(
            why.contains("rank 0 could not make the grow id: ncclCommGetUniqueId failed"),
            "{why}"
        );
    }

    #[test]
    fn the_top_rank_dying_under_a_blocked_grow_id_is_a_recovery_and_the_replacement_waits() {
        let b = bounds(200);
        let (c, mut members, master, own) = recovered(4, &[1], b);
        assert_eq!(own.size, 3, "ranks 0, 2, 3 become 0, 1, 2");
        let mut top = members.pop(); // rank 2 of generation 1, the parent's last rank
                                     // A replacement joins; rank 0 makes the grow id, and the top rank dies just after rank 0 last
                                     // looked: NCCL's send to it is refused and retried, a call that does not return (here, a gate
                                     // never opened while rank 0 waits).
        let (_open, gate) = mpsc::channel::<()>();
        let mut gate = Some(gate);
        let first = master.clone();
        let joiner = std::thread::spawn(move || Client::join(&first, T));
        let (order, member_order) = std::thread::scope(|s| {
            let member = s.spawn(|| members[0].await_grow(1, T));
            let mut grow_id = || {
                drop(top.take());
                let gate = gate.take();
                let call = move || {
                    let _ = gate.map(|g| g.recv());
                };
                bounded::call("ncclCommGetUniqueId", T, &|| c.lost(1), call, |()| ())
                    .map(|()| "a11".to_string())
            };
            let start = Instant::now();
            let order = c.await_grow(1, T, &mut grow_id);
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "given up on the news, not at the bound: {:?}",
                start.elapsed()
            );
            (order, member.join().expect("no panic"))
        });
        let Ok(Order::NoGrowId { gen: 1, why }) = &order else {
            panic!("{order:?}")
        };
        assert!(
            why.starts_with("ncclCommGetUniqueId: given up while it ran: the rendezvous: rank 2 of generation 1 died"),
            "{why}"
        );
        assert_eq!(
            member_order,
            Ok(Order::Recover { gen: 1 }),
            "the member is told too"
        );
        // Rank 0 no longer holds generation 1: a new id for the survivors, the replacement still queued.
        let (own, theirs) = reinit(&c, &members, &[Held::Revoked], b);
        let init = How::Init { id: "cafe".into() };
        assert_eq!(own.map(|p| (p.gen, p.size, p.how)), Ok((2, 2, init)));
        assert_eq!(theirs[0].as_ref().map(|p| p.rank), Ok(1));
        let (order, second) = std::thread::scope(|s| {
            let second = s.spawn(|| Client::join(&master, T));
            let order = c.await_grow(2, T, &mut || Ok("b22".to_string()));
            (order, second.join().expect("no panic"))
        });
        assert_eq!(order, Ok(Order::Grow { gen: 3, size: 4 }));
        let mut ranks: Vec<usize> = [joiner.join().expect("no panic"), second]
            .into_iter()
            .map(|j| j.map(|(_, j)| j.rank).expect("joined"))
            .collect();
        ranks.sort_unstable();
        assert_eq!(
            ranks,
            vec![2, 3],
            "the first replacement waited for this grow"
        );
    }

    #[test]
    fn the_coordinators_death_ends_every_member_with_a_clear_error_at_once() {
        let (c, members, _) = world(3);
        c.crash();
        for m in &members {
            let why = wait_for("the member hears of it", || m.lost(0));
            assert_eq!(why, client::COORDINATOR_GONE);
            let start = Instant::now();
            let err = m.recover(0, Held::Revoked, T).expect_err("no coordinator");
            assert!(err.contains("rank 0 (the coordinator) is gone"), "{err}");
            assert!(
                err.contains("external store"),
                "says what production does: {err}"
            );
            assert!(
                start.elapsed() < Duration::from_secs(1),
                "no wait for a dead coordinator"
            );
        }
    }

    #[test]
    fn members_that_finished_are_no_deaths() {
        let (c, members, _) = world(3);
        for m in &members {
            m.finish().expect("DONE");
        }
        drop(members);
        c.finish(T).expect("every member said DONE");
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(c.lost(0), None, "a finished member's end is no death");
    }
}
