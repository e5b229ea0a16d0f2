//! The etcd side of an elastic job's membership, so that the job outlives any of its ranks, the
//! coordinator included: each rank is a [`Member`] registered under a lease, the coordinating role is held
//! under a lease too ([`Member::campaign`]), and every write of the coordinator is fenced by its term, so
//! a deposed coordinator's writes are refused. A job's keys live under a prefix derived from its token
//! ([`JobPrefix`]): two jobs on one etcd never see each other's keys, and the token is never written.
//!
//! The API is synchronous: each [`Member`] owns a small runtime (one worker thread) that renews its lease,
//! and every call is bounded by the call timeout of its [`Config`]. [`Bounds`] lists what follows.
//!
//! ```no_run
//! use metrale_gpu_elastic_etcd::{Campaign, Config, Member};
//! use std::time::Duration;
//!
//! fn coordinate(token: &[u8], rank: usize) -> Result<(), metrale_gpu_elastic_etcd::Error> {
//!     let config = Config::from_env()?; // METRALE_ETCD_ENDPOINTS, ...
//!     let me = Member::join(&config, token, &format!("rank-{rank}"), b"")?;
//!     loop {
//!         match me.campaign()? {
//!             Campaign::Won(term) => {
//!                 // Written once per generation, and only while this member holds the role.
//!                 me.create_state(&term, "gen/1/plan", b"size 4")?;
//!                 return me.leave();
//!             }
//!             Campaign::Held(_) => {
//!                 let view = me.view()?;
//!                 if view.state.contains_key("gen/1/plan") {
//!                     return me.leave();
//!                 }
//!                 // The role or the state changed, or 5 s passed: look again.
//!                 me.wait_change(view.revision, Duration::from_secs(5))?;
//!             }
//!         }
//!     }
//! }
//! ```

mod config;
mod connection;
mod error;
mod leadership;
mod lease;
mod member;
mod prefix;
mod tls;

pub use config::{
    Config, Tls, DEFAULT_CALL_TIMEOUT, MAX_ENDPOINTS, MAX_LEASE_TTL, MIN_CALL_TIMEOUT,
    MIN_LEASE_TTL,
};
pub use error::Error;
pub use leadership::{Campaign, Leadership};
pub use member::{Holder, Member, View, KEY_CAP, NAME_CAP, VALUE_CAP, VIEW_CAP};
pub use prefix::{JobPrefix, ROOT};

use std::time::Duration;

/// How often etcd's leader looks for expired leases (etcd 3.4's lessor: every 500 ms).
pub const EXPIRY_CHECK: Duration = Duration::from_millis(500);

/// The bounds that follow from a [`Config`]'s TTL and call timeout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Every call to etcd returns within this.
    pub call: Duration,
    /// A member renews its lease this often (a third of the TTL).
    pub renewal: Duration,
    /// A member that died or froze is gone from the job (its keys deleted, a watch told) at most this long
    /// after its last renewal: the TTL, and etcd's check for expired leases.
    pub death: Duration,
    /// A dead coordinator's role is taken by a live member that watches for it at most this long after
    /// the coordinator's last renewal: its death's bound, then one campaign.
    pub takeover: Duration,
    /// A member whose lease cannot be renewed (etcd lost its quorum, or this host is cut off) gets a final
    /// error from [`Member::alive`] and from every call at most this long after the fault: the TTL, then
    /// one call that asks etcd (bounded).
    pub quorum_loss: Duration,
}

impl Bounds {
    /// The bounds of `config`.
    pub fn of(config: &Config) -> Bounds {
        let ttl = config.lease_ttl;
        Bounds {
            call: config.call_timeout,
            renewal: ttl / 3,
            death: ttl + EXPIRY_CHECK,
            takeover: ttl + EXPIRY_CHECK + config.call_timeout,
            quorum_loss: ttl + config.call_timeout,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bounds_follow_from_the_ttl_and_the_call_timeout() {
        let mut config = Config::new(vec!["http://127.0.0.1:2379".into()]);
        config.lease_ttl = Duration::from_secs(6);
        config.call_timeout = Duration::from_secs(1);
        let b = Bounds::of(&config);
        assert_eq!(b.renewal, Duration::from_secs(2));
        assert_eq!(b.death, Duration::from_millis(6500));
        assert_eq!(b.takeover, Duration::from_millis(7500));
        assert_eq!(b.quorum_loss, Duration::from_secs(7));
    }
}
