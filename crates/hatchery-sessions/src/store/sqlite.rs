//! SQLite backend: its own file (`DATA_DIR/sessions.db`), WAL, one
//! connection behind a mutex, every call on the blocking pool. Write
//! transactions begin IMMEDIATE: they take the write lock first, so two
//! stores on one file (two processes) wait for each other through the busy
//! timeout instead of failing a read-to-write upgrade.

use super::*;
use crate::events::{cut, INLINE_TEXT_BYTES, MAX_BLOB_BYTES};
use rusqlite::{params, Connection, OptionalExtension, Row, Transaction, TransactionBehavior};
use std::path::Path;
use std::sync::{Arc, Mutex};

#[derive(Clone)]
pub struct SqliteStore {
    conn: Arc<Mutex<Connection>>,
    host: Arc<str>,
}

fn be(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(e.to_string())
}

pub(crate) fn now() -> String {
    let t = time::OffsetDateTime::now_utc();
    let f = time::format_description::well_known::Rfc3339;
    // Millisecond precision, always `Z`.
    let t = t
        .replace_nanosecond(t.millisecond() as u32 * 1_000_000)
        .unwrap_or(t);
    t.format(&f).unwrap_or_default()
}

impl SqliteStore {
    /// Opens as the single-host default host ([`LOCAL_HOST`]).
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_as(path, LOCAL_HOST)
    }

    /// Opens as host `host_id`: its writes are fenced to its own sessions.
    pub fn open_as(path: &Path, host_id: &str) -> Result<Self, StoreError> {
        check_host_id(host_id)?;
        let mut conn = Connection::open(path).map_err(be)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(be)?;
        // WAL with NORMAL survives a process crash (SIGKILL) with every
        // committed transaction; only an OS crash could lose the last ones.
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(be)?;
        conn.pragma_update(None, "foreign_keys", "ON").map_err(be)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(be)?;
        super::migrations::apply(&mut conn).map_err(be)?;
        super::chain::backfill(&mut conn).map_err(be)?;
        Ok(SqliteStore {
            conn: Arc::new(Mutex::new(conn)),
            host: host_id.into(),
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
        .map_err(be)?
    }
}

const SESSION_COLS: &str = "id, spec, state, idempotency_key, created_at, started_at, ended_at, reason, \
    spend_tokens, spend_usd_cents, spend_wall_s, sandbox_id, process_id, snapshot_id, review_snapshot_id, \
    waiting, output_offset, agent_seq, delivered_seq, cancel_requested, last_seq, host_id, epoch, \
    replay_through";

fn session_row(r: &Row) -> rusqlite::Result<Session> {
    let spec: String = r.get("spec")?;
    let state: String = r.get("state")?;
    let bad = |what: &str, v: &str| {
        rusqlite::Error::FromSqlConversionFailure(
            0,
            rusqlite::types::Type::Text,
            format!("bad {what}: {v}").into(),
        )
    };
    Ok(Session {
        id: r.get("id")?,
        spec: serde_json::from_str(&spec).map_err(|_| bad("spec", &spec))?,
        state: SessionState::parse(&state).ok_or_else(|| bad("state", &state))?,
        idempotency_key: r.get("idempotency_key")?,
        created_at: r.get("created_at")?,
        started_at: r.get("started_at")?,
        ended_at: r.get("ended_at")?,
        reason: r.get("reason")?,
        spend_tokens: r.get::<_, i64>("spend_tokens")? as u64,
        spend_usd_cents: r.get::<_, i64>("spend_usd_cents")? as u64,
        spend_wall_s: r.get::<_, i64>("spend_wall_s")? as u64,
        sandbox_id: r.get("sandbox_id")?,
        process_id: r.get("process_id")?,
        snapshot_id: r.get("snapshot_id")?,
        review_snapshot_id: r.get("review_snapshot_id")?,
        waiting: r.get("waiting")?,
        output_offset: r.get::<_, i64>("output_offset")? as u64,
        agent_seq: r.get::<_, i64>("agent_seq")? as u64,
        delivered_seq: r.get::<_, i64>("delivered_seq")? as u64,
        cancel_requested: r.get::<_, i64>("cancel_requested")? != 0,
        last_seq: r.get::<_, i64>("last_seq")? as u64,
        host_id: r.get("host_id")?,
        epoch: r.get::<_, i64>("epoch")? as u64,
        replay_through: r.get::<_, i64>("replay_through")? as u64,
    })
}

fn event_row(r: &Row) -> rusqlite::Result<Event> {
    let data: String = r.get("data")?;
    let actor: String = r.get("actor")?;
    let kind: EventKind = serde_json::from_str(&data).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, Box::new(e))
    })?;
    Ok(Event {
        seq: r.get::<_, i64>("seq")? as u64,
        at: r.get("at")?,
        actor: Actor::parse(&actor).unwrap_or(Actor::System),
        kind,
    })
}

