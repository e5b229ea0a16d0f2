//! Two jobs on one etcd: different tokens, different prefixes, nothing shared, and no token written.

use crate::support;
use metrale_gpu_elastic_etcd::{Campaign, Error, Member};

#[test]
fn two_jobs_never_see_each_others_keys() {
    let Some((config, _cluster)) = support::shared() else {
        return;
    };
    let (token_x, token_y) = (support::token("job-x"), support::token("job-y"));
    // The same member names in both jobs: each job has its own.
    let x = Member::join(&config, &token_x, "r0", b"x's r0").expect("x's r0 joins");
    let y = Member::join(&config, &token_y, "r0", b"y's r0").expect("y's r0 joins (another job)");
    let y1 = Member::join(&config, &token_y, "r1", b"y's r1").expect("y's r1 joins");
    // Each job elects its own coordinator.
    let Campaign::Won(term_x) = x.campaign().expect("x campaigns") else {
        panic!("x's job has no coordinator")
    };
    let Campaign::Won(term_y) = y.campaign().expect("y campaigns") else {
        panic!("y's job has no coordinator")
    };
    x.put_state(&term_x, "gen/1", b"x's generation")
        .expect("x writes");
    y.put_state(&term_y, "gen/1", b"y's generation")
        .expect("y writes");
    x.report("lost", b"x").expect("x reports");

    let (vx, vy) = (x.view().expect("x's view"), y1.view().expect("y's view"));
    assert_eq!(vx.members.keys().collect::<Vec<_>>(), ["r0"]);
    assert_eq!(vx.members["r0"], b"x's r0");
    assert_eq!(vy.members.keys().collect::<Vec<_>>(), ["r0", "r1"]);
    assert_eq!(vy.members["r0"], b"y's r0");
    assert_eq!(vx.state["gen/1"], b"x's generation");
    assert_eq!(vy.state["gen/1"], b"y's generation");
    assert!(vy.reports.is_empty(), "{vy:?}");
    // One job's term does not hold in the other's (revisions are etcd-wide: the terms differ).
    assert!(matches!(
        x.put_state(&term_y, "gen/2", b""),
        Err(Error::Deposed { .. })
    ));

    // In etcd: every key of the two jobs is under its own prefix, and no token is anywhere.
    let (px, py) = (
        x.prefix().as_str().as_bytes().to_vec(),
        y.prefix().as_str().as_bytes().to_vec(),
    );
    assert_ne!(px, py);
    let keys = support::all_job_keys(&config);
    let ours: Vec<_> = keys
        .iter()
        .filter(|(k, _)| k.starts_with(&px) || k.starts_with(&py))
        .collect();
    let count = |p: &[u8]| ours.iter().filter(|(k, _)| k.starts_with(p)).count();
    // x: r0, the coordinator, gen/1, r0's report; y: r0, r1, the coordinator, gen/1.
    assert_eq!((count(&px), count(&py)), (4, 4), "{ours:?}");
    for (k, v) in &keys {
        for token in [&token_x, &token_y] {
            let found = |hay: &[u8]| hay.windows(token.len()).any(|w| w == token.as_slice());
            assert!(
                !found(k) && !found(v),
                "a token is written in etcd at {}",
                String::from_utf8_lossy(k)
            );
        }
    }
    for m in [x, y, y1] {
        m.leave().expect("a member leaves");
    }
}
