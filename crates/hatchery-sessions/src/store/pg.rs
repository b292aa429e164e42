//! PostgreSQL backend, for many hosts on one database: a deadpool pool of
//! tokio-postgres connections, numbered migrations under an advisory lock,
//! and the same semantics as the SQLite backend.
//!
//! Concurrency: every write locks its session row `FOR UPDATE` first (the
//! fence check). That one lock orders the write against other appends to
//! the session (seqs are `last_seq + 1` under it: contiguous, no
//! duplicates) and against a take-over (which locks the same rows, in id
//! order, and changes `host_id`): a write that was waiting behind a
//! take-over reads the new owner and fails with `Fenced`, and nothing of
//! it commits. Tables are prefixed `session_` so that the daemon's state
//! store (hatchery-store, which has its own `events`) can share the
//! database.

use super::chain::seal_after;
use super::sqlite::now;
use super::*;
use crate::events::{cut, INLINE_TEXT_BYTES, MAX_BLOB_BYTES};
use deadpool_postgres::{GenericClient, Pool};
// The schema is a crate of its own so that `hatchery audit verify` reads
// the logs without linking the sessions service.
use hatchery_sessions_schema::SCHEMA;
use std::sync::Arc;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

pub(super) fn migrate_err(e: hatchery_store::MigrateError) -> StoreError {
    if e.unavailable() {
        StoreError::Unavailable(e.to_string())
    } else {
        match e {
            hatchery_store::MigrateError::TooNew { .. }
            | hatchery_store::MigrateError::Missing { .. } => StoreError::Config(e.to_string()),
            _ => StoreError::Backend(e.to_string()),
        }
    }
}

const UNFINISHED: &str = "state NOT IN ('completed','failed','cancelled')";

const SESSION_COLS: &str = "id, spec, state, idempotency_key, created_at, started_at, ended_at, reason, \
    spend_tokens, spend_usd_cents, spend_wall_s, sandbox_id, process_id, snapshot_id, review_snapshot_id, \
    waiting, output_offset, agent_seq, delivered_seq, cancel_requested, last_seq, host_id, epoch, \
    replay_through";

type Tx<'a> = deadpool_postgres::Transaction<'a>;

/// The PostgreSQL session store of one host.
#[derive(Clone)]
pub struct PgSessionStore {
    pub(super) pool: Pool,
    pub(super) host: Arc<str>,
}

/// Maps a driver error: a connection that is gone (or a server shutting
/// down or starting) is `Unavailable` (retryable, 503), anything else a
/// backend failure with the operation named. No SQL type leaks out.
fn pg(op: &'static str) -> impl FnOnce(tokio_postgres::Error) -> StoreError {
    move |e| {
        let msg = format!("{op}: {}", hatchery_store::pg_message(&e));
        if hatchery_store::pg_unavailable(&e) {
            StoreError::Unavailable(msg)
        } else {
            StoreError::Backend(msg)
        }
    }
}

fn i(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}

fn u(v: i64) -> u64 {
    v.max(0) as u64
}

fn be(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(e.to_string())
}

/// Runs `sql` as a cached prepared statement.
async fn query<C: GenericClient>(
    c: &C,
    op: &'static str,
    sql: &str,
    args: &[&(dyn ToSql + Sync)],
) -> Result<Vec<Row>, StoreError> {
    let st = c.prepare_cached(sql).await.map_err(pg(op))?;
    c.query(&st, args).await.map_err(pg(op))
}

async fn query_opt<C: GenericClient>(
    c: &C,
    op: &'static str,
    sql: &str,
    args: &[&(dyn ToSql + Sync)],
) -> Result<Option<Row>, StoreError> {
    let st = c.prepare_cached(sql).await.map_err(pg(op))?;
    c.query_opt(&st, args).await.map_err(pg(op))
}

async fn exec<C: GenericClient>(
    c: &C,
    op: &'static str,
    sql: &str,
    args: &[&(dyn ToSql + Sync)],
) -> Result<u64, StoreError> {
    let st = c.prepare_cached(sql).await.map_err(pg(op))?;
    c.execute(&st, args).await.map_err(pg(op))
}

