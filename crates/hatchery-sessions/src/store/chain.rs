//! The hash chain over each session's events (docs/policy.md, "Audit"):
//! every event row carries `hash = SHA-256(prev_hash || canonical_json(
//! {chain: session id, seq, ts: at, kind: type, data: data + actor}))`,
//! computed in the append's own transaction. The `audit_events` view
//! presents the rows in the audit crate's layout, so `hatchery audit
//! verify --db DATA_DIR/sessions.db` checks them with no daemon.

use hatchery_audit::event::{from_hex, to_hex};
use hatchery_audit::{Event, GENESIS};
use rusqlite::{params, OptionalExtension, Transaction};
use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    #[error("event chain: {0}")]
    Db(#[from] rusqlite::Error),
    #[error("event chain: {0}")]
    Canonical(String),
}

/// `(prev_hash, hash)` of a new event, hex, given its row fields.
pub fn seal(
    tx: &Transaction,
    session: &str,
    seq: u64,
    at: &str,
    actor: &str,
    kind: &str,
    data: &str,
) -> Result<(String, String), ChainError> {
    let prev: Option<Option<String>> = if seq <= 1 {
        None
    } else {
        tx.query_row(
            "SELECT hash FROM events WHERE session_id = ?1 AND seq = ?2",
            params![session, seq - 1],
            |r| r.get("hash"),
        )
        .optional()?
    };
    seal_after(
        prev.flatten().as_deref(),
        session,
        seq,
        at,
        actor,
        kind,
        data,
    )
}

/// `(prev_hash, hash)` of a new event whose predecessor's hash (hex) is
/// `prev` (None for seq 1 or an unchained predecessor): the backend reads
/// it in its own transaction.
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
    let h = hash(session, seq, at, actor, kind, data, &prev)?;
    Ok((to_hex(&prev), h))
}

fn hash(
    session: &str,
    seq: u64,
    at: &str,
    actor: &str,
    kind: &str,
    data: &str,
    prev: &hatchery_audit::Hash,
) -> Result<String, ChainError> {
    let mut d: Value =
        serde_json::from_str(data).map_err(|e| ChainError::Canonical(e.to_string()))?;
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
    ev.hash(prev)
        .map(|h| to_hex(&h))
        .map_err(|e| ChainError::Canonical(e.to_string()))
}

/// Chains rows written before the chain existed (migration 2), in seq
/// order per session, in one transaction.
pub fn backfill(conn: &mut rusqlite::Connection) -> Result<usize, ChainError> {
    let tx = conn.transaction()?;
    let sessions: Vec<String> = {
        let mut st = tx.prepare("SELECT DISTINCT session_id FROM events WHERE hash IS NULL")?;
        let rows = st.query_map([], |r| r.get::<_, String>("session_id"))?;
        rows.collect::<Result<_, _>>()?
    };
    let mut n = 0;
    for s in sessions {
        let rows: Vec<(u64, String, String, String, String)> = {
            let mut st = tx.prepare(
                "SELECT seq, at, actor, type, data FROM events WHERE session_id = ?1 ORDER BY seq",
            )?;
            let rows = st.query_map([&s], |r| {
                Ok((
                    r.get("seq")?,
                    r.get("at")?,
                    r.get("actor")?,
                    r.get("type")?,
                    r.get("data")?,
                ))
            })?;
            rows.collect::<Result<_, _>>()?
        };
        let mut prev = GENESIS;
        for (seq, at, actor, kind, data) in rows {
            let h = hash(&s, seq, &at, &actor, &kind, &data, &prev)?;
            tx.execute(
                "UPDATE events SET prev_hash = ?3, hash = ?4 WHERE session_id = ?1 AND seq = ?2",
                params![s, seq, to_hex(&prev), h],
            )?;
            prev = from_hex(&h).unwrap_or(GENESIS);
            n += 1;
        }
    }
    tx.commit()?;
    Ok(n)
}
