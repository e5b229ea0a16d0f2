//! Whole lives of fake ranks (`fake.rs`) with their membership in a real etcd cluster:
//! `ci/etcd-cluster -- cargo test -p metrale-gpu-elastic --features etcd`. The coordinator is killed
//! in the steady state and at each phase of a recovery and of a grow: the agreement (`detect`), the
//! making of the next communicator (`plan`, one call on), its checks (`plan`, two calls on), the grow
//! id (`growid`) and the grow (`growing`); a second death during the takeover kills the rank that took
//! the role, or another rank. Each test asserts how many died, who took the role, that every rank not
//! killed ends in the final world of the size the rules say, and that no two ranks made one
//! generation. Without a cluster (`METRALE_ETCD_ENDPOINTS` unset) each prints `SKIP <test>: <why>`
//! and passes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use metrale_gpu_testkit::etcd_cluster::Stopped;

use crate::etcd::tests::{exclusive, shared};
use crate::etcd::{Store, ENDPOINTS_VAR};
use crate::fake::{run, Ending, Kill, Script, COORDINATOR, NEXT_COORDINATOR};
use crate::lines;

#[test]
fn the_etcd_membership_is_chosen_by_its_endpoints_and_needs_a_job_token() {
    let vars = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            let found = pairs.iter().find(|(n, _)| *n == name);
            found.map(|(_, v)| v.to_string())
        }
    };
    assert_eq!(Store::from_vars(&vars(&[])), Ok(None), "the embedded one");
    let no_token = Store::from_vars(&vars(&[(ENDPOINTS_VAR, "http://127.0.0.1:2379")]));
    let err = no_token.expect_err("no token");
    assert!(err.contains("METRALE_JOB_TOKEN"), "{err}");
    const SET: &[(&str, &str)] = &[
        (ENDPOINTS_VAR, "http://127.0.0.1:2379"),
        ("METRALE_JOB_TOKEN", "t0k3n"),
    ];
    let store = Store::from_vars(&vars(SET))
        .expect("valid")
        .expect("chosen");
    assert_eq!(
        store.etcd.endpoints,
        vec!["http://127.0.0.1:2379".to_string()]
    );
    assert_eq!(store.token.key(), b"t0k3n");
}

/// `world` ranks in etcd with `kills`, replacements as the coordinator asks for them.
fn script(store: Store, world: usize, kills: Vec<Kill>) -> Script {
    Script {
        iters: 3000,
        etcd: Some(store),
        ..Script::new(world, kills)
    }
}

/// Who made each generation (and in which term), from the coordinators' lines: one each, or the test
/// fails. The coordinators, in the order they took the role.
fn one_coordinator_per_generation(end: &Ending) -> Vec<String> {
    let mut made: BTreeMap<usize, Vec<(String, usize)>> = BTreeMap::new();
    let mut took = Vec::new();
    for (who, line) in &end.log {
        if line.contains("phase=coordinate ") {
            let gen = lines::number(line, "gen").expect("a generation");
            let term = lines::number(line, "term").expect("a term");
            made.entry(gen).or_default().push((who.clone(), term));
        }
        if line.contains("phase=coordinator ") {
            took.push(who.clone());
        }
    }
    for (gen, by) in &made {
        assert_eq!(by.len(), 1, "generation {gen} made by {by:?}\n{end}");
    }
    assert!(made.contains_key(&0), "generation 0 made\n{end}");
    took
}

/// `world` ranks with `kills`, each the death of one rank, the first coordinator's among them: as many
/// die, no two ranks make one generation, another rank takes the role, and every live rank ends in a
/// world of `world` again (replacements grow it back). The coordinators, in the order they took the
/// role, and the run.
fn coordinator_dies(store: Store, world: usize, kills: Vec<Kill>) -> (Vec<String>, Ending) {
    let deaths = kills.len();
    let end = run(script(store, world, kills));
    assert_eq!(end.deaths(), deaths, "deaths\n{end}");
    let took = one_coordinator_per_generation(&end);
    assert!(
        took.len() >= 2,
        "another rank took the role: {took:?}\n{end}"
    );
    assert!(
        end.killed(&took[0]),
        "the first coordinator died: {took:?}\n{end}"
    );
    end.assert_world(world);
    (took, end)
}

