//! The rounds store: its queries over the deployment's one database,
//! written once for SQLite and PostgreSQL (`hatchery-db` rewrites the
//! little that differs). Each record is its table's row, read and written
//! by its field names (`hatchery_db::record!`).
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
use hatchery_db::{args, Db, Record, ToValue, Value};

/// The rounds store on the deployment's database (cheap to clone).
#[derive(Clone)]
pub struct DbStore {
    db: Db,
    /// Group commit of the rooms' updates (`appender.rs`).
    appender: super::appender::Appender,
    /// Session holds across processes: PostgreSQL only (see `pg_lock.rs`).
    holds: Option<super::pg_lock::Holds>,
}

impl DbStore {
    /// Brings the rounds tables up to date (see `schema.rs`) and opens the
    /// store on `db`.
    pub async fn open(db: Db) -> StoreResult<DbStore> {
        db.migrate(&super::MIGRATIONS).await?;
        let holds = db.pg_pool().map(super::pg_lock::Holds::new);
        let appender = super::appender::Appender::start(db.clone());
        Ok(DbStore {
            db,
            appender,
            holds,
        })
    }

    async fn insert<T: Record>(&self, r: &T) -> StoreResult<()> {
        self.db.insert(r).await?;
        Ok(())
    }
}

/// A time to compare with: past the largest stored value is as good as it.
fn clamp(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

/// `UPDATE <table> SET <set> WHERE id = $1 AND state IN (NULL, $k, ...)`
/// and its arguments: `a`, then the states `from`. It changes one row or
/// none; none at all if `from` is empty (`NULL` matches no row).
fn guarded<S: ToValue>(
    table: &str,
    set: &str,
    mut a: Vec<Value>,
    from: &[S],
) -> StoreResult<(String, Vec<Value>)> {
    let mut marks = String::from("NULL");
    for s in from {
        a.push(s.to_value("state")?);
        marks += &format!(", ${}", a.len());
    }
    let sql = format!("UPDATE {table} SET {set} WHERE id = $1 AND state IN ({marks})");
    Ok((sql, a))
}

#[async_trait]
impl RoundStore for DbStore {
    async fn insert_round(&self, r: &RoundRecord) -> StoreResult<()> {
        self.insert(r).await
    }

    async fn get_round(&self, id: &str) -> StoreResult<Option<RoundRecord>> {
        Ok(self.db.select_opt("WHERE id = $1", args![id]).await?)
    }

    async fn list_rounds(&self) -> StoreResult<Vec<RoundRecord>> {
        let order = "ORDER BY created_at_ms, id";
        Ok(self.db.select(order, args![]).await?)
    }

    async fn set_round_state(
        &self,
        id: &str,
        from: &[RoundState],
        to: RoundState,
        prepared_snapshot: Option<&str>,
        error: Option<&str>,
    ) -> StoreResult<bool> {
        let set = "state = $2, prepared_snapshot = COALESCE($3, prepared_snapshot),
             error = COALESCE($4, error)";
        let a = args![id, to.as_str(), prepared_snapshot, error].to_vec();
        let (sql, a) = guarded("rounds", set, a, from)?;
        Ok(self.db.execute(&sql, &a).await? == 1)
    }

    async fn insert_session(&self, s: &SessionRecord, t: &TokenRecord) -> StoreResult<()> {
        let mut tx = self.db.begin().await?;
        tx.insert(s).await?;
        tx.insert(t).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn get_session(&self, id: &str) -> StoreResult<Option<SessionRecord>> {
        Ok(self.db.select_opt("WHERE id = $1", args![id]).await?)
    }

    async fn list_sessions(&self, round_id: &str) -> StoreResult<Vec<SessionRecord>> {
        let order = "WHERE round_id = $1 ORDER BY created_at_ms, id";
        Ok(self.db.select(order, args![round_id]).await?)
    }

    async fn sessions_in_state(&self, state: SessionState) -> StoreResult<Vec<SessionRecord>> {
        let order = "WHERE state = $1 ORDER BY created_at_ms, id";
        Ok(self.db.select(order, args![state.as_str()]).await?)
    }

    async fn expired_sessions(&self, now_ms: u64) -> StoreResult<Vec<SessionRecord>> {
        let due = "WHERE state <> 'ended' AND expires_at_ms <= $1 ORDER BY created_at_ms, id";
        Ok(self.db.select(due, args![clamp(now_ms)]).await?)
    }

    async fn set_session_state(
        &self,
        id: &str,
        from: &[SessionState],
        to: SessionState,
        sandbox_id: Option<&str>,
        error: Option<&str>,
    ) -> StoreResult<bool> {
        let set = "state = $2, sandbox_id = COALESCE($3, sandbox_id), error = COALESCE($4, error)";
        let a = args![id, to.as_str(), sandbox_id, error].to_vec();
        let (sql, a) = guarded("round_sessions", set, a, from)?;
        Ok(self.db.execute(&sql, &a).await? == 1)
    }

    async fn insert_token(&self, t: &TokenRecord) -> StoreResult<()> {
        self.insert(t).await
    }

    async fn get_token(&self, hash: &str) -> StoreResult<Option<TokenRecord>> {
        Ok(self.db.select_opt("WHERE hash = $1", args![hash]).await?)
    }

    async fn insert_run(&self, r: &RunRecord, keep: usize) -> StoreResult<()> {
        let mut tx = self.db.begin().await?;
        tx.insert(r).await?;
        let trim = "DELETE FROM round_runs WHERE session_id = $1 AND seq NOT IN
            (SELECT seq FROM round_runs WHERE session_id = $1 ORDER BY seq DESC LIMIT $2)";
        let keep = i64::try_from(keep).unwrap_or(i64::MAX);
        tx.execute(trim, args![&r.session_id, keep]).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn list_runs(&self, session_id: &str) -> StoreResult<Vec<RunRecord>> {
        let order = "WHERE session_id = $1 ORDER BY seq";
        Ok(self.db.select(order, args![session_id]).await?)
    }

    async fn begin_submission(
        &self,
        sub: &SubmissionRecord,
        from: &[SessionState],
    ) -> StoreResult<bool> {
        let a = args![&sub.session_id].to_vec();
        let (sql, a) = guarded("round_sessions", "state = 'submitted'", a, from)?;
        let mut tx = self.db.begin().await?;
        if tx.execute(&sql, &a).await? != 1 {
            // Dropped unfinished: rolled back, nothing written.
            return Ok(false);
        }
        tx.insert(sub).await?;
        tx.commit().await?;
        Ok(true)
    }

    async fn finish_grading(&self, g: &GradingRecord, session_id: &str) -> StoreResult<bool> {
        let mut tx = self.db.begin().await?;
        // The lock two racing first gradings serialize on; the check below
        // runs after the other one committed, and sees its row.
        let sub = args![&g.submission_id];
        let lock = "SELECT id FROM round_submissions WHERE id = $1 FOR UPDATE";
        if tx.query_opt(lock, sub).await?.is_none() {
            return Err(StoreError::Conflict(format!(
                "submission {} is not stored",
                g.submission_id
            )));
        }
        let graded = "SELECT 1 AS one FROM round_gradings WHERE submission_id = $1 LIMIT 1";
        if tx.query_opt(graded, sub).await?.is_some() {
            return Ok(false);
        }
        tx.insert(g).await?;
        let to_graded =
            "UPDATE round_sessions SET state = 'graded' WHERE id = $1 AND state = 'submitted'";
        tx.execute(to_graded, args![session_id]).await?;
        tx.commit().await?;
        Ok(true)
    }

    async fn insert_grading(&self, g: &GradingRecord) -> StoreResult<()> {
        self.insert(g).await
    }

    async fn get_submission(&self, id: &str) -> StoreResult<Option<SubmissionRecord>> {
        Ok(self.db.select_opt("WHERE id = $1", args![id]).await?)
    }

    async fn list_submissions(&self, session_id: &str) -> StoreResult<Vec<SubmissionRecord>> {
        let order = "WHERE session_id = $1 ORDER BY seq";
        Ok(self.db.select(order, args![session_id]).await?)
    }

    async fn list_gradings(&self, submission_id: &str) -> StoreResult<Vec<GradingRecord>> {
        let order = "WHERE submission_id = $1 ORDER BY seq";
        Ok(self.db.select(order, args![submission_id]).await?)
    }

    async fn insert_replay(&self, r: &ReplayRecord) -> StoreResult<()> {
        self.insert(r).await
    }

    async fn get_replay(&self, id: &str) -> StoreResult<Option<ReplayRecord>> {
        Ok(self.db.select_opt("WHERE id = $1", args![id]).await?)
    }

    async fn list_replays(&self, session_id: &str) -> StoreResult<Vec<ReplayRecord>> {
        let order = "WHERE session_id = $1 ORDER BY created_at_ms, id";
        Ok(self.db.select(order, args![session_id]).await?)
    }

    async fn due_replays(&self, now_ms: u64) -> StoreResult<Vec<ReplayRecord>> {
        let due = "WHERE state = 'active' AND expires_at_ms <= $1 ORDER BY expires_at_ms, id";
        Ok(self.db.select(due, args![clamp(now_ms)]).await?)
    }

    async fn expire_replay(&self, id: &str) -> StoreResult<bool> {
        let sql = "UPDATE round_replays SET state = 'expired' WHERE id = $1 AND state = 'active'";
        Ok(self.db.execute(sql, args![id]).await? == 1)
    }

    async fn append_doc_log(&self, e: &DocLogRecord) -> StoreResult<()> {
        if e.kind != "update" {
            return self.insert(e).await;
        }
        // A keystroke's update commits without waiting for the disk
        // (`Db::begin_relaxed`: safe against the daemon's crash; a power
        // loss, which ends the sandbox too, can lose the last few). One
        // fsync per keystroke, serialized over every room of the host,
        // was the fan-out's bottleneck (bench/room_bench.py). The seed and
        // the Run and Submit markers stay durable, and their commit makes
        // every update before them durable too (WAL order). Updates from
        // all rooms waiting at once commit together (`appender.rs`).
        self.appender.append(e.clone()).await
    }

    async fn doc_log(&self, session_id: &str, upto: Option<u64>) -> StoreResult<Vec<DocLogRecord>> {
        let upto = clamp(upto.unwrap_or(u64::MAX));
        let order = "WHERE session_id = $1 AND idx <= $2 ORDER BY idx";
        Ok(self.db.select(order, args![session_id, upto]).await?)
    }

    async fn doc_log_tail(
        &self,
        session_id: &str,
        after: Option<u64>,
        upto: u64,
    ) -> StoreResult<Vec<DocLogRecord>> {
        // -1: before entry 0, the seed.
        let after = after.map_or(-1, clamp);
        let order = "WHERE session_id = $1 AND idx > $2 AND idx <= $3 ORDER BY idx";
        Ok(self
            .db
            .select(order, args![session_id, after, clamp(upto)])
            .await?)
    }

    async fn doc_checkpoint(
        &self,
        session_id: &str,
        at: u64,
    ) -> StoreResult<Option<DocCheckpointRecord>> {
        let last = "WHERE session_id = $1 AND idx <= $2 ORDER BY idx DESC LIMIT 1";
        Ok(self
            .db
            .select_opt(last, args![session_id, clamp(at)])
            .await?)
    }

    async fn doc_checkpoints(&self, session_id: &str) -> StoreResult<Vec<DocCheckpointRecord>> {
        let order = "WHERE session_id = $1 ORDER BY idx";
        Ok(self.db.select(order, args![session_id]).await?)
    }

    async fn put_doc_checkpoints(
        &self,
        cps: &[DocCheckpointRecord],
        max_count: usize,
        max_bytes: u64,
    ) -> StoreResult<usize> {
        let Some(first) = cps.first() else {
            return Ok(0);
        };
        let sid = &first.session_id;
        // A cache, rebuilt from the log if lost: no fsync of its own.
        let mut tx = self.db.begin_relaxed().await?;
        // Two reviewers' playbacks of one session take turns, so the caps
        // hold across processes (PostgreSQL; SQLite's writers already do).
        tx.lock(&format!("round_doc_checkpoints:{sid}")).await?;
        let sums = "SELECT COUNT(*) AS n, CAST(COALESCE(SUM(LENGTH(state)), 0) AS BIGINT) AS bytes
            FROM round_doc_checkpoints WHERE session_id = $1";
        let row = tx.query_one(sums, args![sid]).await?;
        let (mut count, mut bytes): (u64, u64) = (row.get("n")?, row.get("bytes")?);
        let put =
            "INSERT INTO round_doc_checkpoints (session_id, idx, state, log_bytes, created_at_ms)
            VALUES ($1, $2, $3, $4, $5) ON CONFLICT (session_id, idx) DO NOTHING";
        let mut stored = 0;
        for c in cps {
            let len = c.state.len() as u64;
            if c.session_id != *sid || count >= max_count as u64 || bytes + len > max_bytes {
                continue;
            }
            let a = args![
                sid,
                clamp(c.idx),
                &c.state,
                clamp(c.log_bytes),
                clamp(c.created_at_ms)
            ];
            if tx.execute(put, a).await? == 1 {
                stored += 1;
                count += 1;
                bytes += len;
            }
        }
        tx.commit().await?;
        Ok(stored)
    }

    async fn delete_room_data(&self, session_id: &str) -> StoreResult<u64> {
        let mut tx = self.db.begin().await?;
        // Before the log they hang off (the foreign key would cascade too).
        tx.execute(
            "DELETE FROM round_doc_checkpoints WHERE session_id = $1",
            args![session_id],
        )
        .await?;
        let n = tx
            .execute(
                "DELETE FROM round_doc_log WHERE session_id = $1",
                args![session_id],
            )
            .await?;
        tx.execute(
            "DELETE FROM round_notes WHERE session_id = $1",
            args![session_id],
        )
        .await?;
        tx.commit().await?;
        Ok(n)
    }

    async fn get_notes(&self, session_id: &str) -> StoreResult<Option<NotesRecord>> {
        Ok(self
            .db
            .select_opt("WHERE session_id = $1", args![session_id])
            .await?)
    }

    async fn put_notes(&self, n: &NotesRecord) -> StoreResult<()> {
        let sql = "INSERT INTO round_notes (session_id, text, author, updated_at_ms)
            VALUES ($1, $2, $3, $4) ON CONFLICT (session_id) DO UPDATE SET
            text = excluded.text, author = excluded.author, updated_at_ms = excluded.updated_at_ms";
        let a = args![&n.session_id, &n.text, &n.author, clamp(n.updated_at_ms)];
        self.db.execute(sql, a).await?;
        Ok(())
    }

    async fn insert_fork(&self, f: &ForkRecord) -> StoreResult<()> {
        self.insert(f).await
    }

    async fn get_fork(&self, id: &str) -> StoreResult<Option<ForkRecord>> {
        Ok(self.db.select_opt("WHERE id = $1", args![id]).await?)
    }

    async fn list_forks(&self, replay_id: &str) -> StoreResult<Vec<ForkRecord>> {
        let order = "WHERE replay_id = $1 ORDER BY created_at_ms, id";
        Ok(self.db.select(order, args![replay_id]).await?)
    }

    async fn delete_fork(&self, id: &str) -> StoreResult<bool> {
        let sql = "DELETE FROM round_forks WHERE id = $1";
        Ok(self.db.execute(sql, args![id]).await? == 1)
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
