//! The membership kept in etcd (feature `etcd`), so that the job outlives any of its ranks, the
//! coordinator included. Each rank is a member of the job under its own lease
//! ([`metrale_gpu_elastic_etcd::Member`]); the generations, the plans, the unique ids and the
//! reports are keys under the job's prefix (`state.rs`). The coordinating role is held under a lease
//! too: every rank of the newest generation campaigns for it when it is free, and its holder's writes
//! are fenced by its term. A new holder reads the keys and goes on with whatever recovery was under
//! way (`coordinator.rs`).
//!
//! A rank learns of a death from its round (NCCL's error, or the deadline D), or from the dead rank's
//! lease, which etcd ends one TTL after its last renewal. Unique ids are made by the ranks, never by
//! the coordinator's thread: the coordinator asks a survivor for one (`idfrom/<gen>/<name>`), and the
//! rank that holds the role makes the grow id on its own communicator, as rank 0 does in the embedded
//! membership. Any rank of the parent may: NCCL 2.29.7's `ncclCommGetUniqueId` starts the grow's
//! bootstrap root in the calling process and sends its handle to the parent's ranks 0 and N-1, which
//! receive it in `ncclCommGrow` (src/init.cc; `bcastGrowHandle`, src/bootstrap.cc). nccl.h calls that
//! caller the root, whatever its rank.

mod coordinator;
mod state;
#[cfg(test)]
pub(crate) mod tests;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use metrale_gpu_elastic_etcd::{Bounds as EtcdBounds, Leadership, Member};

use crate::client::Joined;
use crate::config::{Config, First};
use crate::fabric::{Fabric, Sink};
use crate::membership::{lock, shared, wait_until, Bounds, Membership, NewId, Order, Shared};
use crate::protocol::{Held, Plan};
use crate::recovery::{first_life, replacement_life, STARTUP};
pub use crate::store::{Store, ENDPOINTS_VAR};
use state::{GenPlan, Job, Kind, Loss, Role};

/// How often a rank's wait on the job looks again without a change (its kill flag, its bound).
const LOOK: Duration = Duration::from_millis(50);
/// How long one watch of the job waits before it reads the whole job again.
const WATCH: Duration = Duration::from_millis(500);
/// How soon a read that failed (not for good) is tried again.
const RETRY: Duration = Duration::from_millis(100);

/// The job as this rank last read it, or why it can read it no more.
#[derive(Default)]
struct Seen {
    job: Job,
    error: Option<String>,
}

/// What the rank's threads share.
struct Inner {
    name: String,
    member: Arc<Member>,
    seen: Shared<Seen>,
    term: Mutex<Option<Leadership>>,
    stop: AtomicBool,
    say: Sink,
    /// The etcd bounds of this job (the TTL, a call).
    bounds: EtcdBounds,
}

