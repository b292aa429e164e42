//! The broker's record in the shared PostgreSQL database (`--db
//! postgres://`), so a session that moves to another host, or a broker in
//! another process, sees the calls already made. The same contract as the
//! SQLite store, checked by the same suite (`conformance.rs`).
//!
//! Under READ COMMITTED each statement sees everything committed before
//! it, and a statement that meets a row (or a unique key) another
//! transaction is writing waits for it and then re-checks; so:
//! - `begin` is one `INSERT … ON CONFLICT DO NOTHING`: of two racing first
//!   attempts one inserts, the other waits, inserts nothing and reads the
//!   winner's row;
//! - a state update is one `UPDATE … WHERE state = from RETURNING *`: the
//!   loser of a race re-reads the moved row, no longer matches, and
//!   changes nothing (a final state is never overwritten);
//! - `epoch_for` takes `MAX(epoch) + 1`; two new sandboxes of one session
//!   that picked the same number collide on UNIQUE (session_id, epoch),
//!   and the loser retries with a fresh read.
//!
//! Timestamps are the RFC 3339 text the SQLite side stores, so a `Call`
//! reads the same from both.

use super::{Begin, Call, CallState, EventRef, Recorded, StoreError};
use deadpool_postgres::{GenericClient, Pool};
use tokio_postgres::Row;

/// Numbered migrations, append only; `broker_schema` records how many ran.
/// Tables are prefixed `broker_`: the database is shared with the other
/// stores (sessions, policies, the gateway's budgets).
pub(super) const MIGRATIONS: &[&str] = &[
    "CREATE TABLE broker_calls (
        session_id TEXT NOT NULL,
        seq BIGINT NOT NULL,
        epoch BIGINT NOT NULL,
        tool TEXT NOT NULL,
        args_sha256 TEXT NOT NULL,
        args TEXT NOT NULL,
        state TEXT NOT NULL,
        decision TEXT NOT NULL,
        rule_id TEXT,
        approval_id TEXT,
        event_seq BIGINT,
        result_event_seq BIGINT,
        effect TEXT,
        output TEXT,
        review_event_seq BIGINT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        PRIMARY KEY (session_id, seq)
     );
     CREATE INDEX broker_calls_state ON broker_calls(state);
     CREATE TABLE broker_epochs (
        sandbox_id TEXT PRIMARY KEY,
        session_id TEXT NOT NULL,
        epoch BIGINT NOT NULL,
        UNIQUE (session_id, epoch)
     );",
    // Which broker process runs a call, and which processes are alive
    // (by the database's clock), so a broker resolves a call left
    // mid-effect only when the process that started it is gone.
    "ALTER TABLE broker_calls ADD COLUMN runner TEXT;
     CREATE TABLE broker_runners (
        runner TEXT PRIMARY KEY,
        expires_at TIMESTAMPTZ NOT NULL
     );",
];

/// Any fixed number, distinct from the other stores' ("hatcbrkr"): the
/// transaction-scoped advisory lock that serializes migration runs.
const MIGRATION_LOCK: i64 = 0x6861_7463_6272_6b72;

const SCHEMA: hatchery_store::PgMigrations = hatchery_store::PgMigrations {
    name: "broker",
    table: "broker_schema",
    lock: MIGRATION_LOCK,
    steps: MIGRATIONS,
};

/// How often `epoch_for` retries after losing a race for an epoch number;
/// each loss means another sandbox of the session took one, so this bounds
/// a burst of that many sandboxes starting at once.
const EPOCH_RETRIES: usize = 32;

/// SQLSTATE unique_violation.
const UNIQUE_VIOLATION: &str = "23505";

#[derive(Clone)]
pub(super) struct PgBroker {
    pool: Pool,
}

/// A driver error, named by what was being done: `Unavailable` when the
/// database is not there (retryable), `Pg` otherwise.
fn pg(what: &'static str) -> impl FnOnce(tokio_postgres::Error) -> StoreError {
    move |e| {
        let msg = format!("{what}: {}", hatchery_store::pg_message(&e));
        if hatchery_store::pg_unavailable(&e) {
            StoreError::Unavailable(msg)
        } else {
            StoreError::Pg(msg)
        }
    }
}

/// A u64 as BIGINT; refused (as rusqlite refuses it) rather than wrapped,
/// since a wrapped seq would name another call.
fn big(what: &'static str, v: u64) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError::Pg(format!("{what} {v} is out of range")))
}

