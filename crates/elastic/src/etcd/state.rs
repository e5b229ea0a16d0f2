//! The job as the etcd membership keeps it, read from one [`View`]: the generations' plans, the marks
//! the coordinator wrote, and what each member reported. Every rank reads the same keys the same way,
//! so that any of them can take the coordinating role and go on from what it reads.
//!
//! Written by the coordinator (fenced by its term, no lease: they outlive any rank):
//! - `plan/<gen>`: how generation `gen` is made, and its members in rank order ([`GenPlan`]);
//!   created once;
//! - `lost/<gen>`: generation `gen` is lost, and why (a grow that failed);
//! - `idfrom/<gen>/<name>`: member `name` is asked for the unique id of generation `gen`;
//! - `end`: the job is over (below the minimum size, or finished), and why.
//!
//! Written by each member (under its lease: they vanish with it), one value per topic:
//! - `lost`: `<gen> <revoked|aborted> <round>`: it gave up on generation `gen` at that round;
//! - `id`: `<gen> <hex>`: the unique id it made for generation `gen`;
//! - `ready`: `<gen>`: it has the order of the grow to generation `gen`;
//! - `done`: it finished its last round.
//!
//! A member's own key holds `first <rank> <world>` (a rank of the first world) or `join` (a
//! replacement).

use std::collections::{BTreeMap, BTreeSet};

use metrale_gpu_elastic_etcd::View;

use crate::protocol::{rank_list, Held, How};

/// How a generation is made: a recovery's shrink or init, or a grow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    Made(How),
    Grow { id: String },
}

/// A generation: how it is made, its members in rank order, the first world's size, and the round it
/// trains from (a recovery's) or follows (a grow's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GenPlan {
    pub gen: u64,
    pub kind: Kind,
    pub world: usize,
    pub step: usize,
    pub names: Vec<String>,
}

impl GenPlan {
    /// Its value: `<kind> <world> <step> <names,> <exclude,|id>` (`-` for no exclusion).
    pub fn encode(&self) -> String {
        let (kind, extra) = match &self.kind {
            Kind::Made(How::Shrink { exclude }) if exclude.is_empty() => ("shrink", "-".into()),
            Kind::Made(How::Shrink { exclude }) => ("shrink", rank_list(exclude)),
            Kind::Made(How::Init { id }) => ("init", id.clone()),
            Kind::Grow { id } => ("grow", id.clone()),
        };
        let names = self.names.join(",");
        format!("{kind} {} {} {names} {extra}", self.world, self.step)
    }

    /// The plan of generation `gen` that `value` holds; `None` for anything else.
    pub fn decode(gen: u64, value: &str) -> Option<GenPlan> {
        let words: Vec<&str> = value.split(' ').collect();
        let [kind, world, step, names, extra] = words[..] else {
            return None;
        };
        let kind = match kind {
            "shrink" if extra == "-" => Kind::Made(How::Shrink {
                exclude: Vec::new(),
            }),
            "shrink" => Kind::Made(How::Shrink {
                exclude: extra
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()
                    .ok()?,
            }),
            "init" => Kind::Made(How::Init { id: extra.into() }),
            "grow" => Kind::Grow { id: extra.into() },
            _ => return None,
        };
        Some(GenPlan {
            gen,
            kind,
            world: world.parse().ok()?,
            step: step.parse().ok()?,
            names: names.split(',').map(String::from).collect(),
        })
    }

    /// Whether it is a recovery's (it replaces a lost generation), not a grow's.
    pub fn recovers(&self) -> bool {
        matches!(self.kind, Kind::Made(_))
    }

    /// `name`'s rank in it.
    pub fn rank_of(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| n == name)
    }
}

/// A member's report of a loss: the generation, how it holds it, and the round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loss {
    pub gen: u64,
    pub held: Held,
    pub step: usize,
}

impl Loss {
    pub fn encode(&self) -> String {
        format!("{} {} {}", self.gen, self.held.word(), self.step)
    }

    fn decode(value: &str) -> Option<Loss> {
        let mut words = value.split(' ');
        let loss = Loss {
            gen: words.next()?.parse().ok()?,
            held: Held::from_word(words.next()?)?,
            step: words.next()?.parse().ok()?,
        };
        words.next().is_none().then_some(loss)
    }
}

/// What a member's own key says it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    First { rank: usize, world: usize },
    Join,
}

impl Role {
    pub fn encode(&self) -> String {
        match self {
            Role::First { rank, world } => format!("first {rank} {world}"),
            Role::Join => "join".into(),
        }
    }