#[test]
fn the_coordinator_killed_in_the_steady_state_the_job_goes_on_at_full_size() {
    let Some((store, _cluster)) = shared() else {
        return;
    };
    coordinator_dies(store, 4, vec![Kill::on_own(COORDINATOR, "steady", 0)]);
}

#[test]
fn the_coordinator_killed_during_the_agreement_a_new_one_ends_the_recovery() {
    let Some((store, _cluster)) = shared() else {
        return;
    };
    let kills = vec![
        Kill::on_rank0("rank 3", "steady"),
        // The coordinator dies once it gave up on the lost generation, before any plan.
        Kill::on_own(COORDINATOR, "detect", 0),
    ];
    coordinator_dies(store, 6, kills);
}

/// Rank 3 dies once rank 0 (the first coordinator) trains; rank 0 dies at its `calls`-th call after
/// its recovery's plan (1: as it makes the next communicator, 2: in its first check). A new
/// coordinator ends the recovery, and the replacements bring the world back to 4.
fn coordinator_killed_after_its_plan(store: Store, calls: usize) {
    let kills = vec![
        Kill::on_rank0("rank 3", "steady"),
        Kill::on_own(COORDINATOR, "plan", calls),
    ];
    let (took, end) = coordinator_dies(store, 4, kills);
    assert_eq!(took[0], "rank 0", "{took:?}\n{end}");
    assert!(end.killed("rank 3"), "rank 3 killed\n{end}");
}

#[test]
fn the_coordinator_killed_as_the_survivors_make_the_next_communicator_a_new_one_remakes_it() {
    let Some((store, _cluster)) = shared() else {
        return;
    };
    coordinator_killed_after_its_plan(store, 1);
}

#[test]
fn the_coordinator_killed_during_the_new_communicators_checks_a_new_one_recovers() {
    let Some((store, _cluster)) = shared() else {
        return;
    };
    coordinator_killed_after_its_plan(store, 2);
}

#[test]
fn the_coordinator_killed_as_it_makes_the_grow_id_a_new_one_grows_the_world() {
    let Some((store, _cluster)) = shared() else {
        return;
    };
    let kills = vec![
        Kill::on_rank0("rank 3", "steady"),
        // The coordinator chose to grow (a replacement waits); it dies at its `ncclCommGetUniqueId`.
        Kill::on_own(COORDINATOR, "growid", 1),
    ];
    coordinator_dies(store, 4, kills);
}

/// The coordinator dies in the steady state, and the rank that takes the role from it dies as soon as
/// it holds it: a third rank takes it and ends the recovery.
#[test]
fn the_rank_that_took_the_role_killed_at_once_a_third_one_ends_the_recovery() {
    let Some((store, _cluster)) = shared() else {
        return;
    };
    let kills = vec![
        Kill::on_own(COORDINATOR, "steady", 0),
        Kill::on_own(NEXT_COORDINATOR, "coordinator", 0),
    ];
    let (took, end) = coordinator_dies(store, 4, kills);
    assert!(
        took.len() >= 3,
        "a third rank took the role: {took:?}\n{end}"
    );
    assert!(
        end.killed(&took[1]),
        "the second coordinator died: {took:?}\n{end}"
    );
    assert!(!end.killed(&took[2]), "the third lives: {took:?}\n{end}");
}

/// The coordinator dies in the steady state, and rank 2 within a poll of it, while the dead
/// coordinator's lease still holds the role: rank 2 never takes it, and the new coordinator's plan
/// leaves both out.
#[test]
fn another_rank_killed_during_the_takeover_the_new_coordinator_leaves_both_out() {
    let Some((store, _cluster)) = shared() else {
        return;
    };
    let kills = vec![
        Kill::on_own(COORDINATOR, "steady", 0),
        Kill::on_rank0("rank 2", "steady"),
    ];
    let (took, end) = coordinator_dies(store, 4, kills);
    assert_eq!(took[0], "rank 0", "{took:?}\n{end}");
    assert!(end.killed("rank 2"), "rank 2 killed\n{end}");
    assert!(
        !took.iter().any(|n| n == "rank 2"),
        "rank 2 died before it could take the role: {took:?}\n{end}"
    );
}