fn big_opt(what: &'static str, v: Option<u64>) -> Result<Option<i64>, StoreError> {
    v.map(|v| big(what, v)).transpose()
}

fn unsigned(v: i64) -> u64 {
    v.max(0) as u64
}

impl PgBroker {
    pub(super) async fn connect(dsn: &str, pool_size: usize) -> Result<Self, StoreError> {
        let pool = hatchery_store::pg_pool(dsn, pool_size)
            .map_err(|e| StoreError::Pg(format!("broker store: {e}")))?;
        let s = PgBroker { pool };
        s.migrate().await?;
        Ok(s)
    }

    async fn client(&self) -> Result<deadpool_postgres::Client, StoreError> {
        self.pool
            .get()
            .await
            .map_err(|e| StoreError::Unavailable(format!("connect: {e}")))
    }

    /// Runs the migrations not yet recorded, in one transaction under the
    /// advisory lock: two daemons starting at once end with one schema, and
    /// a second run is a no-op.
    async fn migrate(&self) -> Result<(), StoreError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(pg("begin migration"))?;
        SCHEMA.run(&tx).await.map_err(|e| {
            if e.unavailable() {
                StoreError::Unavailable(e.to_string())
            } else {
                StoreError::Pg(e.to_string())
            }
        })?;
        tx.commit().await.map_err(pg("commit migration"))
    }

    /// How many migrations the database has recorded (tests).
    #[cfg(test)]
    pub(super) async fn schema_version(&self) -> Result<u64, StoreError> {
        let c = self.client().await?;
        SCHEMA
            .version(&c)
            .await
            .map_err(|e| StoreError::Pg(e.to_string()))
    }

    pub(super) async fn epoch_for(
        &self,
        session_id: &str,
        sandbox_id: &str,
    ) -> Result<u64, StoreError> {
        let mut c = self.client().await?;
        for _ in 0..EPOCH_RETRIES {
            let tx = c.transaction().await.map_err(pg("begin epoch"))?;
            let known = tx
                .query_opt(
                    "SELECT session_id, epoch FROM broker_epochs WHERE sandbox_id = $1",
                    &[&sandbox_id],
                )
                .await
                .map_err(pg("read epoch"))?;
            if let Some(r) = &known {
                let ses: String = r.try_get("session_id").map_err(pg("read epoch"))?;
                if ses == session_id {
                    let e: i64 = r.try_get("epoch").map_err(pg("read epoch"))?;
                    tx.commit().await.map_err(pg("commit epoch"))?;
                    return Ok(unsigned(e));
                }
            }
            let next: i64 = tx
                .query_one(
                    "SELECT COALESCE(MAX(epoch), 0) + 1 AS next FROM broker_epochs WHERE session_id = $1",
                    &[&session_id],
                )
                .await
                .map_err(pg("next epoch"))?
                .try_get("next")
                .map_err(pg("next epoch"))?;
            // A sandbox id is never reused across sessions; a mismatch is
            // treated as a new instance all the same (as on SQLite). The
            // WHERE leaves a row this session wrote meanwhile (a racing
            // call for the same new sandbox) as it is: that one wins.
            let wrote = tx
                .execute(
                    "INSERT INTO broker_epochs (sandbox_id, session_id, epoch) VALUES ($1, $2, $3)
                     ON CONFLICT (sandbox_id) DO UPDATE
                        SET session_id = EXCLUDED.session_id, epoch = EXCLUDED.epoch
                        WHERE broker_epochs.session_id <> EXCLUDED.session_id",
                    &[&sandbox_id, &session_id, &next],
                )
                .await;
            match wrote {
                Ok(1) => {
                    tx.commit().await.map_err(pg("commit epoch"))?;
                    return Ok(unsigned(next));
                }
                // Another call gave this sandbox its epoch first: read it
                // on the next round.
                Ok(_) => continue,
                // Another sandbox of the session took `next` first.
                Err(e) if e.code().map(|c| c.code()) == Some(UNIQUE_VIOLATION) => continue,
                Err(e) => return Err(pg("write epoch")(e)),
            }
        }
        Err(StoreError::Pg(format!(
            "epoch for sandbox {sandbox_id}: still contended after {EPOCH_RETRIES} tries"
        )))
    }

    pub(super) async fn known_epoch(
        &self,
        sandbox_id: &str,
    ) -> Result<Option<(String, u64)>, StoreError> {
        let c = self.client().await?;
        let Some(r) = c
            .query_opt(
                "SELECT session_id, epoch FROM broker_epochs WHERE sandbox_id = $1",
                &[&sandbox_id],
            )
            .await
            .map_err(pg("read epoch"))?
        else {
            return Ok(None);
        };
        let e: i64 = r.try_get("epoch").map_err(pg("read epoch"))?;
        Ok(Some((
            r.try_get("session_id").map_err(pg("read epoch"))?,
            unsigned(e),
        )))
    }

    pub(super) async fn begin(&self, new: Call) -> Result<Begin, StoreError> {
        let c = self.client().await?;
        let seq = big("seq", new.seq)?;
        let n = c
            .execute(
                "INSERT INTO broker_calls (session_id, seq, epoch, tool, args_sha256, args, state,
                    decision, rule_id, approval_id, event_seq, result_event_seq, effect, output,
                    review_event_seq, created_at, updated_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $16)
                 ON CONFLICT (session_id, seq) DO NOTHING",
                &[
                    &new.session_id,
                    &seq,
                    &big("epoch", new.epoch)?,
                    &new.tool,
                    &new.args_sha256,
                    &new.args,
                    &new.state.as_str(),
                    &new.decision,
                    &new.rule_id,
                    &new.approval_id,
                    &big_opt("event seq", new.event_seq)?,
                    &big_opt("result event seq", new.result_event_seq)?,
                    &new.effect,
                    &new.output,
                    &big_opt("review event seq", new.review_event_seq)?,
                    &new.created_at,
                ],
            )
            .await
            .map_err(pg("insert call"))?;
        if n == 1 {
            return Ok(Begin::New(new));
        }
        // The key was taken, by a row committed before this statement
        // returned (ON CONFLICT waited for it): this read sees it.
        let old = get(&c, &new.session_id, seq).await?.ok_or_else(|| {
            StoreError::Pg(format!(
                "call {}/{} conflicted but is not there",
                new.session_id, new.seq
            ))
        })?;
        Ok(Begin::taken(old, &new))
    }

    pub(super) async fn get(&self, session_id: &str, seq: u64) -> Result<Option<Call>, StoreError> {
        let c = self.client().await?;
        get(&c, session_id, big("seq", seq)?).await
    }

    pub(super) async fn set_event_ref(
        &self,
        which: EventRef,
        session_id: &str,
        seq: u64,
        ev: u64,
    ) -> Result<(), StoreError> {
        let c = self.client().await?;
        // The column is one of three constants, never input.
        let col = which.column();
        c.execute(
            &format!(
                "UPDATE broker_calls SET {col} = $3 WHERE session_id = $1 AND seq = $2 AND {col} IS NULL"
            ),
            &[&session_id, &big("seq", seq)?, &big("event seq", ev)?],
        )
        .await
        .map_err(pg("set event seq"))?;
        Ok(())
    }

    /// One statement: the guard, the write and the read of the new row.
    pub(super) async fn advance_recorded(
        &self,
        session_id: &str,
        seq: u64,
        from: CallState,
        to: CallState,
        r: Recorded,
    ) -> Result<Option<Call>, StoreError> {
        let c = self.client().await?;
        let row = c
            .query_opt(
                "UPDATE broker_calls SET state = $4, effect = COALESCE($5, effect),
                    output = COALESCE($6, output), updated_at = $7,
                    event_seq = COALESCE(event_seq, $8),
                    result_event_seq = COALESCE(result_event_seq, $9),
                    runner = COALESCE($10, runner)
                 WHERE session_id = $1 AND seq = $2 AND state = $3
                 RETURNING *",
                &[
                    &session_id,
                    &big("seq", seq)?,
                    &from.as_str(),
                    &to.as_str(),
                    &r.effect,
                    &r.output,
                    &super::now(),
                    &big_opt("event seq", r.event_seq)?,
                    &big_opt("result event seq", r.result_event_seq)?,
                    &r.runner,
                ],
            )
            .await
            .map_err(pg("advance call"))?;
        row.as_ref().map(row_call).transpose()
    }

    pub(super) async fn heartbeat(&self, runner: &str, ttl_s: u32) -> Result<(), StoreError> {
        let c = self.client().await?;
        c.execute(
            "INSERT INTO broker_runners (runner, expires_at)
             VALUES ($1, now() + make_interval(secs => $2))
             ON CONFLICT (runner) DO UPDATE SET expires_at = EXCLUDED.expires_at",
            &[&runner, &f64::from(ttl_s)],
        )
        .await
        .map_err(pg("renew broker runner"))?;
        // Rows of processes gone for a day are of no more use.
        c.execute(
            "DELETE FROM broker_runners WHERE expires_at < now() - interval '1 day'",
            &[],
        )
        .await
        .map_err(pg("prune broker runners"))?;
        Ok(())
    }

    pub(super) async fn runner_alive(&self, runner: &str) -> Result<bool, StoreError> {
        let c = self.client().await?;
        let row = c
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM broker_runners
                                WHERE runner = $1 AND expires_at > now()) AS alive",
                &[&runner],
            )
            .await
            .map_err(pg("read broker runner"))?;
        row.try_get("alive").map_err(pg("read broker runner"))
    }

    pub(super) async fn executing(&self) -> Result<Vec<Call>, StoreError> {
        let c = self.client().await?;
        c.query(
            "SELECT * FROM broker_calls WHERE state = 'executing' ORDER BY created_at",
            &[],
        )
        .await
        .map_err(pg("list executing calls"))?
        .iter()
        .map(row_call)
        .collect()
    }

    pub(super) async fn usage(&self, session_id: &str) -> Result<super::CallUsage, StoreError> {
        let c = self.client().await?;
        let r = c
            .query_one(
                "SELECT COUNT(*)::BIGINT, COALESCE(SUM(octet_length(args)), 0)::BIGINT, \
                 COUNT(*) FILTER (WHERE state = 'awaiting_approval')::BIGINT \
                 FROM broker_calls WHERE session_id = $1",
                &[&session_id],
            )
            .await
            .map_err(pg("call usage"))?;
        let g = |i: usize| r.try_get::<_, i64>(i).map_err(pg("call usage"));
        Ok(super::CallUsage::from_row(g(0)?, g(1)?, g(2)?))
    }

    pub(super) async fn calls(&self, session_id: &str) -> Result<Vec<Call>, StoreError> {
        let c = self.client().await?;
        c.query(
            "SELECT * FROM broker_calls WHERE session_id = $1 ORDER BY seq",
            &[&session_id],
        )
        .await
        .map_err(pg("list calls"))?
        .iter()
        .map(row_call)
        .collect()
    }
}