impl Inner {
    fn term(&self) -> Option<Leadership> {
        *self.term.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set_term(&self, term: Option<Leadership>) {
        *self.term.lock().unwrap_or_else(PoisonError::into_inner) = term;
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// The job as last read.
    fn job(&self) -> Job {
        lock(&self.seen).job.clone()
    }

    /// Reports `value` on `topic`, trying again after a call that got no answer, until the lease says
    /// otherwise: within the bound of a quorum's loss and one call.
    fn tell(&self, topic: &str, value: &str) -> Result<(), String> {
        let deadline = Instant::now() + self.bounds.quorum_loss + self.bounds.call;
        loop {
            match self.member.report(topic, value.as_bytes()) {
                Ok(_) => return Ok(()),
                Err(e) if e.is_final() || Instant::now() >= deadline => {
                    return Err(format!("the etcd membership: {e}"))
                }
                Err(_) => std::thread::sleep(RETRY),
            }
        }
    }

    /// Reads the job, then waits for a change, until stopped: every rank's view of the job. A grow
    /// that takes this rank is confirmed (`ready`) once the view holds it.
    fn watch(&self) {
        let mut ready = 0;
        while !self.stopped() {
            let view = match self.member.view() {
                Ok(view) => view,
                Err(e) if e.is_final() => return self.fail(e.to_string()),
                Err(_) => {
                    std::thread::sleep(RETRY);
                    continue;
                }
            };
            let job = Job::read(&view);
            let grow = job
                .newest()
                .filter(|p| !p.recovers() && p.gen > ready && p.rank_of(&self.name).is_some())
                .map(|p| p.gen);
            lock(&self.seen).job = job;
            self.seen.1.notify_all();
            if let Some(gen) = grow {
                if self.tell("ready", &gen.to_string()).is_ok() {
                    ready = gen;
                }
            }
            match self.member.wait_change(view.revision, WATCH) {
                Err(e) if e.is_final() => return self.fail(e.to_string()),
                Err(_) => std::thread::sleep(RETRY),
                Ok(_) => {}
            }
        }
    }

    fn fail(&self, why: String) {
        lock(&self.seen).error = Some(format!("the etcd membership: {why}"));
        self.seen.1.notify_all();
    }

    /// Waits (up to `deadline`, looking every [`LOOK`]) until `answer` has an answer from the job:
    /// `Some(Ok)` or `Some(Err)`; `None` at the deadline. The membership's final error ends it.
    fn wait_for<T>(
        &self,
        deadline: Instant,
        mut answer: impl FnMut(&Job) -> Option<Result<T, String>>,
    ) -> Option<Result<T, String>> {
        loop {
            let by = deadline.min(Instant::now() + LOOK);
            let (seen, _) = wait_until(&self.seen, by, |s| s.error.is_some());
            if let Some(e) = &seen.error {
                return Some(Err(e.clone()));
            }
            let job = seen.job.clone();
            drop(seen);
            if let Some(found) = answer(&job) {
                return Some(found);
            }
            if Instant::now() >= deadline {
                return None;
            }
        }
    }

    /// Makes the unique id of generation `gen` with `new_id` and reports it, where the coordinator asked
    /// this rank for it and it has not answered yet.
    fn answer_id(&self, job: &Job, after: u64, new_id: NewId) -> Option<Result<(), String>> {
        let me = &self.name;
        let gen = job
            .asked
            .range(after..)
            .find(|(_, names)| names.contains(me))
            .map(|(g, _)| *g)
            .filter(|g| job.ids.get(me).is_none_or(|(given, _)| given != g))?;
        Some(new_id().and_then(|id| self.tell("id", &format!("{gen} {id}"))))
    }
}

/// A rank's membership of a job kept in etcd: a thread that watches the job, one that coordinates
/// while this rank holds the role, and the calls of [`Membership`] on what they read.
pub(crate) struct Etcd {
    inner: Arc<Inner>,
    threads: Vec<JoinHandle<()>>,
    leaver: Leaver,
}

impl Etcd {
    /// Joins the job of `store` as `name` (`role`): the watch and the coordinator's threads start.
    /// `min` is the job's `--min-size`, `report` the coordinator's bound on the survivors' reports.
    fn join(
        store: &Store,
        name: &str,
        role: Role,
        (min, report): (usize, Duration),
        say: Sink,
    ) -> Result<Etcd, metrale_gpu_elastic_etcd::Error> {
        let member = Member::join(
            &store.etcd,
            store.token.key(),
            name,
            role.encode().as_bytes(),
        )?;
        let member = Arc::new(member);
        let inner = Arc::new(Inner {
            name: name.into(),
            member: Arc::clone(&member),
            seen: shared(Seen::default()),
            term: Mutex::new(None),
            stop: AtomicBool::new(false),
            say,
            bounds: EtcdBounds::of(&store.etcd),
        });
        let mut threads = Vec::new();
        let watching = Arc::clone(&inner);
        let spawn = |what: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(format!("etcd {what} {name}"))
                .spawn(f)
                .map_err(|e| metrale_gpu_elastic_etcd::Error::Config {
                    what: format!("no thread for the {what}: {e}"),
                })
        };
        threads.push(spawn("watch", Box::new(move || watching.watch()))?);
        let coordinating = coordinator::Coordinating::new(Arc::clone(&inner), min, report);
        threads.push(spawn("coordinator", Box::new(move || coordinating.run()))?);
        Ok(Etcd {
            inner,
            threads,
            leaver: Leaver {
                member: Some(member),
                finished: AtomicBool::new(false),
            },
        })
    }

    /// A rank of the first world: the first unique id, once the coordinator made generation 0 of every
    /// rank (it asks one of them for the id).
    fn first_id(&self, rank: usize, new_id: NewId) -> Result<String, String> {
        let me = &self.inner.name;
        let found = self.inner.wait_for(Instant::now() + STARTUP, |job| {
            if let Some(end) = &job.end {
                return Some(Err(format!("the job ended: {end}")));
            }
            match job.plans.get(&0) {
                Some(GenPlan {
                    kind: Kind::Made(crate::protocol::How::Init { id }),
                    names,
                    ..
                }) => Some(match names.get(rank) {
                    Some(n) if n == me => Ok(id.clone()),
                    _ => Err(format!("generation 0 of this job has no place for {me} at rank {rank}: another job shares its token, or its state is an old job's")),
                }),
                Some(_) => Some(Err("generation 0 of this job is no init".into())),
                None => self.inner.answer_id(job, 0, new_id).and_then(Result::err).map(Err),
            }
        });
        found.unwrap_or_else(|| {
            Err(format!(
                "no generation 0 within {STARTUP:?}: not every rank of the first world joined the job"
            ))
        })
    }

    /// A replacement: its place in the next grow, within [`STARTUP`]. Only a live rank of the newest
    /// generation may take the coordinating role: once none lives, no grow can come, and it ends.
    fn grow_place(&self) -> Result<Joined, String> {
        let me = &self.inner.name;
        let found = self.inner.wait_for(Instant::now() + STARTUP, |job| {
            if let Some(end) = &job.end {
                return Some(Err(format!("the job ended: {end}")));
            }
            let place = job.plans.values().find_map(|p| match &p.kind {
                Kind::Grow { id } => p.rank_of(me).map(|rank| {
                    Ok(Joined {
                        gen: p.gen,
                        rank,
                        size: p.names.len(),
                        after: p.step,
                        id: id.clone(),
                    })
                }),
                Kind::Made(_) => None,
            });
            let newest = job.newest().filter(|p| p.rank_of(me).is_none());
            match newest {
                Some(p) if place.is_none() && !p.names.iter().any(|n| job.live(n)) => {
                    Some(Err(format!(
                        "no rank of generation {} lives: the job ended without a grow",
                        p.gen
                    )))
                }
                _ => place,
            }
        });
        found.unwrap_or_else(|| Err(format!("no grow took this replacement within {STARTUP:?}")))
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Release);
        if self.leaver.finished.load(Ordering::Acquire) {
            // Then the fields drop: `inner`, the last holder of the member but `leaver`, first.
            for t in self.threads.drain(..) {
                let _ = t.join();
            }
        }
    }
}

