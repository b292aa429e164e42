//! Signed preview tokens: an expiring grant to one port of one sandbox,
//! usable without the API key (`/preview/{token}/...`). Nothing is stored:
//! the token carries the grant and an HMAC-SHA256 over it, keyed by a
//! per-daemon secret (`DATA_DIR/preview_key`, 32 random bytes, 0600,
//! made on first start). Deleting that file and restarting revokes every
//! preview URL ever handed out.
//!
//! The layout is in `hatchery_serve::preview_token` (the router reads the
//! sandbox id from it too):
//!
//! ```text
//! u8 version (1) | u16 BE port | u64 BE expiry (unix seconds) | sandbox id | 32-byte MAC
//! ```
//!
//! The MAC covers a domain tag and every byte before it. Verification
//! checks the MAC (in constant time) before anything else, so a forged or
//! altered token learns nothing, not even whether its sandbox exists.

use hatchery_serve::preview_token::{self as layout, MAC_LEN, VERSION};
use rand::RngCore;
use sha2::{Digest, Sha256};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

const DOMAIN: &[u8] = b"hatchery-preview-v1\0";
pub const KEY_FILE: &str = "preview_key";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PreviewError {
    #[error("preview link is not valid")]
    Invalid,
    #[error("preview link has expired")]
    Expired,
}

/// What a valid token grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreviewGrant {
    pub sandbox_id: String,
    pub port: u16,
    pub expires_at_s: u64,
}

pub struct PreviewKey([u8; 32]);

impl std::fmt::Debug for PreviewKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PreviewKey(..)")
    }
}

impl PreviewKey {
    pub fn from_bytes(b: [u8; 32]) -> Self {
        PreviewKey(b)
    }

    /// The daemon's key from `DATA_DIR/preview_key`, made (0600) if absent.
    pub fn load_or_create(data_dir: &Path) -> std::io::Result<PreviewKey> {
        let path = data_dir.join(KEY_FILE);
        if let Ok(s) = std::fs::read_to_string(&path) {
            if let Some(k) = parse_hex(s.trim()) {
                return Ok(PreviewKey(k));
            }
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}: not 64 hex characters", path.display()),
            ));
        }
        let mut k = [0u8; 32];
        rand::thread_rng().fill_bytes(&mut k);
        let hex: String = k.iter().map(|b| format!("{b:02x}")).collect();
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        f.write_all(hex.as_bytes())?;
        Ok(PreviewKey(k))
    }

    pub fn mint(&self, sandbox_id: &str, port: u16, expires_at_s: u64) -> String {
        let blob = layout::body(port, expires_at_s, sandbox_id);
        let mac = self.mac(&blob);
        layout::encode(blob, &mac)
    }

    pub fn verify(&self, token: &str, now_s: u64) -> Result<PreviewGrant, PreviewError> {
        let raw = layout::decode(token).ok_or(PreviewError::Invalid)?;
        let (blob, mac) = layout::split(&raw);
        if !hatchery_serve::headers::constant_time_eq(&self.mac(blob), mac) {
            return Err(PreviewError::Invalid);
        }
        // Authentic from here on: we wrote it.
        let f = layout::fields(blob).ok_or(PreviewError::Invalid)?;
        if f.version != VERSION || f.port == 0 {
            return Err(PreviewError::Invalid);
        }
        if now_s >= f.expires_at_s {
            return Err(PreviewError::Expired);
        }
        Ok(PreviewGrant {
            sandbox_id: f.sandbox_id.to_string(),
            port: f.port,
            expires_at_s: f.expires_at_s,
        })
    }

    fn mac(&self, blob: &[u8]) -> [u8; MAC_LEN] {
        let mut msg = Vec::with_capacity(DOMAIN.len() + blob.len());
        msg.extend_from_slice(DOMAIN);
        msg.extend_from_slice(blob);
        hmac_sha256(&self.0, &msg)
    }
}

/// HMAC-SHA256 (RFC 2104) for keys up to the 64-byte block size.
fn hmac_sha256(key: &[u8], msg: &[u8]) -> [u8; 32] {
    let mut k = [0u8; 64];
    if key.len() > 64 {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let ipad: Vec<u8> = k.iter().map(|b| b ^ 0x36).collect();
    let opad: Vec<u8> = k.iter().map(|b| b ^ 0x5c).collect();
    let inner = Sha256::new()
        .chain_update(&ipad)
        .chain_update(msg)
        .finalize();
    Sha256::new()
        .chain_update(&opad)
        .chain_update(inner)
        .finalize()
        .into()
}

fn parse_hex(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;

    #[test]
    fn hmac_matches_rfc4231() {
        // Test case 2.
        let mac = hmac_sha256(b"Jefe", b"what do ya want for nothing?");
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn tokens_verify_expire_and_resist_tampering() {
        let k = PreviewKey::from_bytes([7; 32]);
        let t = k.mint("sbx_abcdefghijklmnop", 8000, 1_000);
        assert!(t
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        let g = k.verify(&t, 999).unwrap();
        assert_eq!(
            (g.sandbox_id.as_str(), g.port, g.expires_at_s),
            ("sbx_abcdefghijklmnop", 8000, 1_000)
        );
        assert_eq!(k.verify(&t, 1_000), Err(PreviewError::Expired));
        // Another key, a flipped bit anywhere, a truncation: all invalid.
        let other = PreviewKey::from_bytes([8; 32]);
        assert_eq!(other.verify(&t, 0), Err(PreviewError::Invalid));
        let mut raw = URL_SAFE_NO_PAD.decode(&t).unwrap();
        for i in 0..raw.len() {
            raw[i] ^= 1;
            let bad = URL_SAFE_NO_PAD.encode(&raw);
            assert_eq!(k.verify(&bad, 0), Err(PreviewError::Invalid), "byte {i}");
            raw[i] ^= 1;
        }
        assert_eq!(k.verify(&t[..t.len() - 2], 0), Err(PreviewError::Invalid));
        assert_eq!(k.verify("", 0), Err(PreviewError::Invalid));
        assert_eq!(k.verify("not base64!", 0), Err(PreviewError::Invalid));
        // A grant for another port or sandbox is a different token.
        assert_ne!(k.mint("sbx_abcdefghijklmnop", 8001, 1_000), t);
    }

    #[test]
    fn key_file_is_made_once_0600() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("hx-pk-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let a = PreviewKey::load_or_create(&dir).unwrap();
        let b = PreviewKey::load_or_create(&dir).unwrap();
        assert_eq!(a.0, b.0);
        let mode = std::fs::metadata(dir.join(KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