fn get_session(tx: &Connection, id: &str) -> Result<Session, StoreError> {
    tx.query_row(
        &format!("SELECT {SESSION_COLS} FROM sessions WHERE id = ?1"),
        [id],
        session_row,
    )
    .optional()
    .map_err(be)?
    .ok_or_else(|| StoreError::NotFound(id.to_string()))
}

/// Begins a write transaction (IMMEDIATE: the write lock first).
fn write_tx(c: &mut Connection) -> Result<Transaction<'_>, StoreError> {
    c.transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(be)
}

/// The fence: inside the write's transaction (which holds the write lock),
/// the session must belong to `host`; returns its epoch, which the events
/// of this write record.
fn fence(tx: &Transaction, id: &str, host: &str) -> Result<u64, StoreError> {
    let (owner, epoch): (String, i64) = tx
        .query_row(
            "SELECT host_id, epoch FROM sessions WHERE id = ?1",
            [id],
            |r| Ok((r.get("host_id")?, r.get("epoch")?)),
        )
        .optional()
        .map_err(be)?
        .ok_or_else(|| StoreError::NotFound(id.to_string()))?;
    if owner != host {
        return Err(StoreError::Fenced {
            id: id.to_string(),
            owner,
            epoch: epoch as u64,
        });
    }
    Ok(epoch as u64)
}

fn apply_patch(tx: &Transaction, id: &str, p: &Patch) -> Result<(), StoreError> {
    let opt = |col: &str, v: &Option<Option<String>>| -> Result<(), StoreError> {
        if let Some(v) = v {
            tx.execute(
                &format!("UPDATE sessions SET {col} = ?2 WHERE id = ?1"),
                params![id, v],
            )
            .map_err(be)?;
        }
        Ok(())
    };
    opt("sandbox_id", &p.sandbox_id)?;
    opt("process_id", &p.process_id)?;
    opt("snapshot_id", &p.snapshot_id)?;
    opt("review_snapshot_id", &p.review_snapshot_id)?;
    opt("waiting", &p.waiting)?;
    if let Some(d) = p.delivered_seq {
        tx.execute(
            "UPDATE sessions SET delivered_seq = MAX(delivered_seq, ?2) WHERE id = ?1",
            params![id, d as i64],
        )
        .map_err(be)?;
    }
    if p.add_tokens > 0 || p.add_usd_cents > 0 || p.add_wall_s > 0 {
        tx.execute(
            "UPDATE sessions SET spend_tokens = spend_tokens + ?2, spend_usd_cents = spend_usd_cents + ?3, \
             spend_wall_s = spend_wall_s + ?4 WHERE id = ?1",
            params![id, p.add_tokens as i64, p.add_usd_cents as i64, p.add_wall_s as i64],
        )
        .map_err(be)?;
    }
    if let Some((aid, action, details)) = &p.new_approval {
        tx.execute(
            "INSERT OR IGNORE INTO approvals (id, session_id, action, details, state, created_at) \
             VALUES (?1, ?2, ?3, ?4, 'pending', ?5)",
            params![aid, id, action, details, now()],
        )
        .map_err(be)?;
    }
    if let Some(v) = p.policy_version {
        // The spec is JSON; only this field of it ever changes.
        tx.execute(
            "UPDATE sessions SET spec = json_set(spec, '$.policy_version', ?2) WHERE id = ?1",
            params![id, v as i64],
        )
        .map_err(be)?;
    }
    if let Some(c) = p.cancel_requested {
        tx.execute(
            "UPDATE sessions SET cancel_requested = ?2 WHERE id = ?1",
            params![id, c as i64],
        )
        .map_err(be)?;
    }
    if let Some(r) = p.rewind {
        // Not MAX(): a rewind is the one change that moves these back.
        tx.execute(
            "UPDATE sessions SET output_offset = ?2, delivered_seq = ?3, \
             replay_through = MAX(replay_through, agent_seq) WHERE id = ?1",
            params![id, r.output_offset as i64, r.delivered_seq as i64],
        )
        .map_err(be)?;
    }
    Ok(())
}

