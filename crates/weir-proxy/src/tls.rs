//! TLS to targets: `https://` targets, shadows and references are reached over
//! rustls (ring), checked against the Mozilla roots (webpki-roots, built in, so no
//! system certificate store is needed) and, with `[proxy] tls_ca_file`, the
//! certificates of a private CA in a PEM file. Clients talk TLS only to targets;
//! they reach the proxy over cleartext (put a TLS terminator in front for that).

use std::path::Path;
use std::sync::Arc;

use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

/// Certificates taken from `tls_ca_file`, at most.
const CA_CERTS_MAX: usize = 1024;

/// The client side of TLS to targets: the built-in roots, plus `ca_file`'s.
pub fn client_config(ca_file: Option<&Path>) -> Result<Arc<ClientConfig>, String> {
    let mut roots = RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = ca_file {
        let shown = path.display();
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(|e| format!("proxy.tls_ca_file {shown}: {e}"))?;
        let mut added = 0usize;
        for cert in certs {
            let cert = cert.map_err(|e| format!("proxy.tls_ca_file {shown}: {e}"))?;
            roots
                .add(cert)
                .map_err(|e| format!("proxy.tls_ca_file {shown}: a certificate refused: {e}"))?;
            added += 1;
            if added > CA_CERTS_MAX {
                return Err(format!(
                    "proxy.tls_ca_file {shown}: more than {CA_CERTS_MAX} certificates"
                ));
            }
        }
        if added == 0 {
            return Err(format!("proxy.tls_ca_file {shown}: no certificate in it"));
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// Whether an error, or one of its sources, is TLS's: a handshake failed or a
/// certificate was refused (as against a target that cannot be reached).
pub fn is_tls_failure(e: &(dyn std::error::Error + 'static)) -> bool {
    // An I/O error wrapping another (hyper-rustls wraps tokio-rustls's, which wraps
    // rustls's) skips the wrapped one in `source()`: it is followed by `get_ref`.
    let mut at = Some(e);
    let mut steps = 0;
    while let Some(err) = at {
        if err.downcast_ref::<rustls::Error>().is_some() {
            return true;
        }
        steps += 1;
        if steps > 32 {
            return false;
        }
        at = match err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => err.source(),
        };
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_failures_are_told_from_others_through_wrapped_io_errors() {
        use std::io::{Error, ErrorKind};
        let rustls_error =
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let wrapped = Error::other(Error::new(ErrorKind::InvalidData, rustls_error));
        assert!(is_tls_failure(&wrapped));
        let refused = Error::new(ErrorKind::ConnectionRefused, "refused");
        assert!(!is_tls_failure(&refused));
        assert!(!is_tls_failure(&Error::other(refused)));
    }

    #[test]
    fn a_ca_file_is_read_and_bad_ones_are_named() {
        assert!(client_config(None).is_ok());
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        assert!(client_config(Some(&missing))
            .unwrap_err()
            .contains("missing.pem"));
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        assert!(client_config(Some(&empty))
            .unwrap_err()
            .contains("no certificate"));
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let good = dir.path().join("ca.pem");
        std::fs::write(&good, cert.pem()).unwrap();
        assert!(client_config(Some(&good)).is_ok());
    }
}
