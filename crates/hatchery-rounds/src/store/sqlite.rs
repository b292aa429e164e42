//! The SQLite backend: `DATA_DIR/rounds.db`, one connection behind a
//! mutex (a few writes per Run and per session). Columns are read by name.
//! Its contract is checked by the suite in `conformance.rs`.

use super::*;
use rusqlite::{params, Connection, OptionalExtension, Row};
use std::path::Path;
use std::sync::Mutex;

pub struct SqliteStore {
    conn: Mutex<Connection>,
}

fn be(e: rusqlite::Error) -> StoreError {
    match e {
        rusqlite::Error::SqliteFailure(f, m)
            if f.code == rusqlite::ErrorCode::ConstraintViolation =>
        {
            StoreError::Conflict(m.unwrap_or_else(|| "constraint".into()))
        }
        rusqlite::Error::FromSqlConversionFailure(_, _, e) => StoreError::Corrupt(e.to_string()),
        e => StoreError::Backend(e.to_string()),
    }
}

/// A stored name that is none of ours, as the driver's conversion error
/// (which [`be`] reports as `Corrupt`): a row is never read as some
/// default state or scope.
fn named<T>(col: &str, v: &str, parse: impl Fn(&str) -> Option<T>) -> rusqlite::Result<T> {
    parse(v).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            0,
            rusqlite::types::Type::Text,
            format!("{col} {v:?}").into(),
        )
    })
}

/// A stored time (written through [`big`], so never negative).
fn ms(r: &Row, col: &str) -> rusqlite::Result<u64> {
    Ok(unsigned(r.get(col)?))
}

