//! The deployment's interception CA: made at first start in a directory of
//! the data dir (`ca.pem` world-readable, it goes into every session
//! sandbox; `ca.key` 0600, it never leaves the host), and leaf certificates
//! minted from it per host, cached.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio_rustls::rustls;

/// Leaf certificates kept at once (a new host past this empties the cache).
pub const MAX_CACHED_LEAVES: usize = 1024;
/// A leaf's validity: from an hour ago (clock skew) to this many days on.
const LEAF_DAYS: i64 = 7;

#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("egress CA file {}", .0.display())]
    Io(PathBuf, #[source] std::io::Error),
    #[error("egress CA key {} has mode {:o}; it must be readable by its owner only", .0.display(), .1)]
    Mode(PathBuf, u32),
    #[error("egress CA certificate")]
    Cert(#[source] rcgen::Error),
    #[error("egress CA: a TLS configuration for {0}")]
    Tls(String, #[source] rustls::Error),
    #[error("the trust for intercepted upstreams")]
    Trust(#[from] hatchery_tls::TrustError),
}

pub struct Ca {
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    /// The CA as rcgen signs with it: its subject and key identifier are
    /// fixed, so leaves it signs chain to `cert_pem`.
    issuer: rcgen::Certificate,
    key: KeyPair,
    leaves: Mutex<HashMap<String, Arc<rustls::ServerConfig>>>,
}

fn ca_params() -> CertificateParams {
    let mut p = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "Hatchery egress credential proxy CA");
    dn.push(DnType::OrganizationName, "Hatchery");
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let now = time::OffsetDateTime::now_utc();
    p.not_before = now - time::Duration::days(1);
    p.not_after = now + time::Duration::days(3650);
    p
}

impl Ca {
    /// Loads the CA in `dir`, or makes it (the directory 0700, the key 0600).
    pub fn load_or_create(dir: &Path) -> Result<Ca, CaError> {
        let io = |p: &Path| {
            let p = p.to_path_buf();
            move |e| CaError::Io(p, e)
        };
        let (cert_path, key_path) = (dir.join("ca.pem"), dir.join("ca.key"));
        if !key_path.exists() {
            std::fs::create_dir_all(dir).map_err(io(dir))?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(io(dir))?;
            let key = KeyPair::generate().map_err(CaError::Cert)?;
            let cert = ca_params().self_signed(&key).map_err(CaError::Cert)?;
            // The certificate first: a key without its certificate is
            // made again; a certificate without its key is overwritten.
            std::fs::write(&cert_path, cert.pem()).map_err(io(&cert_path))?;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&key_path)
                .map_err(io(&key_path))?;
            f.write_all(key.serialize_pem().as_bytes())
                .and_then(|_| f.sync_all())
                .map_err(io(&key_path))?;
            tracing::info!(cert = %cert_path.display(), "egress CA created");
        }
        let mode = std::fs::metadata(&key_path)
            .map_err(io(&key_path))?
            .permissions()
            .mode()
            & 0o777;
        if mode & 0o077 != 0 {
            return Err(CaError::Mode(key_path, mode));
        }
        let key_pem =
            zeroize::Zeroizing::new(std::fs::read_to_string(&key_path).map_err(io(&key_path))?);
        let key = KeyPair::from_pem(&key_pem).map_err(CaError::Cert)?;
        let cert_pem = std::fs::read_to_string(&cert_path).map_err(io(&cert_path))?;
        let cert_der = {
            use rustls_pki_types::pem::PemObject;
            CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(|e| {
                CaError::Io(
                    cert_path.clone(),
                    std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()),
                )
            })?
        };
        let issuer = ca_params().self_signed(&key).map_err(CaError::Cert)?;
        Ok(Ca {
            cert_pem,
            cert_der,
            issuer,
            key,
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The certificate (PEM) session sandboxes trust.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The TLS server side the guest sees for `host` (a name or an IP
    /// literal): a leaf for it signed by this CA, cached.
    pub fn server_config(&self, host: &str) -> Result<Arc<rustls::ServerConfig>, CaError> {
        if let Some(c) = self.lock().get(host) {
            return Ok(c.clone());
        }
        let leaf_key = KeyPair::generate().map_err(CaError::Cert)?;
        let mut p = CertificateParams::new(vec![host.to_string()]).map_err(CaError::Cert)?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, host);
        p.distinguished_name = dn;
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.use_authority_key_identifier_extension = true;
        let now = time::OffsetDateTime::now_utc();
        p.not_before = now - time::Duration::hours(1);
        p.not_after = now + time::Duration::days(LEAF_DAYS);
        let leaf = p
            .signed_by(&leaf_key, &self.issuer, &self.key)
            .map_err(CaError::Cert)?;
        let chain = vec![leaf.der().clone(), self.cert_der.clone()];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
        let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| CaError::Tls(host.into(), e))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| CaError::Tls(host.into(), e))?;
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        let cfg = Arc::new(cfg);
        let mut m = self.lock();
        if m.len() >= MAX_CACHED_LEAVES {
            m.clear();
        }
        m.insert(host.to_string(), cfg.clone());
        Ok(cfg)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<rustls::ServerConfig>>> {
        self.leaves.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The client side towards real upstreams: the certificates of `bundle`
/// (PEM; the host's trust store by default, a test CA in tests).
pub fn upstream_config(bundle: &Path) -> Result<Arc<rustls::ClientConfig>, CaError> {
    Ok(hatchery_tls::client_config(bundle)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_once_key_private_leaves_cached() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("ca");
        let a = Ca::load_or_create(&d).unwrap();
        let mode = std::fs::metadata(d.join("ca.key"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
        let b = Ca::load_or_create(&d).unwrap();
        assert_eq!(a.cert_pem(), b.cert_pem());
        assert!(!a.cert_pem().contains("PRIVATE KEY"));
        let l1 = a.server_config("api.example.com").unwrap();
        let l2 = a.server_config("api.example.com").unwrap();
        assert!(Arc::ptr_eq(&l1, &l2));
        a.server_config("127.0.0.2").unwrap();
        std::fs::set_permissions(d.join("ca.key"), std::fs::Permissions::from_mode(0o640)).unwrap();
        assert!(matches!(Ca::load_or_create(&d), Err(CaError::Mode(..))));
    }
}
