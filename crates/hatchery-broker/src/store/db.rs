//! The broker's queries, the same on SQLite and PostgreSQL (hatchery-db
//! rewrites the little that differs). What keeps a call exactly-once:
//! - `begin` is one `INSERT … ON CONFLICT DO NOTHING`: of two racing first
//!   attempts one inserts; on PostgreSQL the other waits for it, inserts
//!   nothing and reads the winner's row (READ COMMITTED: each statement
//!   sees what was committed before it); on SQLite writers take turns;
//! - a state update is one `UPDATE … WHERE state = from RETURNING *`: the
//!   loser of a race no longer matches and changes nothing (a final state
//!   is never overwritten);
//! - `epoch_for` takes `MAX(epoch) + 1`; two new sandboxes of one session
//!   that picked the same number collide on UNIQUE (session_id, epoch),
//!   and the loser retries with a fresh read.
//!
//! Timestamps are RFC 3339 text, passed in, so a `Call` reads the same
//! from both. Only the runners' heartbeat uses the database's clock, and
//! only on PostgreSQL (several processes share it there).

use super::{now, Begin, Call, CallState, CallUsage, EventRef, Recorded, StoreError};
use hatchery_db::{args, Db, DbError, Dialect, Record, Row, Tx};

/// How often `epoch_for` retries after losing a race for an epoch number;
/// each loss means another sandbox of the session took one, so this bounds
/// a burst of that many sandboxes starting at once.
const EPOCH_RETRIES: usize = 32;

#[derive(Clone)]
pub struct BrokerStore {
    db: Db,
}

fn err(what: &'static str) -> impl FnOnce(DbError) -> StoreError {
    move |source| StoreError::Db { what, source }
}

const CALL: &str = "SELECT * FROM broker_calls WHERE session_id = $1 AND seq = $2";
const EPOCH_OF: &str = "SELECT session_id, epoch FROM broker_epochs WHERE sandbox_id = $1";
const NEXT_EPOCH: &str = "SELECT CAST(COALESCE(MAX(epoch), 0) + 1 AS BIGINT) AS next
    FROM broker_epochs WHERE session_id = $1";
const SET_EPOCH: &str =
    "INSERT INTO broker_epochs (sandbox_id, session_id, epoch) VALUES ($1, $2, $3)
    ON CONFLICT (sandbox_id) DO UPDATE
       SET session_id = EXCLUDED.session_id, epoch = EXCLUDED.epoch
       WHERE broker_epochs.session_id <> EXCLUDED.session_id";

/// The (session, epoch) of a sandbox's row in `broker_epochs`, if any.
fn epoch_row(r: Option<Row>) -> Result<Option<(String, u64)>, DbError> {
    r.map(|r| Ok((r.get("session_id")?, r.get("epoch")?)))
        .transpose()
}

impl BrokerStore {
    /// The broker's tables in `db`, migrated.
    pub async fn open(db: Db) -> Result<Self, StoreError> {
        db.migrate(&super::schema::MIGRATIONS)
            .await
            .map_err(StoreError::Schema)?;
        Ok(BrokerStore { db })
    }

    /// On a scratch SQLite database (tests).
    pub async fn open_in_memory() -> Result<Self, StoreError> {
        Self::open(Db::sqlite_memory().map_err(err("open"))?).await
    }

