//! A member of a job: registered under its lease, it reads the job ([`View`]), reports under its lease,
//! waits for changes, and campaigns for the coordinating role ([`crate::leadership`]).
//!
//! The job's keys, under its prefix ([`JobPrefix`]):
//! - `members/<name>`: each live member, with the value it joined with; under its lease.
//! - `coordinator`: the coordinator's name; under its lease. Its create revision fences its writes.
//! - `state/<key>`: what the coordinator wrote (generations, plans, ids); no lease: it outlives any rank.
//! - `reports/<topic>/<name>`: what each member reported on a topic; under the member's lease.

use crate::config::Config;
use crate::connection::Etcd;
use crate::error::Error;
use crate::lease::Lease;
use crate::prefix::JobPrefix;
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, WatchOptions};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The longest name of a member or a topic, in bytes.
pub const NAME_CAP: usize = 64;
/// The longest state key, in bytes.
pub const KEY_CAP: usize = 128;
/// The largest value a member or the coordinator writes, in bytes.
pub const VALUE_CAP: usize = 64 * 1024;
/// The most keys a job holds that a [`View`] reads (members, reports and state together).
pub const VIEW_CAP: usize = 4096;
/// A wait for a change re-checks the lease at least this often (a third of the TTL at most).
const WAIT_SLICE: Duration = Duration::from_secs(1);
/// How soon a wait whose watch failed (no leader, a member gone) watches again.
const REWATCH: Duration = Duration::from_millis(100);

/// The coordinator as a [`View`] shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// Its member name.
    pub name: String,
    /// The revision at which it took the role: its term. Every term has its own.
    pub since: i64,
}

/// The job at one revision, read at once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct View {
    /// etcd's revision of this read: [`Member::wait_change`] waits for a change after it.
    pub revision: i64,
    /// The coordinator, if one holds the role.
    pub coordinator: Option<Holder>,
    /// The live members and the values they joined with.
    pub members: BTreeMap<String, Vec<u8>>,
    /// What the coordinator wrote, by key.
    pub state: BTreeMap<String, Vec<u8>>,
    /// The members' reports: topic, then member, then value.
    pub reports: BTreeMap<String, BTreeMap<String, Vec<u8>>>,
}

/// One rank's membership of one job.
pub struct Member {
    pub(crate) etcd: Etcd,
    pub(crate) prefix: JobPrefix,
    pub(crate) name: String,
    pub(crate) lease: Lease,
}

