//! An audit event and its hash: `hash = SHA-256(prev_hash || canonical)`,
//! where `prev_hash` is the 32 raw bytes of the previous event's hash in the
//! same chain (32 zero bytes before the first) and `canonical` is the
//! canonical JSON of `{"chain","data","kind","seq","ts"}`. The chain name and
//! seq are inside the hash, so a row moved to another place or another chain
//! no longer verifies.

use crate::canonical::{canonical_json, CanonicalError};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

pub type Hash = [u8; 32];

/// `prev_hash` of the first event of every chain.
pub const GENESIS: Hash = [0u8; 32];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// The chain: a session id, or `global`.
    pub chain: String,
    /// 1, 2, 3 ... without gaps, per chain.
    pub seq: u64,
    /// RFC 3339 UTC.
    pub ts: String,
    /// What happened, e.g. `tool_call.recorded`, `egress.denied`.
    pub kind: String,
    pub data: Value,
}

/// An event as a store keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    pub event: Event,
    pub prev_hash: Hash,
    pub hash: Hash,
}

impl Event {
    pub fn canonical(&self) -> Result<String, CanonicalError> {
        canonical_json(&serde_json::json!({
            "chain": self.chain,
            "data": self.data,
            "kind": self.kind,
            "seq": self.seq,
            "ts": self.ts,
        }))
    }

    pub fn hash(&self, prev: &Hash) -> Result<Hash, CanonicalError> {
        let c = self.canonical()?;
        let mut h = Sha256::new();
        h.update(prev);
        h.update(c.as_bytes());
        Ok(h.finalize().into())
    }

    /// Seals the event onto a chain whose head is `prev`.
    pub fn seal(self, prev: Hash) -> Result<StoredEvent, CanonicalError> {
        let hash = self.hash(&prev)?;
        Ok(StoredEvent {
            event: self,
            prev_hash: prev,
            hash,
        })
    }
}

pub fn to_hex(h: &Hash) -> String {
    h.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn from_hex(s: &str) -> Option<Hash> {
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[i * 2..i * 2 + 2], 16).ok()?;
    }
    Some(out)
}

pub fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_hash() {
        let e = Event {
            chain: "ses_1".into(),
            seq: 1,
            ts: "2026-01-01T00:00:00Z".into(),
            kind: "k".into(),
            data: serde_json::json!({"b": 1, "a": "x"}),
        };
        assert_eq!(
            e.canonical().unwrap(),
            r#"{"chain":"ses_1","data":{"a":"x","b":1},"kind":"k","seq":1,"ts":"2026-01-01T00:00:00Z"}"#
        );
        // Computed independently, with Python's hashlib:
        // sha256(b"\0" * 32 + canonical).hexdigest()
        let want =
            from_hex("6a68c503ad02fe9df0dae493a36b9c3417abc0e728c54e5e343c435be68dbec7").unwrap();
        assert_eq!(e.hash(&GENESIS).unwrap(), want);
        assert_eq!(from_hex(&to_hex(&want)), Some(want));
        assert_eq!(from_hex("zz"), None);
    }
}
