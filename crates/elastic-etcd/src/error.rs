//! What can go wrong, each with a message that names what, where and the fix.

use std::fmt;
use std::time::Duration;

/// An error of this crate. [`Error::is_final`] tells the errors after which this member cannot go on
/// (its lease is gone or could not be renewed) from those a caller may retry within its own bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A setting is wrong (a variable of the environment, or a field of [`crate::Config`]): `what` says
    /// which and how to fix it.
    Config { what: String },
    /// No etcd endpoint answered within `bound` when this member connected.
    Connect {
        endpoints: String,
        bound: Duration,
        detail: String,
    },
    /// One call got no answer within its bound, or a refusal etcd gives while it changes leader: the
    /// caller may try again (its lease still stands, or [`crate::Member::alive`] says otherwise).
    Unavailable {
        what: String,
        endpoints: String,
        bound: Duration,
        detail: String,
    },
    /// etcd refused a call for a reason a retry does not change (authentication, permission, a request
    /// too large).
    Refused {
        what: String,
        endpoints: String,
        detail: String,
    },
    /// This member's lease is gone: etcd expired it (the member was silent past its TTL: frozen, or cut
    /// off) or it was revoked. Final: every key of the member is gone, others see it as dead.
    LeaseExpired { endpoints: String, ttl: Duration },
    /// This member's lease could not be renewed for its whole TTL: the etcd cluster lost its quorum, or
    /// this host cannot reach it. Final: etcd may expire the lease at any moment, so this member may no
    /// longer act as a member, nor as the coordinator.
    QuorumLost {
        endpoints: String,
        ttl: Duration,
        detail: String,
    },
    /// A write of the coordinator was refused: another member holds the role now (or none does), so
    /// this member was deposed. `holder` is the member holding it, if any.
    Deposed {
        what: String,
        holder: Option<String>,
    },
    /// A member of this name is already registered and alive in this job.
    NameTaken { name: String },
    /// A value or a listing is over its cap.
    TooLarge {
        what: String,
        len: usize,
        cap: usize,
    },
}

impl Error {
    /// Whether this member cannot go on after it: its lease is gone or could not be renewed in time.
    pub fn is_final(&self) -> bool {
        matches!(self, Error::LeaseExpired { .. } | Error::QuorumLost { .. })
    }
}

/// Seconds with a fraction, as the messages print a bound.
pub(crate) fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Config { what } => write!(f, "etcd membership: {what}"),
            Error::Connect { endpoints, bound, detail } => write!(
                f,
                "etcd at {endpoints}: no endpoint answered within {} ({detail}). Check that the cluster runs \
                 and that this host reaches it (`etcdctl --endpoints={endpoints} endpoint health`), and that \
                 METRALE_ETCD_ENDPOINTS lists its client URLs",
                secs(*bound)
            ),
            Error::Unavailable { what, endpoints, bound, detail } => write!(
                f,
                "etcd at {endpoints}: {what} got no answer within {} ({detail}); it may be tried again while \
                 this member's lease stands",
                secs(*bound)
            ),
            Error::Refused { what, endpoints, detail } => write!(
                f,
                "etcd at {endpoints} refused {what}: {detail}. Check the user and password \
                 (METRALE_ETCD_USER, METRALE_ETCD_PASSWORD) and the user's role on the job prefix \
                 /metrale/jobs/"
            ),
            Error::LeaseExpired { endpoints, ttl } => write!(
                f,
                "etcd at {endpoints} expired this member's lease: it renewed nothing for its TTL of {} \
                 (frozen, or cut off from etcd), so the job counts it as dead and goes on without it. Start \
                 it again as a replacement",
                secs(*ttl)
            ),
            Error::QuorumLost { endpoints, ttl, detail } => write!(
                f,
                "etcd at {endpoints}: this member's lease could not be renewed for its TTL of {} ({detail}): \
                 the etcd cluster has lost its quorum or this host cannot reach it, and no coordinator can \
                 act safely. This rank stops. Fix: bring a majority of the etcd members back \
                 (`etcdctl --endpoints={endpoints} endpoint health`), then start the job again",
                secs(*ttl)
            ),
            Error::Deposed { what, holder } => match holder {
                Some(h) => write!(f, "{what} refused: this member is no longer the coordinator ({h} is)"),
                None => write!(f, "{what} refused: this member is no longer the coordinator (none is now)"),
            },
            Error::NameTaken { name } => write!(
                f,
                "a live member named '{name}' is already registered in this job: each rank needs a name of \
                 its own (a replacement of a dead member may take its name once its lease has expired)"
            ),
            Error::TooLarge { what, len, cap } => write!(f, "{what} is {len}, over its cap of {cap}"),
        }
    }
}

impl std::error::Error for Error {}
