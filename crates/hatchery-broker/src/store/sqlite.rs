//! The broker's record in SQLite (DATA_DIR/broker.db): one connection
//! behind a mutex, used on a blocking thread; every multi-statement change
//! is one transaction (IMMEDIATE where it reads before writing, so two
//! racing first attempts of a key cannot both find it free).

use super::{Begin, Call, CallState, EventRef, Recorded, StoreError};
use rusqlite::{params, Connection, OptionalExtension};
use std::path::Path;
use std::sync::{Arc, Mutex};

const MIGRATIONS: &[(u32, &str)] = &[
    (
        1,
        "CREATE TABLE calls (
        session_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        epoch INTEGER NOT NULL,
        tool TEXT NOT NULL,
        args_sha256 TEXT NOT NULL,
        args TEXT NOT NULL,
        state TEXT NOT NULL,
        decision TEXT NOT NULL,
        rule_id TEXT,
        approval_id TEXT,
        event_seq INTEGER,
        result_event_seq INTEGER,
        effect TEXT,
        output TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        PRIMARY KEY (session_id, seq)
    ) WITHOUT ROWID;
    CREATE INDEX calls_state ON calls(state);
    CREATE TABLE epochs (
        sandbox_id TEXT PRIMARY KEY,
        session_id TEXT NOT NULL,
        epoch INTEGER NOT NULL,
        UNIQUE (session_id, epoch)
    ) WITHOUT ROWID;",
    ),
    (2, "ALTER TABLE calls ADD COLUMN review_event_seq INTEGER;"),
    (3, "ALTER TABLE calls ADD COLUMN runner TEXT;"),
];

#[derive(Clone)]
pub(super) struct SqliteBroker {
    conn: Arc<Mutex<Connection>>,
}

fn now() -> String {
    super::now()
}

