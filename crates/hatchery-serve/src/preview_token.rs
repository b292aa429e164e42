//! The layout of a preview token (`/preview/{token}/...`), in one place:
//! hatchery-core's `preview.rs` mints and verifies tokens (the MAC and
//! its key live there), and a control plane or another host reads the
//! sandbox id out of one, unverified, to send the request to the host that
//! owns the sandbox, which then verifies it.
//!
//! Before URL-safe base64 (no padding):
//!
//! ```text
//! u8 version (1) | u16 BE port | u64 BE expiry (unix seconds) | sandbox id | 32-byte MAC
//! ```

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;

pub const VERSION: u8 = 1;
pub const MAC_LEN: usize = 32;
/// Version, port and expiry.
const HEAD_LEN: usize = 11;
/// Longest token accepted; real ones are about 85 characters.
pub const MAX_TOKEN: usize = 256;

/// The fields before the MAC. Whether they can be trusted depends on who
/// checked the MAC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fields<'a> {
    pub version: u8,
    pub port: u16,
    pub expires_at_s: u64,
    pub sandbox_id: &'a str,
}

/// The signed part of a token: everything before the MAC.
pub fn body(port: u16, expires_at_s: u64, sandbox_id: &str) -> Vec<u8> {
    let mut blob = Vec::with_capacity(HEAD_LEN + sandbox_id.len() + MAC_LEN);
    blob.push(VERSION);
    blob.extend_from_slice(&port.to_be_bytes());
    blob.extend_from_slice(&expires_at_s.to_be_bytes());
    blob.extend_from_slice(sandbox_id.as_bytes());
    blob
}

/// The token of a body and its MAC.
pub fn encode(mut blob: Vec<u8>, mac: &[u8; MAC_LEN]) -> String {
    blob.extend_from_slice(mac);
    URL_SAFE_NO_PAD.encode(blob)
}

/// A token's bytes, or None when it is too long, not base64, or too short
/// to hold a head, a one-byte id and a MAC.
pub fn decode(token: &str) -> Option<Vec<u8>> {
    if token.len() > MAX_TOKEN {
        return None;
    }
    let raw = URL_SAFE_NO_PAD.decode(token).ok()?;
    (raw.len() > HEAD_LEN + MAC_LEN).then_some(raw)
}

/// Splits decoded bytes into the signed body and the MAC.
pub fn split(raw: &[u8]) -> (&[u8], &[u8]) {
    raw.split_at(raw.len().saturating_sub(MAC_LEN))
}

/// The fields of a body (not checked against its MAC).
pub fn fields(blob: &[u8]) -> Option<Fields<'_>> {
    if blob.len() <= HEAD_LEN {
        return None;
    }
    Some(Fields {
        version: blob[0],
        port: u16::from_be_bytes([blob[1], blob[2]]),
        expires_at_s: u64::from_be_bytes(blob[3..HEAD_LEN].try_into().ok()?),
        sandbox_id: std::str::from_utf8(&blob[HEAD_LEN..]).ok()?,
    })
}

/// The sandbox a token names, read without verifying it: only for
/// choosing where to send the request, whose owner verifies it.
pub fn sandbox_unverified(token: &str) -> Option<String> {
    grant_unverified(token).map(|(id, _)| id)
}

/// The sandbox and port a token names, read without verifying it: only
/// for choosing where to send the request (which host, which preview
/// host name), whose owner verifies it.
pub fn grant_unverified(token: &str) -> Option<(String, u16)> {
    let raw = decode(token)?;
    let f = fields(split(&raw).0)?;
    (f.version == VERSION).then(|| (f.sandbox_id.to_string(), f.port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_round_trips_and_its_sandbox_is_read() {
        let t = encode(body(8000, 1_000, "sbx_abc"), &[9; MAC_LEN]);
        let raw = decode(&t).unwrap();
        let (blob, mac) = split(&raw);
        assert_eq!(mac, &[9; MAC_LEN]);
        assert_eq!(
            fields(blob).unwrap(),
            Fields {
                version: VERSION,
                port: 8000,
                expires_at_s: 1_000,
                sandbox_id: "sbx_abc"
            }
        );
        assert_eq!(sandbox_unverified(&t).as_deref(), Some("sbx_abc"));
        assert_eq!(grant_unverified(&t), Some(("sbx_abc".into(), 8000)));
    }

    #[test]
    fn malformed_tokens_name_no_sandbox() {
        let mut wrong_version = body(80, 1, "sbx");
        wrong_version[0] = 2;
        let too_long = "A".repeat(MAX_TOKEN + 1);
        for t in [
            "".to_string(),
            "not base64!".to_string(),
            encode(body(80, 1, ""), &[0; MAC_LEN]),
            encode(wrong_version, &[0; MAC_LEN]),
            URL_SAFE_NO_PAD.encode([1u8; 20]),
            too_long,
        ] {
            assert_eq!(sandbox_unverified(&t), None, "{t}");
        }
    }
}