/// Appends inside an open transaction: the next seq comes from the
/// session row (`last_seq + 1`), so seqs have no gaps and two appends can
/// never get the same one. Large fields are cut and stored as blobs.
fn append_tx(
    tx: &Transaction,
    id: &str,
    epoch: u64,
    events: Vec<NewEvent>,
) -> Result<Vec<Event>, StoreError> {
    let mut out = Vec::with_capacity(events.len());
    for (actor, mut kind) in events {
        let seq: i64 = tx
            .query_row(
                "UPDATE sessions SET last_seq = last_seq + 1 WHERE id = ?1 RETURNING last_seq",
                [id],
                |r| r.get(0),
            )
            .optional()
            .map_err(be)?
            .ok_or_else(|| StoreError::NotFound(id.to_string()))?;
        for (i, (text, slot, truncated)) in kind.large_fields().into_iter().enumerate() {
            if text.len() <= INLINE_TEXT_BYTES {
                continue;
            }
            if let Some(slot) = slot {
                let blob_ref = format!("b{seq}.{i}");
                let whole = cut(text, MAX_BLOB_BYTES);
                tx.execute(
                    "INSERT INTO blobs (session_id, ref, data) VALUES (?1, ?2, ?3)",
                    params![id, blob_ref, whole.as_bytes()],
                )
                .map_err(be)?;
                *slot = Some(blob_ref);
            }
            if let Some(t) = truncated {
                *t = true;
            }
            *text = cut(text, INLINE_TEXT_BYTES).to_string();
        }
        let at = now();
        let data = serde_json::to_string(&kind).map_err(be)?;
        let (prev_hash, hash) = super::chain::seal(
            tx,
            id,
            seq as u64,
            &at,
            actor.as_str(),
            kind.type_name(),
            &data,
        )
        .map_err(be)?;
        tx.execute(
            "INSERT INTO events (session_id, seq, at, actor, type, data, prev_hash, hash, epoch) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            params![
                id,
                seq,
                at,
                actor.as_str(),
                kind.type_name(),
                data,
                prev_hash,
                hash,
                epoch as i64
            ],
        )
        .map_err(be)?;
        out.push(Event {
            seq: seq as u64,
            at,
            actor,
            kind,
        });
    }
    Ok(out)
}

#[async_trait]
impl SessionStore for SqliteStore {
    async fn create(
        &self,
        id: &str,
        spec: &SessionSpec,
        idempotency_key: Option<&str>,
        request_hash: &str,
    ) -> Result<CreateOutcome, StoreError> {
        let (id, spec) = (id.to_string(), spec.clone());
        let key = idempotency_key.map(str::to_string);
        let hash = request_hash.to_string();
        let host = self.host.clone();
        self.with(move |c| {
            let tx = write_tx(c)?;
            if let Some(k) = &key {
                let found: Option<(String, String)> = tx
                    .query_row(
                        "SELECT id, request_hash FROM sessions WHERE idempotency_key = ?1",
                        [k],
                        |r| Ok((r.get("id")?, r.get("request_hash")?)),
                    )
                    .optional()
                    .map_err(be)?;
                if let Some((existing, h)) = found {
                    return Ok(if h == hash {
                        CreateOutcome::Existing(get_session(&tx, &existing)?)
                    } else {
                        CreateOutcome::KeyConflict(existing)
                    });
                }
            }
            tx.execute(
                "INSERT INTO sessions (id, spec, state, repo, idempotency_key, request_hash, created_at, host_id, epoch) \
                 VALUES (?1, ?2, 'queued', ?3, ?4, ?5, ?6, ?7, 1)",
                params![id, serde_json::to_string(&spec).map_err(be)?, spec.repo, key, hash, now(), &*host],
            )
            .map_err(be)?;
            let ev = append_tx(
                &tx,
                &id,
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
            )?;
            let s = get_session(&tx, &id)?;
            tx.commit().map_err(be)?;
            Ok(CreateOutcome::Created(s, ev.into_iter().next().expect("one event")))
        })
        .await
    }

    async fn get(&self, id: &str) -> Result<Session, StoreError> {
        let id = id.to_string();
        self.with(move |c| get_session(c, &id)).await
    }