impl SqliteBroker {
    pub(super) fn open(path: &Path) -> Result<Self, StoreError> {
        let mut c = Connection::open(path)?;
        // FULL: a call row is on disk before its effect starts.
        c.execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA busy_timeout=5000;",
        )?;
        migrate(&mut c)?;
        Ok(SqliteBroker {
            conn: Arc::new(Mutex::new(c)),
        })
    }

    pub(super) fn open_in_memory() -> Result<Self, StoreError> {
        let mut c = Connection::open_in_memory()?;
        migrate(&mut c)?;
        Ok(SqliteBroker {
            conn: Arc::new(Mutex::new(c)),
        })
    }

    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let mut c = conn.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut c)
        })
        .await
        .map_err(|e| StoreError::Task(e.to_string()))?
    }

    /// The epoch of `sandbox_id` in `session_id`: known ones keep theirs;
    /// a new sandbox (the session was resumed or forked) gets the next one.
    pub(super) async fn epoch_for(
        &self,
        session_id: &str,
        sandbox_id: &str,
    ) -> Result<u64, StoreError> {
        let (ses, sbx) = (session_id.to_string(), sandbox_id.to_string());
        self.with(move |c| {
            let tx = c.transaction()?;
            let known: Option<(String, u64)> = tx
                .query_row(
                    "SELECT session_id, epoch FROM epochs WHERE sandbox_id = ?1",
                    params![sbx],
                    |r| Ok((r.get("session_id")?, r.get("epoch")?)),
                )
                .optional()?;
            let e = match known {
                Some((s, e)) if s == ses => e,
                // A sandbox id is never reused across sessions; treat a
                // mismatch as a new instance all the same.
                _ => {
                    let next: u64 = tx.query_row(
                        "SELECT COALESCE(MAX(epoch), 0) + 1 AS next FROM epochs WHERE session_id = ?1",
                        params![ses],
                        |r| r.get("next"),
                    )?;
                    tx.execute(
                        "INSERT OR REPLACE INTO epochs (sandbox_id, session_id, epoch) VALUES (?1, ?2, ?3)",
                        params![sbx, ses, next],
                    )?;
                    next
                }
            };
            tx.commit()?;
            Ok(e)
        })
        .await
    }

    /// The epoch a sandbox had, if the broker has seen it.
    pub(super) async fn known_epoch(
        &self,
        sandbox_id: &str,
    ) -> Result<Option<(String, u64)>, StoreError> {
        let sbx = sandbox_id.to_string();
        self.with(move |c| {
            Ok(c.query_row(
                "SELECT session_id, epoch FROM epochs WHERE sandbox_id = ?1",
                params![sbx],
                |r| Ok((r.get("session_id")?, r.get("epoch")?)),
            )
            .optional()?)
        })
        .await
    }

    /// Records the call under its key unless the key is taken; in one
    /// transaction, so two racing first attempts make one row.
    pub(super) async fn begin(&self, new: Call) -> Result<Begin, StoreError> {
        self.with(move |c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            if let Some(old) = get_tx(&tx, &new.session_id, new.seq)? {
                tx.commit()?;
                return Ok(Begin::taken(old, &new));
            }
            tx.execute(
                "INSERT INTO calls (session_id, seq, epoch, tool, args_sha256, args, state, decision, \
                 rule_id, approval_id, event_seq, result_event_seq, effect, output, review_event_seq, \
                 created_at, updated_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?13, ?14, ?15, ?11, ?16, ?12, ?12)",
                params![
                    new.session_id,
                    new.seq,
                    new.epoch,
                    new.tool,
                    new.args_sha256,
                    new.args,
                    new.state.as_str(),
                    new.decision,
                    new.rule_id,
                    new.approval_id,
                    new.output,
                    new.created_at,
                    new.event_seq,
                    new.result_event_seq,
                    new.effect,
                    new.review_event_seq,
                ],
            )?;
            tx.commit()?;
            Ok(Begin::New(new))
        })
        .await
    }

    pub(super) async fn get(&self, session_id: &str, seq: u64) -> Result<Option<Call>, StoreError> {
        let s = session_id.to_string();
        self.with(move |c| {
            let tx = c.transaction()?;
            let r = get_tx(&tx, &s, seq)?;
            tx.commit()?;
            Ok(r)
        })
        .await
    }

    /// Stores the seq of one of the call's events, once: a column already
    /// set keeps its value (a retry never moves it).
    pub(super) async fn set_event_ref(
        &self,
        which: EventRef,
        session_id: &str,
        seq: u64,
        ev: u64,
    ) -> Result<(), StoreError> {
        let s = session_id.to_string();
        self.with(move |c| {
            // The column is one of three constants, never input.
            let col = which.column();
            c.execute(
                &format!(
                    "UPDATE calls SET {col} = ?3 WHERE session_id = ?1 AND seq = ?2 AND {col} IS NULL"
                ),
                params![s, seq, ev],
            )?;
            Ok(())
        })
        .await
    }

    /// Moves the call from `from` to `to` (nothing when it is not in
    /// `from`), with the seqs of the events just written for it, in one
    /// transaction; `BrokerStore::advance` is this with no seqs.
    pub(super) async fn advance_recorded(
        &self,
        session_id: &str,
        seq: u64,
        from: CallState,
        to: CallState,
        r: Recorded,
    ) -> Result<Option<Call>, StoreError> {
        let s = session_id.to_string();
        self.with(move |c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let n = tx.execute(
                "UPDATE calls SET state = ?4, effect = COALESCE(?5, effect), \
                 output = COALESCE(?6, output), updated_at = ?7, \
                 event_seq = COALESCE(event_seq, ?8), \
                 result_event_seq = COALESCE(result_event_seq, ?9), \
                 runner = COALESCE(?10, runner) \
                 WHERE session_id = ?1 AND seq = ?2 AND state = ?3",
                params![
                    s,
                    seq,
                    from.as_str(),
                    to.as_str(),
                    r.effect,
                    r.output,
                    now(),
                    r.event_seq,
                    r.result_event_seq,
                    r.runner
                ],
            )?;
            let r = if n == 1 { get_tx(&tx, &s, seq)? } else { None };
            tx.commit()?;
            Ok(r)
        })
        .await
    }

    /// Calls caught in `executing` (the process stopped mid-effect).
    pub(super) async fn executing(&self) -> Result<Vec<Call>, StoreError> {
        self.with(|c| {
            let mut st =
                c.prepare("SELECT * FROM calls WHERE state = 'executing' ORDER BY created_at")?;
            let rows = st.query_map([], row_call)?;
            let mut out = vec![];
            for r in rows {
                out.push(r??);
            }
            Ok(out)
        })
        .await
    }

    pub(super) async fn usage(&self, session_id: &str) -> Result<super::CallUsage, StoreError> {
        let s = session_id.to_string();
        self.with(move |c| {
            Ok(c.query_row(
                "SELECT COUNT(*), COALESCE(SUM(length(CAST(args AS BLOB))), 0), \
                 COALESCE(SUM(CASE WHEN state = 'awaiting_approval' THEN 1 ELSE 0 END), 0) \
                 FROM calls WHERE session_id = ?1",
                params![s],
                |r| Ok(super::CallUsage::from_row(r.get(0)?, r.get(1)?, r.get(2)?)),
            )?)
        })
        .await
    }

    /// Every call of a session, in seq order (tests and the CLI).
    pub(super) async fn calls(&self, session_id: &str) -> Result<Vec<Call>, StoreError> {
        let s = session_id.to_string();
        self.with(move |c| {
            let mut st = c.prepare("SELECT * FROM calls WHERE session_id = ?1 ORDER BY seq")?;
            let rows = st.query_map(params![s], row_call)?;
            let mut out = vec![];
            for r in rows {
                out.push(r??);
            }
            Ok(out)
        })
        .await
    }
}

fn migrate(c: &mut Connection) -> Result<(), StoreError> {
    let current: u32 = c.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    for (n, sql) in MIGRATIONS {
        if *n <= current {
            continue;
        }
        let tx = c.transaction()?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", n)?;
        tx.commit()?;
    }
    Ok(())
}

fn get_tx(tx: &rusqlite::Transaction<'_>, s: &str, seq: u64) -> Result<Option<Call>, StoreError> {
    let r = tx
        .query_row(
            "SELECT * FROM calls WHERE session_id = ?1 AND seq = ?2",
            params![s, seq],
            row_call,
        )
        .optional()?;
    r.transpose()
}

fn row_call(r: &rusqlite::Row<'_>) -> rusqlite::Result<Result<Call, StoreError>> {
    let state: String = r.get("state")?;
    let Some(st) = CallState::parse(&state) else {
        return Ok(Err(StoreError::Corrupt(state)));
    };
    Ok(Ok(Call {
        session_id: r.get("session_id")?,
        seq: r.get("seq")?,
        epoch: r.get("epoch")?,
        tool: r.get("tool")?,
        args_sha256: r.get("args_sha256")?,
        args: r.get("args")?,
        state: st,
        decision: r.get("decision")?,
        rule_id: r.get("rule_id")?,
        approval_id: r.get("approval_id")?,
        event_seq: r.get("event_seq")?,
        result_event_seq: r.get("result_event_seq")?,
        effect: r.get("effect")?,
        output: r.get("output")?,
        review_event_seq: r.get("review_event_seq")?,
        runner: r.get("runner")?,
        created_at: r.get("created_at")?,
        updated_at: r.get("updated_at")?,
    }))
}
