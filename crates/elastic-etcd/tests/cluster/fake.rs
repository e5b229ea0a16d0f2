//! Fake ranks: threads, each a member of one job with its own connection, running the coordinator's
//! part of a recovery without GPUs. Every rank campaigns; the coordinator makes a new generation
//! (`state/gen/<n>`, created once, fenced by its term) whenever the live members differ from the last
//! generation's. The test kills ranks (a killed rank drops its member without leaving: its lease
//! expires, as a SIGKILLed process's does) and reads what happened: who took the role and when, who
//! made which generation, how each rank ended.

use metrale_gpu_elastic_etcd::{Bounds, Campaign, Config, Error, Leadership, Member, View};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A rank waits for a change at most this long before it looks again (and at its kill flag).
pub const POLL: Duration = Duration::from_millis(200);
/// A call that failed but not for good is tried again after this.
const RETRY: Duration = Duration::from_millis(100);

/// What a rank did, in the order the ranks did it.
#[derive(Clone, Debug)]
pub enum Event {
    /// `by` took the coordinating role for term `term`.
    Took { by: String, term: i64, at: Instant },
    /// `by`, coordinator of `term`, made generation `gen` of `members`.
    Made {
        gen: u64,
        by: String,
        term: i64,
        members: Vec<String>,
    },
    /// `name` died (dropped its member without leaving).
    Died { name: String, at: Instant },
}

#[derive(Default)]
struct Shared {
    events: Mutex<Vec<Event>>,
    changed: Condvar,
    stop: AtomicBool,
    /// The next this many ranks to take the role die at once, before they write anything.
    die_on_taking: AtomicUsize,
}

impl Shared {
    fn events(&self) -> MutexGuard<'_, Vec<Event>> {
        self.events.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record(&self, event: Event) {
        self.events().push(event);
        self.changed.notify_all();
    }
}

struct Rank {
    name: String,
    kill: Arc<AtomicBool>,
    thread: JoinHandle<Result<(), Error>>,
}

/// A job of fake ranks `r0`, `r1`, ...
pub struct Job {
    shared: Arc<Shared>,
    ranks: Vec<Rank>,
}

impl Job {
    /// `n` ranks of the job of `token`, each joined before this returns.
    pub fn start(config: &Config, token: &[u8], n: usize) -> Job {
        let shared = Arc::new(Shared::default());
        let ranks = (0..n)
            .map(|r| {
                let name = format!("r{r}");
                let member =
                    Member::join(config, token, &name, b"fake").expect("a fake rank joins");
                let kill = Arc::new(AtomicBool::new(false));
                let (s, k) = (Arc::clone(&shared), Arc::clone(&kill));
                let thread = std::thread::Builder::new()
                    .name(name.clone())
                    .spawn(move || run(member, &s, &k))
                    .expect("a fake rank's thread");
                Rank { name, kill, thread }
            })
            .collect();
        Job { shared, ranks }
    }

    /// `n` ranks of a job of its own (named after `test`), once they made a first generation of all of
    /// them: the steady state, within the takeover's bound.
    pub fn steady(config: &Config, test: &str, n: usize) -> Job {
        let job = Job::start(config, &crate::support::token(test), n);
        let all: Vec<String> = (0..n).map(|r| format!("r{r}")).collect();
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        let bound = Bounds::of(config).takeover;
        assert!(
            job.wait_world(&all, bound),
            "no first generation within {bound:?}: {:?}",
            job.events()
        );
        job
    }

    /// The first coordinator: the rank that took the first term.
    pub fn first_coordinator(&self) -> String {
        let events = self.events();
        let first = events.iter().find_map(|e| match e {
            Event::Took { by, .. } => Some(by.clone()),
            _ => None,
        });
        first.expect("a coordinator")
    }

    /// Kills rank `name`: it drops its member at its next look (within [`POLL`]).
    pub fn kill(&self, name: &str) {
        let rank = self
            .ranks
            .iter()
            .find(|r| r.name == name)
            .expect("a rank of this job");
        rank.kill.store(true, SeqCst);
    }

    /// The next `n` ranks to take the coordinating role die the moment they take it.
    pub fn die_on_taking(&self, n: usize) {
        self.shared.die_on_taking.store(n, SeqCst);
    }

    /// What the ranks did so far.
    pub fn events(&self) -> Vec<Event> {
        self.shared.events().clone()
    }

