//! The agreement over TCP on loopback, with threads for ranks: no GPU, no NCCL.

use crate::client;
use crate::client::Client;
use crate::client::Joined;
use crate::coordinator::Coordinator;
use crate::membership::*;
use crate::protocol::{Held, How, Plan, LINE_CAP, SILENCE};
use metrale_gpu_launch::auth;
use metrale_gpu_launch::line::Lines;
use metrale_gpu_launch::token::JobToken;
use metrale_gpu_watchdog::bounded;
use std::io::Write;
use std::net::TcpStream;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);

fn bounds(deadline_ms: u64) -> Bounds {
    Bounds::new(Duration::from_millis(deadline_ms))
}

/// A coordinator on a free port and `world - 1` members connected to it.
fn world(world: usize) -> (Coordinator, Vec<Client>, String) {
    let coordinator = Coordinator::listen("127.0.0.1:0", world, 1, "f00d").expect("listens");
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
        let own = c.recover((gen, own), 0, b.report, new_id);
        let theirs = handles
            .into_iter()
            .map(|h| h.join().expect("no panic"))
            .collect();
        (own, theirs)
    })
}

/// A world of `size` ranks in which ranks `dead` (highest first) died, recovered together to
/// generation 1 by a shrink: the coordinator, the survivors, the address and rank 0's plan.
fn recovered(size: usize, dead: &[usize], b: Bounds) -> (Coordinator, Vec<Client>, String, Plan) {
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
        step: 0,
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
            step: 0,
            how: init.clone()
        })
    );
    assert_eq!(
        theirs,
        vec![Ok(Plan {
            gen: 1,
            rank: 1,
            size: 2,
            step: 0,
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
            step: 0,
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

/// A replacement's place: generation, rank, size, and the round its grow follows.
type Seat = (u64, usize, usize, usize);

/// Rank 0 offers the grow of generation `gen` before round `after` once `joining` replacements
/// joined at once (besides `queued` already waiting): its order, the members' reading of it after
/// that round, and the new replacements with their places (gen, rank, size, after), sorted.
fn grow_all(
    c: &Coordinator,
    (gen, after): (u64, usize),
    members: &[Client],
    (joining, queued): (usize, usize),
    master: &str,
) -> (Order, Vec<Client>, Vec<Seat>) {
    let joiners: Vec<_> = (0..joining)
        .map(|_| {
            let master = master.to_string();
            std::thread::spawn(move || Client::join(&master, T).expect("joined"))
        })
        .collect();
    wait_for("the replacements wait", || {
        (c.waiting() >= joining + queued).then_some(())
    });
    let order = c.offer_grow(gen, after, T, &mut || Ok("a11".to_string()));
    let order = order.expect("rank 0 offers").expect("a grow");
    let Order::Grow {
        gen: next, size, ..
    } = order
    else {
        panic!("{order:?}")
    };
    for m in members {
        assert_eq!(m.grow_after(gen, after - 1), None, "not before its round");
        assert_eq!(
            m.grow_after(gen, after),
            Some((next, size)),
            "every member has it"
        );
    }
    let mut joined: Vec<(Client, Joined)> = joiners
        .into_iter()
        .map(|j| j.join().expect("no panic"))
        .collect();
    joined.sort_by_key(|(_, j)| j.rank);
    let places = joined
        .iter()
        .map(|(_, j)| (j.gen, j.rank, j.size, j.after))
        .collect();
    (order, joined.into_iter().map(|(c, _)| c).collect(), places)
}

#[test]
fn replacements_that_wait_join_at_once_and_more_later_in_order() {
    let (c, members, master, own) = recovered(8, &[6, 3, 1], bounds(200));
    assert_eq!(own.size, 5);
    assert_eq!(c.offer_grow(1, 7, T, &mut no_id), Ok(None), "nobody waits");
    let (order, first, places) = grow_all(&c, (1, 40), &members, (2, 0), &master);
    assert_eq!(
        order,
        Order::Grow {
            gen: 2,
            size: 7,
            after: 40
        }
    );
    assert_eq!(
        places,
        vec![(2, 5, 7, 40), (2, 6, 7, 40)],
        "after the survivors"
    );
    // One more comes later: the next grow, to the first world's size and no further.
    let members: Vec<Client> = members.into_iter().chain(first).collect();
    let (order, _, places) = grow_all(&c, (2, 90), &members, (1, 0), &master);
    assert_eq!(
        order,
        Order::Grow {
            gen: 3,
            size: 8,
            after: 90
        }
    );
    assert_eq!(places, vec![(3, 7, 8, 90)]);
    assert_eq!(c.missing(), 0);
}

/// A GPU run: 8 ranks, one dead, 7 survivors on generation 1 about to grow with a
/// replacement (generation 2); old rank 5 dies at the grow. Three members were still checking
/// generation 1 and report it, the others (and the replacement) report generation 2: all of them
/// are survivors, and the plan (an init: not all hold generation 2) takes every one.
#[test]
fn a_member_still_on_the_parent_of_a_grow_is_a_survivor() {
    let b = bounds(200);
    let (c, mut members, master, own) = recovered(8, &[2], b);
    assert_eq!(own.size, 7);
    let (_, mut joined, _) = grow_all(&c, (1, 12), &members, (1, 0), &master);
    drop(members.remove(3)); // rank 4 of generation 1 (5 of the first world)
    wait_for("rank 0 hears of it", || c.lost(2));
    for m in &members {
        let why = wait_for("every member hears of it", || m.lost(1));
        assert!(why.contains("rank 4 of generation 2 died"), "{why}");
    }
    let mut survivors = members;
    survivors.push(joined.remove(0));
    let held = [
        Held::Revoked,
        Held::Revoked,
        Held::Revoked,
        Held::Aborted,
        Held::Aborted,
        Held::Aborted,
    ];
    // Ranks 1-3 still on generation 1, the rest on 2, as in the run.
    let (own, theirs) = std::thread::scope(|s| {
        let handles: Vec<_> = survivors
            .iter()
            .zip(held)
            .enumerate()
            .map(|(i, (m, h))| {
                let gen = if i < 3 { 1 } else { 2 };
                s.spawn(move || m.recover(gen, h, b.plan))
            })
            .collect();
        let own = c.recover((2, Held::Aborted), 12, b.report, &mut || {
            Ok("cafe".to_string())
        });
        let theirs: Vec<_> = handles
            .into_iter()
            .map(|h| h.join().expect("no panic"))
            .collect();
        (own, theirs)
    });
    let init = How::Init { id: "cafe".into() };
    assert_eq!(own.map(|p| (p.gen, p.size, p.how)), Ok((3, 7, init)));
    let ranks: Vec<_> = theirs.iter().map(|p| p.as_ref().map(|p| p.rank)).collect();
    assert_eq!(
        ranks,
        (1..7).map(Ok).collect::<Vec<_>>(),
        "no live rank left out"
    );
}

/// A member's loss of a generation it is not in (a replacement's of the one before its grow), or
/// of an older one whose loss is over, is ignored: no member can lose the generation the others
/// train on with it. Its loss of the newest counts.
#[test]
fn a_loss_of_a_generation_the_member_is_not_in_is_ignored() {
    let b = bounds(200);
    let (c, members, master, _) = recovered(4, &[3], b);
    let (_, joined, _) = grow_all(&c, (1, 10), &members, (1, 0), &master);
    let say_lost = |m: &Client, gen| {
        let _ = m.recover(gen, Held::Revoked, Duration::from_millis(1));
    };
    say_lost(&joined[0], 1); // the replacement joined at generation 2
    say_lost(&members[0], 0); // generation 0's loss is over
    say_lost(&joined[0], 2);
    let why = wait_for("rank 0 hears of it", || c.lost(2));
    assert_eq!(why, "the rendezvous: rank 3 lost generation 2");
    assert_eq!(c.lost(3), None);
}

/// A first-world rank that says nothing after its hello unless the test writes for it: a frozen
/// process (its connection open, silent). Its connection, and its lines after the id.
fn raw_member(master: &str, rank: usize) -> (TcpStream, Lines) {
    let conn = TcpStream::connect(master).expect("connect");
    let mut lines = Lines::new(conn.try_clone().expect("clone"));
    let by = Instant::now() + T;
    let hello = format!("HELLO {rank}");
    auth::prove(&mut lines, &JobToken::none(), &hello, by).expect("admitted");
    let id = lines.next(LINE_CAP, Some(by)).expect("the id");
    assert_eq!(id.as_deref(), Some("ID f00d"));
    (conn, lines)
}

/// On a test clock: rank 1 beats every 250 ms of it, rank 2 is frozen from its hello on. Rank 2 is
/// not dead at 1.5 s of silence, is at 1.75 s (the silence bound, then the check after it), and the
/// others are told at once; rank 1, however slow its training, beats and is never excluded, nor is
/// a replacement that waits (it beats while it waits). The plan then leaves rank 2 out without
/// waiting for its report: the frozen rank is excluded within D + 1.75 s, where waiting for its
/// report took 3D + 1 s.
#[test]
fn a_frozen_member_is_excluded_within_its_bound_and_one_that_beats_never() {
    let clock = Arc::new(crate::clock::TestClock::default());
    let c = Coordinator::listen_with(
        "127.0.0.1:0",
        (3, 1),
        "f00d",
        JobToken::none(),
        Arc::clone(&clock) as Arc<dyn crate::clock::Clock>,
    )
    .expect("listens");
    let master = format!("127.0.0.1:{}", c.port());
    let (mut slow, mut slow_lines) = raw_member(&master, 1);
    let (_frozen, mut frozen_lines) = raw_member(&master, 2);
    c.wait_members(T).expect("every rank connects");
    let waiting = master.clone();
    std::thread::spawn(move || Client::join(&waiting, T).map(drop));
    wait_for("the replacement waits", || (c.waiting() == 1).then_some(()));
    let beat = crate::protocol::BEAT_CHECK;
    for tick in 1..=12u32 {
        let now = beat * tick;
        clock.set(now);
        writeln!(slow, "BEAT").expect("beat");
        // Rank 1's beat and the replacement's own, heard at `now`.
        let beaten = || c.heard_all().iter().filter(|&&t| t == now).count() == 2;
        wait_for("rank 0 hears the beats", || beaten().then_some(()));
        c.check_beats();
        match now > SILENCE {
            false => assert_eq!(c.lost(0), None, "at {now:?}"),
            true => assert_eq!(
                c.lost(0).as_deref(),
                Some("the rendezvous: rank 2 of generation 0 said nothing for 1.5s (frozen, or cut off)"),
                "at {now:?}"
            ),
        }
    }
    let by = Some(Instant::now() + T);
    let told = frozen_lines.next(LINE_CAP, by).expect("a line");
    assert!(
        told.is_some_and(|l| l.starts_with("EXCLUDED rank 2") && l.ends_with("treated as dead"))
    );
    let news = slow_lines.next(LINE_CAP, by).expect("a line");
    assert!(news.is_some_and(|l| l.starts_with("RECOVER 0 rank 2")));
    assert_eq!(c.waiting(), 1, "the replacement still waits");
    writeln!(slow, "LOST 0 revoked").expect("report");
    let b = bounds(100_000); // a report bound no test would wait out
    let start = Instant::now();
    let own = c.recover((0, Held::Revoked), 7, b.report, &mut no_id);
    assert!(
        start.elapsed() < b.report,
        "waited for the frozen rank's report"
    );
    let shrink = How::Shrink { exclude: vec![2] };
    assert_eq!(own.map(|p| (p.size, p.how)), Ok((2, shrink)));
    let plan = slow_lines.next(LINE_CAP, by).expect("a line");
    assert_eq!(plan.as_deref(), Some("SHRINK 1 1 2 7 2"));
    let d = Duration::from_secs(5);
    assert!(Bounds::new(d).frozen <= d + Duration::from_secs(2));
}

#[test]
fn below_the_minimum_every_rank_ends_with_the_reason() {
    let c = Coordinator::listen("127.0.0.1:0", 4, 3, "f00d").expect("listens");
    let master = format!("127.0.0.1:{}", c.port());
    let mut members: Vec<Client> = (1..4)
        .map(|rank| Client::hello(&master, rank, T).expect("hello").0)
        .collect();
    c.wait_members(T).expect("every rank connects");
    drop(members.remove(2));
    drop(members.remove(0));
    let b = bounds(200);
    let (own, theirs) = recover_all(
        &c,
        (0, Held::Revoked),
        &members,
        &[Held::Revoked],
        b,
        &mut no_id,
    );
    let own = own.expect_err("below the minimum");
    assert!(
        own.contains("2 live rank(s), fewer than --min-size 3") && own.contains("ranks 1,3"),
        "{own}"
    );
    let theirs = theirs[0].clone().expect_err("told");
    assert!(
        theirs.contains("rank 0 ended the job") && theirs.contains(&own),
        "{theirs}"
    );
}

#[test]
fn a_failed_grow_id_loses_the_generation_for_all() {
    let (c, members, master, _) = recovered(3, &[2], bounds(200));
    let _joiner = std::thread::spawn(move || Client::join(&master, Duration::from_millis(500)));
    wait_for("the replacement waits", || (c.waiting() > 0).then_some(()));
    let mut failed = || Err("ncclCommGetUniqueId failed: NCCL error 3".to_string());
    let order = c.offer_grow(1, 5, T, &mut failed);
    assert_eq!(
        order,
        Ok(Some(Order::NoGrowId {
            gen: 1,
            why: "ncclCommGetUniqueId failed: NCCL error 3".into()
        }))
    );
    let why = wait_for("the member is told", || members[0].lost(1));
    assert!(
        why.contains("rank 0 could not make the grow id: ncclCommGetUniqueId failed"),
        "{why}"
    );
    assert_eq!(members[0].grow_after(1, 5), None, "no grow");
}

#[test]
fn the_top_rank_dying_under_a_blocked_grow_id_is_a_recovery_and_the_replacement_waits() {
    let b = bounds(200);
    let (c, mut members, master, own) = recovered(4, &[1], b);
    assert_eq!(own.size, 3, "ranks 0, 2, 3 become 0, 1, 2");
    let mut top = members.pop(); // rank 2 of generation 1, the parent's last rank
                                 // A replacement joins; rank 0 makes the grow id, and the top rank dies just after rank 0 last
                                 // looked: NCCL's send to it is refused and retried, a call that does not return (here, a
                                 // gate never opened while rank 0 waits).
    let (_open, gate) = mpsc::channel::<()>();
    let mut gate = Some(gate);
    let first = master.clone();
    let joiner = std::thread::spawn(move || Client::join(&first, T));
    wait_for("the replacement waits", || (c.waiting() > 0).then_some(()));
    let mut grow_id = || {
        drop(top.take());
        let gate = gate.take();
        let call = move || {
            let _ = gate.map(|g| g.recv());
        };
        bounded::call("ncclCommGetUniqueId", T, &|| c.lost(1), call, |()| ())
            .map(|()| "a11".to_string())
            .map_err(|e| e.to_string())
    };
    let start = Instant::now();
    let order = c.offer_grow(1, 9, T, &mut grow_id);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "given up on the news, not at the bound: {:?}",
        start.elapsed()
    );
    let Ok(Some(Order::NoGrowId { gen: 1, why })) = &order else {
        panic!("{order:?}")
    };
    assert!(
        why.starts_with("ncclCommGetUniqueId: given up while it ran: the rendezvous: rank 2 of generation 1 died"),
        "{why}"
    );
    // Rank 0 no longer holds generation 1: a new id for the survivors, the replacement still queued.
    let (own, theirs) = reinit(&c, &members, &[Held::Revoked], b);
    let init = How::Init { id: "cafe".into() };
    assert_eq!(own.map(|p| (p.gen, p.size, p.how)), Ok((2, 2, init)));
    assert_eq!(theirs[0].as_ref().map(|p| p.rank), Ok(1));
    let (order, _, places) = grow_all(&c, (2, 20), &members, (1, 1), &master);
    assert_eq!(
        order,
        Order::Grow {
            gen: 3,
            size: 4,
            after: 20
        }
    );
    let first = joiner.join().expect("no panic").map(|(_, j)| j.rank);
    assert_eq!(first, Ok(2), "the first replacement waited for this grow");
    assert_eq!(places, vec![(3, 3, 4, 20)]);
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

/// A rank that finished the last round before a loss reached it will not report: the agreement
/// does not wait for it, and it is dead to the next generation.
#[test]
fn a_rank_that_finished_is_not_waited_for() {
    let (c, mut members, _) = world(4);
    members[0].finish().expect("DONE");
    drop(members.remove(2)); // rank 3 dies
    wait_for("rank 0 hears of it", || c.lost(0));
    let b = bounds(1000); // report bound: 3 s
    let start = Instant::now();
    let (own, theirs) = recover_all(
        &c,
        (0, Held::Revoked),
        &members[1..],
        &[Held::Revoked],
        b,
        &mut no_id,
    );
    assert!(start.elapsed() < b.report, "{:?}", start.elapsed());
    let shrink = How::Shrink {
        exclude: vec![1, 3],
    };
    assert_eq!(own.map(|p| (p.size, p.how)), Ok((2, shrink)));
    assert_eq!(theirs[0].as_ref().map(|p| p.rank), Ok(1));
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
