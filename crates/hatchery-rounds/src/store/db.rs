//! The rounds store: its queries over the deployment's one database,
//! written once for SQLite and PostgreSQL (`hatchery-db` rewrites the
//! little that differs). Columns are read by name.
//!
//! Races, the same on both databases:
//! - a state change is one `UPDATE … WHERE id = $1 AND state IN (…)`: the
//!   loser of a race finds the row moved and changes nothing (a final
//!   state is never overwritten; PostgreSQL re-checks a row another
//!   transaction moved, SQLite's writers take turns);
//! - `finish_grading` locks the submission row (`FOR UPDATE`; on SQLite
//!   the write transaction holds the only write lock) before it looks
//!   for a grading: two racing first gradings serialize there, and the
//!   second one's check sees the first one's row.

use super::*;
use hatchery_db::{args, Db, Row, Tx, Value};

/// The rounds store on the deployment's database (cheap to clone).
#[derive(Clone)]
pub struct DbStore {
    db: Db,
    /// Session holds across processes: PostgreSQL only (see `pg_lock.rs`).
    holds: Option<super::pg_lock::Holds>,
}

impl DbStore {
    /// Brings the rounds tables up to date (see `schema.rs`) and opens the
    /// store on `db`.
    pub async fn open(db: Db) -> StoreResult<DbStore> {
        db.migrate(&super::MIGRATIONS).await?;
        let holds = db.pg_pool().map(super::pg_lock::Holds::new);
        Ok(DbStore { db, holds })
    }

    /// The database it keeps its rows in.
    pub fn db(&self) -> &Db {
        &self.db
    }

    async fn one<T>(
        &self,
        sql: &str,
        a: &[Value],
        f: fn(&Row) -> StoreResult<T>,
    ) -> StoreResult<Option<T>> {
        self.db.query_opt(sql, a).await?.as_ref().map(f).transpose()
    }

    async fn many<T>(
        &self,
        sql: &str,
        a: &[Value],
        f: fn(&Row) -> StoreResult<T>,
    ) -> StoreResult<Vec<T>> {
        self.db.query(sql, a).await?.iter().map(f).collect()
    }
}

