//! Rounds in the shared PostgreSQL database (`--db postgres://`), so that
//! every daemon on it sees the same rounds, sessions, tokens and gradings.
//! The same contract as the SQLite store, checked by the same suite
//! (`conformance.rs`).
//!
//! The database is shared with the other stores (agent sessions own a
//! table called `sessions`), so every table but `rounds` is prefixed
//! `round_`, and so are the indexes.
//!
//! Under READ COMMITTED each statement sees everything committed before it,
//! and a statement that meets a row another transaction is writing waits
//! for it and then re-checks; so:
//! - a state update is one `UPDATE … WHERE id = $1 AND state = ANY($n)`:
//!   the loser of a race re-reads the moved row, no longer matches, and
//!   changes nothing (a final state is never overwritten);
//! - `finish_grading` locks the submission row (`SELECT … FOR UPDATE`)
//!   before it looks for a grading: two racing first gradings serialize on
//!   that lock, and the second one's check sees the first one's row.

use super::*;
use deadpool_postgres::{GenericClient, Pool};
use tokio_postgres::Row;

/// Numbered migrations, append only; `rounds_schema` records how many ran.
/// The same tables and indexes as SQLite's (`migrations.rs`), `BIGSERIAL
/// seq` where SQLite orders by AUTOINCREMENT.
pub(super) const MIGRATIONS: &[&str] = &["CREATE TABLE rounds (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        state TEXT NOT NULL,
        template TEXT NOT NULL,
        template_version TEXT NOT NULL,
        spec TEXT NOT NULL,
        tests TEXT NOT NULL,
        prepared_snapshot TEXT,
        error TEXT,
        created_at_ms BIGINT NOT NULL
     );
     CREATE TABLE round_sessions (
        id TEXT PRIMARY KEY,
        round_id TEXT NOT NULL REFERENCES rounds(id),
        candidate TEXT NOT NULL,
        state TEXT NOT NULL,
        sandbox_id TEXT,
        created_at_ms BIGINT NOT NULL,
        expires_at_ms BIGINT NOT NULL,
        error TEXT
     );
     CREATE INDEX round_sessions_round ON round_sessions(round_id, created_at_ms);
     CREATE INDEX round_sessions_expiry ON round_sessions(state, expires_at_ms);
     CREATE TABLE round_tokens (
        hash TEXT PRIMARY KEY,
        scope TEXT NOT NULL,
        round_id TEXT NOT NULL,
        session_id TEXT,
        created_at_ms BIGINT NOT NULL,
        expires_at_ms BIGINT NOT NULL
     );
     CREATE TABLE round_runs (
        seq BIGSERIAL PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        session_id TEXT NOT NULL,
        created_at_ms BIGINT NOT NULL,
        result TEXT NOT NULL
     );
     CREATE INDEX round_runs_session ON round_runs(session_id, seq);
     CREATE TABLE round_submissions (
        seq BIGSERIAL PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        session_id TEXT NOT NULL,
        round_id TEXT NOT NULL,
        files TEXT NOT NULL,
        sha256 TEXT NOT NULL,
        created_at_ms BIGINT NOT NULL
     );
     CREATE INDEX round_submissions_session ON round_submissions(session_id, seq);
     CREATE TABLE round_gradings (
        seq BIGSERIAL PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        submission_id TEXT NOT NULL,
        created_at_ms BIGINT NOT NULL,
        status TEXT NOT NULL,
        passed BIGINT NOT NULL,
        total BIGINT NOT NULL,
        report TEXT NOT NULL
     );
     CREATE INDEX round_gradings_submission ON round_gradings(submission_id, seq);
     CREATE TABLE round_replays (
        id TEXT PRIMARY KEY,
        session_id TEXT NOT NULL,
        round_id TEXT NOT NULL,
        snapshot_id TEXT NOT NULL,
        reason TEXT NOT NULL,
        created_at_ms BIGINT NOT NULL,
        expires_at_ms BIGINT NOT NULL,
        state TEXT NOT NULL
     );
     CREATE INDEX round_replays_session ON round_replays(session_id, created_at_ms);
     CREATE INDEX round_replays_due ON round_replays(state, expires_at_ms);
     CREATE TABLE round_forks (
        id TEXT PRIMARY KEY,
        replay_id TEXT NOT NULL,
        round_id TEXT NOT NULL,
        sandbox_id TEXT NOT NULL,
        owner TEXT NOT NULL,
        created_at_ms BIGINT NOT NULL,
        expires_at_ms BIGINT NOT NULL
     );"];

