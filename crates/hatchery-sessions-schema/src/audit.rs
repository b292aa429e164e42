//! `hatchery audit verify` on PostgreSQL: the session event logs read in
//! hatchery-audit's layout (what the SQLite store's `audit_events` view
//! gives: the session id as the chain, the actor folded into the data),
//! so the same verifier recomputes every chain. Read-only.

use crate::SCHEMA;
use hatchery_audit::event::from_hex;
use hatchery_audit::{verify, Event, Head, Report, StoredEvent};
use serde_json::Value;

/// Rows read from the server per query while verifying one chain.
const PAGE: i64 = 1000;

#[derive(Debug, thiserror::Error)]
pub enum AuditReadError {
    #[error(transparent)]
    Config(#[from] hatchery_store::PoolConfigError),
    #[error("connecting to the database")]
    Connect(#[source] deadpool_postgres::PoolError),
    #[error(transparent)]
    Schema(#[from] hatchery_store::MigrateError),
    #[error("reading the session events")]
    Read(#[source] tokio_postgres::Error),
}

/// Reads the session event logs of a shared database, read-only.
pub struct PgAuditReader {
    pool: deadpool_postgres::Pool,
}

impl PgAuditReader {
    /// Opens the shared database for reading the logs only: no migration
    /// is run (the server refuses any write on these connections), and a
    /// database without the sessions schema, or with a newer one than
    /// this build knows, is a clear error rather than an empty report.
    pub async fn open(dsn: &str) -> Result<Self, AuditReadError> {
        let pool = hatchery_store::pg_pool_read_only(dsn, 2)?;
        let r = PgAuditReader { pool };
        SCHEMA.check(&r.client().await?).await?;
        Ok(r)
    }

    async fn client(&self) -> Result<deadpool_postgres::Client, AuditReadError> {
        self.pool.get().await.map_err(AuditReadError::Connect)
    }

    /// Every session id with events, in order.
    pub async fn chains(&self) -> Result<Vec<String>, AuditReadError> {
        let rows = self
            .client()
            .await?
            .query(
                "SELECT DISTINCT session_id FROM session_events ORDER BY session_id",
                &[],
            )
            .await
            .map_err(AuditReadError::Read)?;
        rows.iter()
            .map(|r| r.try_get("session_id").map_err(AuditReadError::Read))
            .collect()
    }

    /// Recomputes the chain of session `chain` (in pages, in seq order)
    /// and checks that each of `anchors` for it is still there.
    pub async fn verify(&self, chain: &str, anchors: &[Head]) -> Result<Report, AuditReadError> {
        let c = self.client().await?;
        let be = AuditReadError::Read;
        let mut events = Vec::new();
        // Each seq's stored hash, for the anchor check (read once, here).
        let mut by_seq = std::collections::HashMap::new();
        let mut after = 0i64;
        loop {
            let rows = c
                .query(
                    "SELECT seq, at, type, actor, data, prev_hash, hash FROM session_events \
                     WHERE session_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
                    &[
                        &chain as &(dyn tokio_postgres::types::ToSql + Sync),
                        &after,
                        &PAGE,
                    ],
                )
                .await
                .map_err(be)?;
            let Some(last) = rows.last() else { break };
            after = last.try_get("seq").map_err(be)?;
            for r in &rows {
                let seq: i64 = r.try_get("seq").map_err(be)?;
                by_seq.insert(seq, r.try_get::<_, String>("hash").map_err(be)?);
                events.push(stored(chain, r).map_err(be));
            }
            if (rows.len() as i64) < PAGE {
                break;
            }
        }
        let mut report = verify(chain, events)?;
        hatchery_audit::verify::check_anchors(&mut report, anchors, |seq| {
            by_seq.get(&(seq as i64)).cloned()
        });
        Ok(report)
    }
}

/// One row as the audit layout has it.
fn stored(chain: &str, r: &tokio_postgres::Row) -> Result<StoredEvent, tokio_postgres::Error> {
    let raw: String = r.try_get("data")?;
    let mut data =
        serde_json::from_str(&raw).unwrap_or(Value::String(format!("<unreadable:{raw}>")));
    if let Value::Object(m) = &mut data {
        m.insert("actor".into(), Value::String(r.try_get("actor")?));
    }
    let hex = |col: &str| -> Result<hatchery_audit::Hash, tokio_postgres::Error> {
        let s: String = r.try_get(col)?;
        // An all-ones value never equals a SHA-256 we computed or GENESIS.
        Ok(from_hex(&s).unwrap_or([0xff; 32]))
    };
    Ok(StoredEvent {
        event: Event {
            chain: chain.to_string(),
            seq: r.try_get::<_, i64>("seq")? as u64,
            ts: r.try_get("at")?,
            kind: r.try_get("type")?,
            data,
        },
        prev_hash: hex("prev_hash")?,
        hash: hex("hash")?,
    })
}
