//! `hatchery audit verify` on the deployment's database (the SQLite file
//! or PostgreSQL): the session event logs read in hatchery-audit's layout
//! (the session id as the chain, the actor folded into the data), so the
//! same verifier recomputes every chain. Read-only: no migration runs,
//! and on PostgreSQL the server refuses any write on these connections.

use crate::SCHEMA;
use hatchery_audit::event::from_hex;
use hatchery_audit::{verify, Event, Head, Report, StoredEvent};
use hatchery_db::{args, Db, DbError, Row};
use serde_json::Value;
use std::path::Path;

/// Rows read per query while verifying one chain.
const PAGE: i64 = 1000;

#[derive(Debug, thiserror::Error)]
pub enum AuditReadError {
    #[error("{0}: no such file")]
    NoFile(String),
    #[error(transparent)]
    Schema(#[from] hatchery_db::MigrateError),
    #[error("reading the session events")]
    Read(#[from] DbError),
}

/// Reads the session event logs of a database, read-only.
pub struct AuditReader {
    db: Db,
}

impl AuditReader {
    /// Opens `address` (a `postgres://` URL or a SQLite file that must
    /// exist) for reading the logs only. A database without the sessions
    /// schema, or with a newer one than this build knows, is a clear error
    /// rather than an empty report.
    pub async fn open(address: &str) -> Result<Self, AuditReadError> {
        let db = if hatchery_db::is_postgres(address) {
            Db::postgres_read_only(address, 2)?
        } else {
            let path = Path::new(address);
            if !path.exists() {
                return Err(AuditReadError::NoFile(address.into()));
            }
            Db::sqlite(path).await?
        };
        Self::on(db).await
    }

    /// The same on an open database.
    pub async fn on(db: Db) -> Result<Self, AuditReadError> {
        SCHEMA.check(&db).await?;
        Ok(AuditReader { db })
    }

    /// Every session id with events, in order.
    pub async fn chains(&self) -> Result<Vec<String>, AuditReadError> {
        let sql = "SELECT DISTINCT session_id FROM session_events ORDER BY session_id";
        let rows = self.db.query(sql, args![]).await?;
        rows.iter().map(|r| Ok(r.get("session_id")?)).collect()
    }

    /// Recomputes the chain of session `chain` (in pages, in seq order, in
    /// one snapshot) and checks that each of `anchors` for it is still
    /// there.
    pub async fn verify(&self, chain: &str, anchors: &[Head]) -> Result<Report, AuditReadError> {
        let mut tx = self.db.read().await?;
        let mut events = Vec::new();
        // Each seq's stored hash, for the anchor check (read once, here).
        let mut by_seq = std::collections::HashMap::new();
        let mut after = 0i64;
        loop {
            let rows = tx
                .query(
                    "SELECT seq, at, type, actor, data, prev_hash, hash FROM session_events \
                     WHERE session_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
                    args![chain, after, PAGE],
                )
                .await?;
            let Some(last) = rows.last() else { break };
            after = last.get("seq")?;
            for r in &rows {
                by_seq.insert(r.get::<i64>("seq")?, r.get::<String>("hash")?);
                events.push(stored(chain, r).map_err(AuditReadError::Read));
            }
            if (rows.len() as i64) < PAGE {
                break;
            }
        }
        tx.commit().await?;
        let mut report = verify(chain, events)?;
        hatchery_audit::verify::check_anchors(&mut report, anchors, |seq| {
            by_seq.get(&(seq as i64)).cloned()
        });
        Ok(report)
    }
}

/// One row as the audit layout has it. Damage that makes a row unreadable
/// (data that is not JSON, a hash that is not hex) is kept as a value
/// that cannot verify, so it is reported at its seq.
fn stored(chain: &str, r: &Row) -> Result<StoredEvent, DbError> {
    let raw: String = r.get("data")?;
    let mut data =
        serde_json::from_str(&raw).unwrap_or(Value::String(format!("<unreadable:{raw}>")));
    if let Value::Object(m) = &mut data {
        m.insert("actor".into(), Value::String(r.get("actor")?));
    }
    let hex = |col: &str| -> Result<hatchery_audit::Hash, DbError> {
        let s: String = r.get(col)?;
        // An all-ones value never equals a SHA-256 we computed or GENESIS.
        Ok(from_hex(&s).unwrap_or([0xff; 32]))
    };
    Ok(StoredEvent {
        event: Event {
            chain: chain.to_string(),
            seq: r.get("seq")?,
            ts: r.get("at")?,
            kind: r.get("type")?,
            data,
        },
        prev_hash: hex("prev_hash")?,
        hash: hex("hash")?,
    })
}
