//! The runs table (SQLite): one row per request to /playground/run, refused
//! or not. Client IPs are stored only as a salted hash. Rows are written by
//! one thread from a bounded queue, so a flood of refusals never blocks a
//! request; if the queue is full, the row is dropped and counted.

use rusqlite::{params, Connection, OptionalExtension};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[derive(Debug, thiserror::Error)]
pub enum RunsError {
    #[error("runs table: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("runs table: {0}")]
    Io(#[from] std::io::Error),
}

const SCHEMA: &str = "
PRAGMA journal_mode=WAL;
PRAGMA synchronous=NORMAL;
CREATE TABLE IF NOT EXISTS runs (
    run_id      TEXT PRIMARY KEY,
    time        TEXT NOT NULL,
    ts_ms       INTEGER NOT NULL,
    ip_hash     TEXT NOT NULL,
    template    TEXT,
    duration_ms INTEGER,
    exit_code   INTEGER,
    bytes_out   INTEGER NOT NULL DEFAULT 0,
    cached      INTEGER NOT NULL DEFAULT 0,
    refused     TEXT,
    outcome     TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_ts ON runs(ts_ms);
";

/// What became of a request: `ok`, `timeout`, `truncated`, `error`,
/// `disconnected` or `refused` (then `refused` holds the reason).
#[derive(Debug, Clone)]
pub struct Run {
    pub run_id: String,
    pub at: SystemTime,
    pub ip_hash: String,
    pub template: Option<String>,
    pub duration_ms: Option<u64>,
    pub exit_code: Option<i32>,
    pub bytes_out: u64,
    pub cached: bool,
    pub refused: Option<&'static str>,
    pub outcome: &'static str,
}

#[derive(Debug, Serialize, PartialEq)]
pub struct Stats {
    pub window_seconds: u64,
    pub requests: u64,
    pub ran: u64,
    pub cached: u64,
    pub refused: BTreeMap<String, u64>,
    pub outcomes: BTreeMap<String, u64>,
    pub unique_clients: u64,
    pub bytes_out: u64,
    pub cache_hit_ratio: f64,
    pub duration_ms_p50: Option<u64>,
    pub duration_ms_p99: Option<u64>,
    pub dropped_rows: u64,
}

pub struct Runs {
    tx: SyncSender<Run>,
    reader: Arc<Mutex<Connection>>,
    salt: String,
    dropped: Arc<AtomicU64>,
}

fn open(path: &Path) -> Result<Connection, RunsError> {
    let c = Connection::open(path)?;
    c.busy_timeout(Duration::from_secs(5))?;
    c.execute_batch(SCHEMA)?;
    Ok(c)
}

fn ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as i64
}

impl Runs {
    pub fn open(path: &Path, salt: String, retention: Duration) -> Result<Runs, RunsError> {
        let writer = open(path)?;
        let reader = open(path)?;
        let (tx, rx) = sync_channel(10_000);
        std::thread::Builder::new()
            .name("runs-writer".into())
            .spawn(move || write_loop(writer, rx, retention))?;
        Ok(Runs {
            tx,
            reader: Arc::new(Mutex::new(reader)),
            salt,
            dropped: Arc::new(AtomicU64::new(0)),
        })
    }

