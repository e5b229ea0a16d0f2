//! The etcd membership's answers to calls whose outcome it cannot know (a write that got no answer may
//! have landed), and a replacement's wait on a job that cannot grow: against the cluster of
//! `ci/etcd-cluster`, each step pinned by the test. Without a cluster each prints its skip line.

use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use metrale_gpu_elastic_etcd::{Campaign, Member};

use super::state::{GenPlan, Job, Kind, Role};
use super::{Etcd, Store, ENDPOINTS_VAR};
use crate::fabric::Sink;
use crate::membership::{Bounds, Membership, Order};
use crate::protocol::How;
use metrale_gpu_launch::token::JobToken;

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

/// Rank 0 of a generation of one (of a world of 2), holding the role, and a replacement that waits.
fn one_rank_and_a_replacement(store: &crate::etcd::Store) -> (Etcd, Member) {
    let (say, _) = sink();
    let role = Role::First { rank: 0, world: 2 };
    let rank0 =
        Etcd::join(store, "rank-0", role, (1, Duration::from_secs(5)), say).expect("rank 0");
    let Campaign::Won(term) = rank0.inner.member.campaign().expect("a campaign") else {
        panic!("the role was free");
    };
    rank0.inner.set_term(Some(term));
    let gen0 = GenPlan {
        gen: 0,
        kind: Kind::Made(How::Init { id: "id0".into() }),
        world: 2,
        step: 0,
        names: vec!["rank-0".into()],
    };
    let member = &rank0.inner.member;
    let created = member.create_state(&term, "plan/0", gen0.encode().as_bytes());
    assert_eq!(created.ok(), Some(true), "generation 0");
    let token = store.token.key();
    let join = Member::join(&store.etcd, token, "join-1", Role::Join.encode().as_bytes());
    let join = join.expect("the replacement");
    until(&rank0, "the view holds the replacement", |job| {
        job.members.contains_key("join-1") && job.plans.contains_key(&0)
    });
    (rank0, join)
}

/// The grow's plan exists, written by this coordinator's term in a call that got no answer (here:
/// while it made the grow id): the members may follow it, though the coordinator never announced it.
/// The coordinator gives the generation up, and its `lost` says so at once, as `Order::Recover`
/// promises (a fabric gives up its communicator on that news).
#[test]
fn a_grow_plan_written_without_an_answer_loses_the_generation_at_once() {
    let Some((store, _cluster)) = shared() else {
        return;
    };
    let (rank0, _join) = one_rank_and_a_replacement(&store);
    let term = rank0.inner.term().expect("rank 0's term");
    let grow = GenPlan {
        gen: 1,
        kind: Kind::Grow { id: "grow".into() },
        world: 2,
        step: 5,
        names: vec!["rank-0".into(), "join-1".into()],
    };
    let mut grow_id = || {
        let member = &rank0.inner.member;
        let created = member.create_state(&term, "plan/1", grow.encode().as_bytes());
        assert_eq!(created.ok(), Some(true), "the grow's plan, unanswered");
        Ok("grow".to_string())
    };
    let bounds = Bounds::new(Duration::from_secs(2));
    let order = rank0.offer_grow(0, 5, &bounds, &mut grow_id);
    assert_eq!(order, Ok(Some(Order::Recover { gen: 0 })));
    assert!(rank0.lost(0).is_some(), "{:#?}", rank0.inner.job());
}

/// Every replacement left while the coordinator made the grow id: it gives the generation up, and its
/// `lost` says so at once.
#[test]
fn the_replacements_gone_during_the_grow_id_the_generation_is_lost_at_once() {
    let Some((store, _cluster)) = shared() else {
        return;
    };
    let (rank0, join) = one_rank_and_a_replacement(&store);
    let mut join = Some(join);
    let mut grow_id = || {
        if let Some(join) = join.take() {
            join.leave().expect("the replacement leaves");
        }
        until(&rank0, "the replacement left", |job| {
            !job.members.contains_key("join-1")
        });
        Ok("grow".to_string())
    };
    let bounds = Bounds::new(Duration::from_secs(2));
    let order = rank0.offer_grow(0, 5, &bounds, &mut grow_id);
    assert_eq!(order, Ok(Some(Order::Recover { gen: 0 })));
    assert!(rank0.lost(0).is_some(), "{:#?}", rank0.inner.job());
}

/// A replacement waits for a grow while a rank of the newest generation lives (one may take the role
/// and grow the world), and ends once none does: no grow can come.
#[test]
fn a_replacement_ends_once_no_rank_of_the_newest_generation_lives() {
    let Some((store, _cluster)) = shared() else {
        return;
    };
    let (rank0, join) = one_rank_and_a_replacement(&store);
    drop(join);
    let (say, _) = sink();
    let bound = (1, Duration::from_secs(5));
    let replacement = Etcd::join(&store, "join-2", Role::Join, bound, say).expect("a replacement");
    let start = Instant::now();
    let waiting = std::thread::spawn(move || (replacement.grow_place().err(), start.elapsed()));
    std::thread::sleep(Duration::from_secs(1));
    assert!(!waiting.is_finished(), "it waits while rank 0 lives");
    // Rank 0 leaves (a finished rank's leave, at once).
    rank0
        .leaver
        .finished
        .store(true, std::sync::atomic::Ordering::Release);
    drop(rank0);
    let (err, took) = waiting.join().expect("the replacement's wait");
    let err = err.expect("no place");
    assert!(err.contains("no rank of generation 0 lives"), "{err}");
    assert!(took < STEP, "it ended after {took:?}");
}

/// The cluster's store for a job of this test's own (a token of its own, a 3 s lease), or `None`
/// after the skip line.
pub(crate) fn store() -> Option<Store> {
    if std::env::var_os(ENDPOINTS_VAR).is_none() {
        metrale_gpu_testkit::skip::skip(format!(
            "no etcd cluster: {ENDPOINTS_VAR} is unset (run under ci/etcd-cluster)"
        ));
        return None;
    }
    let mut etcd = metrale_gpu_elastic_etcd::Config::from_env().expect("ci/etcd-cluster's config");
    // Short enough for a test, long enough that a loaded machine's renewals keep every live lease.
    etcd.lease_ttl = Duration::from_secs(3);
    etcd.call_timeout = Duration::from_secs(1);
    let test = std::thread::current().name().unwrap_or("test").to_string();
    let value = format!("{test}-{}-{}", std::process::id(), crate::fabric::unix_us());
    let token = JobToken::new("the test", &value).expect("a token");
    Some(Store { etcd, token })
}

/// Readers: the tests that leave etcd's members alone. Writers: those that stop some.
static CLUSTER: RwLock<()> = RwLock::new(());

/// For a test that leaves etcd's members alone: the store, and a share of the cluster.
pub(crate) fn shared() -> Option<(Store, RwLockReadGuard<'static, ()>)> {
    let store = store()?;
    Some((
        store,
        CLUSTER.read().unwrap_or_else(PoisonError::into_inner),
    ))
}

/// For a test that stops etcd members: the store, and the cluster to itself.
pub(crate) fn exclusive() -> Option<(Store, RwLockWriteGuard<'static, ()>)> {
    let store = store()?;
    Some((
        store,
        CLUSTER.write().unwrap_or_else(PoisonError::into_inner),
    ))
}