/// Any fixed number, distinct from the other stores' ("hatcrnds"): the
/// transaction-scoped advisory lock that serializes migration runs.
const MIGRATION_LOCK: i64 = 0x6861_7463_726e_6473;

const SCHEMA: hatchery_store::PgMigrations = hatchery_store::PgMigrations {
    name: "rounds",
    table: "rounds_schema",
    lock: MIGRATION_LOCK,
    steps: MIGRATIONS,
};

/// The rounds store on PostgreSQL: a pool of connections to the shared
/// database, and a second one for session holds (`pg_lock.rs`), which
/// keep their connection for as long as a Run lasts and must not starve
/// the queries.
#[derive(Clone)]
pub struct PgStore {
    pool: Pool,
    locks: Pool,
}

/// A driver error, named by what was being done: `Unavailable` when the
/// database is not there (retryable), `Conflict` for a refused constraint
/// (SQLSTATE class 23, as SQLite's constraint violations), `Backend`
/// otherwise.
pub(super) fn pg(what: &'static str) -> impl Fn(tokio_postgres::Error) -> StoreError {
    move |e| {
        let msg = format!("{what}: {}", hatchery_store::pg_message(&e));
        if hatchery_store::pg_unavailable(&e) {
            StoreError::Unavailable(msg)
        } else if e.code().is_some_and(|c| c.code().starts_with("23")) {
            StoreError::Conflict(msg)
        } else {
            StoreError::Backend(msg)
        }
    }
}

fn migrate_err(e: hatchery_store::MigrateError) -> StoreError {
    if e.unavailable() {
        StoreError::Unavailable(e.to_string())
    } else {
        StoreError::Backend(e.to_string())
    }
}

