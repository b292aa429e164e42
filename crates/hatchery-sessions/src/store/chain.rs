//! The hash chain over each session's events (docs/policy.md, "Audit"):
//! every event row carries `hash = SHA-256(prev_hash || canonical_json(
//! {chain: session id, seq, ts: at, kind: type, data: data + actor}))`,
//! computed in the append's own transaction. hatchery-sessions-schema's
//! audit reader presents the rows in the audit crate's layout, so
//! `hatchery audit verify --db DATA_DIR/hatchery.db` (or the PostgreSQL
//! URL) checks them with no daemon.

use hatchery_audit::event::{from_hex, to_hex};
use hatchery_audit::{Event, GENESIS};
use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    #[error("event chain: {0}")]
    Canonical(String),
}

/// `(prev_hash, hash)` of a new event whose predecessor's hash (hex) is
/// `prev` (None for seq 1 or an unchained predecessor): the backend reads
/// it in its own transaction (store/db.rs).
pub fn seal_after(
    prev: Option<&str>,
    session: &str,
    seq: u64,
    at: &str,
    actor: &str,
    kind: &str,
    data: &str,
) -> Result<(String, String), ChainError> {
    let prev = prev.and_then(from_hex).unwrap_or(GENESIS);
    let canonical = |e: String| ChainError::Canonical(e);
    let mut d: Value = serde_json::from_str(data).map_err(|e| canonical(e.to_string()))?;
    if let Value::Object(m) = &mut d {
        m.insert("actor".into(), Value::String(actor.into()));
    }
    let ev = Event {
        chain: session.to_string(),
        seq,
        ts: at.to_string(),
        kind: kind.to_string(),
        data: d,
    };
    let h = ev.hash(&prev).map_err(|e| canonical(e.to_string()))?;
    Ok((to_hex(&prev), to_hex(&h)))
}