/// The member, left once the rank finished; a rank that dies (dropped before it finished) leaves
/// nothing: its lease ends one TTL after its last renewal, as a killed process's does.
struct Leaver {
    member: Option<Arc<Member>>,
    /// Set by `finish`.
    finished: AtomicBool,
}

impl Drop for Leaver {
    fn drop(&mut self) {
        if !self.finished.load(Ordering::Acquire) {
            return;
        }
        if let Some(Ok(member)) = self.member.take().map(Arc::try_unwrap) {
            let _ = member.leave();
        }
    }
}

impl Membership for Etcd {
    fn lost(&self, gen: u64) -> Option<String> {
        let seen = lock(&self.inner.seen);
        seen.error.clone().or_else(|| seen.job.lost(gen))
    }

    fn recover(
        &self,
        (gen, held): (u64, Held),
        step: usize,
        bounds: &Bounds,
        new_id: NewId,
    ) -> Result<Plan, String> {
        let me = &self.inner.name;
        self.inner
            .tell("lost", &Loss { gen, held, step }.encode())?;
        let bound = bounds.plan + self.inner.bounds.takeover;
        let found = self.inner.wait_for(Instant::now() + bound, |job| {
            if let Some(end) = &job.end {
                return Some(Err(format!("the job ended: {end}")));
            }
            let next = job.plans.range(gen + 1..).map(|(_, p)| p);
            if let Some(p) = next.clone().find(|p| p.recovers()) {
                let Kind::Made(how) = &p.kind else {
                    return None;
                };
                return Some(match p.rank_of(me) {
                    Some(rank) => Ok(Plan {
                        gen: p.gen,
                        rank,
                        size: p.names.len(),
                        step: p.step,
                        how: how.clone(),
                    }),
                    None => Err(format!(
                        "the coordinator left this rank out of generation {}: it did not report in time",
                        p.gen
                    )),
                });
            }
            self.inner.answer_id(job, gen + 1, new_id).and_then(Result::err).map(Err)
        });
        found.unwrap_or_else(|| {
            Err(format!(
                "no plan for generation {} within {bound:?}",
                gen + 1
            ))
        })
    }

