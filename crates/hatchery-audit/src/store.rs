//! A SQLite audit log with a documented table layout (docs/policy.md), so
//! `hatchery audit verify --db FILE` and other tools can read it:
//!
//! ```sql
//! CREATE TABLE audit_events (
//!     chain     TEXT NOT NULL,     -- session id, or "global"
//!     seq       INTEGER NOT NULL,  -- 1, 2, ... per chain
//!     ts        TEXT NOT NULL,     -- RFC 3339 UTC
//!     kind      TEXT NOT NULL,
//!     data      TEXT NOT NULL,     -- JSON
//!     prev_hash TEXT NOT NULL,     -- hex, 64 zeros for seq 1
//!     hash      TEXT NOT NULL,     -- hex SHA-256(prev_hash bytes || canonical JSON)
//!     PRIMARY KEY (chain, seq)
//! );
//! ```
//!
//! Appends take the write lock first (`BEGIN IMMEDIATE`), so two writers
//! cannot both extend the same head.

use crate::event::{from_hex, now_rfc3339, to_hex, Event, Hash, StoredEvent, GENESIS};
use crate::verify::{self, Head, Report};
use rusqlite::TransactionBehavior::Immediate;
use rusqlite::{params, Connection, OptionalExtension, Row};
use serde_json::Value;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("database: {0}")]
    Db(#[from] rusqlite::Error),
    #[error("event: {0}")]
    Canonical(#[from] crate::canonical::CanonicalError),
    #[error("invalid {0}: {1}")]
    Invalid(&'static str, String),
    #[error("anchor file {0}: {1}")]
    Anchor(String, std::io::Error),
    #[error("anchoring to the {sink} sink")]
    Sink {
        sink: &'static str,
        #[source]
        source: crate::sink::SinkError,
    },
    /// The store the heads come from failed (another backend than this
    /// crate's SQLite reader).
    #[error("reading chain heads: {0}")]
    Heads(String),
}

/// Caps on what one event may carry (documented; tested at the boundary).
pub const MAX_CHAIN_BYTES: usize = 128;
pub const MAX_KIND_BYTES: usize = 128;
pub const MAX_DATA_BYTES: usize = 64 * 1024;

const MIGRATIONS: &[&str] = &["CREATE TABLE audit_events (
         chain TEXT NOT NULL,
         seq INTEGER NOT NULL,
         ts TEXT NOT NULL,
         kind TEXT NOT NULL,
         data TEXT NOT NULL,
         prev_hash TEXT NOT NULL,
         hash TEXT NOT NULL,
         PRIMARY KEY (chain, seq)
     );"];

pub struct SqliteAuditLog {
    conn: Connection,
}

impl SqliteAuditLog {
    /// Opens (creating) the log and runs pending migrations.
    pub fn open(path: &Path) -> Result<Self, AuditError> {
        let mut conn = Connection::open(path)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        // An event must be on disk before the effect it records happens.
        conn.pragma_update(None, "synchronous", "FULL")?;
        migrate(&mut conn)?;
        Ok(SqliteAuditLog { conn })
    }

    /// Opens an existing file read-only, for verification: it never
    /// creates or migrates anything.
    pub fn open_read_only(path: &Path) -> Result<Self, AuditError> {
        let conn = Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
        Ok(SqliteAuditLog { conn })
    }

    /// Seals and appends one event to `chain`; returns it as stored.
    pub fn append(
        &mut self,
        chain: &str,
        kind: &str,
        data: Value,
    ) -> Result<StoredEvent, AuditError> {
        for (what, v, max) in [
            ("chain", chain, MAX_CHAIN_BYTES),
            ("kind", kind, MAX_KIND_BYTES),
        ] {
            if v.is_empty() || v.len() > max {
                return Err(AuditError::Invalid(what, format!("must be 1–{max} bytes")));
            }
        }
        let data_json =
            serde_json::to_string(&data).map_err(|e| AuditError::Invalid("data", e.to_string()))?;
        if data_json.len() > MAX_DATA_BYTES {
            let over = format!("over {MAX_DATA_BYTES} bytes");
            return Err(AuditError::Invalid("data", over));
        }
        let tx = self.conn.transaction_with_behavior(Immediate)?;
        let sql = "SELECT seq, hash FROM audit_events WHERE chain = ?1 ORDER BY seq DESC LIMIT 1";
        let head = tx.query_row(sql, [chain], |r| Ok((r.get("seq")?, r.get("hash")?)));
        let head: Option<(u64, String)> = head.optional()?;
        let (seq, prev) = match head {
            None => (1, GENESIS),
            Some((seq, h)) => (
                seq + 1,
                from_hex(&h).ok_or_else(|| AuditError::Invalid("stored head hash", h.clone()))?,
            ),
        };
        let stored = Event {
            chain: chain.to_string(),
            seq,
            ts: now_rfc3339(),
            kind: kind.to_string(),
            data,
        }
        .seal(prev)?;
        let sql = "INSERT INTO audit_events (chain, seq, ts, kind, data, prev_hash, hash)
                   VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";
        let (p, h) = (to_hex(&stored.prev_hash), to_hex(&stored.hash));
        let args = params![chain, seq, stored.event.ts, kind, data_json, p, h];
        tx.execute(sql, args)?;
        tx.commit()?;
        Ok(stored)
    }

    pub fn chains(&self) -> Result<Vec<String>, AuditError> {
        let sql = "SELECT DISTINCT chain FROM audit_events ORDER BY chain";
        let mut st = self.conn.prepare(sql)?;
        let rows = st.query_map([], |r| r.get::<_, String>("chain"))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// The latest (seq, hash) of every chain, for anchoring.
    pub fn heads(&self) -> Result<Vec<Head>, AuditError> {
        let sql = "SELECT chain, seq, hash FROM audit_events e
                   WHERE seq = (SELECT MAX(seq) FROM audit_events WHERE chain = e.chain)
                   ORDER BY chain";
        let mut st = self.conn.prepare(sql)?;
        let rows = st.query_map([], |r| {
            let (chain, seq, hash) = (r.get("chain")?, r.get("seq")?, r.get("hash")?);
            Ok(Head { chain, seq, hash })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Verifies one chain, streaming its rows in seq order; with `anchors`,
    /// also checks each anchored head of this chain is still there.
    pub fn verify_chain(&self, chain: &str, anchors: &[Head]) -> Result<Report, AuditError> {
        let sql = "SELECT chain, seq, ts, kind, data, prev_hash, hash FROM audit_events
                   WHERE chain = ?1 ORDER BY seq";
        let mut st = self.conn.prepare(sql)?;
        let rows = st.query_map([chain], read_row)?;
        let mut report = verify::verify(chain, rows)?;
        let sql = "SELECT hash FROM audit_events WHERE chain = ?1 AND seq = ?2";
        let mut lookup = self.conn.prepare(sql)?;
        verify::check_anchors(&mut report, anchors, |seq| {
            let hash = lookup.query_row(params![chain, seq], |r| r.get::<_, String>("hash"));
            hash.ok()
        });
        Ok(report)
    }

    pub fn connection(&self) -> &Connection {
        &self.conn
    }
}

fn migrate(conn: &mut Connection) -> Result<(), AuditError> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS audit_migrations (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)",
    )?;
    let done = "SELECT COALESCE(MAX(version), 0) FROM audit_migrations";
    let done: usize = conn.query_row(done, [], |r| r.get(0))?;
    let record = "INSERT INTO audit_migrations (version, applied_at) VALUES (?1, ?2)";
    for (n, sql) in (1_i64..).zip(MIGRATIONS).skip(done) {
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        tx.execute(record, params![n, now_rfc3339()])?;
        tx.commit()?;
    }
    Ok(())
}

/// A row as the verifier sees it. Damage that makes a row unreadable (data
/// that is not JSON, a hash that is not hex) is kept as a value that cannot
/// verify, so it is reported at its seq instead of aborting the walk.
fn read_row(r: &Row<'_>) -> rusqlite::Result<StoredEvent> {
    let data: String = r.get("data")?;
    let data = serde_json::from_str(&data).unwrap_or(Value::String(format!("<unreadable:{data}>")));
    let hex = |col: &str| -> rusqlite::Result<Hash> {
        let s: String = r.get(col)?;
        // An all-ones value never equals a SHA-256 we computed or GENESIS.
        Ok(from_hex(&s).unwrap_or([0xff; 32]))
    };
    Ok(StoredEvent {
        event: Event {
            chain: r.get("chain")?,
            seq: r.get("seq")?,
            ts: r.get("ts")?,
            kind: r.get("kind")?,
            data,
        },
        prev_hash: hex("prev_hash")?,
        hash: hex("hash")?,
    })
}