    async fn list(&self, f: &ListFilter) -> Result<Vec<Session>, StoreError> {
        let f = f.clone();
        self.with(move |c| {
            // rowid order is creation order; the cursor is a session id.
            let mut sql = format!("SELECT {SESSION_COLS} FROM sessions WHERE 1=1");
            let mut args: Vec<String> = vec![];
            if let Some(s) = f.state {
                args.push(s.as_str().to_string());
                sql += &format!(" AND state = ?{}", args.len());
            }
            if let Some(r) = &f.repo {
                args.push(r.clone());
                sql += &format!(" AND repo = ?{}", args.len());
            }
            if let Some(a) = &f.after_id {
                args.push(a.clone());
                sql += &format!(
                    " AND rowid > COALESCE((SELECT rowid FROM sessions WHERE id = ?{}), 0)",
                    args.len()
                );
            }
            sql += &format!(" ORDER BY rowid LIMIT {}", f.limit.max(1));
            let mut st = c.prepare(&sql).map_err(be)?;
            let rows = st
                .query_map(rusqlite::params_from_iter(args.iter()), session_row)
                .map_err(be)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(be)
        })
        .await
    }

    async fn with_sandbox(&self, sandbox_id: &str) -> Result<Option<Session>, StoreError> {
        let sbx = sandbox_id.to_string();
        self.with(move |c| {
            c.query_row(&with_sandbox_sql(), [&sbx], session_row)
                .optional()
                .map_err(be)
        })
        .await
    }

    async fn unfinished(&self) -> Result<Vec<Session>, StoreError> {
        let host = self.host.clone();
        self.with(move |c| {
            let mut st = c
                .prepare(&format!(
                    "SELECT {SESSION_COLS} FROM sessions WHERE host_id = ?1 \
                     AND state NOT IN ('completed','failed','cancelled') ORDER BY rowid"
                ))
                .map_err(be)?;
            let rows = st.query_map([&*host], session_row).map_err(be)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(be)
        })
        .await
    }