fn session_row(r: &Row) -> Result<Session, StoreError> {
    let g = |col: &str| -> Result<String, StoreError> { r.try_get(col).map_err(be) };
    let o = |col: &str| -> Result<Option<String>, StoreError> { r.try_get(col).map_err(be) };
    let n = |col: &str| -> Result<u64, StoreError> { r.try_get::<_, i64>(col).map(u).map_err(be) };
    let spec = g("spec")?;
    let state = g("state")?;
    Ok(Session {
        id: g("id")?,
        spec: serde_json::from_str(&spec).map_err(|e| be(format!("bad spec: {e}")))?,
        state: SessionState::parse(&state).ok_or_else(|| be(format!("bad state {state}")))?,
        idempotency_key: o("idempotency_key")?,
        created_at: g("created_at")?,
        started_at: o("started_at")?,
        ended_at: o("ended_at")?,
        reason: o("reason")?,
        spend_tokens: n("spend_tokens")?,
        spend_usd_cents: n("spend_usd_cents")?,
        spend_wall_s: n("spend_wall_s")?,
        sandbox_id: o("sandbox_id")?,
        process_id: o("process_id")?,
        snapshot_id: o("snapshot_id")?,
        review_snapshot_id: o("review_snapshot_id")?,
        waiting: o("waiting")?,
        output_offset: n("output_offset")?,
        agent_seq: n("agent_seq")?,
        delivered_seq: n("delivered_seq")?,
        cancel_requested: r.try_get("cancel_requested").map_err(be)?,
        last_seq: n("last_seq")?,
        host_id: g("host_id")?,
        epoch: n("epoch")?,
        replay_through: n("replay_through")?,
    })
}

fn event_row(r: &Row) -> Result<Event, StoreError> {
    let data: String = r.try_get("data").map_err(be)?;
    let actor: String = r.try_get("actor").map_err(be)?;
    Ok(Event {
        seq: u(r.try_get("seq").map_err(be)?),
        at: r.try_get("at").map_err(be)?,
        actor: Actor::parse(&actor).unwrap_or(Actor::System),
        kind: serde_json::from_str(&data).map_err(be)?,
    })
}

async fn get_session<C: GenericClient>(c: &C, id: &str) -> Result<Session, StoreError> {
    let sql = format!("SELECT {SESSION_COLS} FROM sessions WHERE id = $1");
    let r = query_opt(c, "get session", &sql, &[&id])
        .await?
        .ok_or_else(|| StoreError::NotFound(id.to_string()))?;
    session_row(&r)
}

/// The fence: locks the session row and checks that `host` owns it;
/// returns the epoch this write's events record.
async fn fence(tx: &Tx<'_>, id: &str, host: &str) -> Result<u64, StoreError> {
    let r = query_opt(
        tx,
        "fence check",
        "SELECT host_id, epoch FROM sessions WHERE id = $1 FOR UPDATE",
        &[&id],
    )
    .await?
    .ok_or_else(|| StoreError::NotFound(id.to_string()))?;
    let owner: String = r.try_get("host_id").map_err(be)?;
    let epoch = u(r.try_get("epoch").map_err(be)?);
    if owner != host {
        return Err(StoreError::Fenced {
            id: id.to_string(),
            owner,
            epoch,
        });
    }
    Ok(epoch)
}