    pub fn ip_hash(&self, ip: IpAddr) -> String {
        let mut h = Sha256::new();
        h.update(self.salt.as_bytes());
        h.update([0]);
        h.update(ip.to_string().as_bytes());
        h.finalize()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    pub fn record(&self, run: Run) {
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = self.tx.try_send(run) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub async fn stats(&self, window: Duration) -> Result<Stats, RunsError> {
        let reader = self.reader.clone();
        let dropped = self.dropped.load(Ordering::Relaxed);
        tokio::task::spawn_blocking(move || {
            let c = reader.lock().unwrap_or_else(|e| e.into_inner());
            stats(&c, window, dropped)
        })
        .await
        .map_err(|e| RunsError::Io(std::io::Error::other(e)))?
    }
}

fn write_loop(c: Connection, rx: Receiver<Run>, retention: Duration) {
    let mut since_prune = 0u32;
    while let Ok(first) = rx.recv() {
        // Batch whatever is queued into one transaction.
        let mut batch = vec![first];
        while let Ok(r) = rx.try_recv() {
            batch.push(r);
            if batch.len() >= 500 {
                break;
            }
        }
        since_prune += batch.len() as u32;
        if let Err(e) = insert(&c, &batch) {
            tracing::error!(error = %e, rows = batch.len(), "runs table write failed");
        }
        if since_prune >= 1000 {
            since_prune = 0;
            let cutoff = ms(SystemTime::now()) - retention.as_millis() as i64;
            if let Err(e) = c.execute("DELETE FROM runs WHERE ts_ms < ?1", [cutoff]) {
                tracing::error!(error = %e, "runs table prune failed");
            }
        }
    }
}

fn insert(c: &Connection, batch: &[Run]) -> Result<(), rusqlite::Error> {
    let tx = c.unchecked_transaction()?;
    {
        let mut st = tx.prepare_cached(
            "INSERT OR REPLACE INTO runs (run_id, time, ts_ms, ip_hash, template, duration_ms, exit_code,
             bytes_out, cached, refused, outcome) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11)",
        )?;
        for r in batch {
            let time = time::OffsetDateTime::from(r.at)
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default();
            st.execute(params![
                r.run_id,
                time,
                ms(r.at),
                r.ip_hash,
                r.template,
                r.duration_ms.map(|d| d as i64),
                r.exit_code,
                r.bytes_out as i64,
                r.cached,
                r.refused,
                r.outcome
            ])?;
        }
    }
    tx.commit()
}

fn stats(c: &Connection, window: Duration, dropped: u64) -> Result<Stats, RunsError> {
    let since = ms(SystemTime::now()) - window.as_millis() as i64;
    let count = |sql: &str| -> Result<u64, rusqlite::Error> {
        c.query_row(sql, [since], |r| r.get::<_, i64>(0))
            .map(|n| n as u64)
    };
    let requests = count("SELECT COUNT(*) FROM runs WHERE ts_ms >= ?1")?;
    let cached = count("SELECT COUNT(*) FROM runs WHERE ts_ms >= ?1 AND cached = 1")?;
    let ran =
        count("SELECT COUNT(*) FROM runs WHERE ts_ms >= ?1 AND cached = 0 AND refused IS NULL")?;
    let unique_clients = count("SELECT COUNT(DISTINCT ip_hash) FROM runs WHERE ts_ms >= ?1")?;
    let bytes_out = count("SELECT COALESCE(SUM(bytes_out), 0) FROM runs WHERE ts_ms >= ?1")?;
    let group = |sql: &str| -> Result<BTreeMap<String, u64>, rusqlite::Error> {
        let mut st = c.prepare(sql)?;
        let rows = st.query_map([since], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64))
        })?;
        rows.collect()
    };
    let refused = group("SELECT refused, COUNT(*) FROM runs WHERE ts_ms >= ?1 AND refused IS NOT NULL GROUP BY refused")?;
    let outcomes = group("SELECT outcome, COUNT(*) FROM runs WHERE ts_ms >= ?1 GROUP BY outcome")?;
    let pct = |p: f64| -> Result<Option<u64>, rusqlite::Error> {
        if ran == 0 {
            return Ok(None);
        }
        let off = ((ran as f64 - 1.0) * p).round() as i64;
        c.query_row(
            "SELECT duration_ms FROM runs WHERE ts_ms >= ?1 AND cached = 0 AND refused IS NULL
             AND duration_ms IS NOT NULL ORDER BY duration_ms LIMIT 1 OFFSET ?2",
            params![since, off],
            |r| r.get::<_, i64>(0),
        )
        .optional()
        .map(|o| o.map(|d| d as u64))
    };
    let served = ran + cached;
    Ok(Stats {
        window_seconds: window.as_secs(),
        requests,
        ran,
        cached,
        refused,
        outcomes,
        unique_clients,
        bytes_out,
        cache_hit_ratio: if served == 0 {
            0.0
        } else {
            cached as f64 / served as f64
        },
        duration_ms_p50: pct(0.5)?,
        duration_ms_p99: pct(0.99)?,
        dropped_rows: dropped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(id: &str, refused: Option<&'static str>, cached: bool, d: u64) -> Run {
        Run {
            run_id: id.into(),
            at: SystemTime::now(),
            ip_hash: "h".into(),
            template: Some("t".into()),
            duration_ms: Some(d),
            exit_code: Some(0),
            bytes_out: 3,
            cached,
            refused,
            outcome: if refused.is_some() { "refused" } else { "ok" },
        }
    }

    #[tokio::test]
    async fn writes_and_aggregates() {
        let dir = std::env::temp_dir().join(format!("pg-runs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let runs = Runs::open(
            &dir.join("runs.db"),
            "salt".into(),
            Duration::from_secs(3600),
        )
        .unwrap();
        assert_ne!(
            runs.ip_hash("1.2.3.4".parse().unwrap()),
            runs.ip_hash("1.2.3.5".parse().unwrap())
        );
        assert!(!runs.ip_hash("1.2.3.4".parse().unwrap()).contains("1.2.3.4"));
        runs.record(run("a", None, false, 100));
        runs.record(run("b", None, false, 300));
        runs.record(run("c", None, true, 1));
        runs.record(run("d", Some("rate_limited"), false, 0));
        let mut s = runs.stats(Duration::from_secs(60)).await.unwrap();
        for _ in 0..50 {
            if s.requests == 4 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            s = runs.stats(Duration::from_secs(60)).await.unwrap();
        }
        assert_eq!((s.requests, s.ran, s.cached), (4, 2, 1));
        assert_eq!(s.refused.get("rate_limited"), Some(&1));
        assert_eq!(s.duration_ms_p50, Some(300));
        assert!((s.cache_hit_ratio - 1.0 / 3.0).abs() < 1e-9);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