    fn offer_grow(
        &self,
        gen: u64,
        after: usize,
        bounds: &Bounds,
        grow_id: NewId,
    ) -> Result<Option<Order>, String> {
        let inner = &self.inner;
        let Some(term) = inner.term() else {
            return Ok(None);
        };
        let job = inner.job();
        if job.lost(gen).is_some() {
            return Ok(Some(Order::Recover { gen }));
        }
        let Some(now) = job.newest().filter(|p| p.gen == gen) else {
            return Ok(None);
        };
        if waiting(&job, now).is_empty() || now.names.len() >= now.world {
            return Ok(None);
        }
        let member = &inner.member;
        let mark =
            |g: u64, why: &str| member.put_state(&term, &format!("lost/{g}"), why.as_bytes());
        // `Order::Recover` means that `lost(gen)` says so: the mark written, this rank waits (a call and
        // a watch at most) until its own view holds it. A mark that failed leaves the loss to this
        // rank's report.
        let give_up = |g: u64, why: &str| {
            if mark(g, why).is_ok() {
                let by = Instant::now() + inner.bounds.call + WATCH;
                inner.wait_for(by, |job| job.lost(gen).map(|_| Ok(())));
            }
            Ok(Some(Order::Recover { gen }))
        };
        let id = match grow_id() {
            Ok(id) => id,
            Err(why) => {
                let _ = mark(
                    gen,
                    &format!("the coordinator could not make the grow id: {why}"),
                );
                return Ok(Some(Order::NoGrowId { gen, why }));
            }
        };
        let job = inner.job();
        if job.lost(gen).is_some() || inner.stopped() {
            return Ok(Some(Order::Recover { gen }));
        }
        let take: Vec<String> = waiting(&job, now)
            .into_iter()
            .take(now.world - now.names.len())
            .collect();
        if take.is_empty() {
            return give_up(
                gen,
                "every replacement left while the coordinator made the grow id",
            );
        }
        let next = GenPlan {
            gen: gen + 1,
            kind: Kind::Grow { id },
            world: now.world,
            step: after,
            names: now.names.iter().cloned().chain(take).collect(),
        };
        let size = next.names.len();
        match member.create_state(
            &term,
            &format!("plan/{}", gen + 1),
            next.encode().as_bytes(),
        ) {
            Ok(true) => {
                (inner.say)(coordinator::line(inner, &term, gen + 1, "grow", size));
                coordinator::prune(inner, &term, gen + 1);
            }
            // Deposed: the next coordinator finds the generation as this rank leaves it, and so does
            // this rank.
            Err(metrale_gpu_elastic_etcd::Error::Deposed { .. }) => return Ok(None),
            // The plan exists, and only this term writes plans: a try whose answer was lost wrote it
            // (the call tries again after a transient error). Or the call got no answer, and may have
            // written it. Either way the members may follow a grow this rank never announced. No
            // grow, then: generation `gen` is lost for all, and a grow plan with it (this rank's report
            // of `gen` loses it).
            Ok(false) | Err(_) => {
                return give_up(
                    gen,
                    &format!(
                        "the coordinator could not tell whether it wrote the grow to generation {}",
                        gen + 1
                    ),
                )
            }
        }
        // Every member of `now` has the order before this rank starts the round the grow follows.
        let others: Vec<&String> = now.names.iter().filter(|n| *n != &inner.name).collect();
        let confirmed = inner.wait_for(Instant::now() + bounds.ready, |job| {
            if job.lost(gen + 1).is_some() {
                return Some(Err(String::new()));
            }
            let ready = |n: &&String| !job.live(n) || job.ready.get(*n) == Some(&(gen + 1));
            others.iter().all(ready).then_some(Ok(()))
        });
        match confirmed {
            Some(Ok(())) => Ok(Some(Order::Grow {
                gen: gen + 1,
                size,
                after,
            })),
            Some(Err(_)) => Ok(Some(Order::Recover { gen })),
            None => {
                let why = format!(
                    "a member did not confirm the grow to generation {} within {:?}",
                    gen + 1,
                    bounds.ready
                );
                give_up(gen + 1, &why)
            }
        }
    }