async fn apply_patch(tx: &Tx<'_>, id: &str, p: &Patch) -> Result<(), StoreError> {
    for (col, v) in [
        ("sandbox_id", &p.sandbox_id),
        ("process_id", &p.process_id),
        ("snapshot_id", &p.snapshot_id),
        ("review_snapshot_id", &p.review_snapshot_id),
        ("waiting", &p.waiting),
    ] {
        if let Some(v) = v {
            let sql = format!("UPDATE sessions SET {col} = $2 WHERE id = $1");
            exec(tx, "patch", &sql, &[&id, v]).await?;
        }
    }
    if let Some(d) = p.delivered_seq {
        exec(
            tx,
            "patch delivered",
            "UPDATE sessions SET delivered_seq = GREATEST(delivered_seq, $2) WHERE id = $1",
            &[&id, &i(d)],
        )
        .await?;
    }
    if p.add_tokens > 0 || p.add_usd_cents > 0 || p.add_wall_s > 0 {
        exec(
            tx,
            "patch spend",
            "UPDATE sessions SET spend_tokens = spend_tokens + $2, spend_usd_cents = spend_usd_cents + $3, \
             spend_wall_s = spend_wall_s + $4 WHERE id = $1",
            &[&id, &i(p.add_tokens), &i(p.add_usd_cents), &i(p.add_wall_s)],
        )
        .await?;
    }
    if let Some((aid, action, details)) = &p.new_approval {
        exec(
            tx,
            "patch approval",
            "INSERT INTO session_approvals (id, session_id, action, details, state, created_at) \
             VALUES ($1, $2, $3, $4, 'pending', $5) ON CONFLICT (id) DO NOTHING",
            &[aid, &id, action, details, &now()],
        )
        .await?;
    }
    if let Some(v) = p.policy_version {
        // The spec is JSON text; only this field of it ever changes.
        exec(
            tx,
            "patch policy",
            "UPDATE sessions SET spec = jsonb_set(spec::jsonb, '{policy_version}', to_jsonb($2::bigint))::text \
             WHERE id = $1",
            &[&id, &(v as i64)],
        )
        .await?;
    }
    if let Some(c) = p.cancel_requested {
        exec(
            tx,
            "patch cancel",
            "UPDATE sessions SET cancel_requested = $2 WHERE id = $1",
            &[&id, &c],
        )
        .await?;
    }
    if let Some(r) = p.rewind {
        // Not GREATEST(): a rewind is the one change that moves these back.
        exec(
            tx,
            "patch rewind",
            "UPDATE sessions SET output_offset = $2, delivered_seq = $3, \
             replay_through = GREATEST(replay_through, agent_seq) WHERE id = $1",
            &[&id, &i(r.output_offset), &i(r.delivered_seq)],
        )
        .await?;
    }
    Ok(())
}

/// Appends inside an open transaction that holds the session row's lock:
/// seqs come from `last_seq + 1`; large fields are cut and kept as blobs;
/// each event is sealed onto the chain and records `epoch`.
async fn append_tx(
    tx: &Tx<'_>,
    id: &str,
    epoch: u64,
    events: Vec<NewEvent>,
) -> Result<Vec<Event>, StoreError> {
    let mut out = Vec::with_capacity(events.len());
    let mut prev: Option<String> = None;
    for (actor, mut kind) in events {
        let seq: i64 = query_opt(
            tx,
            "next seq",
            "UPDATE sessions SET last_seq = last_seq + 1 WHERE id = $1 RETURNING last_seq",
            &[&id],
        )
        .await?
        .ok_or_else(|| StoreError::NotFound(id.to_string()))?
        .try_get("last_seq")
        .map_err(be)?;
        if prev.is_none() && seq > 1 {
            prev = query_opt(
                tx,
                "chain head",
                "SELECT hash FROM session_events WHERE session_id = $1 AND seq = $2",
                &[&id, &(seq - 1)],
            )
            .await?
            .map(|r| r.try_get::<_, String>("hash"))
            .transpose()
            .map_err(be)?;
        }
        for (n, (text, slot, truncated)) in kind.large_fields().into_iter().enumerate() {
            if text.len() <= INLINE_TEXT_BYTES {
                continue;
            }
            if let Some(slot) = slot {
                let blob_ref = format!("b{seq}.{n}");
                let whole = cut(text, MAX_BLOB_BYTES).as_bytes();
                exec(
                    tx,
                    "blob",
                    "INSERT INTO session_blobs (session_id, ref, data) VALUES ($1, $2, $3)",
                    &[&id, &blob_ref, &whole],
                )
                .await?;
                *slot = Some(blob_ref);
            }
            if let Some(t) = truncated {
                *t = true;
            }
            *text = cut(text, INLINE_TEXT_BYTES).to_string();
        }
        let at = now();
        let data = serde_json::to_string(&kind).map_err(be)?;
        let (prev_hash, hash) = seal_after(
            prev.as_deref(),
            id,
            u(seq),
            &at,
            actor.as_str(),
            kind.type_name(),
            &data,
        )
        .map_err(be)?;
        exec(
            tx,
            "append",
            "INSERT INTO session_events (session_id, seq, at, actor, type, data, prev_hash, hash, epoch) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            &[
                &id,
                &seq,
                &at,
                &actor.as_str(),
                &kind.type_name(),
                &data,
                &prev_hash,
                &hash,
                &i(epoch),
            ],
        )
        .await?;
        prev = Some(hash);
        out.push(Event {
            seq: u(seq),
            at,
            actor,
            kind,
        });
    }
    Ok(out)
}

