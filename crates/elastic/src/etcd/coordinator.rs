//! The coordinating role in the etcd membership: a thread in every rank that campaigns for it while
//! the rank is in the newest generation (or, before the first, a rank of the first world) and the role
//! is free; while its rank holds it, it makes generation 0 once every rank of the first world joined,
//! and the next generation whenever the newest is lost. It keeps nothing but a timer: everything it
//! acts on is the job as read from etcd, so a rank that takes the role from a dead one goes on where
//! it was. Each of its writes is fenced by its term: a deposed coordinator writes nothing.
//!
//! The recovery: once every live member of the lost generation reported (or the report bound passed
//! since this coordinator saw the loss), the reporters are the survivors. Fewer than `--min-size`: the
//! job ends (`end`). All holding the lost generation revoked, someone dead: a shrink. Else an init from
//! a new unique id, asked of the first survivor (the next one if it dies meanwhile). The plan is
//! created once (`plan/<gen>`): two coordinators never make one generation.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrale_gpu_elastic_etcd::{Campaign, Error, Leadership};

use super::state::{GenPlan, Job, Kind, Loss, Role};
use super::{Inner, LOOK};
use crate::membership::below_minimum;
use crate::protocol::{Held, How};

/// The line a coordinator says when it made generation `gen` (`how`, of `size` ranks), with its term:
/// the tests read from these that no two ranks made one generation.
pub(super) fn line(inner: &Inner, term: &Leadership, gen: u64, how: &str, size: usize) -> String {
    format!(
        "ELASTIC phase=coordinate name={} term={} gen={gen} how={how} size={size}",
        inner.name,
        term.since()
    )
}

pub(super) struct Coordinating {
    inner: Arc<Inner>,
    min: usize,
    report: Duration,
    /// The lost generation this coordinator waits on reports for, and since when.
    since: Option<(u64, Instant)>,
}

impl Coordinating {
    pub(super) fn new(inner: Arc<Inner>, min: usize, report: Duration) -> Coordinating {
        Coordinating {
            inner,
            min,
            report,
            since: None,
        }
    }

    /// Until the rank stops or its membership ends: campaigns when it may, coordinates while it holds
    /// the role.
    pub(super) fn run(mut self) {
        while !self.inner.stopped() {
            std::thread::sleep(LOOK);
            let job = {
                let seen = super::lock(&self.inner.seen);
                if seen.error.is_some() {
                    return;
                }
                seen.job.clone()
            };
            if job.end.is_some() {
                continue;
            }
            let done = match self.inner.term() {
                None => self.campaign(&job),
                Some(term) => match &job.coordinator {
                    Some((_, since)) if *since != term.since() => Err(Error::Deposed {
                        what: "a look".into(),
                        holder: None,
                    }),
                    _ => self.coordinate(&job, &term),
                },
            };
            match done {
                Err(Error::Deposed { .. }) => self.inner.set_term(None),
                Err(e) if e.is_final() => return,
                _ => {}
            }
        }
    }

    /// Takes the role where this rank may hold it and none does, or where it holds it without a term:
    /// a campaign that got no answer may have won it (the key is this rank's, under its lease, and
    /// nobody else can take it while the rank lives), and a campaign again tells so.
    fn campaign(&mut self, job: &Job) -> Result<(), Error> {
        let me = &self.inner.name;
        let eligible = match job.newest() {
            Some(p) => p.rank_of(me).is_some() && job.live(me),
            // The first coordinator: the lowest rank, once every rank of the first world joined.
            None => {
                first_world(job).is_some_and(|names| names.iter().find(|n| job.live(n)) == Some(me))
            }
        };
        let mine = job.coordinator.as_ref().is_some_and(|(name, _)| name == me);
        if !mine && (!eligible || job.coordinator.is_some()) {
            return Ok(());
        }
        if let Campaign::Won(term) = self.inner.member.campaign()? {
            self.since = None;
            self.inner.set_term(Some(term));
            (self.inner.say)(format!(
                "ELASTIC phase=coordinator name={me} term={}",
                term.since()
            ));
        }
        Ok(())
    }

    fn coordinate(&mut self, job: &Job, term: &Leadership) -> Result<(), Error> {
        match job.newest() {
            None => self.start(job, term),
            Some(plan) => match job.newest_lost() {
                Some(_) => self.recover(job, plan, term),
                None => {
                    self.since = None;
                    Ok(())
                }
            },
        }
    }

    /// Generation 0, of every rank of the first world by its rank, once all joined.
    fn start(&mut self, job: &Job, term: &Leadership) -> Result<(), Error> {
        let Some(names) = first_world(job) else {
            return Ok(());
        };
        let world = names.len();
        let Some(id) = self.id_for(job, 0, &names, term)? else {
            return Ok(());
        };
        let plan = GenPlan {
            gen: 0,
            kind: Kind::Made(How::Init { id }),
            world,
            step: 0,
            names,
        };
        self.make(term, &plan, "init")
    }

