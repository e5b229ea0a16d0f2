//! Where etcd is and how to reach it: the endpoints, TLS, a user, and the two bounds every wait derives
//! from (the lease's TTL and one call's timeout), from the environment or set in code.

use crate::error::Error;
use std::path::PathBuf;
use std::time::Duration;

/// The shortest lease TTL accepted: etcd's own minimum with its default election timeout (1 s) is 2 s.
pub const MIN_LEASE_TTL: Duration = Duration::from_secs(2);
/// The longest lease TTL accepted: a dead member is noticed at the latest this long after it died.
pub const MAX_LEASE_TTL: Duration = Duration::from_secs(60);
/// The shortest call timeout accepted.
pub const MIN_CALL_TIMEOUT: Duration = Duration::from_millis(100);
/// One call's bound unless set (or a third of a TTL under 4.5 s).
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_millis(1500);
/// At most this many endpoints (a cluster has an odd handful of members).
pub const MAX_ENDPOINTS: usize = 16;

/// TLS to etcd (feature `tls`): a CA that signs the members' certificates, and this client's own
/// certificate and key where the members ask for one (`--client-cert-auth`). PEM files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tls {
    /// The CA certificate the members' certificates are checked against (`METRALE_ETCD_CACERT`).
    pub ca: PathBuf,
    /// This client's certificate and key (`METRALE_ETCD_CERT`, `METRALE_ETCD_KEY`), where etcd asks for one.
    pub identity: Option<(PathBuf, PathBuf)>,
}

/// How to reach etcd, and the bounds. Its `Debug` never shows the password.
#[derive(Clone, PartialEq, Eq)]
pub struct Config {
    /// The members' client URLs, `http://host:port` or `https://host:port` (`METRALE_ETCD_ENDPOINTS`,
    /// comma-separated). Calls go to any that answers.
    pub endpoints: Vec<String>,
    /// etcd's user and password (`METRALE_ETCD_USER`, `METRALE_ETCD_PASSWORD`), where auth is on.
    pub user: Option<(String, String)>,
    /// TLS, for `https://` endpoints.
    pub tls: Option<Tls>,
    /// The lease's TTL (`METRALE_ETCD_LEASE_TTL`, whole seconds, 2 to 60; 5 by default): a member silent
    /// this long is dead to the others, and a member that could renew nothing this long stops.
    pub lease_ttl: Duration,
    /// One call's bound (`METRALE_ETCD_CALL_TIMEOUT_MS`; by default 1500, or a third of a shorter TTL; at
    /// least 100 and at most a third of the TTL, so that a renewal given up on leaves time for two more).
    pub call_timeout: Duration,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("endpoints", &self.endpoints)
            .field(
                "user",
                &self.user.as_ref().map(|(user, _)| (user, "<password>")),
            )
            .field("tls", &self.tls)
            .field("lease_ttl", &self.lease_ttl)
            .field("call_timeout", &self.call_timeout)
            .finish()
    }
}

impl Config {
    /// The defaults for these endpoints: no user, no TLS, a 5 s lease, 1.5 s calls.
    pub fn new(endpoints: Vec<String>) -> Config {
        Config {
            endpoints,
            user: None,
            tls: None,
            lease_ttl: Duration::from_secs(5),
            call_timeout: DEFAULT_CALL_TIMEOUT,
        }
    }

    /// From the environment's `METRALE_ETCD_*` variables (see [`Config`]'s fields), checked.
    pub fn from_env() -> Result<Config, Error> {
        Config::from_vars(|name| std::env::var(name).ok())
    }