/// The session that holds idempotency key `key`, with its request hash.
async fn find_key(tx: &Tx<'_>, key: Option<&str>) -> Result<Option<(String, String)>, StoreError> {
    let Some(k) = key else { return Ok(None) };
    let r = query_opt(
        tx,
        "idempotency",
        "SELECT id, request_hash FROM sessions WHERE idempotency_key = $1",
        &[&k],
    )
    .await?;
    r.map(|r| {
        Ok((
            r.try_get::<_, String>("id").map_err(be)?,
            r.try_get::<_, String>("request_hash").map_err(be)?,
        ))
    })
    .transpose()
}

/// A create with a key seen before: the same request is a repeat, another
/// one a conflict.
async fn repeat(
    tx: &Tx<'_>,
    (sid, h): (String, String),
    request_hash: &str,
) -> Result<CreateOutcome, StoreError> {
    Ok(if h == request_hash {
        CreateOutcome::Existing(get_session(tx, &sid).await?)
    } else {
        CreateOutcome::KeyConflict(sid)
    })
}

impl PgSessionStore {
    /// `dsn`: a `postgres://` URL or a libpq connection string; `host_id`:
    /// the host this store writes as. Connects, then runs the migrations
    /// not yet run. A server that is not there is `Unavailable` within the
    /// pool's 10 s connect timeout, never a hang.
    pub async fn connect(dsn: &str, pool_size: usize, host_id: &str) -> Result<Self, StoreError> {
        check_host_id(host_id)?;
        let pool = hatchery_store::pg_pool(dsn, pool_size).map_err(|e| StoreError::Config(e.0))?;
        let s = PgSessionStore {
            pool,
            host: host_id.into(),
        };
        s.migrate().await?;
        Ok(s)
    }

    pub(super) async fn client(&self) -> Result<deadpool_postgres::Client, StoreError> {
        self.pool
            .get()
            .await
            .map_err(|e| StoreError::Unavailable(e.to_string()))
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(pg("begin migration"))?;
        SCHEMA.run(&tx).await.map_err(migrate_err)?;
        tx.commit().await.map_err(pg("commit migration"))
    }

    /// How many migrations the database has recorded.
    pub async fn schema_version(&self) -> Result<u64, StoreError> {
        let c = self.client().await?;
        SCHEMA.version(&c).await.map_err(migrate_err)
    }

    /// The same database, written as another host (tests and sweepers).
    pub fn as_host(&self, host_id: &str) -> Result<Self, StoreError> {
        check_host_id(host_id)?;
        Ok(PgSessionStore {
            pool: self.pool.clone(),
            host: host_id.into(),
        })
    }

    /// Runs `f` in one transaction after the fence check on `id`; commits
    /// only if `f` succeeds.
    async fn write<T, F>(&self, id: &str, f: F) -> Result<T, StoreError>
    where
        F: for<'a> FnOnce(
            &'a Tx<'a>,
            u64,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<T, StoreError>> + Send + 'a>,
        >,
    {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(pg("begin"))?;
        let epoch = fence(&tx, id, &self.host).await?;
        let out = f(&tx, epoch).await?;
        tx.commit().await.map_err(pg("commit"))?;
        Ok(out)
    }
}

