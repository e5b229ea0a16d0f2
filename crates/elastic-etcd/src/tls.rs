//! TLS to etcd, where the crate is built with its feature `tls` (etcd-client's rustls): the CA and, where
//! etcd asks for one, this client's certificate and key, read from their PEM files.

use crate::config::Tls;
use crate::error::Error;
use etcd_client::ConnectOptions;

/// `options` with `tls` set, where it is.
#[cfg(feature = "tls")]
pub(crate) fn apply(options: ConnectOptions, tls: Option<&Tls>) -> Result<ConnectOptions, Error> {
    use etcd_client::{Certificate, Identity, TlsOptions};
    let Some(tls) = tls else { return Ok(options) };
    let read = |path: &std::path::Path, what: &str| {
        std::fs::read(path).map_err(|e| Error::Config {
            what: format!("cannot read {what} {}: {e}", path.display()),
        })
    };
    let mut tls_options = TlsOptions::new().ca_certificate(Certificate::from_pem(read(
        &tls.ca,
        "the CA (METRALE_ETCD_CACERT)",
    )?));
    if let Some((cert, key)) = &tls.identity {
        let cert = read(cert, "the certificate (METRALE_ETCD_CERT)")?;
        let key = read(key, "the key (METRALE_ETCD_KEY)")?;
        tls_options = tls_options.identity(Identity::from_pem(cert, key));
    }
    Ok(options.with_tls(tls_options))
}

/// `options`, where no TLS is asked for; an error naming the feature where it is.
#[cfg(not(feature = "tls"))]
pub(crate) fn apply(options: ConnectOptions, tls: Option<&Tls>) -> Result<ConnectOptions, Error> {
    match tls {
        None => Ok(options),
        Some(_) => Err(Error::Config {
            what: "TLS is set (METRALE_ETCD_CACERT) but this build has no TLS: build metrale-gpu-elastic-etcd \
                   with its feature `tls`"
                .into(),
        }),
    }
}