async fn get(
    c: &impl GenericClient,
    session_id: &str,
    seq: i64,
) -> Result<Option<Call>, StoreError> {
    c.query_opt(
        "SELECT * FROM broker_calls WHERE session_id = $1 AND seq = $2",
        &[&session_id, &seq],
    )
    .await
    .map_err(pg("read call"))?
    .as_ref()
    .map(row_call)
    .transpose()
}

/// A row, its columns read by name.
fn row_call(r: &Row) -> Result<Call, StoreError> {
    let e = || pg("read call");
    let state: String = r.try_get("state").map_err(e())?;
    let Some(st) = CallState::parse(&state) else {
        return Err(StoreError::Corrupt(state));
    };
    let opt = |name: &str| -> Result<Option<u64>, StoreError> {
        Ok(r.try_get::<_, Option<i64>>(name)
            .map_err(e())?
            .map(unsigned))
    };
    Ok(Call {
        session_id: r.try_get("session_id").map_err(e())?,
        seq: unsigned(r.try_get("seq").map_err(e())?),
        epoch: unsigned(r.try_get("epoch").map_err(e())?),
        tool: r.try_get("tool").map_err(e())?,
        args_sha256: r.try_get("args_sha256").map_err(e())?,
        args: r.try_get("args").map_err(e())?,
        state: st,
        decision: r.try_get("decision").map_err(e())?,
        rule_id: r.try_get("rule_id").map_err(e())?,
        approval_id: r.try_get("approval_id").map_err(e())?,
        event_seq: opt("event_seq")?,
        result_event_seq: opt("result_event_seq")?,
        effect: r.try_get("effect").map_err(e())?,
        output: r.try_get("output").map_err(e())?,
        review_event_seq: opt("review_event_seq")?,
        runner: r.try_get("runner").map_err(e())?,
        created_at: r.try_get("created_at").map_err(e())?,
        updated_at: r.try_get("updated_at").map_err(e())?,
    })
}
