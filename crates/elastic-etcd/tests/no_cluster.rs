//! What a member does where no etcd answers, and settings refused before any connection: no cluster needed.

use metrale_gpu_elastic_etcd::{Config, Error, Member};

/// A loopback URL where nothing listens (a port just bound and closed).
fn closed_endpoint() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let port = listener.local_addr().expect("its address").port();
    format!("http://127.0.0.1:{port}")
}

#[test]
fn a_member_that_reaches_no_etcd_fails_to_join_naming_the_endpoints_and_the_fix() {
    let endpoint = closed_endpoint();
    let config = Config::new(vec![endpoint.clone()]);
    match Member::join(&config, b"token", "r0", b"") {
        Err(e @ Error::Connect { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains(&endpoint) && text.contains("endpoint health"),
                "{text}"
            );
            assert!(!e.is_final(), "a failed connection is not a lost lease");
        }
        other => panic!(
            "joined through a closed port: {:?}",
            other.map(|m| m.name().to_string())
        ),
    }
}

#[test]
fn a_bad_name_is_refused_before_any_connection() {
    // The endpoint is never tried: the name is checked first.
    let config = Config::new(vec![closed_endpoint()]);
    match Member::join(&config, b"token", "rank 0", b"") {
        Err(Error::Config { what }) => assert!(what.contains("'rank 0'"), "{what}"),
        other => panic!(
            "a name with a space was taken: {:?}",
            other.map(|m| m.name().to_string())
        ),
    }
}

#[cfg(not(feature = "tls"))]
#[test]
fn tls_without_the_feature_is_refused_naming_it() {
    let mut config = Config::new(vec!["https://127.0.0.1:2379".into()]);
    config.tls = Some(metrale_gpu_elastic_etcd::Tls {
        ca: "/nonexistent/ca.pem".into(),
        identity: None,
    });
    match Member::join(&config, b"token", "r0", b"") {
        Err(Error::Config { what }) => assert!(what.contains("feature `tls`"), "{what}"),
        other => panic!(
            "TLS was set without the feature: {:?}",
            other.map(|m| m.name().to_string())
        ),
    }
}

#[cfg(feature = "tls")]
#[test]
fn tls_with_a_missing_ca_is_refused_naming_the_file() {
    let mut config = Config::new(vec!["https://127.0.0.1:2379".into()]);
    config.tls = Some(metrale_gpu_elastic_etcd::Tls {
        ca: "/nonexistent/ca.pem".into(),
        identity: None,
    });
    match Member::join(&config, b"token", "r0", b"") {
        Err(Error::Config { what }) => assert!(what.contains("/nonexistent/ca.pem"), "{what}"),
        other => panic!(
            "a CA that does not exist was taken: {:?}",
            other.map(|m| m.name().to_string())
        ),
    }
}
