//! TLS for the calls the host makes on a tenant's behalf: the model
//! gateway to its upstreams, the egress proxy to a destination it
//! intercepts, the broker's `http_fetch` and `open_pr`. One place decides
//! what they trust (a PEM bundle: the system's, or one given for a test or
//! a private CA) and how a name is checked, so none of them can drift into
//! skipping verification. Also the one HTTP/1.1 client exchange those
//! callers share (http.rs) and the check of an operator's URL they send a
//! credential or an anchor to (origin.rs).

pub mod http;
pub mod origin;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls;

/// Debian's bundle of the system's trusted CAs.
pub const SYSTEM_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("CA bundle {}", .0.display())]
    Read(PathBuf, #[source] std::io::Error),
    #[error("CA bundle {}: a certificate", .0.display())]
    Pem(PathBuf, #[source] rustls_pki_types::pem::Error),
    #[error("CA bundle {}: no usable certificate", .0.display())]
    Empty(PathBuf),
    #[error("TLS client configuration")]
    Config(#[source] rustls::Error),
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("{0:?} is not a name or address a certificate can be checked against")]
    Name(String),
    #[error("TLS handshake with {host}")]
    Handshake {
        host: String,
        #[source]
        source: std::io::Error,
    },
}

/// A client configuration trusting exactly the certificates in `bundle`
/// (PEM), speaking HTTP/1.1 by ALPN. Certificates rustls cannot use are
/// skipped (system bundles hold a few); a bundle with none left is an
/// error, not a client that trusts nothing.
pub fn client_config(bundle: &Path) -> Result<Arc<rustls::ClientConfig>, TrustError> {
    let pem = std::fs::read(bundle).map_err(|e| TrustError::Read(bundle.into(), e))?;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(&pem) {
        let c = c.map_err(|e| TrustError::Pem(bundle.into(), e))?;
        let _ = roots.add(c);
    }
    if roots.is_empty() {
        return Err(TrustError::Empty(bundle.into()));
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(TrustError::Config)?
    .with_root_certificates(roots)
    .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// The name a server's certificate must carry: a DNS name or an IP
/// address (brackets of an IPv6 literal removed).
pub fn server_name(host: &str) -> Result<ServerName<'static>, ConnectError> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(bare.to_string()).map_err(|_| ConnectError::Name(host.to_string()))
}

/// TLS over `tcp`, verifying `host`'s certificate against `cfg`'s roots.
pub async fn connect(
    cfg: &Arc<rustls::ClientConfig>,
    host: &str,
    tcp: TcpStream,
) -> Result<TlsStream<TcpStream>, ConnectError> {
    let name = server_name(host)?;
    tokio_rustls::TlsConnector::from(cfg.clone())
        .connect(name, tcp)
        .await
        .map_err(|source| ConnectError::Handshake {
            host: host.to_string(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_without_certificates_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("empty.pem");
        std::fs::write(&p, "not a certificate\n").unwrap();
        assert!(matches!(client_config(&p), Err(TrustError::Empty(_))));
        assert!(matches!(
            client_config(&dir.path().join("missing.pem")),
            Err(TrustError::Read(..))
        ));
    }

    #[test]
    fn a_bundle_with_a_ca_is_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec![]).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = params.self_signed(&key).unwrap();
        let p = dir.path().join("ca.pem");
        std::fs::write(&p, ca.pem()).unwrap();
        let cfg = client_config(&p).unwrap();
        assert_eq!(cfg.alpn_protocols, vec![b"http/1.1".to_vec()]);
    }

    #[test]
    fn names() {
        assert!(server_name("example.com").is_ok());
        assert!(server_name("127.0.0.2").is_ok());
        assert!(server_name("[::1]").is_ok());
        assert!(server_name("bad name").is_err());
    }
}
