//! One member's connection to etcd: the client, the runtime it runs on (one worker thread, owned here:
//! the API of this crate is synchronous), and calls bounded by the call timeout.

use crate::config::Config;
use crate::error::Error;
use etcd_client::{Client, ConnectOptions};
use std::future::Future;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;
use tokio::runtime::Runtime;

/// The runtime's threads: one worker (the calls, the lease's renewals) and at most this many blocking
/// threads (a name lookup of an endpoint).
const BLOCKING_THREADS: usize = 2;
/// How soon a call that failed for a reason a retry may change is tried again, within its bound.
const RETRY: Duration = Duration::from_millis(50);

pub(crate) struct Etcd {
    rt: Runtime,
    client: Client,
    /// The endpoints, as the messages name them.
    pub(crate) endpoints: String,
    /// One call's bound.
    pub(crate) call: Duration,
    /// The lease's TTL, which the errors of an expired lease name.
    pub(crate) ttl: Duration,
}

impl Etcd {
    /// Connects (lazily: without a user, the first call is the first contact), within the call timeout.
    pub(crate) fn connect(config: &Config) -> Result<Etcd, Error> {
        config.check()?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(BLOCKING_THREADS)
            .thread_name("metrale-etcd")
            .enable_all()
            .build()
            .map_err(|e| Error::Config {
                what: format!("cannot start the etcd client's thread: {e}"),
            })?;
        let endpoints = config.endpoint_list();
        // No per-request timeout of tonic's: it would also end the long streams (the lease's renewals, a
        // watch). Each call is bounded here instead; HTTP/2 pings find a dead connection within a call's bound.
        let mut options = ConnectOptions::new()
            .with_connect_timeout(config.call_timeout)
            .with_keep_alive(config.call_timeout, config.call_timeout)
            .with_require_leader(true);
        if let Some((user, password)) = &config.user {
            options = options.with_user(user.clone(), password.clone());
        }
        options = crate::tls::apply(options, config.tls.as_ref())?;
        let connect = Client::connect(config.endpoints.clone(), Some(options));
        let client =
            match rt.block_on(async { tokio::time::timeout(config.call_timeout, connect).await }) {
                Ok(Ok(client)) => client,
                Ok(Err(e)) => {
                    return Err(match classify(&e) {
                        Kind::Refused => Error::Refused {
                            what: "the connection".into(),
                            endpoints,
                            detail: e.to_string(),
                        },
                        _ => Error::Connect {
                            endpoints,
                            bound: config.call_timeout,
                            detail: e.to_string(),
                        },
                    })
                }
                Err(_) => {
                    return Err(Error::Connect {
                        endpoints,
                        bound: config.call_timeout,
                        detail: "no answer".into(),
                    })
                }
            };
        Ok(Etcd {
            rt,
            client,
            endpoints,
            call: config.call_timeout,
            ttl: config.lease_ttl,
        })
    }

    /// Runs `f(client, request)` bounded by the call timeout, again (after [`RETRY`]) where it failed for
    /// a reason a retry may change (no leader yet, an endpoint gone: the next try may reach another).
    /// Every request of this crate may be sent twice: a put of the same value, a create-if-absent (the
    /// second finds the first's key), a revocation, a read.
    pub(crate) fn call<R, T, F>(
        &self,
        what: &str,
        request: R,
        f: impl Fn(Client, R) -> F,
    ) -> Result<T, Error>
    where
        R: Clone,
        F: Future<Output = Result<T, etcd_client::Error>>,
    {
        // The last failure, should the bound pass during the pause or the next try.
        let last = Mutex::new(String::from("no answer"));
        let tries = async {
            loop {
                match f(self.client.clone(), request.clone()).await {
                    Err(e) if classify(&e) == Kind::Transient => {
                        *last.lock().unwrap_or_else(PoisonError::into_inner) = e.to_string();
                        tokio::time::sleep(RETRY).await;
                    }
                    done => return done,
                }
            }
        };
        match self
            .rt
            .block_on(async { tokio::time::timeout(self.call, tries).await })
        {
            Ok(Ok(t)) => Ok(t),
            Ok(Err(e)) => Err(self.error(what, &e)),
            Err(_) => Err(self.unavailable(
                what,
                last.into_inner().unwrap_or_else(PoisonError::into_inner),
            )),
        }
    }

