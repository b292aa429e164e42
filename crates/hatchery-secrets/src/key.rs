//! The sealing key: 32 random bytes in a file of its own (by default
//! `DATA_DIR/secrets.key`), made with mode 0600 at first start. It is kept
//! out of the database so that a database dump or backup alone opens
//! nothing; an operator backs it up separately (docs/operations.md).

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use zeroize::Zeroizing;

pub const KEY_BYTES: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("secrets key file {}", .0.display())]
    Io(PathBuf, #[source] std::io::Error),
    #[error("secrets key file {} is {} bytes; it must be exactly {KEY_BYTES}", .0.display(), .1)]
    Length(PathBuf, usize),
    #[error("secrets key file {} has mode {:o}; it must be readable by its owner only (chmod 600)", .0.display(), .1)]
    Mode(PathBuf, u32),
}

/// The key, zeroed when dropped.
pub struct SecretKey {
    bytes: Zeroizing<[u8; KEY_BYTES]>,
}

impl SecretKey {
    /// Reads the key at `path`, or makes it (0600, created exclusively, so
    /// two daemons starting at once agree on one key) if there is none.
    pub fn load_or_create(path: &Path) -> Result<SecretKey, KeyError> {
        let io = |e| KeyError::Io(path.to_path_buf(), e);
        match std::fs::metadata(path) {
            Ok(m) => {
                let mode = m.permissions().mode() & 0o777;
                if mode & 0o077 != 0 {
                    return Err(KeyError::Mode(path.to_path_buf(), mode));
                }
                let raw = Zeroizing::new(std::fs::read(path).map_err(io)?);
                if raw.len() != KEY_BYTES {
                    return Err(KeyError::Length(path.to_path_buf(), raw.len()));
                }
                let mut bytes = Zeroizing::new([0u8; KEY_BYTES]);
                bytes.copy_from_slice(&raw);
                Ok(SecretKey { bytes })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut bytes = Zeroizing::new([0u8; KEY_BYTES]);
                rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut bytes[..]);
                let made = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(path);
                match made {
                    Ok(mut f) => {
                        f.write_all(&bytes[..]).map_err(io)?;
                        f.sync_all().map_err(io)?;
                        tracing::info!(path = %path.display(), "secrets key created");
                        Ok(SecretKey { bytes })
                    }
                    // Another daemon made it first: use that one.
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                        Self::load_or_create(path)
                    }
                    Err(e) => Err(io(e)),
                }
            }
            Err(e) => Err(io(e)),
        }
    }

    /// A key for tests.
    pub fn from_bytes(b: [u8; KEY_BYTES]) -> SecretKey {
        SecretKey {
            bytes: Zeroizing::new(b),
        }
    }

    pub(crate) fn bytes(&self) -> &[u8; KEY_BYTES] {
        &self.bytes
    }

    /// A short public fingerprint stored with each value, so a value sealed
    /// under another key is reported as such rather than as corrupt.
    pub fn id(&self) -> String {
        use sha2::{Digest, Sha256};
        let d = Sha256::digest([b"hatchery-secrets-key-id:".as_slice(), &self.bytes[..]].concat());
        d[..8].iter().map(|b| format!("{b:02x}")).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_once_with_0600_and_refused_when_loose() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("secrets.key");
        let a = SecretKey::load_or_create(&p).unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let b = SecretKey::load_or_create(&p).unwrap();
        assert_eq!(a.id(), b.id());
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            SecretKey::load_or_create(&p),
            Err(KeyError::Mode(_, 0o644))
        ));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&p, b"short").unwrap();
        assert!(matches!(
            SecretKey::load_or_create(&p),
            Err(KeyError::Length(_, 5))
        ));
    }
}
