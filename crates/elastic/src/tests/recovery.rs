//! Whole lives of fake ranks (`fake.rs`): the real training, agreement and grows, on threads, a
//! second death at each phase of a recovery; each test asserts that every rank not killed ends
//! in the final world, and its size.

use std::time::Duration;

use crate::fake::{run, Kill, Script};
use crate::recovery::MAX_ROUNDS;

/// 8 ranks; rank 3 killed in the steady loop, then `second`; replacements as asked for: the
/// world ends at 8, every live rank in it.
fn second_death(second: Kill) {
    let first = Kill::on_rank0("rank 3", "steady");
    let end = run(Script::new(8, vec![first, second]));
    assert_eq!(end.deaths(), 2);
    end.assert_world(8);
}

#[test]
fn a_second_death_during_the_agreement() {
    second_death(Kill::on_own("rank 6", "detect", 0));
}

#[test]
fn a_second_death_during_the_shrink() {
    second_death(Kill::on_own("rank 6", "plan", 1));
}

#[test]
fn a_second_death_during_the_checks_after_the_shrink() {
    second_death(Kill::on_own("rank 6", "plan", 2));
}

#[test]
fn a_second_death_while_training_below_full_size() {
    second_death(Kill::on_rank0("rank 6", "waiting"));
}

#[test]
fn a_second_death_while_rank_0_makes_the_grow_id() {
    second_death(Kill::on_rank0("rank 6", "growid"));
}

#[test]
fn a_second_death_during_the_grow() {
    second_death(Kill::on_rank0("rank 6", "growing"));
}

#[test]
fn a_second_death_during_the_checks_after_the_grow() {
    second_death(Kill::on_own("rank 6", "growing", 2));
}

#[test]
fn a_replacement_killed_during_its_grow() {
    second_death(Kill::on_rank0("replacement 1", "growing"));
}

#[test]
fn sixteen_ranks_four_deaths_in_three_phases() {
    let kills = vec![
        Kill::on_rank0("rank 5", "steady"),
        Kill::on_rank0("rank 11", "steady"),
        Kill::on_own("rank 2", "detect", 0),
        Kill::on_rank0("rank 14", "growing"),
    ];
    let end = run(Script::new(16, kills));
    assert_eq!(end.deaths(), 4);
    end.assert_world(16);
}

/// No replacement ever comes: training goes on at the smaller size to the last round.
#[test]
fn without_replacements_the_survivors_train_to_the_end() {
    let kills = vec![
        Kill::on_rank0("rank 2", "steady"),
        Kill::on_rank0("rank 7", "steady"),
    ];
    let end = run(Script {
        replacements: 0,
        ..Script::new(8, kills)
    });
    end.assert_world(6);
}

/// Of three missing ranks one replacement comes, late: the world trains at 5 meanwhile, grows to 6
/// when it comes and ends there.
#[test]
fn a_late_replacement_grows_the_world_that_kept_training() {
    let kills = vec![
        Kill::on_rank0("rank 1", "steady"),
        Kill::on_rank0("rank 4", "steady"),
        Kill::on_rank0("rank 6", "steady"),
    ];
    let end = run(Script {
        replacements: 1,
        late: Duration::from_millis(300),
        ..Script::new(8, kills)
    });
    end.assert_world(6);
    let rank0: Vec<&str> = end
        .log
        .iter()
        .filter(|(who, _)| who == "rank 0")
        .map(|(_, line)| line.as_str())
        .collect();
    let at = |phase: &str| rank0.iter().position(|l| l.contains(phase));
    assert!(
        at("phase=shrink").is_some() && at("phase=shrink") < at("phase=growing"),
        "resumed before the replacement came: {rank0:#?}"
    );
}

/// Ten deaths, one after another, each once the world recovered from the last (rank 0's shrink
/// line, after the new communicator's checks): ten recoveries of one round each, which the old
/// count (never reset) ended at the ninth. The survivors finish at 2.
#[test]
fn the_round_limit_counts_per_recovery() {
    let mut kills = vec![Kill::on_rank0("rank 11", "steady")];
    kills.extend((1..10).map(|gen| {
        let size = 12 - gen;
        let victim = format!("rank {}", 11 - gen);
        Kill::on_rank0(&victim, &format!("shrink rank=0 size={size} gen={gen} "))
    }));
    let end = run(Script {
        replacements: 0,
        ..Script::new(12, kills)
    });
    assert_eq!(end.deaths(), 10);
    end.assert_world(2);
}

/// One recovery whose every round loses its new generation (a death at each of rank 0's plans):
/// after MAX_ROUNDS rounds every live rank gives up, saying so.
#[test]
fn more_rounds_than_the_limit_in_one_recovery_end_every_rank() {
    let mut kills = vec![Kill::on_rank0("rank 11", "steady")];
    kills.extend((1..=MAX_ROUNDS as u64).map(|gen| {
        let victim = format!("rank {}", 11 - gen);
        Kill::on_rank0(&victim, &format!("plan rank=0 gen={gen} "))
    }));
    let end = run(Script {
        replacements: 0,
        ..Script::new(12, kills)
    });
    let live = end.live();
    assert_eq!(live.len(), 12 - 1 - MAX_ROUNDS);
    for (name, result) in live {
        let err = result.as_ref().expect_err("given up");
        assert!(err.contains("8 rounds of one recovery"), "{name}: {err}");
    }
}

#[test]
fn below_the_minimum_every_live_rank_ends_with_the_reason() {
    let kills = vec![
        Kill::on_rank0("rank 2", "steady"),
        Kill::on_rank0("rank 5", "steady"),
    ];
    let end = run(Script {
        min_size: 7,
        ..Script::new(8, kills)
    });
    let live = end.live();
    assert_eq!(live.len(), 6);
    for (name, result) in live {
        let err = result.as_ref().expect_err("the job ended");
        assert!(err.contains("fewer than --min-size 7"), "{name}: {err}");
    }
}
