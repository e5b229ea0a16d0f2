//! A member's lease, renewed by a task of the connection's runtime every third of its TTL, and what the
//! member knows of it: until when etcd holds it for certain, or that etcd let it go.
//!
//! A renewal sent at `t` and answered with a TTL of `ttl` holds the lease at least until `t + ttl` (etcd
//! counts from when it received the renewal, later). Past that instant with no newer answer, the member
//! cannot tell whether etcd still holds its lease: it must act as if it did not ([`Lease::check`] says
//! [`Error::QuorumLost`], or [`Error::LeaseExpired`] where etcd answers that the lease is gone). So a
//! member notices a loss of etcd's quorum at most one TTL after it: its last renewal answered before the
//! loss holds until at most one TTL past it.

use crate::connection::{classify, Etcd, Kind};
use crate::error::Error;
use etcd_client::{Client, LeaseKeepAliveStream, LeaseKeeper};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// How soon a failed renewal is tried again (a leader change takes about 2 s; the lease lasts longer).
const RETRY: Duration = Duration::from_millis(200);

/// What the renewals found.
struct Health {
    /// etcd holds the lease at least until then.
    until: Instant,
    /// etcd answered that the lease is gone.
    gone: bool,
    /// Why the last renewal failed, if it did.
    last_error: Option<String>,
    /// Why the lease was given up on (no renewal for a TTL, and etcd could not be asked): for good.
    lost: Option<String>,
}

pub(crate) struct Lease {
    pub(crate) id: i64,
    health: Arc<Mutex<Health>>,
    renewals: tokio::task::JoinHandle<()>,
}

fn lock(health: &Mutex<Health>) -> MutexGuard<'_, Health> {
    // A renewal that panicked left a whole Health: the data is still what was last written.
    health.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Lease {
    /// A new lease of the connection's TTL, renewed from now on.
    pub(crate) fn grant(etcd: &Etcd) -> Result<Lease, Error> {
        let ttl_secs = etcd.ttl.as_secs() as i64;
        let sent = Instant::now();
        let granted = etcd.call("a lease grant", ttl_secs, |mut c, ttl| async move {
            c.lease_grant(ttl, None).await
        })?;
        let ttl = Duration::from_secs(u64::try_from(granted.ttl()).unwrap_or(0));
        let health = Arc::new(Mutex::new(Health {
            until: sent + ttl,
            gone: false,
            last_error: None,
            lost: None,
        }));
        let renewals = etcd.spawn(renew(
            etcd.client(),
            granted.id(),
            etcd.ttl,
            etcd.call,
            Arc::clone(&health),
        ));
        Ok(Lease {
            id: granted.id(),
            health,
            renewals,
        })
    }

    /// `Ok` while etcd holds the lease for certain; the final error otherwise, and from then on. Past
    /// the last renewal's hold, one bounded question to etcd tells a lease it still holds (its answer
    /// then extends the hold) from one it expired and from one it cannot be asked about.
    pub(crate) fn check(&self, etcd: &Etcd) -> Result<(), Error> {
        let (until, gone, lost) = {
            let h = lock(&self.health);
            (h.until, h.gone, h.lost.clone())
        };
        let expired = || Error::LeaseExpired {
            endpoints: etcd.endpoints.clone(),
            ttl: etcd.ttl,
        };
        let quorum_lost = |detail| Error::QuorumLost {
            endpoints: etcd.endpoints.clone(),
            ttl: etcd.ttl,
            detail,
        };
        if gone {
            return Err(expired());
        }
        if let Some(detail) = lost {
            return Err(quorum_lost(detail));
        }
        if Instant::now() < until {
            return Ok(());
        }
        let sent = Instant::now();
        let asked = etcd.call("a lease's time to live", self.id, |mut c, id| async move {
            c.lease_time_to_live(id, None).await
        });
        let mut h = lock(&self.health);
        match asked {
            // etcd's leader answered: it holds the lease for `ttl` more seconds (-1: it has it no more).
            Ok(r) if r.ttl() > 0 => {
                h.until = h.until.max(sent + Duration::from_secs(r.ttl() as u64));
                Ok(())
            }
            Ok(_) | Err(Error::LeaseExpired { .. }) => {
                h.gone = true;
                Err(expired())
            }
            // No renewal got through for a whole TTL, and etcd cannot say now: the lease may end at any
            // moment. It is not this member's to count on, ever again.
            Err(e) => {
                let detail = match &h.last_error {
                    Some(renewal) => format!("{renewal}; then {e}"),
                    None => e.to_string(),
                };
                h.lost = Some(detail.clone());
                Err(quorum_lost(detail))
            }
        }
    }

    /// Stops the renewals: etcd expires the lease one TTL after the last, as it would a dead process's.
    pub(crate) fn stop_renewals(&self) {
        self.renewals.abort();
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.stop_renewals();
    }
}

/// The renewals: one every third of the TTL, each bounded by the call timeout, retried after [`RETRY`] on
/// a failure, on a new stream (the old one may be bound to a member that is gone).
async fn renew(
    mut client: Client,
    id: i64,
    ttl: Duration,
    call: Duration,
    health: Arc<Mutex<Health>>,
) {
    let mut stream: Option<(LeaseKeeper, LeaseKeepAliveStream)> = None;
    loop {
        let sent = Instant::now();
        let next =
            match tokio::time::timeout(call, renew_once(&mut client, id, ttl, &mut stream)).await {
                Ok(Ok(Some(held))) => {
                    let mut h = lock(&health);
                    h.until = h.until.max(sent + held);
                    h.last_error = None;
                    sent + ttl / 3
                }
                Ok(Ok(None)) => {
                    lock(&health).gone = true;
                    return;
                }
                Ok(Err(e)) => {
                    stream = None;
                    if classify(&e) == Kind::LeaseGone {
                        lock(&health).gone = true;
                        return;
                    }
                    lock(&health).last_error = Some(format!("the last renewal failed: {e}"));
                    Instant::now() + RETRY
                }
                Err(_) => {
                    stream = None;
                    lock(&health).last_error = Some(format!(
                        "the last renewal got no answer within {}",
                        crate::error::secs(call)
                    ));
                    Instant::now() + RETRY
                }
            };
        tokio::time::sleep_until(next.into()).await;
    }
}

/// One renewal: how long etcd now holds the lease, or `None` where it answered that the lease is gone.
async fn renew_once(
    client: &mut Client,
    id: i64,
    ttl: Duration,
    stream: &mut Option<(LeaseKeeper, LeaseKeepAliveStream)>,
) -> Result<Option<Duration>, etcd_client::Error> {
    let Some((keeper, answers)) = stream else {
        // Opening the stream renews once (and fails with "lease not found" for a lease that is gone).
        *stream = Some(client.lease_keep_alive(id).await?);
        return Ok(Some(ttl));
    };
    keeper.keep_alive().await?;
    match answers.message().await? {
        Some(r) if r.ttl() > 0 => Ok(Some(Duration::from_secs(r.ttl() as u64))),
        Some(_) => Ok(None),
        None => Err(etcd_client::Error::LeaseKeepAliveError(
            "the renewal stream ended".into(),
        )),
    }
}