    /// From variables that `var` reads (the environment's, in [`Config::from_env`]), checked.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Config, Error> {
        let endpoints = var("METRALE_ETCD_ENDPOINTS").unwrap_or_default();
        let endpoints: Vec<String> = endpoints
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(String::from)
            .collect();
        let mut config = Config::new(endpoints);
        config.user =
            match (var("METRALE_ETCD_USER"), var("METRALE_ETCD_PASSWORD")) {
                (None, None) => None,
                (Some(user), Some(password)) => Some((user, password)),
                _ => return Err(config_error(
                    "METRALE_ETCD_USER and METRALE_ETCD_PASSWORD go together: set both or neither",
                )),
            };
        let identity = match (var("METRALE_ETCD_CERT"), var("METRALE_ETCD_KEY")) {
            (None, None) => None,
            (Some(cert), Some(key)) => Some((PathBuf::from(cert), PathBuf::from(key))),
            _ => {
                return Err(config_error(
                    "METRALE_ETCD_CERT and METRALE_ETCD_KEY go together: set both or neither",
                ))
            }
        };
        config.tls = match (var("METRALE_ETCD_CACERT"), identity) {
            (Some(ca), identity) => Some(Tls {
                ca: PathBuf::from(ca),
                identity,
            }),
            (None, None) => None,
            (None, Some(_)) => {
                return Err(config_error(
                    "METRALE_ETCD_CERT needs METRALE_ETCD_CACERT, the CA of the etcd members",
                ))
            }
        };
        if let Some(ttl) = var("METRALE_ETCD_LEASE_TTL") {
            let secs: u64 = ttl.trim().parse().map_err(|_| {
                config_error(format!(
                    "METRALE_ETCD_LEASE_TTL='{ttl}' is not a whole number of seconds"
                ))
            })?;
            config.lease_ttl = Duration::from_secs(secs);
            config.call_timeout = DEFAULT_CALL_TIMEOUT.min(config.lease_ttl / 3);
        }
        if let Some(ms) = var("METRALE_ETCD_CALL_TIMEOUT_MS") {
            let n: u64 = ms.trim().parse().map_err(|_| {
                config_error(format!(
                    "METRALE_ETCD_CALL_TIMEOUT_MS='{ms}' is not a whole number of milliseconds"
                ))
            })?;
            config.call_timeout = Duration::from_millis(n);
        }
        config.check()?;
        Ok(config)
    }

    /// Refuses what cannot work or would be unsafe: no endpoint, a URL of another scheme, `https://` without
    /// TLS (or TLS over `http://`), a password in clear to a host beyond loopback, bounds out of range.
    pub fn check(&self) -> Result<(), Error> {
        if self.endpoints.is_empty() {
            return Err(config_error(
                "no etcd endpoint: set METRALE_ETCD_ENDPOINTS to the members' client URLs, e.g. \
                 http://10.0.0.1:2379,http://10.0.0.2:2379,http://10.0.0.3:2379",
            ));
        }
        if self.endpoints.len() > MAX_ENDPOINTS {
            return Err(config_error(format!(
                "{} etcd endpoints, over the cap of {MAX_ENDPOINTS}",
                self.endpoints.len()
            )));
        }
        for e in &self.endpoints {
            let host = host_of(e)?;
            let https = e.starts_with("https://");
            if https && self.tls.is_none() {
                return Err(config_error(format!(
                    "endpoint {e} is https:// but no CA is set: set METRALE_ETCD_CACERT (and build with the \
                     crate's feature `tls`)"
                )));
            }
            if !https && self.tls.is_some() {
                return Err(config_error(format!(
                    "endpoint {e} is http:// but TLS is set (METRALE_ETCD_CACERT): write it https://"
                )));
            }
            if !https && self.user.is_some() && !is_loopback(host) {
                return Err(config_error(format!(
                    "METRALE_ETCD_USER is set and endpoint {e} is plain http:// beyond loopback: the password \
                     would cross the network in clear. Use https:// endpoints with METRALE_ETCD_CACERT"
                )));
            }
        }
        if self.lease_ttl < MIN_LEASE_TTL
            || self.lease_ttl > MAX_LEASE_TTL
            || self.lease_ttl.subsec_nanos() != 0
        {
            return Err(config_error(format!(
                "the lease TTL (METRALE_ETCD_LEASE_TTL) is {} s: it must be whole seconds from {} to {}",
                self.lease_ttl.as_secs_f64(),
                MIN_LEASE_TTL.as_secs(),
                MAX_LEASE_TTL.as_secs()
            )));
        }
        if self.call_timeout < MIN_CALL_TIMEOUT || self.call_timeout > self.lease_ttl / 3 {
            return Err(config_error(format!(
                "the call timeout (METRALE_ETCD_CALL_TIMEOUT_MS) is {} ms: it must be from {} ms to a third \
                 of the lease TTL ({} ms)",
                self.call_timeout.as_millis(),
                MIN_CALL_TIMEOUT.as_millis(),
                (self.lease_ttl / 3).as_millis()
            )));
        }
        Ok(())
    }

    /// The endpoints as the messages name them.
    pub(crate) fn endpoint_list(&self) -> String {
        self.endpoints.join(",")
    }
}

