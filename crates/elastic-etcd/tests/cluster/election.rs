//! The coordinating role: taken over within the bound when its holder dies, in the steady state and
//! during a takeover; a deposed coordinator's writes refused; names of live members taken.

use crate::fake::{assert_one_coordinator_per_generation, last_world, Event, Job, POLL};
use crate::support;
use metrale_gpu_elastic_etcd::{Bounds, Campaign, Error, Member};
use std::time::{Duration, Instant};

/// When `name` died.
fn death_of(events: &[Event], name: &str) -> Instant {
    events
        .iter()
        .find_map(|e| match e {
            Event::Died { name: n, at } if n == name => Some(*at),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{name} died: {events:?}"))
}

/// The first term taken after `after` by someone other than `old`: who and when.
fn takeover(events: &[Event], old: &str, after: Instant) -> Option<(String, Instant)> {
    events.iter().find_map(|e| match e {
        Event::Took { by, at, .. } if by != old && *at >= after => Some((by.clone(), *at)),
        _ => None,
    })
}

#[test]
fn a_dead_coordinators_role_is_taken_within_the_takeover_bound() {
    let Some((config, _cluster)) = support::shared() else {
        return;
    };
    let bounds = Bounds::of(&config);
    let job = Job::steady(&config, "takeover", 4);
    let old = job.first_coordinator();
    job.kill(&old);
    let rest: Vec<String> = ["r0", "r1", "r2", "r3"]
        .iter()
        .filter(|r| **r != old)
        .map(|r| r.to_string())
        .collect();
    let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
    // The new coordinator makes a generation of the three survivors. Waiting bound: the takeover's, one
    // look of a rank for its kill flag, one view and one creation by the new coordinator.
    let bound = bounds.takeover + POLL + 2 * bounds.call;
    assert!(
        job.wait_world(&rest, bound),
        "no generation of {rest:?} within {bound:?}: {:?}",
        job.events()
    );
    let events = job.events();
    let died = death_of(&events, &old);
    let (new, took) = takeover(&events, &old, died).expect("a takeover");
    assert!(rest.contains(&new.as_str()));
    // Measured from the death (after the dead rank's last renewal, which the bound counts from), plus the
    // view each rank reads before it campaigns.
    let waited = took - died;
    assert!(
        waited <= bounds.takeover + bounds.call,
        "{new} took the role {waited:?} after {old} died: over {:?}",
        bounds.takeover
    );
    assert_one_coordinator_per_generation(&events);
    job.finish_well();
}

#[test]
fn a_second_death_during_the_takeover_is_survived() {
    let Some((config, _cluster)) = support::shared() else {
        return;
    };
    let bounds = Bounds::of(&config);
    let job = Job::steady(&config, "second-death", 4);
    let old = job.first_coordinator();
    // The rank that takes the role over dies the moment it has it, before it writes anything: a third
    // rank takes it from the second.
    job.die_on_taking(1);
    job.kill(&old);
    let died_twice = |events: &[Event]| {
        events
            .iter()
            .filter(|e| matches!(e, Event::Died { .. }))
            .count()
            == 2
    };
    let bound = 2 * (bounds.takeover + bounds.call) + POLL;
    assert!(
        job.wait_for(bound, died_twice),
        "no second death within {bound:?}: {:?}",
        job.events()
    );
    let events = job.events();
    let dead: Vec<String> = events
        .iter()
        .filter_map(|e| match e {
            Event::Died { name, .. } => Some(name.clone()),
            _ => None,
        })
        .collect();
    let rest: Vec<String> = ["r0", "r1", "r2", "r3"]
        .iter()
        .map(|r| r.to_string())
        .filter(|r| !dead.contains(r))
        .collect();
    let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
    assert_eq!(rest.len(), 2, "{events:?}");
    assert!(
        job.wait_world(&rest, bound),
        "no generation of {rest:?} within {bound:?}: {:?}",
        job.events()
    );
    let events = job.events();
    // The second takeover, counted from the second death: within the bound too.
    let second = death_of(&events, &dead[1]);
    let (third, took) = takeover(&events, &dead[1], second).expect("a third coordinator");
    assert!(
        rest.contains(&third.as_str()),
        "{third} is not a survivor: {events:?}"
    );
    let waited = took - second;
    assert!(
        waited <= bounds.takeover + bounds.call,
        "{third} took the role {waited:?} after {} died",
        dead[1]
    );
    assert_eq!(last_world(&events).expect("a world"), rest);
    assert_one_coordinator_per_generation(&events);
    // The dying coordinator wrote nothing: every generation's maker lived past making it.
    for e in &events {
        if let Event::Made { gen, by, .. } = e {
            assert!(
                *gen == 1 || *by != dead[1],
                "{by} made generation {gen} though it died on taking the role"
            );
        }
    }
    job.finish_well();
}

#[test]
fn a_deposed_coordinators_writes_are_refused() {
    let Some((config, _cluster)) = support::shared() else {
        return;
    };
    let token = support::token("deposed");
    let a = Member::join(&config, &token, "a", b"").expect("a joins");
    let b = Member::join(&config, &token, "b", b"").expect("b joins");
    let Campaign::Won(term_a) = a.campaign().expect("a campaigns") else {
        panic!("a, alone, takes the role")
    };
    assert!(a
        .create_state(&term_a, "gen/1", b"by=a")
        .expect("a writes as coordinator"));
    let Campaign::Held(holder) = b.campaign().expect("b campaigns") else {
        panic!("a holds the role")
    };
    assert_eq!((holder.name.as_str(), holder.since), ("a", term_a.since()));

    // a's lease revoked (as when it froze past its TTL): the role is free, and a cannot write.
    support::revoke(&config, a.lease_id());
    match a.put_state(&term_a, "gen/2", b"by=a") {
        Err(Error::Deposed { holder: None, .. }) | Err(Error::LeaseExpired { .. }) => {}
        other => panic!("a deposed coordinator's write went through: {other:?}"),
    }
    let Campaign::Won(term_b) = b.campaign().expect("b campaigns") else {
        panic!("the role is free")
    };
    assert!(term_b.since() > term_a.since());
    // a, thawed, still holds its old term: each of its writes is refused; b's go through.
    for write in [
        a.put_state(&term_a, "gen/2", b"by=a"),
        a.create_state(&term_a, "gen/2", b"by=a").map(|_| 0),
    ] {
        assert!(
            matches!(
                write,
                Err(Error::Deposed { .. }) | Err(Error::LeaseExpired { .. })
            ),
            "{write:?}"
        );
    }
    assert!(b
        .create_state(&term_b, "gen/2", b"by=b")
        .expect("b writes as coordinator"));
    assert!(
        !b.create_state(&term_b, "gen/2", b"by=b again")
            .expect("b writes as coordinator"),
        "gen/2 is made once"
    );
    let view = b.view().expect("a view");
    assert_eq!(
        view.state.get("gen/2").map(Vec::as_slice),
        Some(&b"by=b"[..])
    );
    assert_eq!(view.coordinator.map(|h| h.name), Some("b".into()));
    assert!(
        !view.members.contains_key("a"),
        "a's lease is gone, and its key with it"
    );
    // a itself learns that it is out, with the final error, at its next renewal.
    let bounds = Bounds::of(&config);
    let revoked = Instant::now();
    while a.alive().is_ok() {
        assert!(
            revoked.elapsed() <= bounds.renewal + bounds.call,
            "a still counts itself alive"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        matches!(a.alive(), Err(Error::LeaseExpired { .. })),
        "{:?}",
        a.alive()
    );
    b.end_job(term_b).expect("b ends the job");
    let view = b.view().expect("a view");
    assert!(
        view.state.is_empty() && view.coordinator.is_none(),
        "{view:?}"
    );
    b.leave().expect("b leaves");
}

#[test]
fn a_live_members_name_is_taken_and_a_departed_ones_is_free() {
    let Some((config, _cluster)) = support::shared() else {
        return;
    };
    let token = support::token("names");
    let first = Member::join(&config, &token, "r0", b"host-a").expect("r0 joins");
    match Member::join(&config, &token, "r0", b"host-b") {
        Err(Error::NameTaken { name }) => assert_eq!(name, "r0"),
        other => panic!(
            "a second live r0 was admitted: {:?}",
            other.map(|m| m.name().to_string())
        ),
    }
    first.leave().expect("r0 leaves");
    let second =
        Member::join(&config, &token, "r0", b"host-b").expect("r0's name is free once it left");
    let view = second.view().expect("a view");
    assert_eq!(
        view.members.get("r0").map(Vec::as_slice),
        Some(&b"host-b"[..])
    );
    second.leave().expect("r0 leaves");
}

#[test]
fn a_dead_members_keys_vanish_within_the_death_bound() {
    let Some((config, _cluster)) = support::shared() else {
        return;
    };
    let bounds = Bounds::of(&config);
    let token = support::token("death");
    let watcher = Member::join(&config, &token, "watcher", b"").expect("the watcher joins");
    let doomed = Member::join(&config, &token, "doomed", b"").expect("doomed joins");
    doomed.report("lost", b"gen=1").expect("a report");
    let view = watcher.view().expect("a view");
    assert!(
        view.members.contains_key("doomed") && view.reports["lost"].contains_key("doomed"),
        "{view:?}"
    );
    // Dropped without leaving: its renewals stop, as a killed process's do.
    drop(doomed);
    let died = Instant::now();
    let mut view = view;
    while view.members.contains_key("doomed") {
        let left = (bounds.death + bounds.call).saturating_sub(died.elapsed());
        assert!(
            !left.is_zero(),
            "doomed is still a member {:?} after its death",
            died.elapsed()
        );
        watcher.wait_change(view.revision, left).expect("a wait");
        view = watcher.view().expect("a view");
    }
    assert!(
        !view.reports.contains_key("lost"),
        "its report vanished with it: {view:?}"
    );
    watcher.leave().expect("the watcher leaves");
}