#[test]
fn without_replacements_the_survivors_of_the_coordinators_death_train_to_the_end() {
    let Some((store, _cluster)) = shared() else {
        return;
    };
    let kill = Kill::on_own(COORDINATOR, "steady", 0);
    let end = run(Script {
        replacements: 0,
        ..script(store, 4, vec![kill])
    });
    one_coordinator_per_generation(&end);
    end.assert_world(3);
}

#[test]
fn the_coordinator_killed_while_the_world_grows_a_new_one_recovers_and_grows_it_again() {
    let Some((store, _cluster)) = shared() else {
        return;
    };
    let kills = vec![
        Kill::on_rank0("rank 3", "steady"),
        // The coordinator made the grow id and announced the grow; it dies as the grow begins.
        Kill::on_own(COORDINATOR, "growing", 0),
    ];
    let (_, end) = coordinator_dies(store, 4, kills);
    let grows = end
        .log
        .iter()
        .filter(|(_, l)| l.contains("phase=coordinate ") && l.contains("how=grow"))
        .count();
    assert!(grows >= 2, "a grow before the death and one after\n{end}");
}

/// Two of etcd's three members stopped once the ranks train: no generation is made after, and every
/// rank ends with the error that names the loss of quorum and its fix.
#[test]
fn the_quorum_lost_every_rank_ends_with_the_error_that_says_so() {
    let Some((store, _cluster)) = exclusive() else {
        return;
    };
    let stopped = Arc::new(Mutex::new(Stopped::default()));
    let stopping = Arc::clone(&stopped);
    let stop = move || {
        let mut s = stopping.lock().unwrap_or_else(PoisonError::into_inner);
        s.stop(0);
        s.stop(1);
    };
    let end = run(Script {
        iters: 100_000,
        replacements: 0,
        at_line: Some(("phase=steady", Box::new(stop))),
        ..script(store, 3, vec![])
    });
    let live = end.live();
    assert_eq!(live.len(), 3, "no rank killed\n{end}");
    for (name, result) in live {
        let Err(err) = result else {
            panic!("{name} ended well: the job cannot go on\n{end}");
        };
        assert!(err.contains("lost its quorum"), "{name}: {err}\n{end}");
    }
    let at = end.log.iter().position(|(who, _)| who == "test");
    let after = &end.log[at.expect("the members were stopped")..];
    assert!(
        !after.iter().any(|(_, l)| l.contains("phase=coordinate ")),
        "a generation made without a quorum\n{end}"
    );
    drop(stopped);
}

/// One of etcd's three members stopped once the ranks train: nothing changes for the job. No rank is
/// counted dead, no generation is made but the first, and every rank ends well in the first world.
#[test]
fn one_etcd_member_stopped_changes_nothing_for_the_job() {
    let Some((store, _cluster)) = exclusive() else {
        return;
    };
    let stopped = Arc::new(Mutex::new(Stopped::default()));
    let stopping = Arc::clone(&stopped);
    let stop = move || {
        let mut s = stopping.lock().unwrap_or_else(PoisonError::into_inner);
        s.stop(1);
    };
    let end = run(Script {
        iters: 8000,
        at_line: Some(("phase=steady", Box::new(stop))),
        ..script(store, 4, vec![])
    });
    assert!(
        end.log.iter().any(|(who, _)| who == "test"),
        "the member was stopped while the ranks trained\n{end}"
    );
    assert!(
        !end.log.iter().any(|(_, l)| l.contains("phase=detect")),
        "a loss\n{end}"
    );
    end.assert_world(4);
    drop(stopped);
}