/// A time to compare with: past the largest stored value is as good as it.
fn clamp(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

impl PgStore {
    /// The shared PostgreSQL database at `dsn` (a `postgres://` URL or a
    /// libpq string), through a pool of at most `pool_size` connections
    /// for queries and as many again for sessions held during a Run (a
    /// Run or Submit beyond that waits for one); runs the rounds
    /// migrations first. `Unavailable` when the database
    /// is not reachable (retryable), `Backend` for a DSN that cannot be
    /// read or a schema this build cannot use.
    pub async fn connect(dsn: &str, pool_size: usize) -> Result<PgStore, StoreError> {
        let open = || {
            hatchery_store::pg_pool(dsn, pool_size)
                .map_err(|e| StoreError::Backend(format!("rounds store: {e}")))
        };
        let s = PgStore {
            pool: open()?,
            locks: open()?,
        };
        s.migrate().await?;
        Ok(s)
    }

    async fn client(&self) -> StoreResult<deadpool_postgres::Client> {
        self.pool
            .get()
            .await
            .map_err(|e| StoreError::Unavailable(format!("connect: {e}")))
    }

    /// Runs the migrations not yet recorded, in one transaction under the
    /// advisory lock: two daemons starting at once end with one schema, and
    /// a second run is a no-op.
    async fn migrate(&self) -> StoreResult<()> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(pg("begin migration"))?;
        SCHEMA.run(&tx).await.map_err(migrate_err)?;
        tx.commit().await.map_err(pg("commit migration"))
    }

    /// How many migrations the database has recorded (tests).
    #[cfg(test)]
    pub(super) async fn schema_version(&self) -> StoreResult<u64> {
        let c = self.client().await?;
        SCHEMA.version(&c).await.map_err(migrate_err)
    }

    async fn one<T>(
        &self,
        what: &'static str,
        sql: &str,
        p: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        f: fn(&Row) -> StoreResult<T>,
    ) -> StoreResult<Option<T>> {
        let c = self.client().await?;
        c.query_opt(sql, p)
            .await
            .map_err(pg(what))?
            .as_ref()
            .map(f)
            .transpose()
    }

    async fn many<T>(
        &self,
        what: &'static str,
        sql: &str,
        p: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        f: fn(&Row) -> StoreResult<T>,
    ) -> StoreResult<Vec<T>> {
        let c = self.client().await?;
        c.query(sql, p)
            .await
            .map_err(pg(what))?
            .iter()
            .map(f)
            .collect()
    }

    async fn exec(
        &self,
        what: &'static str,
        sql: &str,
        p: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> StoreResult<u64> {
        let c = self.client().await?;
        c.execute(sql, p).await.map_err(pg(what))
    }
}

/// Our own enum names, for `state = ANY($n)`.
fn names<T: Copy>(from: &[T], name: impl Fn(T) -> &'static str) -> Vec<&'static str> {
    from.iter().map(|s| name(*s)).collect()
}

#[async_trait]
impl RoundStore for PgStore {
    async fn insert_round(&self, r: &RoundRecord) -> StoreResult<()> {
        self.exec(
            "insert round",
            "INSERT INTO rounds (id, name, state, template, template_version, spec, tests,
                prepared_snapshot, error, created_at_ms)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            &[
                &r.id,
                &r.name,
                &r.state.as_str(),
                &r.template,
                &r.template_version,
                &r.spec,
                &r.tests,
                &r.prepared_snapshot,
                &r.error,
                &big("created_at_ms", r.created_at_ms)?,
            ],
        )
        .await?;
        Ok(())
    }

    async fn get_round(&self, id: &str) -> StoreResult<Option<RoundRecord>> {
        self.one(
            "read round",
            "SELECT * FROM rounds WHERE id = $1",
            &[&id],
            round_row,
        )
        .await
    }

    async fn list_rounds(&self) -> StoreResult<Vec<RoundRecord>> {
        self.many(
            "list rounds",
            "SELECT * FROM rounds ORDER BY created_at_ms, id",
            &[],
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
        let n = self
            .exec(
                "set round state",
                "UPDATE rounds SET state = $2,
                    prepared_snapshot = COALESCE($3, prepared_snapshot),
                    error = COALESCE($4, error)
                 WHERE id = $1 AND state = ANY($5)",
                &[
                    &id,
                    &to.as_str(),
                    &prepared_snapshot,
                    &error,
                    &names(from, RoundState::as_str),
                ],
            )
            .await?;
        Ok(n == 1)
    }

    async fn insert_session(&self, s: &SessionRecord, t: &TokenRecord) -> StoreResult<()> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(pg("begin session"))?;
        tx.execute(
            "INSERT INTO round_sessions (id, round_id, candidate, state, sandbox_id,
                created_at_ms, expires_at_ms, error)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            &[
                &s.id,
                &s.round_id,
                &s.candidate,
                &s.state.as_str(),
                &s.sandbox_id,
                &big("created_at_ms", s.created_at_ms)?,
                &big("expires_at_ms", s.expires_at_ms)?,
                &s.error,
            ],
        )
        .await
        .map_err(pg("insert session"))?;
        insert_token(&tx, t).await?;
        tx.commit().await.map_err(pg("commit session"))
    }

    async fn get_session(&self, id: &str) -> StoreResult<Option<SessionRecord>> {
        self.one(
            "read session",
            "SELECT * FROM round_sessions WHERE id = $1",
            &[&id],
            session_row,
        )
        .await
    }

    async fn list_sessions(&self, round_id: &str) -> StoreResult<Vec<SessionRecord>> {
        self.many(
            "list sessions",
            "SELECT * FROM round_sessions WHERE round_id = $1 ORDER BY created_at_ms, id",
            &[&round_id],
            session_row,
        )
        .await
    }

    async fn sessions_in_state(&self, state: SessionState) -> StoreResult<Vec<SessionRecord>> {
        self.many(
            "list sessions in state",
            "SELECT * FROM round_sessions WHERE state = $1 ORDER BY created_at_ms, id",
            &[&state.as_str()],
            session_row,
        )
        .await
    }

    async fn expired_sessions(&self, now_ms: u64) -> StoreResult<Vec<SessionRecord>> {
        self.many(
            "list expired sessions",
            "SELECT * FROM round_sessions WHERE state <> 'ended' AND expires_at_ms <= $1
             ORDER BY created_at_ms, id",
            &[&clamp(now_ms)],
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
        let n = self
            .exec(
                "set session state",
                "UPDATE round_sessions SET state = $2,
                    sandbox_id = COALESCE($3, sandbox_id), error = COALESCE($4, error)
                 WHERE id = $1 AND state = ANY($5)",
                &[
                    &id,
                    &to.as_str(),
                    &sandbox_id,
                    &error,
                    &names(from, SessionState::as_str),
                ],
            )
            .await?;
        Ok(n == 1)
    }

    async fn insert_token(&self, t: &TokenRecord) -> StoreResult<()> {
        let c = self.client().await?;
        insert_token(&c, t).await
    }

    async fn get_token(&self, hash: &str) -> StoreResult<Option<TokenRecord>> {
        self.one(
            "read token",
            "SELECT * FROM round_tokens WHERE hash = $1",
            &[&hash],
            token_row,
        )
        .await
    }

    async fn insert_run(&self, r: &RunRecord, keep: usize) -> StoreResult<()> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(pg("begin run"))?;
        tx.execute(
            "INSERT INTO round_runs (id, session_id, created_at_ms, result)
             VALUES ($1, $2, $3, $4)",
            &[
                &r.id,
                &r.session_id,
                &big("created_at_ms", r.created_at_ms)?,
                &r.result,
            ],
        )
        .await
        .map_err(pg("insert run"))?;
        tx.execute(
            "DELETE FROM round_runs WHERE session_id = $1 AND seq NOT IN
                (SELECT seq FROM round_runs WHERE session_id = $1 ORDER BY seq DESC LIMIT $2)",
            &[&r.session_id, &i64::try_from(keep).unwrap_or(i64::MAX)],
        )
        .await
        .map_err(pg("prune runs"))?;
        tx.commit().await.map_err(pg("commit run"))
    }

    async fn list_runs(&self, session_id: &str) -> StoreResult<Vec<RunRecord>> {
        self.many(
            "list runs",
            "SELECT * FROM round_runs WHERE session_id = $1 ORDER BY seq",
            &[&session_id],
            run_row,
        )
        .await
    }

    async fn begin_submission(
        &self,
        sub: &SubmissionRecord,
        from: &[SessionState],
    ) -> StoreResult<bool> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(pg("begin submission"))?;
        let moved = tx
            .execute(
                "UPDATE round_sessions SET state = 'submitted' WHERE id = $1 AND state = ANY($2)",
                &[&sub.session_id, &names(from, SessionState::as_str)],
            )
            .await
            .map_err(pg("move session to submitted"))?;
        if moved != 1 {
            // Dropped unfinished: rolled back, nothing written.
            return Ok(false);
        }
        tx.execute(
            "INSERT INTO round_submissions (id, session_id, round_id, files, sha256,
                created_at_ms)
             VALUES ($1, $2, $3, $4, $5, $6)",
            &[
                &sub.id,
                &sub.session_id,
                &sub.round_id,
                &sub.files,
                &sub.sha256,
                &big("created_at_ms", sub.created_at_ms)?,
            ],
        )
        .await
        .map_err(pg("insert submission"))?;
        tx.commit().await.map_err(pg("commit submission"))?;
        Ok(true)
    }

    async fn finish_grading(&self, g: &GradingRecord, session_id: &str) -> StoreResult<bool> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(pg("begin grading"))?;
        // The lock two racing first gradings serialize on; the check below
        // runs after the other one committed, and sees its row.
        let stored = tx
            .query_opt(
                "SELECT id FROM round_submissions WHERE id = $1 FOR UPDATE",
                &[&g.submission_id],
            )
            .await
            .map_err(pg("lock submission"))?;
        if stored.is_none() {
            return Err(StoreError::Conflict(format!(
                "submission {} is not stored",
                g.submission_id
            )));
        }
        let graded = tx
            .query_opt(
                "SELECT 1 AS one FROM round_gradings WHERE submission_id = $1 LIMIT 1",
                &[&g.submission_id],
            )
            .await
            .map_err(pg("look for a grading"))?;
        if graded.is_some() {
            return Ok(false);
        }
        insert_grading(&tx, g).await?;
        tx.execute(
            "UPDATE round_sessions SET state = 'graded' WHERE id = $1 AND state = 'submitted'",
            &[&session_id],
        )
        .await
        .map_err(pg("move session to graded"))?;
        tx.commit().await.map_err(pg("commit grading"))?;
        Ok(true)
    }

    async fn insert_grading(&self, g: &GradingRecord) -> StoreResult<()> {
        let c = self.client().await?;
        insert_grading(&c, g).await
    }

    async fn get_submission(&self, id: &str) -> StoreResult<Option<SubmissionRecord>> {
        self.one(
            "read submission",
            "SELECT * FROM round_submissions WHERE id = $1",
            &[&id],
            submission_row,
        )
        .await
    }

    async fn list_submissions(&self, session_id: &str) -> StoreResult<Vec<SubmissionRecord>> {
        self.many(
            "list submissions",
            "SELECT * FROM round_submissions WHERE session_id = $1 ORDER BY seq",
            &[&session_id],
            submission_row,
        )
        .await
    }

    async fn list_gradings(&self, submission_id: &str) -> StoreResult<Vec<GradingRecord>> {
        self.many(
            "list gradings",
            "SELECT * FROM round_gradings WHERE submission_id = $1 ORDER BY seq",
            &[&submission_id],
            grading_row,
        )
        .await
    }

    async fn insert_replay(&self, r: &ReplayRecord) -> StoreResult<()> {
        self.exec(
            "insert replay",
            "INSERT INTO round_replays (id, session_id, round_id, snapshot_id, reason,
                created_at_ms, expires_at_ms, state)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            &[
                &r.id,
                &r.session_id,
                &r.round_id,
                &r.snapshot_id,
                &r.reason,
                &big("created_at_ms", r.created_at_ms)?,
                &big("expires_at_ms", r.expires_at_ms)?,
                &r.state,
            ],
        )
        .await?;
        Ok(())
    }

    async fn get_replay(&self, id: &str) -> StoreResult<Option<ReplayRecord>> {
        self.one(
            "read replay",
            "SELECT * FROM round_replays WHERE id = $1",
            &[&id],
            replay_row,
        )
        .await
    }

    async fn list_replays(&self, session_id: &str) -> StoreResult<Vec<ReplayRecord>> {
        self.many(
            "list replays",
            "SELECT * FROM round_replays WHERE session_id = $1 ORDER BY created_at_ms, id",
            &[&session_id],
            replay_row,
        )
        .await
    }

    async fn due_replays(&self, now_ms: u64) -> StoreResult<Vec<ReplayRecord>> {
        self.many(
            "list due replays",
            "SELECT * FROM round_replays WHERE state = 'active' AND expires_at_ms <= $1
             ORDER BY expires_at_ms, id",
            &[&clamp(now_ms)],
            replay_row,
        )
        .await
    }

    async fn expire_replay(&self, id: &str) -> StoreResult<bool> {
        let n = self
            .exec(
                "expire replay",
                "UPDATE round_replays SET state = 'expired' WHERE id = $1 AND state = 'active'",
                &[&id],
            )
            .await?;
        Ok(n == 1)
    }

    async fn insert_fork(&self, f: &ForkRecord) -> StoreResult<()> {
        self.exec(
            "insert fork",
            "INSERT INTO round_forks (id, replay_id, round_id, sandbox_id, owner,
                created_at_ms, expires_at_ms)
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
            &[
                &f.id,
                &f.replay_id,
                &f.round_id,
                &f.sandbox_id,
                &f.owner,
                &big("created_at_ms", f.created_at_ms)?,
                &big("expires_at_ms", f.expires_at_ms)?,
            ],
        )
        .await?;
        Ok(())
    }

    async fn get_fork(&self, id: &str) -> StoreResult<Option<ForkRecord>> {
        self.one(
            "read fork",
            "SELECT * FROM round_forks WHERE id = $1",
            &[&id],
            fork_row,
        )
        .await
    }

    async fn list_forks(&self, replay_id: &str) -> StoreResult<Vec<ForkRecord>> {
        self.many(
            "list forks",
            "SELECT * FROM round_forks WHERE replay_id = $1 ORDER BY created_at_ms, id",
            &[&replay_id],
            fork_row,
        )
        .await
    }

    async fn lock_session(&self, session_id: &str, wait: bool) -> StoreResult<Option<SessionHold>> {
        super::pg_lock::lock_session(&self.locks, session_id, wait).await
    }

    async fn delete_fork(&self, id: &str) -> StoreResult<bool> {
        let n = self
            .exec(
                "delete fork",
                "DELETE FROM round_forks WHERE id = $1",
                &[&id],
            )
            .await?;
        Ok(n == 1)
    }
}