    fn decode(value: &str) -> Option<Role> {
        match value.split(' ').collect::<Vec<_>>()[..] {
            ["first", rank, world] => Some(Role::First {
                rank: rank.parse().ok()?,
                world: world.parse().ok()?,
            }),
            ["join"] => Some(Role::Join),
            _ => None,
        }
    }
}

/// The job at one revision. Keys that do not parse are left out: no member writes them.
#[derive(Clone, Debug, Default)]
pub struct Job {
    pub plans: BTreeMap<u64, GenPlan>,
    pub lost_marks: BTreeMap<u64, String>,
    /// Who is asked for the id of each generation.
    pub asked: BTreeMap<u64, BTreeSet<String>>,
    pub end: Option<String>,
    /// The live members and what they are.
    pub members: BTreeMap<String, Role>,
    /// The coordinator's name and term, if one holds the role.
    pub coordinator: Option<(String, i64)>,
    pub losses: BTreeMap<String, Loss>,
    pub ids: BTreeMap<String, (u64, String)>,
    pub ready: BTreeMap<String, u64>,
    pub done: BTreeSet<String>,
}

fn text(value: &[u8]) -> Option<&str> {
    std::str::from_utf8(value).ok()
}

impl Job {
    pub fn read(view: &View) -> Job {
        let mut job = Job {
            coordinator: view.coordinator.as_ref().map(|h| (h.name.clone(), h.since)),
            ..Job::default()
        };
        for (name, value) in &view.members {
            if let Some(role) = text(value).and_then(Role::decode) {
                job.members.insert(name.clone(), role);
            }
        }
        for (key, value) in &view.state {
            let Some(value) = text(value) else { continue };
            let parts: Vec<&str> = key.split('/').collect();
            let gen = || parts.get(1).and_then(|g| g.parse::<u64>().ok());
            match (parts[0], gen()) {
                ("plan", Some(g)) if parts.len() == 2 => {
                    if let Some(plan) = GenPlan::decode(g, value) {
                        job.plans.insert(g, plan);
                    }
                }
                ("lost", Some(g)) if parts.len() == 2 => {
                    job.lost_marks.insert(g, value.into());
                }
                ("idfrom", Some(g)) if parts.len() == 3 => {
                    job.asked.entry(g).or_default().insert(parts[2].into());
                }
                ("end", None) => job.end = Some(value.into()),
                _ => {}
            }
        }
        let topic = |t: &str| view.reports.get(t).into_iter().flatten();
        for (name, value) in topic("lost") {
            if let Some(loss) = text(value).and_then(Loss::decode) {
                job.losses.insert(name.clone(), loss);
            }
        }
        for (name, value) in topic("id") {
            let id = text(value).and_then(|v| v.split_once(' '));
            if let Some((gen, id)) = id.and_then(|(g, id)| Some((g.parse().ok()?, id))) {
                job.ids.insert(name.clone(), (gen, id.to_string()));
            }
        }
        for (name, value) in topic("ready") {
            if let Some(gen) = text(value).and_then(|v| v.parse().ok()) {
                job.ready.insert(name.clone(), gen);
            }
        }
        job.done = topic("done").map(|(name, _)| name.clone()).collect();
        job
    }

    /// The newest generation's plan.
    pub fn newest(&self) -> Option<&GenPlan> {
        self.plans.values().next_back()
    }

    /// Whether `name` is alive in the job's eyes: a member, and not finished.
    pub fn live(&self, name: &str) -> bool {
        self.members.contains_key(name) && !self.done.contains(name)
    }

    /// Whether `loss` (by a member of the newest generation `plan`) loses it: a loss of that
    /// generation, or of its parent when it is a grow (a member still on the parent cannot grow).
    fn loses(plan: &GenPlan, loss: &Loss) -> bool {
        loss.gen >= plan.gen || (!plan.recovers() && loss.gen + 1 == plan.gen)
    }

    /// Why the newest generation is lost, if it is: a member of it died (its key vanished before it
    /// finished), a member reported its loss, or the coordinator marked it.
    pub fn newest_lost(&self) -> Option<(u64, String)> {
        let plan = self.newest()?;
        let gen = plan.gen;
        for (rank, name) in plan.names.iter().enumerate() {
            if !self.members.contains_key(name) && !self.done.contains(name) {
                return Some((
                    gen,
                    format!("rank {rank} of generation {gen} ({name}) died: its lease ended"),
                ));
            }
            if let Some(loss) = self.losses.get(name).filter(|l| Job::loses(plan, l)) {
                return Some((
                    gen,
                    format!("rank {rank} ({name}) lost generation {}", loss.gen),
                ));
            }
        }
        self.lost_marks.get(&gen).map(|why| (gen, why.clone()))
    }