    /// "sqlite" or "postgres", for logs.
    pub fn backend(&self) -> &'static str {
        self.db.dialect().pick("sqlite", "postgres")
    }

    /// The epoch of `sandbox_id` in `session_id`: known ones keep theirs;
    /// a new sandbox (the session was resumed or forked) gets the next one.
    pub async fn epoch_for(&self, session_id: &str, sandbox_id: &str) -> Result<u64, StoreError> {
        for _ in 0..EPOCH_RETRIES {
            let mut tx = self.db.begin().await.map_err(err("begin epoch"))?;
            let known = tx.query_opt(EPOCH_OF, args![sandbox_id]).await;
            if let Some((s, e)) = known.and_then(epoch_row).map_err(err("read epoch"))? {
                if s == session_id {
                    tx.commit().await.map_err(err("commit epoch"))?;
                    return Ok(e);
                }
            }
            let next = tx.query_one(NEXT_EPOCH, args![session_id]).await;
            let next: u64 = next
                .and_then(|r| r.get("next"))
                .map_err(err("next epoch"))?;
            // A sandbox id is never reused across sessions; a mismatch is
            // treated as a new instance all the same. The WHERE leaves a
            // row this session wrote meanwhile (a racing call for the same
            // new sandbox) as it is: that one wins.
            let a = args![sandbox_id, session_id, next];
            match tx.execute(SET_EPOCH, a).await {
                Ok(1) => {
                    tx.commit().await.map_err(err("commit epoch"))?;
                    return Ok(next);
                }
                // Another call gave this sandbox its epoch first (read it
                // on the next round), or another sandbox of the session
                // took `next` first. Dropping `tx` rolls it back.
                Ok(_) => continue,
                Err(e) if e.unique_violation() => continue,
                Err(e) => return Err(err("write epoch")(e)),
            }
        }
        Err(StoreError::Contended(sandbox_id.to_string()))
    }

    /// The epoch a sandbox had, if the broker has seen it.
    pub async fn known_epoch(&self, sandbox_id: &str) -> Result<Option<(String, u64)>, StoreError> {
        let known = self.db.query_opt(EPOCH_OF, args![sandbox_id]).await;
        known.and_then(epoch_row).map_err(err("read epoch"))
    }

    /// Records the call under its key unless the key is taken; atomically,
    /// so two racing first attempts make one row (and one `New`).
    pub async fn begin(&self, new: Call) -> Result<Begin, StoreError> {
        let mut tx = self.db.begin().await.map_err(err("begin call"))?;
        let n = insert_tx(&mut tx, &new).await.map_err(err("insert call"))?;
        if n == 1 {
            tx.commit().await.map_err(err("commit call"))?;
            return Ok(Begin::New(new));
        }
        // The key was taken, by a row committed before this statement
        // returned (ON CONFLICT waited for it): this read sees it.
        let old = tx.query_one(CALL, args![&new.session_id, new.seq]).await;
        let old = old.map_err(err("read the call holding the key"))?;
        tx.commit().await.map_err(err("commit call"))?;
        Ok(Begin::taken(row_call(&old)?, &new))
    }

    pub async fn get(&self, session_id: &str, seq: u64) -> Result<Option<Call>, StoreError> {
        let row = self.db.query_opt(CALL, args![session_id, seq]).await;
        let row = row.map_err(err("read call"))?;
        row.as_ref().map(row_call).transpose()
    }

    /// Stores the seq of one of the call's events, once: a column already
    /// set keeps its value (a retry never moves it).
    pub async fn set_event_ref(
        &self,
        which: EventRef,
        session_id: &str,
        seq: u64,
        ev: u64,
    ) -> Result<(), StoreError> {
        let mut tx = self.db.begin().await.map_err(err("begin event seq"))?;
        let set = set_ref_tx(&mut tx, which, session_id, seq, ev).await;
        set.map_err(err("set event seq"))?;
        tx.commit().await.map_err(err("commit event seq"))
    }

    /// Moves the call to `to` if it is in `from`, with what `r` records
    /// (`effect`/`output` if given, the seqs of the events just written
    /// for it), in one statement and commit: the new row, or `None` when
    /// it was not in `from` (someone else moved it first).
    pub async fn advance_recorded(
        &self,
        session_id: &str,
        seq: u64,
        from: CallState,
        to: CallState,
        r: Recorded,
    ) -> Result<Option<Call>, StoreError> {
        debug_assert!(from.valid_transition(to), "{from:?} -> {to:?}");
        let mut tx = self.db.begin().await.map_err(err("begin advance"))?;
        let row = advance_tx(&mut tx, session_id, seq, from, to, &r).await;
        let row = row.map_err(err("advance call"))?;
        tx.commit().await.map_err(err("commit advance"))?;
        row.as_ref().map(row_call).transpose()
    }

    /// Calls caught in `executing` (the process stopped mid-effect).
    pub async fn executing(&self) -> Result<Vec<Call>, StoreError> {
        let sql = "SELECT * FROM broker_calls WHERE state = 'executing' ORDER BY created_at";
        self.list(sql, args![]).await
    }

    /// Every call of a session, in seq order (tests and the CLI).
    pub async fn calls(&self, session_id: &str) -> Result<Vec<Call>, StoreError> {
        let sql = "SELECT * FROM broker_calls WHERE session_id = $1 ORDER BY seq";
        self.list(sql, args![session_id]).await
    }

    async fn list(&self, sql: &str, a: &[hatchery_db::Value]) -> Result<Vec<Call>, StoreError> {
        let rows = self.db.query(sql, a).await.map_err(err("list calls"))?;
        rows.iter().map(row_call).collect()
    }

    /// Records that broker process `runner` is alive for `ttl_s` more
    /// seconds, by the database's clock. A no-op on SQLite, whose file
    /// only one process uses.
    pub async fn heartbeat(&self, runner: &str, ttl_s: u32) -> Result<(), StoreError> {
        if self.db.dialect() == Dialect::Sqlite {
            return Ok(());
        }
        let mut tx = self.db.begin().await.map_err(err("begin heartbeat"))?;
        // PostgreSQL only (the database's clock is the point).
        let renew = "INSERT INTO broker_runners (runner, expires_at)
             VALUES ($1, now() + make_interval(secs => $2))
             ON CONFLICT (runner) DO UPDATE SET expires_at = EXCLUDED.expires_at";
        let renewed = tx.execute(renew, args![runner, f64::from(ttl_s)]).await;
        renewed.map_err(err("renew broker runner"))?;
        // Rows of processes gone for a day are of no more use.
        let prune = "DELETE FROM broker_runners WHERE expires_at < now() - interval '1 day'";
        let pruned = tx.execute(prune, args![]).await;
        pruned.map_err(err("prune broker runners"))?;
        tx.commit().await.map_err(err("commit heartbeat"))
    }

    /// Whether broker process `runner` renewed its heartbeat recently
    /// enough. On SQLite never: the only process using the file is the
    /// one asking, and it knows its own id (crate::runner).
    pub async fn runner_alive(&self, runner: &str) -> Result<bool, StoreError> {
        if self.db.dialect() == Dialect::Sqlite {
            return Ok(false);
        }
        let sql = "SELECT runner FROM broker_runners WHERE runner = $1 AND expires_at > now()";
        let row = self.db.query_opt(sql, args![runner]).await;
        Ok(row.map_err(err("read broker runner"))?.is_some())
    }

    /// What a session's calls hold: how many, their stored argument
    /// bytes, how many wait for an approval (the per-session caps).
    pub async fn usage(&self, session_id: &str) -> Result<CallUsage, StoreError> {
        let sql = "SELECT COUNT(*) AS calls,
                CAST(COALESCE(SUM(octet_length(args)), 0) AS BIGINT) AS bytes,
                CAST(COALESCE(SUM(CASE WHEN state = 'awaiting_approval' THEN 1 ELSE 0 END), 0)
                    AS BIGINT) AS awaiting
             FROM broker_calls WHERE session_id = $1";
        let r = self.db.query_opt(sql, args![session_id]).await;
        let usage = r.and_then(|r| {
            let r = r.ok_or(DbError::NoRow)?;
            let (calls, bytes, awaiting) = (r.get("calls")?, r.get("bytes")?, r.get("awaiting")?);
            Ok(CallUsage::from_row(calls, bytes, awaiting))
        });
        usage.map_err(err("call usage"))
    }
}