async fn insert_token(c: &impl GenericClient, t: &TokenRecord) -> StoreResult<()> {
    c.execute(
        "INSERT INTO round_tokens (hash, scope, round_id, session_id, created_at_ms,
            expires_at_ms)
         VALUES ($1, $2, $3, $4, $5, $6)",
        &[
            &t.hash,
            &t.scope.as_str(),
            &t.round_id,
            &t.session_id,
            &big("created_at_ms", t.created_at_ms)?,
            &big("expires_at_ms", t.expires_at_ms)?,
        ],
    )
    .await
    .map_err(pg("insert token"))?;
    Ok(())
}

async fn insert_grading(c: &impl GenericClient, g: &GradingRecord) -> StoreResult<()> {
    c.execute(
        "INSERT INTO round_gradings (id, submission_id, created_at_ms, status, passed, total,
            report)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
        &[
            &g.id,
            &g.submission_id,
            &big("created_at_ms", g.created_at_ms)?,
            &g.status,
            &i64::from(g.passed),
            &i64::from(g.total),
            &g.report,
        ],
    )
    .await
    .map_err(pg("insert grading"))?;
    Ok(())
}

// Rows, their columns read by name.

fn get<'a, T: tokio_postgres::types::FromSql<'a>>(r: &'a Row, col: &str) -> StoreResult<T> {
    r.try_get(col)
        .map_err(|e| StoreError::Corrupt(format!("column {col}: {e}")))
}