    async fn append(
        &self,
        id: &str,
        events: Vec<NewEvent>,
        patch: Patch,
    ) -> Result<Vec<Event>, StoreError> {
        let id = id.to_string();
        let host = self.host.clone();
        self.with(move |c| {
            let tx = write_tx(c)?;
            let epoch = fence(&tx, &id, &host)?;
            let out = append_tx(&tx, &id, epoch, events)?;
            apply_patch(&tx, &id, &patch)?;
            tx.commit().map_err(be)?;
            Ok(out)
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
        let (id, key) = (id.to_string(), key.to_string());
        let host = self.host.clone();
        self.with(move |c| {
            let tx = write_tx(c)?;
            let epoch = fence(&tx, &id, &host)?;
            let fresh = tx
                .execute(
                    "INSERT INTO session_deliveries (session_id, key) VALUES (?1, ?2)
                     ON CONFLICT DO NOTHING",
                    params![id, key],
                )
                .map_err(be)?;
            if fresh == 0 {
                return Ok(None);
            }
            let out = append_tx(&tx, &id, epoch, events)?;
            apply_patch(&tx, &id, &patch)?;
            tx.commit().map_err(be)?;
            Ok(Some(out))
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
        let id = id.to_string();
        let host = self.host.clone();
        self.with(move |c| {
            let tx = write_tx(c)?;
            let epoch = fence(&tx, &id, &host)?;
            let done: i64 = tx
                .query_row("SELECT output_offset FROM sessions WHERE id = ?1", [&id], |r| r.get(0))
                .optional()
                .map_err(be)?
                .ok_or_else(|| StoreError::NotFound(id.clone()))?;
            if line_end as i64 <= done {
                return Ok(None);
            }
            let out = append_tx(&tx, &id, epoch, events)?;
            apply_patch(&tx, &id, &patch)?;
            tx.execute(
                "UPDATE sessions SET output_offset = ?2, agent_seq = MAX(agent_seq, ?3) WHERE id = ?1",
                params![id, line_end as i64, n.unwrap_or(0) as i64],
            )
            .map_err(be)?;
            tx.commit().map_err(be)?;
            Ok(Some(out))
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
        let id = id.to_string();
        let from = from.to_vec();
        let host = self.host.clone();
        self.with(move |c| {
            let tx = write_tx(c)?;
            let epoch = fence(&tx, &id, &host)?;
            let cur = get_session(&tx, &id)?;
            if !from.contains(&cur.state) || !cur.state.valid_transition(to) {
                return Err(StoreError::StateConflict {
                    id,
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
            let out = append_tx(&tx, &id, epoch, evs)?;
            apply_patch(&tx, &id, &patch)?;
            // Guarded: the UPDATE names the state it moves from.
            tx.execute(
                "UPDATE sessions SET state = ?2 WHERE id = ?1 AND state = ?3",
                params![id, to.as_str(), cur.state.as_str()],
            )
            .map_err(be)?;
            if to == SessionState::Running {
                tx.execute(
                    "UPDATE sessions SET started_at = COALESCE(started_at, ?2) WHERE id = ?1",
                    params![id, now()],
                )
                .map_err(be)?;
            }
            if to.is_terminal() {
                tx.execute(
                    "UPDATE sessions SET ended_at = ?2, reason = ?3, waiting = NULL WHERE id = ?1",
                    params![id, now(), reason],
                )
                .map_err(be)?;
                tx.execute(
                    "UPDATE approvals SET state = 'expired' WHERE session_id = ?1 AND state = 'pending'",
                    [&id],
                )
                .map_err(be)?;
            }
            let s = get_session(&tx, &id)?;
            tx.commit().map_err(be)?;
            Ok((s, out))
        })
        .await
    }

    async fn events(&self, id: &str, after: u64, limit: usize) -> Result<Vec<Event>, StoreError> {
        let id = id.to_string();
        self.with(move |c| {
            let mut st = c
                .prepare_cached(
                    "SELECT seq, at, actor, data FROM events WHERE session_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
                )
                .map_err(be)?;
            let rows = st
                .query_map(params![id, after as i64, limit as i64], event_row)
                .map_err(be)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(be)
        })
        .await
    }

    async fn chain_heads(&self) -> Result<Vec<hatchery_audit::Head>, StoreError> {
        let host = self.host.clone();
        self.with(move |c| {
            let mut st = c
                .prepare_cached(
                    "SELECT e.session_id, e.seq, e.hash FROM events e JOIN sessions s ON s.id = e.session_id \
                     WHERE s.host_id = ?1 \
                     AND e.seq = (SELECT MAX(seq) FROM events WHERE session_id = e.session_id) \
                     ORDER BY e.session_id",
                )
                .map_err(be)?;
            let rows = st
                .query_map(params![&*host], |r| {
                    Ok(hatchery_audit::Head {
                        chain: r.get("session_id")?,
                        seq: r.get::<_, i64>("seq")? as u64,
                        hash: r.get::<_, Option<String>>("hash")?.unwrap_or_default(),
                    })
                })
                .map_err(be)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(be)
        })
        .await
    }

    async fn append_if_state(
        &self,
        id: &str,
        states: &[SessionState],
        events: Vec<NewEvent>,
        patch: Patch,
    ) -> Result<Vec<Event>, StoreError> {
        let id = id.to_string();
        let states = states.to_vec();
        let host = self.host.clone();
        self.with(move |c| {
            let tx = write_tx(c)?;
            let epoch = fence(&tx, &id, &host)?;
            let cur = get_session(&tx, &id)?;
            if !states.contains(&cur.state) {
                return Err(StoreError::StateConflict {
                    id,
                    current: cur.state,
                });
            }
            let out = append_tx(&tx, &id, epoch, events)?;
            apply_patch(&tx, &id, &patch)?;
            tx.commit().map_err(be)?;
            Ok(out)
        })
        .await
    }

    async fn deliverables_after(&self, id: &str, after: u64) -> Result<Vec<Event>, StoreError> {
        let id = id.to_string();
        self.with(move |c| {
            let mut st = c
                .prepare_cached(
                    "SELECT seq, at, actor, data FROM events WHERE session_id = ?1 AND seq > ?2 AND type IN ('message', 'approval_decided') ORDER BY seq",
                )
                .map_err(be)?;
            let rows = st.query_map(params![id, after as i64], event_row).map_err(be)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(be)
        })
        .await
    }

    async fn blob(&self, id: &str, blob_ref: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let (id, r) = (id.to_string(), blob_ref.to_string());
        self.with(move |c| {
            c.query_row(
                "SELECT data FROM blobs WHERE session_id = ?1 AND ref = ?2",
                params![id, r],
                |row| row.get("data"),
            )
            .optional()
            .map_err(be)
        })
        .await
    }

    async fn request_approval(
        &self,
        id: &str,
        approval_id: &str,
        action: &str,
        details: &str,
    ) -> Result<Vec<Event>, StoreError> {
        let (id, aid, action, details) = (
            id.to_string(),
            approval_id.to_string(),
            action.to_string(),
            details.to_string(),
        );
        let host = self.host.clone();
        self.with(move |c| {
            let tx = write_tx(c)?;
            let epoch = fence(&tx, &id, &host)?;
            tx.execute(
                "INSERT OR IGNORE INTO approvals (id, session_id, action, details, state, created_at) \
                 VALUES (?1, ?2, ?3, ?4, 'pending', ?5)",
                params![aid, id, action, details, now()],
            )
            .map_err(be)?;
            let out = append_tx(
                &tx,
                &id,
                epoch,
                vec![(
                    Actor::Agent,
                    EventKind::ApprovalRequested {
                        approval_id: aid.clone(),
                        action: action.clone(),
                        details: details.clone(),
                    },
                )],
            )?;
            tx.commit().map_err(be)?;
            Ok(out)
        })
        .await
    }

    async fn usage(&self, id: &str) -> Result<super::StorageUsage, StoreError> {
        let id = id.to_string();
        self.with(move |c| {
            let tx = c.transaction().map_err(be)?;
            let found: Option<i64> = tx
                .query_row("SELECT 1 FROM sessions WHERE id = ?1", [&id], |r| r.get(0))
                .optional()
                .map_err(be)?;
            if found.is_none() {
                return Err(StoreError::NotFound(id));
            }
            let ev = tx
                .query_row(
                    "SELECT COUNT(*), COALESCE(SUM(length(CAST(data AS BLOB))), 0), \
                     COALESCE(SUM(CASE WHEN actor = 'agent' THEN length(CAST(data AS BLOB)) ELSE 0 END), 0) \
                     FROM events WHERE session_id = ?1",
                    [&id],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )
                .map_err(be)?;
            let bl = tx
                .query_row(
                    "SELECT COUNT(*), COALESCE(SUM(length(data)), 0) FROM blobs WHERE session_id = ?1",
                    [&id],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .map_err(be)?;
            let ap: i64 = tx
                .query_row(
                    "SELECT COUNT(*) FROM approvals WHERE session_id = ?1 AND state = 'pending'",
                    [&id],
                    |r| r.get(0),
                )
                .map_err(be)?;
            let mut st = tx
                .prepare("SELECT data FROM events WHERE session_id = ?1 AND type = 'output_capped'")
                .map_err(be)?;
            let markers = st
                .query_map([&id], |r| r.get::<_, String>(0))
                .map_err(be)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(be)?;
            drop(st);
            tx.commit().map_err(be)?;
            Ok(super::StorageUsage::from_parts(ev, bl, ap, markers))
        })
        .await
    }

    async fn pending_approval(&self, id: &str) -> Result<Option<Approval>, StoreError> {
        let id = id.to_string();
        self.with(move |c| {
            c.query_row(
                "SELECT id, action, details, state, created_at FROM approvals \
                 WHERE session_id = ?1 AND state = 'pending' ORDER BY created_at LIMIT 1",
                [id],
                |r| {
                    Ok(Approval {
                        approval_id: r.get("id")?,
                        action: r.get("action")?,
                        details: r.get("details")?,
                        state: r.get("state")?,
                        created_at: r.get("created_at")?,
                    })
                },
            )
            .optional()
            .map_err(be)
        })
        .await
    }

    async fn decide_approval(
        &self,
        id: &str,
        approval_id: &str,
        decision: &str,
        note: &str,
    ) -> Result<Vec<Event>, StoreError> {
        let (id, aid, decision, note) = (
            id.to_string(),
            approval_id.to_string(),
            decision.to_string(),
            note.to_string(),
        );
        let host = self.host.clone();
        self.with(move |c| {
            let tx = write_tx(c)?;
            let epoch = fence(&tx, &id, &host)?;
            let n = tx
                .execute(
                    "UPDATE approvals SET state = 'decided', decision = ?3, note = ?4, decided_at = ?5 \
                     WHERE id = ?1 AND session_id = ?2 AND state = 'pending'",
                    params![aid, id, decision, note, now()],
                )
                .map_err(be)?;
            if n == 0 {
                return Err(StoreError::ApprovalNotFound(aid));
            }
            let out = append_tx(
                &tx,
                &id,
                epoch,
                vec![(
                    Actor::User,
                    EventKind::ApprovalDecided {
                        approval_id: aid.clone(),
                        decision: decision.clone(),
                        note: note.clone(),
                    },
                )],
            )?;
            tx.commit().map_err(be)?;
            Ok(out)
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
        let (from, to, reason) = (
            from_host.to_string(),
            to_host.to_string(),
            reason.to_string(),
        );
        self.with(move |c| {
            let tx = write_tx(c)?;
            let ids: Vec<String> = {
                let mut st = tx
                    .prepare(
                        "SELECT id FROM sessions WHERE host_id = ?1 \
                         AND state NOT IN ('completed','failed','cancelled') ORDER BY rowid",
                    )
                    .map_err(be)?;
                let rows = st.query_map([&from], |r| r.get("id")).map_err(be)?;
                rows.collect::<Result<_, _>>().map_err(be)?
            };
            let mut moved = Vec::with_capacity(ids.len());
            for id in ids {
                // Guarded on the old owner, in the transaction that holds
                // the write lock.
                let epoch: Option<i64> = tx
                    .query_row(
                        "UPDATE sessions SET host_id = ?2, epoch = epoch + 1 \
                         WHERE id = ?1 AND host_id = ?3 RETURNING epoch",
                        params![id, to, from],
                        |r| r.get("epoch"),
                    )
                    .optional()
                    .map_err(be)?;
                let Some(epoch) = epoch else { continue };
                let epoch = epoch as u64;
                append_tx(
                    &tx,
                    &id,
                    epoch,
                    vec![(
                        Actor::System,
                        EventKind::HostChanged {
                            from: from.clone(),
                            to: to.clone(),
                            epoch,
                            reason: reason.clone(),
                        },
                    )],
                )?;
                moved.push((id, epoch));
            }
            tx.commit().map_err(be)?;
            Ok(moved)
        })
        .await
    }

    fn host_id(&self) -> &str {
        &self.host
    }
}

/// The lookup behind `with_sandbox`; its filter is the predicate of the
/// partial index `sessions_live_sandbox` (migration 6), word for word, so
/// SQLite uses the index.
fn with_sandbox_sql() -> String {
    format!(
        "SELECT {SESSION_COLS} FROM sessions WHERE sandbox_id = ?1 \
         AND state NOT IN ('completed','failed','cancelled') ORDER BY rowid LIMIT 1"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The broker asks for a sandbox's session on every call: that lookup
    /// must be an index search, not a scan of every session.
    #[test]
    fn the_sandbox_lookup_uses_its_index() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("s.db");
        drop(SqliteStore::open(&p).unwrap());
        let c = Connection::open(&p).unwrap();
        let mut st = c
            .prepare(&format!("EXPLAIN QUERY PLAN {}", with_sandbox_sql()))
            .unwrap();
        let plan: Vec<String> = st
            .query_map(["sbx_1"], |r| r.get::<_, String>(3))
            .unwrap()
            .map(|r| r.unwrap())
            .collect();
        assert!(
            plan.iter().any(|d| d.contains("sessions_live_sandbox")),
            "{plan:?}"
        );
    }

    fn spec() -> SessionSpec {
        crate::store::conformance::spec("git://127.0.0.1/r.git")
    }

    // The backend-neutral behaviour is in store/conformance.rs (run on
    // both backends by tests/store_conformance.rs); what is here is
    // SQLite's own: reopening, the audit view, old rows, migration 3.

    /// A database from before ownership (migrations 1 and 2 only) gets
    /// its sessions assigned to the single-host default at epoch 1, and
    /// that host keeps writing them.
    #[tokio::test]
    async fn migration_3_gives_old_rows_to_the_local_host() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("s.db");
        {
            let c = Connection::open(&p).unwrap();
            for (n, sql) in &super::super::migrations::MIGRATIONS[..2] {
                c.execute_batch(sql).unwrap();
                c.pragma_update(None, "user_version", n).unwrap();
            }
            c.execute(
                "INSERT INTO sessions (id, spec, state, repo, request_hash, created_at, last_seq) \
                 VALUES ('ses_old', ?1, 'idle', 'r', 'h', '2026-01-01T00:00:00.000Z', 0)",
                [serde_json::to_string(&spec()).unwrap()],
            )
            .unwrap();
        }
        let s = SqliteStore::open(&p).unwrap();
        let old = s.get("ses_old").await.unwrap();
        assert_eq!((old.host_id.as_str(), old.epoch), (LOCAL_HOST, 1));
        assert_eq!(s.unfinished().await.unwrap().len(), 1);
        s.append(
            "ses_old",
            vec![(Actor::System, EventKind::CancelRequested)],
            Patch::default(),
        )
        .await
        .unwrap();
        let other = SqliteStore::open_as(&p, "h2").unwrap();
        assert!(other.unfinished().await.unwrap().is_empty());
        assert!(matches!(
            other.append("ses_old", vec![], Patch::default()).await,
            Err(StoreError::Fenced { .. })
        ));
        assert!(matches!(
            SqliteStore::open_as(&p, ""),
            Err(StoreError::Config(_))
        ));
    }

    #[tokio::test]
    async fn reopen_keeps_everything() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("s.db");
        {
            let s = SqliteStore::open(&p).unwrap();
            s.create("ses_a", &spec(), None, "h").await.unwrap();
        }
        let s = SqliteStore::open(&p).unwrap();
        assert_eq!(s.unfinished().await.unwrap().len(), 1);
        assert_eq!(s.get("ses_a").await.unwrap().spec, spec());
    }

    /// The chain over a session's events, checked by the audit crate's
    /// verifier through the `audit_events` view: an untouched log verifies;
    /// an edited, a deleted and a swapped row are each caught at their seq.
    #[tokio::test]
    async fn events_are_hash_chained_and_tampering_is_caught() {
        use hatchery_audit::{Problem, SqliteAuditLog};
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("s.db");
        let s = SqliteStore::open(&p).unwrap();
        s.create("ses_a", &spec(), None, "h").await.unwrap();
        for i in 0..40 {
            s.append(
                "ses_a",
                vec![(
                    Actor::Agent,
                    EventKind::AgentMessage {
                        text: format!("m{i}"),
                        text_ref: None,
                    },
                )],
                Patch::default(),
            )
            .await
            .unwrap();
        }
        let verify = || {
            let log = SqliteAuditLog::open_read_only(&p).unwrap();
            log.verify_chain("ses_a", &[]).unwrap()
        };
        let r = verify();
        assert!(r.ok(), "{r:?}");
        assert_eq!(r.verified, 41);
        let raw = rusqlite::Connection::open(&p).unwrap();
        let bad = |r: hatchery_audit::Report| r.first_bad.map(|b| (b.seq, b.problem));
        // Edited data.
        raw.execute("UPDATE events SET data = replace(data, 'm9', 'mX') WHERE session_id = 'ses_a' AND seq = 11", [])
            .unwrap();
        assert_eq!(bad(verify()), Some((11, Problem::HashMismatch)));
        // The actor is covered too.
        raw.execute("UPDATE events SET data = replace(data, 'mX', 'm9') WHERE session_id = 'ses_a' AND seq = 11", [])
            .unwrap();
        assert!(verify().ok());
        raw.execute(
            "UPDATE events SET actor = 'user' WHERE session_id = 'ses_a' AND seq = 12",
            [],
        )
        .unwrap();
        assert_eq!(bad(verify()), Some((12, Problem::HashMismatch)));
        raw.execute(
            "UPDATE events SET actor = 'agent' WHERE session_id = 'ses_a' AND seq = 12",
            [],
        )
        .unwrap();
        // Swapped rows (contents exchanged, seqs kept).
        raw.execute_batch(
            "UPDATE events SET seq = -1 WHERE session_id = 'ses_a' AND seq = 20;
             UPDATE events SET seq = 20 WHERE session_id = 'ses_a' AND seq = 21;
             UPDATE events SET seq = 21 WHERE session_id = 'ses_a' AND seq = -1;",
        )
        .unwrap();
        assert!(matches!(bad(verify()), Some((20, _))));
        raw.execute_batch(
            "UPDATE events SET seq = -1 WHERE session_id = 'ses_a' AND seq = 20;
             UPDATE events SET seq = 20 WHERE session_id = 'ses_a' AND seq = 21;
             UPDATE events SET seq = 21 WHERE session_id = 'ses_a' AND seq = -1;",
        )
        .unwrap();
        assert!(verify().ok());
        // A deleted row.
        raw.execute(
            "DELETE FROM events WHERE session_id = 'ses_a' AND seq = 30",
            [],
        )
        .unwrap();
        assert_eq!(bad(verify()), Some((30, Problem::SeqGap { found: 31 })));
    }

    /// Rows written before migration 2 get their chain when the store opens.
    #[tokio::test]
    async fn old_rows_are_chained_on_open() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("s.db");
        {
            let s = SqliteStore::open(&p).unwrap();
            s.create("ses_a", &spec(), None, "h").await.unwrap();
            s.append(
                "ses_a",
                vec![(Actor::System, EventKind::CancelRequested)],
                Patch::default(),
            )
            .await
            .unwrap();
        }
        rusqlite::Connection::open(&p)
            .unwrap()
            .execute("UPDATE events SET hash = NULL, prev_hash = NULL", [])
            .unwrap();
        let s = SqliteStore::open(&p).unwrap();
        s.append(
            "ses_a",
            vec![(Actor::System, EventKind::CancelRequested)],
            Patch::default(),
        )
        .await
        .unwrap();
        let log = hatchery_audit::SqliteAuditLog::open_read_only(&p).unwrap();
        let r = log.verify_chain("ses_a", &[]).unwrap();
        assert!(r.ok() && r.verified == 3, "{r:?}");
    }
}