    /// Why generation `gen` must be given up on: the job ended, a recovery replaced it, the
    /// coordinator marked it or a later one lost, or it is the newest and lost.
    pub fn lost(&self, gen: u64) -> Option<String> {
        if let Some(end) = &self.end {
            return Some(format!("the job ended: {end}"));
        }
        if let Some(p) = self
            .plans
            .range(gen + 1..)
            .map(|(_, p)| p)
            .find(|p| p.recovers())
        {
            return Some(format!("generation {} replaces it", p.gen));
        }
        if let Some((_, why)) = self.lost_marks.range(gen..).next() {
            return Some(format!("the membership: {why}"));
        }
        self.newest_lost()
            .filter(|(g, _)| *g >= gen)
            .map(|(_, why)| format!("the membership: {why}"))
    }

    /// Whether member `name`'s report answers the loss of the newest generation `plan`.
    pub fn reported(&self, plan: &GenPlan, name: &str) -> Option<Loss> {
        let loss = *self.losses.get(name)?;
        (loss.gen == plan.gen || (!plan.recovers() && loss.gen + 1 == plan.gen)).then_some(loss)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_read_back_as_written() {
        let names = vec!["rank-0".to_string(), "join-7".into()];
        for kind in [
            Kind::Made(How::Shrink { exclude: vec![] }),
            Kind::Made(How::Shrink {
                exclude: vec![1, 4],
            }),
            Kind::Made(How::Init { id: "ab12".into() }),
            Kind::Grow { id: "cd".into() },
        ] {
            let plan = GenPlan {
                gen: 3,
                kind,
                world: 8,
                step: 41,
                names: names.clone(),
            };
            assert_eq!(GenPlan::decode(3, &plan.encode()), Some(plan));
        }
        assert_eq!(GenPlan::decode(1, "grow 8 4"), None);
        let loss = Loss {
            gen: 2,
            held: Held::Aborted,
            step: 9,
        };
        assert_eq!(Loss::decode(&loss.encode()), Some(loss));
        assert_eq!(Role::decode(&Role::Join.encode()), Some(Role::Join));
    }

    fn job(members: &[&str], newest: GenPlan) -> Job {
        let mut job = Job::default();
        for m in members {
            job.members.insert(m.to_string(), Role::Join);
        }
        job.plans.insert(newest.gen, newest);
        job
    }

    fn plan(gen: u64, kind: Kind, names: &[&str]) -> GenPlan {
        GenPlan {
            gen,
            kind,
            world: 4,
            step: 0,
            names: names.iter().map(|n| n.to_string()).collect(),
        }
    }

    #[test]
    fn a_death_a_report_and_a_parents_report_lose_the_newest_and_a_finished_member_does_not() {
        let init = Kind::Made(How::Init { id: "a".into() });
        let mut j = job(&["a", "b"], plan(1, init.clone(), &["a", "b", "c"]));
        assert!(j.lost(1).unwrap().contains("(c) died"));
        assert!(j.lost(0).is_some(), "an older generation is lost with it");
        j.done.insert("c".into());
        assert_eq!(j.lost(1), None, "c finished");
        let loss = |gen| Loss {
            gen,
            held: Held::Revoked,
            step: 3,
        };
        j.losses.insert("b".into(), loss(0));
        assert_eq!(j.lost(1), None, "a stale report of an older generation");
        j.losses.insert("b".into(), loss(1));
        assert!(j.lost(1).unwrap().contains("(b) lost generation 1"));
        // A grow of generation 1: a member still on 1 that lost it loses the grow too.
        let mut g = job(
            &["a", "b"],
            plan(2, Kind::Grow { id: "g".into() }, &["a", "b"]),
        );
        g.losses.insert("a".into(), loss(1));
        assert!(g.lost(2).is_some());
        assert_eq!(g.reported(g.newest().unwrap(), "a"), Some(loss(1)));
        // A recovery's plan replaces every generation before it.
        let r = job(&["a"], plan(3, init, &["a"]));
        assert!(r.lost(2).unwrap().contains("generation 3 replaces it"));
        assert_eq!(r.lost(3), None);
    }
}