fn ms(r: &Row, col: &str) -> StoreResult<u64> {
    Ok(unsigned(get(r, col)?))
}

fn count(r: &Row, col: &str) -> StoreResult<u32> {
    let v: i64 = get(r, col)?;
    u32::try_from(v).map_err(|_| StoreError::Corrupt(format!("column {col}: {v}")))
}

fn round_row(r: &Row) -> StoreResult<RoundRecord> {
    let state: String = get(r, "state")?;
    Ok(RoundRecord {
        id: get(r, "id")?,
        name: get(r, "name")?,
        state: RoundState::parse(&state)
            .ok_or_else(|| StoreError::Corrupt(format!("round state {state:?}")))?,
        template: get(r, "template")?,
        template_version: get(r, "template_version")?,
        spec: get(r, "spec")?,
        tests: get(r, "tests")?,
        prepared_snapshot: get(r, "prepared_snapshot")?,
        error: get(r, "error")?,
        created_at_ms: ms(r, "created_at_ms")?,
    })
}

fn session_row(r: &Row) -> StoreResult<SessionRecord> {
    let state: String = get(r, "state")?;
    Ok(SessionRecord {
        id: get(r, "id")?,
        round_id: get(r, "round_id")?,
        candidate: get(r, "candidate")?,
        state: SessionState::parse(&state)
            .ok_or_else(|| StoreError::Corrupt(format!("session state {state:?}")))?,
        sandbox_id: get(r, "sandbox_id")?,
        created_at_ms: ms(r, "created_at_ms")?,
        expires_at_ms: ms(r, "expires_at_ms")?,
        error: get(r, "error")?,
    })
}