    /// Waits (at most `bound`) until `done` holds of the events; whether it does.
    pub fn wait_for(&self, bound: Duration, done: impl Fn(&[Event]) -> bool) -> bool {
        let deadline = Instant::now() + bound;
        let mut events = self.shared.events();
        while !done(&events) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            events = self
                .shared
                .changed
                .wait_timeout(events, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    /// Waits (at most `bound`) until a generation of exactly `members` is made; whether one is.
    pub fn wait_world(&self, members: &[&str], bound: Duration) -> bool {
        let want: Vec<String> = members.iter().map(|m| m.to_string()).collect();
        self.wait_for(bound, |events| {
            last_world(events).is_some_and(|w| w == want)
        })
    }

    /// Waits (at most `bound`) until every rank's thread has ended by itself; whether all have.
    pub fn wait_ended(&self, bound: Duration) -> bool {
        let deadline = Instant::now() + bound;
        while !self.ranks.iter().all(|r| r.thread.is_finished()) {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    /// Stops the ranks that live, and asserts that each left cleanly (a killed rank ended well too).
    pub fn finish_well(self) {
        for (name, outcome) in self.finish() {
            assert!(outcome.is_ok(), "{name} ended with {outcome:?}");
        }
    }

    /// Stops the ranks that live (each leaves the job) and how every rank ended, by name.
    pub fn finish(self) -> Vec<(String, Result<(), Error>)> {
        self.shared.stop.store(true, SeqCst);
        self.ranks
            .into_iter()
            .map(|r| {
                (
                    r.name,
                    r.thread
                        .join()
                        .unwrap_or_else(|_| panic!("a fake rank panicked")),
                )
            })
            .collect()
    }
}

/// The members of the last generation made.
pub fn last_world(events: &[Event]) -> Option<Vec<String>> {
    events.iter().rev().find_map(|e| match e {
        Event::Made { members, .. } => Some(members.clone()),
        _ => None,
    })
}

/// Asserts that each generation was made once, by the coordinator of one term, in order, and that a
/// later generation's term is never older: no two ranks acted as coordinator for the same generation.
pub fn assert_one_coordinator_per_generation(events: &[Event]) {
    let made: Vec<(u64, &str, i64)> = events
        .iter()
        .filter_map(|e| match e {
            Event::Made { gen, by, term, .. } => Some((*gen, by.as_str(), *term)),
            _ => None,
        })
        .collect();
    let gens: Vec<u64> = made.iter().map(|m| m.0).collect();
    let expected: Vec<u64> = (1..=made.len() as u64).collect();
    assert_eq!(
        gens, expected,
        "each generation made once, in order: {events:?}"
    );
    for pair in made.windows(2) {
        assert!(
            pair[0].2 <= pair[1].2,
            "generation {} was made in an older term than {}: {events:?}",
            pair[1].0,
            pair[0].0
        );
    }
    // The terms each rank took: a term belongs to one rank.
    let mut terms = BTreeSet::new();
    for e in events {
        if let Event::Took { by, term, .. } = e {
            assert!(
                terms.insert(*term),
                "term {term} taken twice (again by {by}): {events:?}"
            );
        }
    }
    for (gen, by, term) in &made {
        let took = events
            .iter()
            .any(|e| matches!(e, Event::Took { by: b, term: t, .. } if b == by && t == term));
        assert!(
            took,
            "generation {gen} was made by {by} in term {term}, which it never took: {events:?}"
        );
    }
}

/// A rank's life: look, campaign, coordinate if it holds the role, wait for a change; until killed,
/// stopped, or a final error.
fn run(member: Member, shared: &Shared, kill: &AtomicBool) -> Result<(), Error> {
    let mut held: Option<i64> = None;
    loop {
        if kill.load(SeqCst) {
            shared.record(Event::Died {
                name: member.name().into(),
                at: Instant::now(),
            });
            return Ok(());
        }
        if shared.stop.load(SeqCst) {
            return member.leave();
        }
        let step = member.view().and_then(|view| {
            let Campaign::Won(term) = member.campaign()? else {
                return Ok(Some(view.revision));
            };
            if held != Some(term.since()) {
                held = Some(term.since());
                let took = Event::Took {
                    by: member.name().into(),
                    term: term.since(),
                    at: Instant::now(),
                };
                shared.record(took);
                if shared
                    .die_on_taking
                    .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                    .is_ok()
                {
                    return Ok(None);
                }
            }
            coordinate(&member, &term, &view, shared)?;
            Ok(Some(view.revision))
        });
        match step {
            Ok(Some(revision)) => {
                member.wait_change(revision, POLL)?;
            }
            Ok(None) => {
                shared.record(Event::Died {
                    name: member.name().into(),
                    at: Instant::now(),
                });
                return Ok(());
            }
            Err(e) if e.is_final() => return Err(e),
            Err(_) => std::thread::sleep(RETRY),
        }
    }
}

/// The coordinator's part: a new generation of the live members where they differ from the last one's.
fn coordinate(
    member: &Member,
    term: &Leadership,
    view: &View,
    shared: &Shared,
) -> Result<(), Error> {
    let last = view
        .state
        .keys()
        .filter_map(|k| k.strip_prefix("gen/")?.parse::<u64>().ok())
        .max()
        .unwrap_or(0);
    let live: Vec<String> = view.members.keys().cloned().collect();
    let last_members = view
        .state
        .get(&format!("gen/{last}"))
        .map(|v| members_of(v));
    if last_members.as_ref() == Some(&live) {
        return Ok(());
    }
    let gen = last + 1;
    let value = format!(
        "by={} term={} members={}",
        member.name(),
        term.since(),
        live.join(",")
    );
    if member.create_state(term, &format!("gen/{gen}"), value.as_bytes())? {
        shared.record(Event::Made {
            gen,
            by: member.name().into(),
            term: term.since(),
            members: live,
        });
    }
    Ok(())
}

/// The members a generation's value lists.
fn members_of(value: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(value);
    let list = text
        .split(' ')
        .find_map(|w| w.strip_prefix("members="))
        .unwrap_or("");
    list.split(',')
        .filter(|m| !m.is_empty())
        .map(String::from)
        .collect()
}