    /// The next generation after the lost newest `plan`, once its survivors reported.
    fn recover(&mut self, job: &Job, plan: &GenPlan, term: &Leadership) -> Result<(), Error> {
        let since = match self.since {
            Some((gen, at)) if gen == plan.gen => at,
            _ => {
                let now = Instant::now();
                self.since = Some((plan.gen, now));
                now
            }
        };
        let live: Vec<(usize, &String, Option<Loss>)> = plan
            .names
            .iter()
            .enumerate()
            .filter(|(_, n)| job.live(n))
            .map(|(r, n)| (r, n, job.reported(plan, n)))
            .collect();
        if live.iter().any(|l| l.2.is_none()) && since.elapsed() < self.report {
            return Ok(());
        }
        let survivors: Vec<(usize, String, Loss)> = live
            .into_iter()
            .filter_map(|(r, n, loss)| loss.map(|l| (r, n.clone(), l)))
            .collect();
        let dead: Vec<usize> = (0..plan.names.len())
            .filter(|r| !survivors.iter().any(|s| s.0 == *r))
            .collect();
        let gen = plan.gen;
        if survivors.len() < self.min {
            let why = below_minimum(gen, survivors.len(), self.min, &dead);
            if !self.inner.stopped()
                && self
                    .inner
                    .member
                    .create_state(term, "end", why.as_bytes())?
            {
                (self.inner.say)(line(&self.inner, term, gen + 1, "end", survivors.len()));
            }
            return Ok(());
        }
        let names: Vec<String> = survivors.iter().map(|s| s.1.clone()).collect();
        let revoked = survivors
            .iter()
            .all(|s| s.2.gen == gen && s.2.held == Held::Revoked);
        let how = match revoked && !dead.is_empty() {
            true => How::Shrink { exclude: dead },
            false => match self.id_for(job, gen + 1, &names, term)? {
                Some(id) => How::Init { id },
                None => return Ok(()),
            },
        };
        let word = match how {
            How::Shrink { .. } => "shrink",
            How::Init { .. } => "init",
        };
        let next = GenPlan {
            gen: gen + 1,
            kind: Kind::Made(how),
            world: plan.world,
            step: survivors.iter().map(|s| s.2.step).min().unwrap_or(0),
            names,
        };
        self.make(term, &next, word)
    }

    /// The unique id of generation `gen`, if one of `names` reported it; else asks the first of them
    /// that is alive and not asked yet (where none asked is alive), and `None`.
    fn id_for(
        &self,
        job: &Job,
        gen: u64,
        names: &[String],
        term: &Leadership,
    ) -> Result<Option<String>, Error> {
        let given = names.iter().find_map(|n| match job.ids.get(n) {
            Some((g, id)) if *g == gen => Some(id.clone()),
            _ => None,
        });
        if given.is_some() {
            return Ok(given);
        }
        let asked = job.asked.get(&gen);
        let was_asked = |n: &String| asked.is_some_and(|a| a.contains(n));
        if names.iter().any(|n| was_asked(n) && job.live(n)) || self.inner.stopped() {
            return Ok(None);
        }
        if let Some(next) = names.iter().find(|n| !was_asked(n) && job.live(n)) {
            self.inner
                .member
                .create_state(term, &format!("idfrom/{gen}/{next}"), b"")?;
        }
        Ok(None)
    }

    /// Creates `plan` (fenced by `term`, once) and says so.
    fn make(&self, term: &Leadership, plan: &GenPlan, how: &str) -> Result<(), Error> {
        if self.inner.stop.load(Ordering::Acquire) {
            return Ok(());
        }
        let key = format!("plan/{}", plan.gen);
        if self
            .inner
            .member
            .create_state(term, &key, plan.encode().as_bytes())?
        {
            (self.inner.say)(line(&self.inner, term, plan.gen, how, plan.names.len()));
            prune(&self.inner, term, plan.gen);
        }
        Ok(())
    }
}

/// Once generation `gen` is made, the keys of generation `gen - 2` go (its plan, its mark, who was
/// asked for its id): a job holds those of three generations at most, however long it lives. A
/// failure leaves them to the next generation's pruning.
pub(super) fn prune(inner: &Inner, term: &Leadership, gen: u64) {
    let Some(old) = gen.checked_sub(2) else {
        return;
    };
    for key in ["plan", "lost", "idfrom"] {
        let _ = inner.member.clear(term, &format!("{key}/{old}"), None);
    }
}

/// The names of the first world's ranks by rank, once every one of them joined.
fn first_world(job: &Job) -> Option<Vec<String>> {
    let firsts: Vec<(usize, usize, &String)> = job
        .members
        .iter()
        .filter_map(|(name, role)| match role {
            Role::First { rank, world } => Some((*rank, *world, name)),
            Role::Join => None,
        })
        .collect();
    let world = firsts.first()?.1;
    (0..world)
        .map(|r| {
            let at = firsts.iter().find(|f| f.0 == r && f.1 == world);
            at.map(|f| f.2.clone())
        })
        .collect()
}