fn token_row(r: &Row) -> StoreResult<TokenRecord> {
    let scope: String = get(r, "scope")?;
    Ok(TokenRecord {
        hash: get(r, "hash")?,
        scope: Scope::parse(&scope)
            .ok_or_else(|| StoreError::Corrupt(format!("token scope {scope:?}")))?,
        round_id: get(r, "round_id")?,
        session_id: get(r, "session_id")?,
        created_at_ms: ms(r, "created_at_ms")?,
        expires_at_ms: ms(r, "expires_at_ms")?,
    })
}

fn run_row(r: &Row) -> StoreResult<RunRecord> {
    Ok(RunRecord {
        id: get(r, "id")?,
        session_id: get(r, "session_id")?,
        created_at_ms: ms(r, "created_at_ms")?,
        result: get(r, "result")?,
    })
}

fn submission_row(r: &Row) -> StoreResult<SubmissionRecord> {
    Ok(SubmissionRecord {
        id: get(r, "id")?,
        session_id: get(r, "session_id")?,
        round_id: get(r, "round_id")?,
        files: get(r, "files")?,
        sha256: get(r, "sha256")?,
        created_at_ms: ms(r, "created_at_ms")?,
    })
}

fn grading_row(r: &Row) -> StoreResult<GradingRecord> {
    Ok(GradingRecord {
        id: get(r, "id")?,
        submission_id: get(r, "submission_id")?,
        created_at_ms: ms(r, "created_at_ms")?,
        status: get(r, "status")?,
        passed: count(r, "passed")?,
        total: count(r, "total")?,
        report: get(r, "report")?,
    })
}

fn replay_row(r: &Row) -> StoreResult<ReplayRecord> {
    Ok(ReplayRecord {
        id: get(r, "id")?,
        session_id: get(r, "session_id")?,
        round_id: get(r, "round_id")?,
        snapshot_id: get(r, "snapshot_id")?,
        reason: get(r, "reason")?,
        created_at_ms: ms(r, "created_at_ms")?,
        expires_at_ms: ms(r, "expires_at_ms")?,
        state: get(r, "state")?,
    })
}

fn fork_row(r: &Row) -> StoreResult<ForkRecord> {
    Ok(ForkRecord {
        id: get(r, "id")?,
        replay_id: get(r, "replay_id")?,
        round_id: get(r, "round_id")?,
        sandbox_id: get(r, "sandbox_id")?,
        owner: get(r, "owner")?,
        created_at_ms: ms(r, "created_at_ms")?,
        expires_at_ms: ms(r, "expires_at_ms")?,
    })
}