/// A time to compare with: past the largest stored value is as good as it.
fn clamp(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

fn states<T: Copy>(from: &[T], name: impl Fn(T) -> &'static str) -> String {
    // Only our own enum names go in here, never caller input.
    from.iter()
        .map(|s| format!("'{}'", name(*s)))
        .collect::<Vec<_>>()
        .join(",")
}

fn round_row(r: &Row) -> rusqlite::Result<RoundRecord> {
    let state: String = r.get("state")?;
    Ok(RoundRecord {
        id: r.get("id")?,
        name: r.get("name")?,
        state: named("round state", &state, RoundState::parse)?,
        template: r.get("template")?,
        template_version: r.get("template_version")?,
        spec: r.get("spec")?,
        tests: r.get("tests")?,
        prepared_snapshot: r.get("prepared_snapshot")?,
        error: r.get("error")?,
        created_at_ms: ms(r, "created_at_ms")?,
    })
}

fn session_row(r: &Row) -> rusqlite::Result<SessionRecord> {
    let state: String = r.get("state")?;
    Ok(SessionRecord {
        id: r.get("id")?,
        round_id: r.get("round_id")?,
        candidate: r.get("candidate")?,
        state: named("session state", &state, SessionState::parse)?,
        sandbox_id: r.get("sandbox_id")?,
        created_at_ms: ms(r, "created_at_ms")?,
        expires_at_ms: ms(r, "expires_at_ms")?,
        error: r.get("error")?,
    })
}

fn token_row(r: &Row) -> rusqlite::Result<TokenRecord> {
    let scope: String = r.get("scope")?;
    Ok(TokenRecord {
        hash: r.get("hash")?,
        scope: named("token scope", &scope, Scope::parse)?,
        round_id: r.get("round_id")?,
        session_id: r.get("session_id")?,
        created_at_ms: ms(r, "created_at_ms")?,
        expires_at_ms: ms(r, "expires_at_ms")?,
    })
}

fn run_row(r: &Row) -> rusqlite::Result<RunRecord> {
    Ok(RunRecord {
        id: r.get("id")?,
        session_id: r.get("session_id")?,
        created_at_ms: ms(r, "created_at_ms")?,
        result: r.get("result")?,
    })
}

fn submission_row(r: &Row) -> rusqlite::Result<SubmissionRecord> {
    Ok(SubmissionRecord {
        id: r.get("id")?,
        session_id: r.get("session_id")?,
        round_id: r.get("round_id")?,
        files: r.get("files")?,
        sha256: r.get("sha256")?,
        created_at_ms: ms(r, "created_at_ms")?,
    })
}

fn grading_row(r: &Row) -> rusqlite::Result<GradingRecord> {
    Ok(GradingRecord {
        id: r.get("id")?,
        submission_id: r.get("submission_id")?,
        created_at_ms: ms(r, "created_at_ms")?,
        status: r.get("status")?,
        passed: r.get("passed")?,
        total: r.get("total")?,
        report: r.get("report")?,
    })
}

fn replay_row(r: &Row) -> rusqlite::Result<ReplayRecord> {
    Ok(ReplayRecord {
        id: r.get("id")?,
        session_id: r.get("session_id")?,
        round_id: r.get("round_id")?,
        snapshot_id: r.get("snapshot_id")?,
        reason: r.get("reason")?,
        created_at_ms: ms(r, "created_at_ms")?,
        expires_at_ms: ms(r, "expires_at_ms")?,
        state: r.get("state")?,
    })
}

fn fork_row(r: &Row) -> rusqlite::Result<ForkRecord> {
    Ok(ForkRecord {
        id: r.get("id")?,
        replay_id: r.get("replay_id")?,
        round_id: r.get("round_id")?,
        sandbox_id: r.get("sandbox_id")?,
        owner: r.get("owner")?,
        created_at_ms: ms(r, "created_at_ms")?,
        expires_at_ms: ms(r, "expires_at_ms")?,
    })
}

impl SqliteStore {
    pub fn open(path: &Path) -> StoreResult<SqliteStore> {
        let mut conn = Connection::open(path).map_err(be)?;
        Self::init(&mut conn)?;
        Ok(SqliteStore {
            conn: Mutex::new(conn),
        })
    }

    pub fn in_memory() -> StoreResult<SqliteStore> {
        let mut conn = Connection::open_in_memory().map_err(be)?;
        Self::init(&mut conn)?;
        Ok(SqliteStore {
            conn: Mutex::new(conn),
        })
    }

    fn init(conn: &mut Connection) -> StoreResult<()> {
        conn.execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=5000;
             PRAGMA foreign_keys=ON;",
        )
        .map_err(be)?;
        super::migrations::migrate(conn).map_err(be)?;
        Ok(())
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn many<T>(
        &self,
        sql: &str,
        p: impl rusqlite::Params,
        f: fn(&Row) -> rusqlite::Result<T>,
    ) -> StoreResult<Vec<T>> {
        let c = self.conn();
        let mut st = c.prepare(sql).map_err(be)?;
        let rows = st.query_map(p, f).map_err(be)?;
        rows.collect::<Result<Vec<_>, _>>().map_err(be)
    }

    fn one<T>(
        &self,
        sql: &str,
        p: impl rusqlite::Params,
        f: fn(&Row) -> rusqlite::Result<T>,
    ) -> StoreResult<Option<T>> {
        self.conn().query_row(sql, p, f).optional().map_err(be)
    }
}

#[async_trait]
impl RoundStore for SqliteStore {
    async fn insert_round(&self, r: &RoundRecord) -> StoreResult<()> {
        self.conn()
            .execute(
                "INSERT INTO rounds (id, name, state, template, template_version, spec, tests,
                   prepared_snapshot, error, created_at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                params![
                    r.id,
                    r.name,
                    r.state.as_str(),
                    r.template,
                    r.template_version,
                    r.spec,
                    r.tests,
                    r.prepared_snapshot,
                    r.error,
                    big("created_at_ms", r.created_at_ms)?
                ],
            )
            .map_err(be)?;
        Ok(())
    }

    async fn get_round(&self, id: &str) -> StoreResult<Option<RoundRecord>> {
        self.one("SELECT * FROM rounds WHERE id = ?1", [id], round_row)
    }

    async fn list_rounds(&self) -> StoreResult<Vec<RoundRecord>> {
        self.many(
            "SELECT * FROM rounds ORDER BY created_at_ms, id",
            [],
            round_row,
        )
    }

    async fn set_round_state(
        &self,
        id: &str,
        from: &[RoundState],
        to: RoundState,
        prepared_snapshot: Option<&str>,
        error: Option<&str>,
    ) -> StoreResult<bool> {
        let sql = format!(
            "UPDATE rounds SET state = ?2,
               prepared_snapshot = COALESCE(?3, prepared_snapshot), error = COALESCE(?4, error)
             WHERE id = ?1 AND state IN ({})",
            states(from, RoundState::as_str)
        );
        let n = self
            .conn()
            .execute(&sql, params![id, to.as_str(), prepared_snapshot, error])
            .map_err(be)?;
        Ok(n == 1)
    }

    async fn insert_session(&self, s: &SessionRecord, t: &TokenRecord) -> StoreResult<()> {
        let mut c = self.conn();
        let tx = c.transaction().map_err(be)?;
        tx.execute(
            "INSERT INTO sessions (id, round_id, candidate, state, sandbox_id, created_at_ms,
               expires_at_ms, error) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![
                s.id,
                s.round_id,
                s.candidate,
                s.state.as_str(),
                s.sandbox_id,
                big("created_at_ms", s.created_at_ms)?,
                big("expires_at_ms", s.expires_at_ms)?,
                s.error
            ],
        )
        .map_err(be)?;
        insert_token(&tx, t)?;
        tx.commit().map_err(be)
    }

    async fn get_session(&self, id: &str) -> StoreResult<Option<SessionRecord>> {
        self.one("SELECT * FROM sessions WHERE id = ?1", [id], session_row)
    }

    async fn list_sessions(&self, round_id: &str) -> StoreResult<Vec<SessionRecord>> {
        self.many(
            "SELECT * FROM sessions WHERE round_id = ?1 ORDER BY created_at_ms, id",
            [round_id],
            session_row,
        )
    }

    async fn sessions_in_state(&self, state: SessionState) -> StoreResult<Vec<SessionRecord>> {
        self.many(
            "SELECT * FROM sessions WHERE state = ?1 ORDER BY created_at_ms, id",
            [state.as_str()],
            session_row,
        )
    }

    async fn expired_sessions(&self, now_ms: u64) -> StoreResult<Vec<SessionRecord>> {
        self.many(
            "SELECT * FROM sessions WHERE state != 'ended' AND expires_at_ms <= ?1",
            [clamp(now_ms)],
            session_row,
        )
    }

    async fn set_session_state(
        &self,
        id: &str,
        from: &[SessionState],
        to: SessionState,
        sandbox_id: Option<&str>,
        error: Option<&str>,
    ) -> StoreResult<bool> {
        let sql = format!(
            "UPDATE sessions SET state = ?2,
               sandbox_id = COALESCE(?3, sandbox_id), error = COALESCE(?4, error)
             WHERE id = ?1 AND state IN ({})",
            states(from, SessionState::as_str)
        );
        let n = self
            .conn()
            .execute(&sql, params![id, to.as_str(), sandbox_id, error])
            .map_err(be)?;
        Ok(n == 1)
    }

    async fn insert_token(&self, t: &TokenRecord) -> StoreResult<()> {
        let c = self.conn();
        insert_token(&c, t)
    }

    async fn get_token(&self, hash: &str) -> StoreResult<Option<TokenRecord>> {
        self.one("SELECT * FROM tokens WHERE hash = ?1", [hash], token_row)
    }

    async fn insert_run(&self, r: &RunRecord, keep: usize) -> StoreResult<()> {
        let mut c = self.conn();
        let tx = c.transaction().map_err(be)?;
        tx.execute(
            "INSERT INTO runs (id, session_id, created_at_ms, result) VALUES (?1, ?2, ?3, ?4)",
            params![
                r.id,
                r.session_id,
                big("created_at_ms", r.created_at_ms)?,
                r.result
            ],
        )
        .map_err(be)?;
        tx.execute(
            "DELETE FROM runs WHERE session_id = ?1 AND seq NOT IN
               (SELECT seq FROM runs WHERE session_id = ?1 ORDER BY seq DESC LIMIT ?2)",
            params![r.session_id, i64::try_from(keep).unwrap_or(i64::MAX)],
        )
        .map_err(be)?;
        tx.commit().map_err(be)
    }

    async fn list_runs(&self, session_id: &str) -> StoreResult<Vec<RunRecord>> {
        self.many(
            "SELECT * FROM runs WHERE session_id = ?1 ORDER BY seq",
            [session_id],
            run_row,
        )
    }

    async fn begin_submission(
        &self,
        sub: &SubmissionRecord,
        from: &[SessionState],
    ) -> StoreResult<bool> {
        let mut c = self.conn();
        let tx = c.transaction().map_err(be)?;
        let sql = format!(
            "UPDATE sessions SET state = 'submitted' WHERE id = ?1 AND state IN ({})",
            states(from, SessionState::as_str)
        );
        if tx.execute(&sql, [&sub.session_id]).map_err(be)? != 1 {
            return Ok(false);
        }
        tx.execute(
            "INSERT INTO submissions (id, session_id, round_id, files, sha256, created_at_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                sub.id,
                sub.session_id,
                sub.round_id,
                sub.files,
                sub.sha256,
                big("created_at_ms", sub.created_at_ms)?
            ],
        )
        .map_err(be)?;
        tx.commit().map_err(be)?;
        Ok(true)
    }

    async fn finish_grading(&self, g: &GradingRecord, session_id: &str) -> StoreResult<bool> {
        let mut c = self.conn();
        // IMMEDIATE: the write lock is taken before the check, so another
        // process on the same file cannot slip a grading in between.
        let tx = c
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(be)?;
        let stored: Option<i64> = tx
            .query_row(
                "SELECT 1 FROM submissions WHERE id = ?1",
                [&g.submission_id],
                |r| r.get(0),
            )
            .optional()
            .map_err(be)?;
        if stored.is_none() {
            return Err(StoreError::Conflict(format!(
                "submission {} is not stored",
                g.submission_id
            )));
        }
        let graded: Option<i64> = tx
            .query_row(
                "SELECT 1 FROM gradings WHERE submission_id = ?1 LIMIT 1",
                [&g.submission_id],
                |r| r.get(0),
            )
            .optional()
            .map_err(be)?;
        if graded.is_some() {
            return Ok(false);
        }
        insert_grading(&tx, g)?;
        tx.execute(
            "UPDATE sessions SET state = 'graded' WHERE id = ?1 AND state = 'submitted'",
            [session_id],
        )
        .map_err(be)?;
        tx.commit().map_err(be)?;
        Ok(true)
    }

    async fn insert_grading(&self, g: &GradingRecord) -> StoreResult<()> {
        let c = self.conn();
        insert_grading(&c, g)
    }

    async fn get_submission(&self, id: &str) -> StoreResult<Option<SubmissionRecord>> {
        self.one(
            "SELECT * FROM submissions WHERE id = ?1",
            [id],
            submission_row,
        )
    }

    async fn list_submissions(&self, session_id: &str) -> StoreResult<Vec<SubmissionRecord>> {
        self.many(
            "SELECT * FROM submissions WHERE session_id = ?1 ORDER BY seq",
            [session_id],
            submission_row,
        )
    }

    async fn list_gradings(&self, submission_id: &str) -> StoreResult<Vec<GradingRecord>> {
        self.many(
            "SELECT * FROM gradings WHERE submission_id = ?1 ORDER BY seq",
            [submission_id],
            grading_row,
        )
    }

    async fn insert_replay(&self, r: &ReplayRecord) -> StoreResult<()> {
        self.conn()
            .execute(
                "INSERT INTO replays (id, session_id, round_id, snapshot_id, reason, created_at_ms,
                   expires_at_ms, state) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    r.id,
                    r.session_id,
                    r.round_id,
                    r.snapshot_id,
                    r.reason,
                    big("created_at_ms", r.created_at_ms)?,
                    big("expires_at_ms", r.expires_at_ms)?,
                    r.state
                ],
            )
            .map_err(be)?;
        Ok(())
    }

    async fn get_replay(&self, id: &str) -> StoreResult<Option<ReplayRecord>> {
        self.one("SELECT * FROM replays WHERE id = ?1", [id], replay_row)
    }

    async fn list_replays(&self, session_id: &str) -> StoreResult<Vec<ReplayRecord>> {
        self.many(
            "SELECT * FROM replays WHERE session_id = ?1 ORDER BY created_at_ms, id",
            [session_id],
            replay_row,
        )
    }

    async fn due_replays(&self, now_ms: u64) -> StoreResult<Vec<ReplayRecord>> {
        self.many(
            "SELECT * FROM replays WHERE state = 'active' AND expires_at_ms <= ?1
             ORDER BY expires_at_ms, id",
            [clamp(now_ms)],
            replay_row,
        )
    }

    async fn expire_replay(&self, id: &str) -> StoreResult<bool> {
        let n = self
            .conn()
            .execute(
                "UPDATE replays SET state = 'expired' WHERE id = ?1 AND state = 'active'",
                [id],
            )
            .map_err(be)?;
        Ok(n == 1)
    }

    async fn insert_fork(&self, f: &ForkRecord) -> StoreResult<()> {
        self.conn()
            .execute(
                "INSERT INTO forks (id, replay_id, round_id, sandbox_id, owner, created_at_ms,
                   expires_at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    f.id,
                    f.replay_id,
                    f.round_id,
                    f.sandbox_id,
                    f.owner,
                    big("created_at_ms", f.created_at_ms)?,
                    big("expires_at_ms", f.expires_at_ms)?
                ],
            )
            .map_err(be)?;
        Ok(())
    }

    async fn get_fork(&self, id: &str) -> StoreResult<Option<ForkRecord>> {
        self.one("SELECT * FROM forks WHERE id = ?1", [id], fork_row)
    }

    async fn list_forks(&self, replay_id: &str) -> StoreResult<Vec<ForkRecord>> {
        self.many(
            "SELECT * FROM forks WHERE replay_id = ?1 ORDER BY created_at_ms, id",
            [replay_id],
            fork_row,
        )
    }

    async fn lock_session(&self, _id: &str, _wait: bool) -> StoreResult<Option<SessionHold>> {
        // One process owns the file: its own lock (taken first) is enough.
        Ok(Some(SessionHold::new(())))
    }

    async fn delete_fork(&self, id: &str) -> StoreResult<bool> {
        let n = self
            .conn()
            .execute("DELETE FROM forks WHERE id = ?1", [id])
            .map_err(be)?;
        Ok(n == 1)
    }
}

fn insert_token(c: &Connection, t: &TokenRecord) -> StoreResult<()> {
    c.execute(
        "INSERT INTO tokens (hash, scope, round_id, session_id, created_at_ms, expires_at_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![
            t.hash,
            t.scope.as_str(),
            t.round_id,
            t.session_id,
            big("created_at_ms", t.created_at_ms)?,
            big("expires_at_ms", t.expires_at_ms)?
        ],
    )
    .map_err(be)?;
    Ok(())
}

fn insert_grading(c: &Connection, g: &GradingRecord) -> StoreResult<()> {
    c.execute(
        "INSERT INTO gradings (id, submission_id, created_at_ms, status, passed, total, report)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![
            g.id,
            g.submission_id,
            big("created_at_ms", g.created_at_ms)?,
            g.status,
            g.passed,
            g.total,
            g.report
        ],
    )
    .map_err(be)?;
    Ok(())
}