#[async_trait]
impl SessionStore for PgSessionStore {
    async fn create(
        &self,
        id: &str,
        spec: &SessionSpec,
        idempotency_key: Option<&str>,
        request_hash: &str,
    ) -> Result<CreateOutcome, StoreError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(pg("begin"))?;
        if let Some(found) = find_key(&tx, idempotency_key).await? {
            return repeat(&tx, found, request_hash).await;
        }
        let spec_json = serde_json::to_string(spec).map_err(be)?;
        // Two creates with one key at once: the second waits for the
        // first's commit, inserts nothing, and then answers as a repeat.
        let inserted = query_opt(
            &tx,
            "create",
            "INSERT INTO sessions (id, spec, state, repo, idempotency_key, request_hash, created_at, host_id, epoch) \
             VALUES ($1, $2, 'queued', $3, $4, $5, $6, $7, 1) \
             ON CONFLICT (idempotency_key) DO NOTHING RETURNING id",
            &[
                &id,
                &spec_json,
                &spec.repo,
                &idempotency_key,
                &request_hash,
                &now(),
                &&*self.host,
            ],
        )
        .await?;
        if inserted.is_none() {
            let found = find_key(&tx, idempotency_key)
                .await?
                .ok_or_else(|| be("idempotency key conflicted but no row holds it"))?;
            return repeat(&tx, found, request_hash).await;
        }
        let ev = append_tx(
            &tx,
            id,
            1,
            vec![(
                Actor::User,
                EventKind::SessionCreated {
                    repo: spec.repo.clone(),
                    git_ref: spec.git_ref.clone(),
                    task: spec.task.clone(),
                    policy_id: spec.policy_id.clone(),
                    policy_version: spec.policy_version,
                    template: spec.template.clone(),
                },
            )],
        )
        .await?;
        let s = get_session(&tx, id).await?;
        tx.commit().await.map_err(pg("commit"))?;
        Ok(CreateOutcome::Created(
            s,
            ev.into_iter().next().expect("one event"),
        ))
    }

    async fn get(&self, id: &str) -> Result<Session, StoreError> {
        let c = self.client().await?;
        get_session(&c, id).await
    }

    async fn list(&self, f: &ListFilter) -> Result<Vec<Session>, StoreError> {
        let mut sql = format!("SELECT {SESSION_COLS} FROM sessions WHERE true");
        let mut args: Vec<String> = vec![];
        if let Some(s) = f.state {
            args.push(s.as_str().to_string());
            sql += &format!(" AND state = ${}", args.len());
        }
        if let Some(r) = &f.repo {
            args.push(r.clone());
            sql += &format!(" AND repo = ${}", args.len());
        }
        if let Some(a) = &f.after_id {
            args.push(a.clone());
            sql += &format!(
                " AND ord > COALESCE((SELECT ord FROM sessions WHERE id = ${}), 0)",
                args.len()
            );
        }
        sql += &format!(" ORDER BY ord LIMIT {}", f.limit.max(1));
        let params: Vec<&(dyn ToSql + Sync)> =
            args.iter().map(|a| a as &(dyn ToSql + Sync)).collect();
        let c = self.client().await?;
        query(&c, "list", &sql, &params)
            .await?
            .iter()
            .map(session_row)
            .collect()
    }

    async fn with_sandbox(&self, sandbox_id: &str) -> Result<Option<Session>, StoreError> {
        let sql = format!(
            "SELECT {SESSION_COLS} FROM sessions WHERE sandbox_id = $1 AND {UNFINISHED} ORDER BY ord LIMIT 1"
        );
        let c = self.client().await?;
        query(&c, "with_sandbox", &sql, &[&sandbox_id])
            .await?
            .iter()
            .map(session_row)
            .next()
            .transpose()
    }

    async fn unfinished(&self) -> Result<Vec<Session>, StoreError> {
        let sql = format!(
            "SELECT {SESSION_COLS} FROM sessions WHERE host_id = $1 AND {UNFINISHED} ORDER BY ord"
        );
        let c = self.client().await?;
        query(&c, "unfinished", &sql, &[&&*self.host])
            .await?
            .iter()
            .map(session_row)
            .collect()
    }

    async fn append(
        &self,
        id: &str,
        events: Vec<NewEvent>,
        patch: Patch,
    ) -> Result<Vec<Event>, StoreError> {
        let sid = id.to_string();
        self.write(id, move |tx, epoch| {
            Box::pin(async move {
                let out = append_tx(tx, &sid, epoch, events).await?;
                apply_patch(tx, &sid, &patch).await?;
                Ok(out)
            })
        })
        .await
    }

    async fn append_once(
        &self,
        id: &str,
        key: &str,
        events: Vec<NewEvent>,
        patch: Patch,
    ) -> Result<Option<Vec<Event>>, StoreError> {
        let (sid, key) = (id.to_string(), key.to_string());
        self.write(id, move |tx, epoch| {
            Box::pin(async move {
                let fresh = exec(
                    tx,
                    "delivery",
                    "INSERT INTO session_deliveries (session_id, key) VALUES ($1, $2)
                     ON CONFLICT DO NOTHING",
                    &[&sid, &key],
                )
                .await?;
                if fresh == 0 {
                    return Ok(None);
                }
                let out = append_tx(tx, &sid, epoch, events).await?;
                apply_patch(tx, &sid, &patch).await?;
                Ok(Some(out))
            })
        })
        .await
    }

    async fn append_agent(
        &self,
        id: &str,
        line_end: u64,
        n: Option<u64>,
        events: Vec<NewEvent>,
        patch: Patch,
    ) -> Result<Option<Vec<Event>>, StoreError> {
        let sid = id.to_string();
        self.write(id, move |tx, epoch| {
            Box::pin(async move {
                let done: i64 = query_opt(
                    tx,
                    "output offset",
                    "SELECT output_offset FROM sessions WHERE id = $1",
                    &[&sid],
                )
                .await?
                .ok_or_else(|| StoreError::NotFound(sid.clone()))?
                .try_get("output_offset")
                .map_err(be)?;
                if i(line_end) <= done {
                    return Ok(None);
                }
                let out = append_tx(tx, &sid, epoch, events).await?;
                apply_patch(tx, &sid, &patch).await?;
                exec(
                    tx,
                    "agent offset",
                    "UPDATE sessions SET output_offset = $2, agent_seq = GREATEST(agent_seq, $3) WHERE id = $1",
                    &[&sid, &i(line_end), &i(n.unwrap_or(0))],
                )
                .await?;
                Ok(Some(out))
            })
        })
        .await
    }

    async fn transition(
        &self,
        id: &str,
        from: &[SessionState],
        to: SessionState,
        reason: Option<String>,
        extra: Vec<NewEvent>,
        patch: Patch,
    ) -> Result<(Session, Vec<Event>), StoreError> {
        let sid = id.to_string();
        let from = from.to_vec();
        let host = self.host.clone();
        self.write(id, move |tx, epoch| {
            Box::pin(async move {
                let cur = get_session(tx, &sid).await?;
                if !from.contains(&cur.state) || !cur.state.valid_transition(to) {
                    return Err(StoreError::StateConflict {
                        id: sid,
                        current: cur.state,
                    });
                }
                let mut evs = extra;
                evs.push((
                    Actor::System,
                    EventKind::StateChanged {
                        from: cur.state,
                        to,
                        reason: reason.clone(),
                    },
                ));
                let out = append_tx(tx, &sid, epoch, evs).await?;
                apply_patch(tx, &sid, &patch).await?;
                // Guarded: the UPDATE names the state it moves from and
                // the owner (both hold under the row lock; belt and braces).
                let n = exec(
                    tx,
                    "transition",
                    "UPDATE sessions SET state = $2 WHERE id = $1 AND state = $3 AND host_id = $4",
                    &[&sid, &to.as_str(), &cur.state.as_str(), &&*host],
                )
                .await?;
                if n != 1 {
                    return Err(StoreError::StateConflict {
                        id: sid,
                        current: cur.state,
                    });
                }
                if to == SessionState::Running {
                    exec(
                        tx,
                        "started",
                        "UPDATE sessions SET started_at = COALESCE(started_at, $2) WHERE id = $1",
                        &[&sid, &now()],
                    )
                    .await?;
                }
                if to.is_terminal() {
                    exec(
                        tx,
                        "ended",
                        "UPDATE sessions SET ended_at = $2, reason = $3, waiting = NULL WHERE id = $1",
                        &[&sid, &now(), &reason],
                    )
                    .await?;
                    exec(
                        tx,
                        "expire approvals",
                        "UPDATE session_approvals SET state = 'expired' WHERE session_id = $1 AND state = 'pending'",
                        &[&sid],
                    )
                    .await?;
                }
                let s = get_session(tx, &sid).await?;
                Ok((s, out))
            })
        })
        .await
    }

    async fn events(&self, id: &str, after: u64, limit: usize) -> Result<Vec<Event>, StoreError> {
        let c = self.client().await?;
        query(
            &c,
            "events",
            "SELECT seq, at, actor, data FROM session_events WHERE session_id = $1 AND seq > $2 \
             ORDER BY seq LIMIT $3",
            &[&id, &i(after), &(limit as i64)],
        )
        .await?
        .iter()
        .map(event_row)
        .collect()
    }

    async fn chain_heads(&self) -> Result<Vec<hatchery_audit::Head>, StoreError> {
        let c = self.client().await?;
        query(
            &c,
            "chain heads",
            "SELECT DISTINCT ON (e.session_id) e.session_id, e.seq, e.hash \
             FROM session_events e JOIN sessions s ON s.id = e.session_id \
             WHERE s.host_id = $1 ORDER BY e.session_id, e.seq DESC",
            &[&&*self.host],
        )
        .await?
        .iter()
        .map(|r| {
            Ok(hatchery_audit::Head {
                chain: r.try_get("session_id").map_err(be)?,
                seq: r.try_get::<_, i64>("seq").map_err(be)? as u64,
                hash: r.try_get("hash").map_err(be)?,
            })
        })
        .collect()
    }

    async fn deliverables_after(&self, id: &str, after: u64) -> Result<Vec<Event>, StoreError> {
        let c = self.client().await?;
        query(
            &c,
            "deliverables",
            "SELECT seq, at, actor, data FROM session_events WHERE session_id = $1 AND seq > $2 \
             AND type IN ('message', 'approval_decided') ORDER BY seq",
            &[&id, &i(after)],
        )
        .await?
        .iter()
        .map(event_row)
        .collect()
    }

    async fn append_if_state(
        &self,
        id: &str,
        states: &[SessionState],
        events: Vec<NewEvent>,
        patch: Patch,
    ) -> Result<Vec<Event>, StoreError> {
        let sid = id.to_string();
        let states = states.to_vec();
        self.write(id, move |tx, epoch| {
            Box::pin(async move {
                let cur = get_session(tx, &sid).await?;
                if !states.contains(&cur.state) {
                    return Err(StoreError::StateConflict {
                        id: sid,
                        current: cur.state,
                    });
                }
                let out = append_tx(tx, &sid, epoch, events).await?;
                apply_patch(tx, &sid, &patch).await?;
                Ok(out)
            })
        })
        .await
    }

    async fn blob(&self, id: &str, blob_ref: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let c = self.client().await?;
        query_opt(
            &c,
            "blob",
            "SELECT data FROM session_blobs WHERE session_id = $1 AND ref = $2",
            &[&id, &blob_ref],
        )
        .await?
        .map(|r| r.try_get::<_, Vec<u8>>("data").map_err(be))
        .transpose()
    }

    async fn request_approval(
        &self,
        id: &str,
        approval_id: &str,
        action: &str,
        details: &str,
    ) -> Result<Vec<Event>, StoreError> {
        let (sid, aid, action, details) = (
            id.to_string(),
            approval_id.to_string(),
            action.to_string(),
            details.to_string(),
        );
        self.write(id, move |tx, epoch| {
            Box::pin(async move {
                exec(
                    tx,
                    "request approval",
                    "INSERT INTO session_approvals (id, session_id, action, details, state, created_at) \
                     VALUES ($1, $2, $3, $4, 'pending', $5) ON CONFLICT (id) DO NOTHING",
                    &[&aid, &sid, &action, &details, &now()],
                )
                .await?;
                append_tx(
                    tx,
                    &sid,
                    epoch,
                    vec![(
                        Actor::Agent,
                        EventKind::ApprovalRequested {
                            approval_id: aid.clone(),
                            action: action.clone(),
                            details: details.clone(),
                        },
                    )],
                )
                .await
            })
        })
        .await
    }

    async fn usage(&self, id: &str) -> Result<super::StorageUsage, StoreError> {
        let c = self.client().await?;
        if query_opt(&c, "usage", "SELECT 1 FROM sessions WHERE id = $1", &[&id])
            .await?
            .is_none()
        {
            return Err(StoreError::NotFound(id.to_string()));
        }
        let r = query(
            &c,
            "usage",
            "SELECT COUNT(*)::BIGINT, COALESCE(SUM(octet_length(data)), 0)::BIGINT, \
             COALESCE(SUM(CASE WHEN actor = 'agent' THEN octet_length(data) ELSE 0 END), 0)::BIGINT \
             FROM session_events WHERE session_id = $1",
            &[&id],
        )
        .await?;
        let g =
            |r: &Row, i: usize| -> Result<i64, StoreError> { r.try_get::<_, i64>(i).map_err(be) };
        let ev = match r.first() {
            Some(r) => (g(r, 0)?, g(r, 1)?, g(r, 2)?),
            None => (0, 0, 0),
        };
        let r = query(
            &c,
            "usage",
            "SELECT COUNT(*)::BIGINT, COALESCE(SUM(octet_length(data)), 0)::BIGINT \
             FROM session_blobs WHERE session_id = $1",
            &[&id],
        )
        .await?;
        let bl = match r.first() {
            Some(r) => (g(r, 0)?, g(r, 1)?),
            None => (0, 0),
        };
        let r = query(
            &c,
            "usage",
            "SELECT COUNT(*)::BIGINT FROM session_approvals WHERE session_id = $1 AND state = 'pending'",
            &[&id],
        )
        .await?;
        let ap = match r.first() {
            Some(r) => g(r, 0)?,
            None => 0,
        };
        let markers = query(
            &c,
            "usage",
            "SELECT data FROM session_events WHERE session_id = $1 AND type = 'output_capped'",
            &[&id],
        )
        .await?
        .iter()
        .map(|r| r.try_get::<_, String>(0).map_err(be))
        .collect::<Result<Vec<_>, _>>()?;
        Ok(super::StorageUsage::from_parts(ev, bl, ap, markers))
    }

    async fn pending_approval(&self, id: &str) -> Result<Option<Approval>, StoreError> {
        let c = self.client().await?;
        let r = query_opt(
            &c,
            "pending approval",
            "SELECT id, action, details, state, created_at FROM session_approvals \
             WHERE session_id = $1 AND state = 'pending' ORDER BY created_at, id LIMIT 1",
            &[&id],
        )
        .await?;
        r.map(|r| {
            Ok(Approval {
                approval_id: r.try_get("id").map_err(be)?,
                action: r.try_get("action").map_err(be)?,
                details: r.try_get("details").map_err(be)?,
                state: r.try_get("state").map_err(be)?,
                created_at: r.try_get("created_at").map_err(be)?,
            })
        })
        .transpose()
    }

    async fn decide_approval(
        &self,
        id: &str,
        approval_id: &str,
        decision: &str,
        note: &str,
    ) -> Result<Vec<Event>, StoreError> {
        let (sid, aid, decision, note) = (
            id.to_string(),
            approval_id.to_string(),
            decision.to_string(),
            note.to_string(),
        );
        self.write(id, move |tx, epoch| {
            Box::pin(async move {
                let n = exec(
                    tx,
                    "decide approval",
                    "UPDATE session_approvals SET state = 'decided', decision = $3, note = $4, decided_at = $5 \
                     WHERE id = $1 AND session_id = $2 AND state = 'pending'",
                    &[&aid, &sid, &decision, &note, &now()],
                )
                .await?;
                if n == 0 {
                    return Err(StoreError::ApprovalNotFound(aid));
                }
                append_tx(
                    tx,
                    &sid,
                    epoch,
                    vec![(
                        Actor::User,
                        EventKind::ApprovalDecided {
                            approval_id: aid.clone(),
                            decision: decision.clone(),
                            note: note.clone(),
                        },
                    )],
                )
                .await
            })
        })
        .await
    }

    async fn take_over(
        &self,
        from_host: &str,
        to_host: &str,
        reason: &str,
    ) -> Result<Vec<(String, u64)>, StoreError> {
        check_host_id(to_host)?;
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(pg("begin"))?;
        // Locks in id order (no deadlock between two sweepers); a row that
        // another sweeper moved meanwhile is re-checked after its lock is
        // released and drops out (READ COMMITTED re-evaluates the WHERE).
        let sql = format!(
            "SELECT id FROM sessions WHERE host_id = $1 AND {UNFINISHED} ORDER BY id FOR UPDATE"
        );
        let ids: Vec<String> = query(&tx, "take over", &sql, &[&from_host])
            .await?
            .iter()
            .map(|r| r.try_get("id").map_err(be))
            .collect::<Result<_, _>>()?;
        let mut moved = Vec::with_capacity(ids.len());
        for id in ids {
            let Some(r) = query_opt(
                &tx,
                "take over",
                "UPDATE sessions SET host_id = $2, epoch = epoch + 1 \
                 WHERE id = $1 AND host_id = $3 RETURNING epoch",
                &[&id, &to_host, &from_host],
            )
            .await?
            else {
                continue;
            };
            let epoch = u(r.try_get("epoch").map_err(be)?);
            append_tx(
                &tx,
                &id,
                epoch,
                vec![(
                    Actor::System,
                    EventKind::HostChanged {
                        from: from_host.to_string(),
                        to: to_host.to_string(),
                        epoch,
                        reason: reason.to_string(),
                    },
                )],
            )
            .await?;
            moved.push((id, epoch));
        }
        tx.commit().await.map_err(pg("commit"))?;
        Ok(moved)
    }

    fn host_id(&self) -> &str {
        &self.host
    }
}