    /// Runs `fut` on the runtime, bounded by `bound` (a wait longer than one call): `None` after it.
    pub(crate) fn within<T>(&self, bound: Duration, fut: impl Future<Output = T>) -> Option<T> {
        self.rt
            .block_on(async { tokio::time::timeout(bound, fut).await.ok() })
    }

    /// Starts `fut` on the runtime's worker (the lease's renewals).
    pub(crate) fn spawn(
        &self,
        fut: impl Future<Output = ()> + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        self.rt.spawn(fut)
    }

    /// A clone of the client, for a task of the runtime.
    pub(crate) fn client(&self) -> Client {
        self.client.clone()
    }

    /// etcd's error `e` for the call `what`, as this crate's.
    pub(crate) fn error(&self, what: &str, e: &etcd_client::Error) -> Error {
        match classify(e) {
            Kind::LeaseGone => Error::LeaseExpired {
                endpoints: self.endpoints.clone(),
                ttl: self.ttl,
            },
            Kind::Refused => Error::Refused {
                what: what.into(),
                endpoints: self.endpoints.clone(),
                detail: e.to_string(),
            },
            Kind::Transient => self.unavailable(what, e.to_string()),
        }
    }

    pub(crate) fn unavailable(&self, what: &str, detail: String) -> Error {
        Error::Unavailable {
            what: what.into(),
            endpoints: self.endpoints.clone(),
            bound: self.call,
            detail,
        }
    }
}

/// What an error of etcd's means for the caller.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The member's lease is gone (etcd: "requested lease not found").
    LeaseGone,
    /// A retry does not change it: authentication, permission, a malformed or too large request.
    Refused,
    /// No answer, no leader, a leader change, a connection lost: a retry may succeed.
    Transient,
}

pub(crate) fn classify(e: &etcd_client::Error) -> Kind {
    use tonic::Code;
    match e {
        etcd_client::Error::GRpcStatus(s) if s.message().contains("lease not found") => {
            Kind::LeaseGone
        }
        etcd_client::Error::LeaseKeepAliveError(m) if m.contains("lease not found") => {
            Kind::LeaseGone
        }
        etcd_client::Error::GRpcStatus(s) => match s.code() {
            Code::Unauthenticated
            | Code::PermissionDenied
            | Code::InvalidArgument
            | Code::OutOfRange
            | Code::ResourceExhausted
            | Code::Unimplemented => Kind::Refused,
            _ => Kind::Transient,
        },
        etcd_client::Error::InvalidArgs(_) | etcd_client::Error::InvalidUri(_) => Kind::Refused,
        _ => Kind::Transient,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcds_errors_are_told_apart() {
        let status =
            |code, msg: &str| etcd_client::Error::GRpcStatus(tonic::Status::new(code, msg));
        use tonic::Code;
        assert_eq!(
            classify(&status(
                Code::NotFound,
                "etcdserver: requested lease not found"
            )),
            Kind::LeaseGone
        );
        let gone = etcd_client::Error::LeaseKeepAliveError("lease not found".into());
        assert_eq!(classify(&gone), Kind::LeaseGone);
        assert_eq!(
            classify(&status(
                Code::InvalidArgument,
                "etcdserver: user name is empty"
            )),
            Kind::Refused
        );
        assert_eq!(
            classify(&status(
                Code::PermissionDenied,
                "etcdserver: permission denied"
            )),
            Kind::Refused
        );
        assert_eq!(
            classify(&status(Code::Unavailable, "etcdserver: no leader")),
            Kind::Transient
        );
        assert_eq!(
            classify(&status(Code::Unavailable, "etcdserver: leader changed")),
            Kind::Transient
        );
        assert_eq!(
            classify(&status(Code::DeadlineExceeded, "context deadline exceeded")),
            Kind::Transient
        );
    }
}