impl Member {
    /// Connects to etcd, takes a lease and registers as `name` in the job of `token`, with `value` (what the
    /// others should know of it: an address, a host). A live member of the same name makes this fail
    /// ([`Error::NameTaken`]); a dead one's name is free once its lease has expired.
    pub fn join(config: &Config, token: &[u8], name: &str, value: &[u8]) -> Result<Member, Error> {
        check_name("a member's name", name)?;
        check_value("a member's value", value)?;
        let etcd = Etcd::connect(config)?;
        let lease = Lease::grant(&etcd).map_err(|e| match e {
            Error::Unavailable {
                endpoints,
                bound,
                detail,
                ..
            } => Error::Connect {
                endpoints,
                bound,
                detail,
            },
            e => e,
        })?;
        let member = Member {
            etcd,
            prefix: JobPrefix::of_token(token),
            name: name.into(),
            lease,
        };
        let key = member.key(&format!("members/{name}"));
        let (id, value) = (member.lease.id, value.to_vec());
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key,
                value,
                Some(PutOptions::new().with_lease(id)),
            )]);
        let created = member.call("the registration", txn, |mut c, txn| async move {
            c.txn(txn).await
        })?;
        if !created.succeeded() {
            // The lease is of no use: give it back now (it would expire one TTL later anyway).
            let _ = member.leave();
            return Err(Error::NameTaken { name: name.into() });
        }
        Ok(member)
    }

    /// This member's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The job's key prefix.
    pub fn prefix(&self) -> &JobPrefix {
        &self.prefix
    }

    /// The lease's id, as etcd and `etcdctl lease` name it.
    pub fn lease_id(&self) -> i64 {
        self.lease.id
    }

    /// `Ok` while etcd holds this member's lease for certain; [`Error::LeaseExpired`] or
    /// [`Error::QuorumLost`] (both final) once it does not. Local, but for one bounded call once the last
    /// renewal's hold has passed.
    pub fn alive(&self) -> Result<(), Error> {
        self.lease.check(&self.etcd)
    }

    /// The whole job at one revision (at most [`VIEW_CAP`] keys): one call.
    pub fn view(&self) -> Result<View, Error> {
        let prefix = self.prefix.as_str().to_string();
        let options = GetOptions::new()
            .with_prefix()
            .with_limit(VIEW_CAP as i64 + 1);
        let request = (prefix, options);
        let got = self.call(
            "a read of the job",
            request,
            |mut c, (prefix, options)| async move { c.get(prefix, Some(options)).await },
        )?;
        if got.kvs().len() > VIEW_CAP || got.more() {
            return Err(Error::TooLarge {
                what: "the job's key count".into(),
                len: got.count() as usize,
                cap: VIEW_CAP,
            });
        }
        let mut view = View {
            revision: got.header().map_or(0, |h| h.revision()),
            ..View::default()
        };
        for kv in got.kvs() {
            let Some(rest) = self.prefix.relative(kv.key()) else {
                continue;
            };
            let Ok(rest) = std::str::from_utf8(rest) else {
                continue;
            };
            let value = kv.value().to_vec();
            if rest == "coordinator" {
                let name = String::from_utf8_lossy(&value).into_owned();
                view.coordinator = Some(Holder {
                    name,
                    since: kv.create_revision(),
                });
            } else if let Some(name) = rest.strip_prefix("members/") {
                view.members.insert(name.into(), value);
            } else if let Some(key) = rest.strip_prefix("state/") {
                view.state.insert(key.into(), value);
            } else if let Some((topic, name)) = rest
                .strip_prefix("reports/")
                .and_then(|r| r.split_once('/'))
            {
                view.reports
                    .entry(topic.into())
                    .or_default()
                    .insert(name.into(), value);
            }
        }
        Ok(view)
    }

    /// Reports `value` on `topic` (a loss, a readiness, a departure: the caller's words) under this member's
    /// lease: it vanishes with the member. Returns the revision of the write.
    pub fn report(&self, topic: &str, value: &[u8]) -> Result<i64, Error> {
        check_name("a topic", topic)?;
        check_value("a report", value)?;
        let key = self.key(&format!("reports/{topic}/{}", self.name));
        let request = (
            key,
            value.to_vec(),
            PutOptions::new().with_lease(self.lease.id),
        );
        let put = self.call(
            "a report",
            request,
            |mut c, (key, value, options)| async move { c.put(key, value, Some(options)).await },
        )?;
        Ok(put.header().map_or(0, |h| h.revision()))
    }

    /// Waits until the job changes after `revision` (a member joins or dies, the coordinator changes or
    /// writes, a report), at most `bound`: `true` on a change, `false` after the bound. The lease is
    /// checked at least every second, so a final error ends the wait within a second of the lease's hold.
    pub fn wait_change(&self, revision: i64, bound: Duration) -> Result<bool, Error> {
        let deadline = Instant::now() + bound;
        loop {
            self.alive()?;
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            let slice = left.min(WAIT_SLICE).min(self.etcd.ttl / 3);
            let (mut client, prefix) = (self.etcd.client(), self.prefix.as_str().to_string());
            let watched = self.etcd.within(slice, async move {
                let options = WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(revision + 1);
                let (_watcher, mut stream) = client.watch(prefix, Some(options)).await?;
                loop {
                    match stream.message().await? {
                        // A change, or history compacted past `revision` (so there were changes).
                        Some(r) if !r.events().is_empty() || r.compact_revision() > 0 => {
                            return Ok(true)
                        }
                        Some(r) if r.canceled() => {
                            let why = format!("the watch was canceled: {}", r.cancel_reason());
                            return Err(etcd_client::Error::WatchError(why));
                        }
                        Some(_) => continue,
                        None => {
                            return Err(etcd_client::Error::WatchError("the watch ended".into()))
                        }
                    }
                }
            });
            match watched {
                Some(Ok(changed)) => return Ok(changed),
                Some(Err(e)) => {
                    let e = self.etcd.error("a watch", &e);
                    if !matches!(e, Error::Unavailable { .. }) {
                        return Err(e);
                    }
                    std::thread::sleep(
                        REWATCH.min(deadline.saturating_duration_since(Instant::now())),
                    );
                }
                None => {}
            }
        }
    }

    /// Leaves the job: revokes the lease, so that the member's keys (and the coordinator's role, if it
    /// held it) vanish now, not one TTL later. Dropping a member without this is what a crash looks like
    /// to the others: its keys vanish when its lease expires.
    pub fn leave(self) -> Result<(), Error> {
        self.lease.stop_renewals();
        let id = self.lease.id;
        match self
            .etcd
            .call("the lease's revocation", id, |mut c, id| async move {
                c.lease_revoke(id).await
            }) {
            Ok(_) | Err(Error::LeaseExpired { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The full key of `rest`.
    pub(crate) fn key(&self, rest: &str) -> String {
        self.prefix.key(rest)
    }

    /// One bounded call, after a check of the lease; a call that failed for want of an answer is
    /// reported as the lease's final error where the lease has lapsed meanwhile.
    pub(crate) fn call<R, T, F>(
        &self,
        what: &str,
        request: R,
        f: impl Fn(etcd_client::Client, R) -> F,
    ) -> Result<T, Error>
    where
        R: Clone,
        F: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        self.alive()?;
        match self.etcd.call(what, request, f) {
            Err(e @ Error::Unavailable { .. }) => Err(self.alive().err().unwrap_or(e)),
            other => other,
        }
    }
}

/// A member's name or a topic: 1 to [`NAME_CAP`] bytes of ASCII letters, digits, `.`, `_` and `-`.
pub(crate) fn check_name(what: &str, name: &str) -> Result<(), Error> {
    let ok = |b: u8| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-';
    if name.is_empty() || name.len() > NAME_CAP || !name.bytes().all(ok) {
        return Err(Error::Config {
            what: format!(
                "{what} '{name}' must be 1 to {NAME_CAP} letters, digits, '.', '_' or '-'"
            ),
        });
    }
    Ok(())
}

/// A state key: 1 to [`KEY_CAP`] bytes of names' characters and `/`.
pub(crate) fn check_key(key: &str) -> Result<(), Error> {
    let ok = |b: u8| b.is_ascii_alphanumeric() || b"._-/".contains(&b);
    if key.is_empty() || key.len() > KEY_CAP || !key.bytes().all(ok) {
        return Err(Error::Config {
            what: format!("the state key '{key}' must be 1 to {KEY_CAP} letters, digits, '.', '_', '-' or '/'"),
        });
    }
    Ok(())
}

pub(crate) fn check_value(what: &str, value: &[u8]) -> Result<(), Error> {
    if value.len() > VALUE_CAP {
        return Err(Error::TooLarge {
            what: format!("{what}'s size in bytes"),
            len: value.len(),
            cap: VALUE_CAP,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_can_be_shared_between_threads() {
        fn shared<T: Send + Sync>() {}
        shared::<Member>();
        shared::<View>();
        shared::<Error>();
    }

    #[test]
    fn names_topics_and_keys_are_checked_before_any_call() {
        assert!(check_name("a name", "rank-3.host_a").is_ok());
        for bad in ["", "a/b", "a b", "é", &"x".repeat(NAME_CAP + 1)] {
            assert!(
                matches!(check_name("a name", bad), Err(Error::Config { .. })),
                "{bad:?}"
            );
        }
        assert!(check_key("gen/7/plan").is_ok());
        for bad in ["", "a b", &"x".repeat(KEY_CAP + 1)] {
            assert!(
                matches!(check_key(bad), Err(Error::Config { .. })),
                "{bad:?}"
            );
        }
        assert!(check_value("v", &vec![0; VALUE_CAP]).is_ok());
        assert!(matches!(
            check_value("v", &vec![0; VALUE_CAP + 1]),
            Err(Error::TooLarge { .. })
        ));
    }
}