/// A time to compare with: past the largest stored value is as good as it.
fn clamp(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

/// `UPDATE <table> SET <set> WHERE id = $1 AND state IN ($k, ...)`, the
/// states (our own enum names) bound after `args`; `false` if none
/// matched or `from` is empty.
async fn guarded(
    tx: &mut Tx,
    table: &str,
    set: &str,
    mut a: Vec<Value>,
    from: &[&'static str],
) -> StoreResult<bool> {
    if from.is_empty() {
        return Ok(false);
    }
    let first = a.len() + 1;
    let marks: Vec<String> = (0..from.len()).map(|i| format!("${}", first + i)).collect();
    a.extend(from.iter().map(|s| Value::from(*s)));
    let sql = format!(
        "UPDATE {table} SET {set} WHERE id = $1 AND state IN ({})",
        marks.join(", ")
    );
    Ok(tx.execute(&sql, &a).await? == 1)
}

async fn guarded_once(
    db: &Db,
    table: &str,
    set: &str,
    a: Vec<Value>,
    from: &[&'static str],
) -> StoreResult<bool> {
    let mut tx = db.begin().await?;
    let moved = guarded(&mut tx, table, set, a, from).await?;
    tx.commit().await?;
    Ok(moved)
}

#[async_trait]
impl RoundStore for DbStore {
    async fn insert_round(&self, r: &RoundRecord) -> StoreResult<()> {
        self.db
            .execute(
                "INSERT INTO rounds (id, name, state, template, template_version, spec, tests,
                    prepared_snapshot, error, created_at_ms)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                args![
                    &r.id,
                    &r.name,
                    r.state.as_str(),
                    &r.template,
                    &r.template_version,
                    &r.spec,
                    &r.tests,
                    r.prepared_snapshot.as_deref(),
                    r.error.as_deref(),
                    big("created_at_ms", r.created_at_ms)?
                ],
            )
            .await?;
        Ok(())
    }

    async fn get_round(&self, id: &str) -> StoreResult<Option<RoundRecord>> {
        self.one("SELECT * FROM rounds WHERE id = $1", args![id], round_row)
            .await
    }

    async fn list_rounds(&self) -> StoreResult<Vec<RoundRecord>> {
        self.many(
            "SELECT * FROM rounds ORDER BY created_at_ms, id",
            args![],
            round_row,
        )
        .await
    }

    async fn set_round_state(
        &self,
        id: &str,
        from: &[RoundState],
        to: RoundState,
        prepared_snapshot: Option<&str>,
        error: Option<&str>,
    ) -> StoreResult<bool> {
        let from: Vec<_> = from.iter().map(|s| s.as_str()).collect();
        guarded_once(
            &self.db,
            "rounds",
            "state = $2, prepared_snapshot = COALESCE($3, prepared_snapshot),
             error = COALESCE($4, error)",
            args![id, to.as_str(), prepared_snapshot, error].to_vec(),
            &from,
        )
        .await
    }

    async fn insert_session(&self, s: &SessionRecord, t: &TokenRecord) -> StoreResult<()> {
        let a = args![
            &s.id,
            &s.round_id,
            &s.candidate,
            s.state.as_str(),
            s.sandbox_id.as_deref(),
            big("created_at_ms", s.created_at_ms)?,
            big("expires_at_ms", s.expires_at_ms)?,
            s.error.as_deref()
        ];
        let token = token_args(t)?;
        let mut tx = self.db.begin().await?;
        tx.execute(
            "INSERT INTO round_sessions (id, round_id, candidate, state, sandbox_id,
                created_at_ms, expires_at_ms, error)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            a,
        )
        .await?;
        tx.execute(INSERT_TOKEN, &token).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn get_session(&self, id: &str) -> StoreResult<Option<SessionRecord>> {
        self.one(
            "SELECT * FROM round_sessions WHERE id = $1",
            args![id],
            session_row,
        )
        .await
    }

    async fn list_sessions(&self, round_id: &str) -> StoreResult<Vec<SessionRecord>> {
        self.many(
            "SELECT * FROM round_sessions WHERE round_id = $1 ORDER BY created_at_ms, id",
            args![round_id],
            session_row,
        )
        .await
    }

    async fn sessions_in_state(&self, state: SessionState) -> StoreResult<Vec<SessionRecord>> {
        self.many(
            "SELECT * FROM round_sessions WHERE state = $1 ORDER BY created_at_ms, id",
            args![state.as_str()],
            session_row,
        )
        .await
    }

    async fn expired_sessions(&self, now_ms: u64) -> StoreResult<Vec<SessionRecord>> {
        self.many(
            "SELECT * FROM round_sessions WHERE state <> 'ended' AND expires_at_ms <= $1
             ORDER BY created_at_ms, id",
            args![clamp(now_ms)],
            session_row,
        )
        .await
    }

    async fn set_session_state(
        &self,
        id: &str,
        from: &[SessionState],
        to: SessionState,
        sandbox_id: Option<&str>,
        error: Option<&str>,
    ) -> StoreResult<bool> {
        let from: Vec<_> = from.iter().map(|s| s.as_str()).collect();
        guarded_once(
            &self.db,
            "round_sessions",
            "state = $2, sandbox_id = COALESCE($3, sandbox_id), error = COALESCE($4, error)",
            args![id, to.as_str(), sandbox_id, error].to_vec(),
            &from,
        )
        .await
    }

    async fn insert_token(&self, t: &TokenRecord) -> StoreResult<()> {
        self.db.execute(INSERT_TOKEN, &token_args(t)?).await?;
        Ok(())
    }

    async fn get_token(&self, hash: &str) -> StoreResult<Option<TokenRecord>> {
        self.one(
            "SELECT * FROM round_tokens WHERE hash = $1",
            args![hash],
            token_row,
        )
        .await
    }

    async fn insert_run(&self, r: &RunRecord, keep: usize) -> StoreResult<()> {
        let created = big("created_at_ms", r.created_at_ms)?;
        let mut tx = self.db.begin().await?;
        tx.execute(
            "INSERT INTO round_runs (id, session_id, created_at_ms, result)
             VALUES ($1, $2, $3, $4)",
            args![&r.id, &r.session_id, created, &r.result],
        )
        .await?;
        tx.execute(
            "DELETE FROM round_runs WHERE session_id = $1 AND seq NOT IN
                (SELECT seq FROM round_runs WHERE session_id = $1 ORDER BY seq DESC LIMIT $2)",
            args![&r.session_id, i64::try_from(keep).unwrap_or(i64::MAX)],
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn list_runs(&self, session_id: &str) -> StoreResult<Vec<RunRecord>> {
        self.many(
            "SELECT * FROM round_runs WHERE session_id = $1 ORDER BY seq",
            args![session_id],
            run_row,
        )
        .await
    }

    async fn begin_submission(
        &self,
        sub: &SubmissionRecord,
        from: &[SessionState],
    ) -> StoreResult<bool> {
        let created = big("created_at_ms", sub.created_at_ms)?;
        let from: Vec<_> = from.iter().map(|s| s.as_str()).collect();
        let mut tx = self.db.begin().await?;
        let moved = guarded(
            &mut tx,
            "round_sessions",
            "state = 'submitted'",
            args![&sub.session_id].to_vec(),
            &from,
        )
        .await?;
        if !moved {
            // Dropped unfinished: rolled back, nothing written.
            return Ok(false);
        }
        tx.execute(
            "INSERT INTO round_submissions (id, session_id, round_id, files, sha256,
                created_at_ms)
             VALUES ($1, $2, $3, $4, $5, $6)",
            args![
                &sub.id,
                &sub.session_id,
                &sub.round_id,
                &sub.files,
                &sub.sha256,
                created
            ],
        )
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    async fn finish_grading(&self, g: &GradingRecord, session_id: &str) -> StoreResult<bool> {
        let grading = grading_args(g)?;
        let mut tx = self.db.begin().await?;
        // The lock two racing first gradings serialize on; the check below
        // runs after the other one committed, and sees its row.
        let stored = tx
            .query_opt(
                "SELECT id FROM round_submissions WHERE id = $1 FOR UPDATE",
                args![&g.submission_id],
            )
            .await?;
        if stored.is_none() {
            return Err(StoreError::Conflict(format!(
                "submission {} is not stored",
                g.submission_id
            )));
        }
        let graded = tx
            .query_opt(
                "SELECT 1 AS one FROM round_gradings WHERE submission_id = $1 LIMIT 1",
                args![&g.submission_id],
            )
            .await?;
        if graded.is_some() {
            return Ok(false);
        }
        tx.execute(INSERT_GRADING, &grading).await?;
        tx.execute(
            "UPDATE round_sessions SET state = 'graded' WHERE id = $1 AND state = 'submitted'",
            args![session_id],
        )
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    async fn insert_grading(&self, g: &GradingRecord) -> StoreResult<()> {
        self.db.execute(INSERT_GRADING, &grading_args(g)?).await?;
        Ok(())
    }

    async fn get_submission(&self, id: &str) -> StoreResult<Option<SubmissionRecord>> {
        self.one(
            "SELECT * FROM round_submissions WHERE id = $1",
            args![id],
            submission_row,
        )
        .await
    }

    async fn list_submissions(&self, session_id: &str) -> StoreResult<Vec<SubmissionRecord>> {
        self.many(
            "SELECT * FROM round_submissions WHERE session_id = $1 ORDER BY seq",
            args![session_id],
            submission_row,
        )
        .await
    }

    async fn list_gradings(&self, submission_id: &str) -> StoreResult<Vec<GradingRecord>> {
        self.many(
            "SELECT * FROM round_gradings WHERE submission_id = $1 ORDER BY seq",
            args![submission_id],
            grading_row,
        )
        .await
    }

    async fn insert_replay(&self, r: &ReplayRecord) -> StoreResult<()> {
        self.db
            .execute(
                "INSERT INTO round_replays (id, session_id, round_id, snapshot_id, reason,
                    created_at_ms, expires_at_ms, state)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                args![
                    &r.id,
                    &r.session_id,
                    &r.round_id,
                    &r.snapshot_id,
                    &r.reason,
                    big("created_at_ms", r.created_at_ms)?,
                    big("expires_at_ms", r.expires_at_ms)?,
                    &r.state
                ],
            )
            .await?;
        Ok(())
    }

    async fn get_replay(&self, id: &str) -> StoreResult<Option<ReplayRecord>> {
        self.one(
            "SELECT * FROM round_replays WHERE id = $1",
            args![id],
            replay_row,
        )
        .await
    }

    async fn list_replays(&self, session_id: &str) -> StoreResult<Vec<ReplayRecord>> {
        self.many(
            "SELECT * FROM round_replays WHERE session_id = $1 ORDER BY created_at_ms, id",
            args![session_id],
            replay_row,
        )
        .await
    }

    async fn due_replays(&self, now_ms: u64) -> StoreResult<Vec<ReplayRecord>> {
        self.many(
            "SELECT * FROM round_replays WHERE state = 'active' AND expires_at_ms <= $1
             ORDER BY expires_at_ms, id",
            args![clamp(now_ms)],
            replay_row,
        )
        .await
    }

    async fn expire_replay(&self, id: &str) -> StoreResult<bool> {
        let n = self
            .db
            .execute(
                "UPDATE round_replays SET state = 'expired' WHERE id = $1 AND state = 'active'",
                args![id],
            )
            .await?;
        Ok(n == 1)
    }

    async fn insert_fork(&self, f: &ForkRecord) -> StoreResult<()> {
        self.db
            .execute(
                "INSERT INTO round_forks (id, replay_id, round_id, sandbox_id, owner,
                    created_at_ms, expires_at_ms)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
                args![
                    &f.id,
                    &f.replay_id,
                    &f.round_id,
                    &f.sandbox_id,
                    &f.owner,
                    big("created_at_ms", f.created_at_ms)?,
                    big("expires_at_ms", f.expires_at_ms)?
                ],
            )
            .await?;
        Ok(())
    }

    async fn get_fork(&self, id: &str) -> StoreResult<Option<ForkRecord>> {
        self.one(
            "SELECT * FROM round_forks WHERE id = $1",
            args![id],
            fork_row,
        )
        .await
    }

    async fn list_forks(&self, replay_id: &str) -> StoreResult<Vec<ForkRecord>> {
        self.many(
            "SELECT * FROM round_forks WHERE replay_id = $1 ORDER BY created_at_ms, id",
            args![replay_id],
            fork_row,
        )
        .await
    }

    async fn delete_fork(&self, id: &str) -> StoreResult<bool> {
        let n = self
            .db
            .execute("DELETE FROM round_forks WHERE id = $1", args![id])
            .await?;
        Ok(n == 1)
    }

    async fn lock_session(&self, session_id: &str, wait: bool) -> StoreResult<Option<SessionHold>> {
        match &self.holds {
            Some(h) => h.lock_session(session_id, wait).await,
            // SQLite: one process owns the file, and its own lock (taken
            // first) is the only one needed.
            None => Ok(Some(SessionHold::new(()))),
        }
    }
}

const INSERT_TOKEN: &str =
    "INSERT INTO round_tokens (hash, scope, round_id, session_id, created_at_ms, expires_at_ms)
     VALUES ($1, $2, $3, $4, $5, $6)";

fn token_args(t: &TokenRecord) -> StoreResult<Vec<Value>> {
    Ok(args![
        &t.hash,
        t.scope.as_str(),
        &t.round_id,
        t.session_id.as_deref(),
        big("created_at_ms", t.created_at_ms)?,
        big("expires_at_ms", t.expires_at_ms)?
    ]
    .to_vec())
}

const INSERT_GRADING: &str =
    "INSERT INTO round_gradings (id, submission_id, created_at_ms, status, passed, total, report)
     VALUES ($1, $2, $3, $4, $5, $6, $7)";

fn grading_args(g: &GradingRecord) -> StoreResult<Vec<Value>> {
    Ok(args![
        &g.id,
        &g.submission_id,
        big("created_at_ms", g.created_at_ms)?,
        &g.status,
        g.passed,
        g.total,
        &g.report
    ]
    .to_vec())
}

// Rows, their columns read by name.

fn ms(r: &Row, col: &str) -> StoreResult<u64> {
    Ok(unsigned(r.get::<i64>(col)?))
}

/// A stored name that is none of ours reads as `Corrupt`, never as some
/// default state or scope.
fn named<T>(r: &Row, col: &str, what: &str, parse: fn(&str) -> Option<T>) -> StoreResult<T> {
    let v: String = r.get(col)?;
    parse(&v).ok_or_else(|| StoreError::Corrupt(format!("{what} {v:?}")))
}

fn round_row(r: &Row) -> StoreResult<RoundRecord> {
    Ok(RoundRecord {
        id: r.get("id")?,
        name: r.get("name")?,
        state: named(r, "state", "round state", RoundState::parse)?,
        template: r.get("template")?,
        template_version: r.get("template_version")?,
        spec: r.get("spec")?,
        tests: r.get("tests")?,
        prepared_snapshot: r.get("prepared_snapshot")?,
        error: r.get("error")?,
        created_at_ms: ms(r, "created_at_ms")?,
    })
}

fn session_row(r: &Row) -> StoreResult<SessionRecord> {
    Ok(SessionRecord {
        id: r.get("id")?,
        round_id: r.get("round_id")?,
        candidate: r.get("candidate")?,
        state: named(r, "state", "session state", SessionState::parse)?,
        sandbox_id: r.get("sandbox_id")?,
        created_at_ms: ms(r, "created_at_ms")?,
        expires_at_ms: ms(r, "expires_at_ms")?,
        error: r.get("error")?,
    })
}

fn token_row(r: &Row) -> StoreResult<TokenRecord> {
    Ok(TokenRecord {
        hash: r.get("hash")?,
        scope: named(r, "scope", "token scope", Scope::parse)?,
        round_id: r.get("round_id")?,
        session_id: r.get("session_id")?,
        created_at_ms: ms(r, "created_at_ms")?,
        expires_at_ms: ms(r, "expires_at_ms")?,
    })
}

fn run_row(r: &Row) -> StoreResult<RunRecord> {
    Ok(RunRecord {
        id: r.get("id")?,
        session_id: r.get("session_id")?,
        created_at_ms: ms(r, "created_at_ms")?,
        result: r.get("result")?,
    })
}

fn submission_row(r: &Row) -> StoreResult<SubmissionRecord> {
    Ok(SubmissionRecord {
        id: r.get("id")?,
        session_id: r.get("session_id")?,
        round_id: r.get("round_id")?,
        files: r.get("files")?,
        sha256: r.get("sha256")?,
        created_at_ms: ms(r, "created_at_ms")?,
    })
}

fn grading_row(r: &Row) -> StoreResult<GradingRecord> {
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

fn replay_row(r: &Row) -> StoreResult<ReplayRecord> {
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

fn fork_row(r: &Row) -> StoreResult<ForkRecord> {
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
