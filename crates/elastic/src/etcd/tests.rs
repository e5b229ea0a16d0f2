//! The etcd membership's answers to calls whose outcome it cannot know (a write that got no answer may
//! have landed): against the cluster of `ci/etcd-cluster`, each step pinned by the test. Without a
//! cluster each prints its skip line.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use metrale_gpu_elastic_etcd::Campaign;

use super::state::{Job, Role};
use super::Etcd;
use crate::fabric::Sink;
use crate::tests::etcd::shared;

/// How long a step of these tests may take: far past a few calls and watches.
const STEP: Duration = Duration::from_secs(20);

/// A sink that keeps the lines said.
fn sink() -> (Sink, Arc<Mutex<Vec<String>>>) {
    let said = Arc::new(Mutex::new(Vec::new()));
    let keep = Arc::clone(&said);
    let sink: Sink = Arc::new(move |line| {
        keep.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(line)
    });
    (sink, said)
}

/// `who`'s view of the job once `done` holds of it, or a failure after [`STEP`].
fn until(who: &Etcd, what: &str, done: impl Fn(&Job) -> bool) -> Job {
    let found = who.inner.wait_for(Instant::now() + STEP, |job| {
        done(job).then(|| Ok(job.clone()))
    });
    match found {
        Some(Ok(job)) => job,
        other => panic!("{what}: {other:?}\n{:#?}", who.inner.job()),
    }
}

/// A campaign that won the role but got no answer leaves the rank holding it without a term. It
/// campaigns again, learns that it holds the role, and coordinates: the job does not wait forever for
/// a coordinator that does not know it is one.
#[test]
fn a_rank_that_won_the_role_without_an_answer_coordinates() {
    let Some((store, _cluster)) = shared() else {
        return;
    };
    let bound = (1, Duration::from_secs(5));
    let (say, said) = sink();
    let first = |rank| Role::First { rank, world: 2 };
    let rank0 = Etcd::join(&store, "rank-0", first(0), bound, Arc::clone(&say)).expect("rank 0");
    // Rank 1 has not joined: rank 0 may not campaign yet. The campaign that got no answer:
    let Campaign::Won(term) = rank0.inner.member.campaign().expect("a campaign") else {
        panic!("the role was free");
    };
    until(&rank0, "the view holds rank 0's role", |job| {
        job.coordinator == Some(("rank-0".into(), term.since()))
    });
    let _rank1 = Etcd::join(&store, "rank-1", first(1), bound, say).expect("rank 1");
    // Rank 0 may hold the role now: it takes its term, and asks a rank for generation 0's id.
    until(&rank0, "rank 0 coordinates", |job| {
        job.asked.contains_key(&0)
    });
    assert_eq!(rank0.inner.term(), Some(term));
    let said = said.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let line = format!(
        "ELASTIC phase=coordinator name=rank-0 term={}",
        term.since()
    );
    assert!(said.contains(&line), "{said:#?}");
}