fn config_error(what: impl Into<String>) -> Error {
    Error::Config { what: what.into() }
}

/// The host of `http://host:port` or `https://host:port` (an IPv6 host in brackets, kept in them).
fn host_of(endpoint: &str) -> Result<&str, Error> {
    let rest = endpoint
        .strip_prefix("http://")
        .or_else(|| endpoint.strip_prefix("https://"))
        .ok_or_else(|| {
            config_error(format!(
                "endpoint '{endpoint}' is not http://HOST:PORT or https://HOST:PORT"
            ))
        })?;
    let (host, port) = rest.rsplit_once(':').ok_or_else(|| {
        config_error(format!(
            "endpoint '{endpoint}' has no port (etcd's client port is 2379)"
        ))
    })?;
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(config_error(format!(
            "endpoint '{endpoint}' is not http://HOST:PORT or https://HOST:PORT"
        )));
    }
    Ok(host)
}

fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn from(vars: &[(&str, &str)]) -> Result<Config, Error> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_vars(|name| map.get(name).cloned())
    }

    fn refused(vars: &[(&str, &str)], naming: &str) {
        match from(vars) {
            Err(Error::Config { what }) => {
                assert!(what.contains(naming), "'{what}' does not name {naming}")
            }
            other => panic!("{vars:?}: expected a config error naming {naming}, got {other:?}"),
        }
    }

    #[test]
    fn the_endpoints_are_read_comma_separated_with_the_default_bounds() {
        let c = from(&[(
            "METRALE_ETCD_ENDPOINTS",
            "http://127.0.0.1:2379, http://127.0.0.1:2380,",
        )])
        .unwrap();
        assert_eq!(
            c.endpoints,
            ["http://127.0.0.1:2379", "http://127.0.0.1:2380"]
        );
        assert_eq!(
            (c.lease_ttl, c.call_timeout),
            (Duration::from_secs(5), Duration::from_millis(1500))
        );
        assert_eq!((c.user, c.tls), (None, None));
    }

    #[test]
    fn no_endpoint_is_refused_naming_the_variable() {
        refused(&[], "METRALE_ETCD_ENDPOINTS");
        refused(
            &[("METRALE_ETCD_ENDPOINTS", " , ")],
            "METRALE_ETCD_ENDPOINTS",
        );
    }

    #[test]
    fn a_malformed_endpoint_is_refused() {
        refused(
            &[("METRALE_ETCD_ENDPOINTS", "127.0.0.1:2379")],
            "127.0.0.1:2379",
        );
        refused(&[("METRALE_ETCD_ENDPOINTS", "http://127.0.0.1")], "no port");
        refused(
            &[("METRALE_ETCD_ENDPOINTS", "http://127.0.0.1:99999")],
            "99999",
        );
    }

    #[test]
    fn debug_never_shows_the_password() {
        let mut config = Config::new(vec!["https://etcd:2379".into()]);
        config.user = Some(("trainer".into(), "s3cret-pass".into()));
        let shown = format!("{config:?}");
        assert!(shown.contains("trainer"), "{shown}");
        assert!(!shown.contains("s3cret-pass"), "{shown}");
    }

    #[test]
    fn a_password_in_clear_beyond_loopback_is_refused() {
        let user = [
            ("METRALE_ETCD_USER", "job"),
            ("METRALE_ETCD_PASSWORD", "secret"),
        ];
        refused(
            &[
                ("METRALE_ETCD_ENDPOINTS", "http://10.0.0.1:2379"),
                user[0],
                user[1],
            ],
            "in clear",
        );
        for loopback in [
            "http://127.0.0.1:2379",
            "http://localhost:2379",
            "http://[::1]:2379",
        ] {
            let c = from(&[("METRALE_ETCD_ENDPOINTS", loopback), user[0], user[1]]).unwrap();
            assert_eq!(c.user, Some(("job".into(), "secret".into())));
        }
        refused(
            &[("METRALE_ETCD_ENDPOINTS", "http://127.0.0.1:2379"), user[0]],
            "METRALE_ETCD_PASSWORD",
        );
    }

    #[test]
    fn tls_and_the_scheme_must_agree() {
        refused(
            &[("METRALE_ETCD_ENDPOINTS", "https://10.0.0.1:2379")],
            "METRALE_ETCD_CACERT",
        );
        refused(
            &[
                ("METRALE_ETCD_ENDPOINTS", "http://10.0.0.1:2379"),
                ("METRALE_ETCD_CACERT", "/ca.pem"),
            ],
            "https://",
        );
        let c = from(&[
            ("METRALE_ETCD_ENDPOINTS", "https://10.0.0.1:2379"),
            ("METRALE_ETCD_CACERT", "/ca.pem"),
            ("METRALE_ETCD_CERT", "/c.pem"),
            ("METRALE_ETCD_KEY", "/k.pem"),
            ("METRALE_ETCD_USER", "job"),
            ("METRALE_ETCD_PASSWORD", "secret"),
        ])
        .unwrap();
        let identity = Some((PathBuf::from("/c.pem"), PathBuf::from("/k.pem")));
        assert_eq!(
            c.tls,
            Some(Tls {
                ca: PathBuf::from("/ca.pem"),
                identity
            })
        );
        refused(
            &[
                ("METRALE_ETCD_ENDPOINTS", "https://h:1"),
                ("METRALE_ETCD_CERT", "/c.pem"),
            ],
            "METRALE_ETCD_KEY",
        );
    }

    #[test]
    fn bounds_out_of_range_are_refused() {
        let e = ("METRALE_ETCD_ENDPOINTS", "http://127.0.0.1:2379");
        refused(
            &[e, ("METRALE_ETCD_LEASE_TTL", "1")],
            "METRALE_ETCD_LEASE_TTL",
        );
        refused(
            &[e, ("METRALE_ETCD_LEASE_TTL", "61")],
            "METRALE_ETCD_LEASE_TTL",
        );
        refused(
            &[e, ("METRALE_ETCD_LEASE_TTL", "18446744073709551616")],
            "METRALE_ETCD_LEASE_TTL",
        );
        refused(
            &[e, ("METRALE_ETCD_CALL_TIMEOUT_MS", "99")],
            "METRALE_ETCD_CALL_TIMEOUT_MS",
        );
        // A third of the default 5 s TTL is 1666 ms.
        refused(
            &[
                e,
                ("METRALE_ETCD_CALL_TIMEOUT_MS", "2000"),
                ("METRALE_ETCD_LEASE_TTL", "5"),
            ],
            "third",
        );
        let c = from(&[
            e,
            ("METRALE_ETCD_LEASE_TTL", "9"),
            ("METRALE_ETCD_CALL_TIMEOUT_MS", "3000"),
        ])
        .unwrap();
        assert_eq!(
            (c.lease_ttl, c.call_timeout),
            (Duration::from_secs(9), Duration::from_secs(3))
        );
        // A short TTL without a call timeout: a third of it.
        let c = from(&[e, ("METRALE_ETCD_LEASE_TTL", "2")]).unwrap();
        assert_eq!(c.call_timeout, Duration::from_secs(2) / 3);
    }
}