    fn grow_after(&self, gen: u64, step: usize) -> Option<(u64, usize)> {
        let seen = lock(&self.inner.seen);
        seen.job
            .plans
            .get(&(gen + 1))
            .filter(|p| !p.recovers() && p.step == step)
            .map(|p| (p.gen, p.names.len()))
    }

    fn missing(&self) -> usize {
        if self.inner.term().is_none() {
            return 0;
        }
        let job = self.inner.job();
        job.newest()
            .map_or(0, |p| p.world.saturating_sub(p.names.len()))
    }

    fn finish(&self, timeout: Duration) -> Result<(), String> {
        let inner = &self.inner;
        self.leaver.finished.store(true, Ordering::Release);
        inner.tell("done", "")?;
        let me = &inner.name;
        let all = inner.wait_for(Instant::now() + timeout, |job| {
            let names = job.newest().map(|p| p.names.clone()).unwrap_or_default();
            let late: Vec<usize> = (0..names.len())
                .filter(|&r| {
                    &names[r] != me
                        && job.members.contains_key(&names[r])
                        && !job.done.contains(&names[r])
                })
                .collect();
            late.is_empty().then_some(Ok(()))
        });
        if let Some(term) = inner.term() {
            let why = b"the job finished before this replacement could join";
            let _ = inner.member.create_state(&term, "end", why);
        }
        all.unwrap_or_else(|| Err(format!("the others did not finish within {timeout:?}")))
    }
}

/// The replacements waiting for a grow: members that joined as such and are in no generation yet, by
/// name.
fn waiting(job: &Job, now: &GenPlan) -> Vec<String> {
    job.members
        .iter()
        .filter(|(name, role)| **role == Role::Join && now.rank_of(name).is_none())
        .map(|(name, _)| name.clone())
        .collect()
}

/// Tells one replacement's name from another's in one process, and from another process's.
static JOINS: AtomicU64 = AtomicU64::new(0);

/// A rank's life with its membership in etcd: joins the job (a rank of the first world as `rank-R`,
/// a replacement under a name of its own), then lives as with the embedded membership.
pub(crate) fn run<F: Fabric>(config: &Config, store: &Store, fabric: &mut F) -> Result<(), String> {
    let bound = (config.min_size, Bounds::new(config.deadline).report);
    let say = fabric.sink();
    match config.first {
        Some(first @ First { rank, world_size }) => {
            let role = Role::First {
                rank,
                world: world_size,
            };
            let who = Etcd::join(store, &format!("rank-{rank}"), role, bound, say)
                .map_err(|e| format!("rank {rank}: {e}"))?;
            let id = who.first_id(rank, &mut || fabric.new_id())?;
            first_life(config, first, fabric, &who, &id)
        }
        None => {
            let n = JOINS.fetch_add(1, Ordering::Relaxed);
            let name = format!(
                "join-{}-{}-{n}",
                std::process::id(),
                crate::fabric::unix_us() % 1_000_000_000
            );
            let who = Etcd::join(store, &name, Role::Join, bound, say)
                .map_err(|e| format!("replacement {name}: {e}"))?;
            let joined = who.grow_place()?;
            replacement_life(config, fabric, &who, &joined)
        }
    }
}