/// Inserts `new` unless its key is taken: 1 row written, or 0.
pub(super) async fn insert_tx(tx: &mut Tx, new: &Call) -> Result<u64, DbError> {
    let sql = Call::insert_sql() + " ON CONFLICT (session_id, seq) DO NOTHING";
    tx.execute(&sql, &new.values()?).await
}

/// Moves a call from `from` to `to` with what `r` records (event seqs
/// already set are kept): the new row, or `None` when the call was not in
/// `from` (someone else moved it first).
pub(super) async fn advance_tx(
    tx: &mut Tx,
    session_id: &str,
    seq: u64,
    from: CallState,
    to: CallState,
    r: &Recorded,
) -> Result<Option<Row>, DbError> {
    tx.query_opt(
        "UPDATE broker_calls SET state = $4, effect = COALESCE($5, effect),
            output = COALESCE($6, output), updated_at = $7,
            event_seq = COALESCE(event_seq, $8),
            result_event_seq = COALESCE(result_event_seq, $9),
            runner = COALESCE($10, runner),
            review_event_seq = COALESCE(review_event_seq, $11)
         WHERE session_id = $1 AND seq = $2 AND state = $3
         RETURNING *",
        args![
            session_id,
            seq,
            from.as_str(),
            to.as_str(),
            r.effect.as_deref(),
            r.output.as_deref(),
            now(),
            r.event_seq,
            r.result_event_seq,
            r.runner.as_deref(),
            r.review_event_seq,
        ],
    )
    .await
}

/// Stores the seq of one of a call's events unless it is set: 1 row
/// written, or 0 (a retry never moves it).
pub(super) async fn set_ref_tx(
    tx: &mut Tx,
    which: EventRef,
    session_id: &str,
    seq: u64,
    ev: u64,
) -> Result<u64, DbError> {
    // The column is one of three constants, never input.
    let col = which.column();
    let sql = format!(
        "UPDATE broker_calls SET {col} = $3
         WHERE session_id = $1 AND seq = $2 AND {col} IS NULL"
    );
    tx.execute(&sql, args![session_id, seq, ev]).await
}

/// A row of `broker_calls` (an unknown state is a type error naming the
/// column).
pub(super) fn row_call(r: &Row) -> Result<Call, StoreError> {
    Call::from_row(r).map_err(err("read call"))
}
