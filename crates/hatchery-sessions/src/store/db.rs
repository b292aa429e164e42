//! The session store's queries over the deployment's one database
//! (hatchery-db), the same SQL on SQLite and PostgreSQL.
//!
//! Concurrency: every write begins with the fence, which reads the session
//! row `FOR UPDATE` (on SQLite the write transaction already holds the
//! file's only write lock). That one lock orders the write against other
//! appends to the session (seqs are `last_seq + 1` under it: contiguous,
//! no duplicates) and against a take-over (which locks the same rows, in
//! id order, and changes `host_id`): a write that was waiting behind a
//! take-over reads the new owner and fails with `Fenced`, and nothing of
//! it commits.

use super::chain::seal_after;
use super::*;
use crate::events::{cut, INLINE_TEXT_BYTES, MAX_BLOB_BYTES};
use hatchery_db::{args, copy_table, Db, Import, Imported, Joined, Record, Row, Tx};
use std::path::Path;
use std::sync::Arc;

/// The single-host data dir's old file, copied into the one database on
/// first start (hatcheryd's opener). Its tables are those of the last
/// release's `DATA_DIR/sessions.db` (SQLite migrations 1 to 6); sessions
/// are copied in rowid order, which `ord` keeps as the creation order.
pub const IMPORT: Import = Import {
    file: "sessions.db",
    copy: &[
        copy_table!(
            "main.sessions",
            "sessions",
            "id, spec, state, repo, idempotency_key, request_hash, created_at, started_at, \
             ended_at, reason, spend_tokens, spend_usd_cents, spend_wall_s, sandbox_id, \
             process_id, snapshot_id, review_snapshot_id, waiting, output_offset, agent_seq, \
             delivered_seq, cancel_requested, last_seq, host_id, epoch, replay_through",
            "ORDER BY rowid"
        ),
        copy_table!(
            "main.session_events",
            "events",
            "session_id, seq, at, actor, type, data, prev_hash, hash, epoch"
        ),
        copy_table!("main.session_blobs", "blobs", "session_id, ref, data"),
        copy_table!(
            "main.session_approvals",
            "approvals",
            "id, session_id, action, details, state, decision, note, created_at, decided_at"
        ),
        copy_table!(
            "main.session_deliveries",
            "session_deliveries",
            "session_id, key"
        ),
    ],
};

const BY_ID: &str = "SELECT * FROM sessions WHERE id = $1";

const UNFINISHED: &str = "state NOT IN ('completed','failed','cancelled')";

/// The session store of one host on the deployment's database.
#[derive(Clone)]
pub struct DbSessionStore {
    db: Db,
    host: Arc<str>,
}

/// The store on a SQLite file of its own, for tests of crates that do not
/// open the deployment's [`Db`] yet.
pub struct SqliteStore;

impl SqliteStore {
    /// Opens (creating and migrating) the file as the single-host default
    /// host. Blocks the calling thread; any runtime, or none.
    pub fn open(path: &Path) -> Result<DbSessionStore, StoreError> {
        let path = path.to_path_buf();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| StoreError::Config(e.to_string()))?;
            rt.block_on(async { DbSessionStore::open(Db::sqlite(&path).await?, LOCAL_HOST).await })
        })
        .join()
        .map_err(|_| StoreError::Config("opening the session store panicked".into()))?
    }
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

fn data_err(e: impl std::fmt::Display) -> StoreError {
    StoreError::Data(e.to_string())
}

fn event_row(r: &Row) -> Result<Event, StoreError> {
    let data: String = r.get("data")?;
    let actor: String = r.get("actor")?;
    Ok(Event {
        seq: r.get("seq")?,
        at: r.get("at")?,
        actor: Actor::parse(&actor).unwrap_or(Actor::System),
        kind: serde_json::from_str(&data).map_err(data_err)?,
    })
}

fn sessions(rows: Vec<Row>) -> Result<Vec<Session>, StoreError> {
    Ok(rows
        .iter()
        .map(Session::from_row)
        .collect::<Result<_, _>>()?)
}

async fn get_session(tx: &mut Tx, id: &str) -> Result<Session, StoreError> {
    let r = tx
        .query_opt(BY_ID, args![id])
        .await?
        .ok_or_else(|| StoreError::NotFound(id.to_string()))?;
    Ok(Session::from_row(&r)?)
}

/// The fence: locks the session row and checks that `host` owns it;
/// returns the epoch this write's events record.
async fn fence(tx: &mut Tx, id: &str, host: &str) -> Result<u64, StoreError> {
    let r = tx
        .query_opt(
            "SELECT host_id, epoch FROM sessions WHERE id = $1 FOR UPDATE",
            args![id],
        )
        .await?
        .ok_or_else(|| StoreError::NotFound(id.to_string()))?;
    let owner: String = r.get("host_id")?;
    let epoch: u64 = r.get("epoch")?;
    if owner != host {
        return Err(StoreError::Fenced {
            id: id.to_string(),
            owner,
            epoch,
        });
    }
    Ok(epoch)
}

/// Records a pending approval, once per id (a patch or a request).
async fn open_approval(
    tx: &mut Tx,
    id: &str,
    aid: &str,
    action: &str,
    details: &str,
) -> Result<(), StoreError> {
    tx.execute(
        "INSERT INTO session_approvals (id, session_id, action, details, state, created_at) \
         VALUES ($1, $2, $3, $4, 'pending', $5) ON CONFLICT (id) DO NOTHING",
        args![aid, id, action, details, now()],
    )
    .await?;
    Ok(())
}

async fn apply_patch(tx: &mut Tx, id: &str, p: &Patch) -> Result<(), StoreError> {
    for (col, v) in [
        ("sandbox_id", &p.sandbox_id),
        ("process_id", &p.process_id),
        ("snapshot_id", &p.snapshot_id),
        ("review_snapshot_id", &p.review_snapshot_id),
        ("waiting", &p.waiting),
    ] {
        if let Some(v) = v {
            let sql = format!("UPDATE sessions SET {col} = $2 WHERE id = $1");
            tx.execute(&sql, args![id, v.as_deref()]).await?;
        }
    }
    if let Some(d) = p.delivered_seq {
        tx.execute(
            "UPDATE sessions SET delivered_seq = CASE WHEN delivered_seq > $2 \
             THEN delivered_seq ELSE $2 END WHERE id = $1",
            args![id, d],
        )
        .await?;
    }
    if p.add_tokens > 0 || p.add_usd_cents > 0 || p.add_wall_s > 0 {
        tx.execute(
            "UPDATE sessions SET spend_tokens = spend_tokens + $2, spend_usd_cents = spend_usd_cents + $3, \
             spend_wall_s = spend_wall_s + $4 WHERE id = $1",
            args![id, p.add_tokens, p.add_usd_cents, p.add_wall_s],
        )
        .await?;
    }
    if let Some((aid, action, details)) = &p.new_approval {
        open_approval(tx, id, aid, action, details).await?;
    }
    if let Some(v) = p.policy_version {
        // Only this field of the spec ever changes; the row is locked.
        let mut s = get_session(tx, id).await?.spec;
        s.policy_version = v;
        let spec = serde_json::to_string(&s).map_err(data_err)?;
        tx.execute(
            "UPDATE sessions SET spec = $2 WHERE id = $1",
            args![id, spec],
        )
        .await?;
    }
    if let Some(c) = p.cancel_requested {
        tx.execute(
            "UPDATE sessions SET cancel_requested = $2 WHERE id = $1",
            args![id, c],
        )
        .await?;
    }
    if let Some(r) = p.rewind {
        // Not the greater of: a rewind is the one change that moves these
        // back.
        tx.execute(
            "UPDATE sessions SET output_offset = $2, delivered_seq = $3, \
             replay_through = CASE WHEN replay_through > agent_seq \
             THEN replay_through ELSE agent_seq END WHERE id = $1",
            args![id, r.output_offset, r.delivered_seq],
        )
        .await?;
    }
    Ok(())
}

/// Appends inside an open transaction that holds the session row's lock:
/// seqs come from `last_seq + 1`; large fields are cut and kept as blobs;
/// each event is sealed onto the chain and records `epoch`.
async fn append_tx(
    tx: &mut Tx,
    id: &str,
    epoch: u64,
    events: Vec<NewEvent>,
) -> Result<Vec<Event>, StoreError> {
    let mut out = Vec::with_capacity(events.len());
    let mut prev: Option<String> = None;
    for (actor, mut kind) in events {
        let seq: u64 = tx
            .query_opt(
                "UPDATE sessions SET last_seq = last_seq + 1 WHERE id = $1 RETURNING last_seq",
                args![id],
            )
            .await?
            .ok_or_else(|| StoreError::NotFound(id.to_string()))?
            .get("last_seq")?;
        if prev.is_none() && seq > 1 {
            prev = tx
                .query_opt(
                    "SELECT hash FROM session_events WHERE session_id = $1 AND seq = $2",
                    args![id, seq - 1],
                )
                .await?
                .map(|r| r.get::<String>("hash"))
                .transpose()?;
        }
        for (n, (text, slot, truncated)) in kind.large_fields().into_iter().enumerate() {
            if text.len() <= INLINE_TEXT_BYTES {
                continue;
            }
            if let Some(slot) = slot {
                let blob_ref = format!("b{seq}.{n}");
                let whole = cut(text, MAX_BLOB_BYTES).as_bytes();
                tx.execute(
                    "INSERT INTO session_blobs (session_id, ref, data) VALUES ($1, $2, $3)",
                    args![id, &blob_ref, whole],
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
        let data = serde_json::to_string(&kind).map_err(data_err)?;
        let (prev_hash, hash) = seal_after(
            prev.as_deref(),
            id,
            seq,
            &at,
            actor.as_str(),
            kind.type_name(),
            &data,
        )
        .map_err(data_err)?;
        tx.execute(
            "INSERT INTO session_events (session_id, seq, at, actor, type, data, prev_hash, hash, epoch) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            args![id, seq, &at, actor.as_str(), kind.type_name(), data, prev_hash, &hash, epoch],
        )
        .await?;
        prev = Some(hash);
        out.push(Event {
            seq,
            at,
            actor,
            kind,
        });
    }
    Ok(out)
}

/// The session that holds idempotency key `key`, with its request hash.
async fn find_key(tx: &mut Tx, key: Option<&str>) -> Result<Option<(String, String)>, StoreError> {
    let Some(k) = key else { return Ok(None) };
    let r = tx
        .query_opt(
            "SELECT id, request_hash FROM sessions WHERE idempotency_key = $1",
            args![k],
        )
        .await?;
    Ok(match r {
        Some(r) => Some((r.get("id")?, r.get("request_hash")?)),
        None => None,
    })
}

/// A create with a key seen before: the same request is a repeat, another
/// one a conflict.
async fn repeat(
    tx: &mut Tx,
    (sid, h): (String, String),
    request_hash: &str,
) -> Result<CreateOutcome, StoreError> {
    Ok(if h == request_hash {
        CreateOutcome::Existing(get_session(tx, &sid).await?)
    } else {
        CreateOutcome::KeyConflict(sid)
    })
}

impl DbSessionStore {
    /// The store on `db`, written as host `host_id` (fenced to its own
    /// sessions; [`LOCAL_HOST`] on a single host). Runs the migrations not
    /// yet run.
    pub async fn open(db: Db, host_id: &str) -> Result<Self, StoreError> {
        check_host_id(host_id)?;
        db.migrate(&SCHEMA).await?;
        Ok(DbSessionStore {
            db,
            host: host_id.into(),
        })
    }

    /// Copies a single-host data dir's old `sessions.db` in, once (see
    /// [`IMPORT`]); run after [`DbSessionStore::open`].
    pub async fn import_sqlite(&self, data_dir: &Path) -> Result<Imported, StoreError> {
        Ok(self.db.import_sqlite(data_dir, &IMPORT).await?)
    }

    /// The same database, written as another host (tests and sweepers).
    pub fn as_host(&self, host_id: &str) -> Result<Self, StoreError> {
        check_host_id(host_id)?;
        Ok(DbSessionStore {
            db: self.db.clone(),
            host: host_id.into(),
        })
    }

    /// The sessions schema's recorded version.
    pub async fn schema_version(&self) -> Result<u64, StoreError> {
        Ok(SCHEMA.check(&self.db).await?)
    }

    pub fn db(&self) -> &Db {
        &self.db
    }

    /// A write transaction on `id` after the fence check: the transaction
    /// and the epoch its events record.
    async fn write(&self, id: &str) -> Result<(Tx, u64), StoreError> {
        let mut tx = self.db.begin().await?;
        let epoch = fence(&mut tx, id, &self.host).await?;
        Ok((tx, epoch))
    }
}

#[async_trait]
impl SessionStore for DbSessionStore {
    async fn create(
        &self,
        id: &str,
        spec: &SessionSpec,
        idempotency_key: Option<&str>,
        request_hash: &str,
    ) -> Result<CreateOutcome, StoreError> {
        let mut tx = self.db.begin().await?;
        if let Some(found) = find_key(&mut tx, idempotency_key).await? {
            return repeat(&mut tx, found, request_hash).await;
        }
        let spec_json = serde_json::to_string(spec).map_err(data_err)?;
        // Two creates with one key at once (PostgreSQL): the second waits
        // for the first's commit, inserts nothing, and then answers as a
        // repeat.
        let inserted = tx
            .query_opt(
                "INSERT INTO sessions (id, spec, state, repo, idempotency_key, request_hash, created_at, host_id, epoch) \
                 VALUES ($1, $2, 'queued', $3, $4, $5, $6, $7, 1) \
                 ON CONFLICT (idempotency_key) DO NOTHING RETURNING id",
                args![id, spec_json, &spec.repo, idempotency_key, request_hash, now(), &*self.host],
            )
            .await?;
        if inserted.is_none() {
            let found = find_key(&mut tx, idempotency_key)
                .await?
                .ok_or_else(|| data_err("idempotency key conflicted but no row holds it"))?;
            return repeat(&mut tx, found, request_hash).await;
        }
        let ev = append_tx(
            &mut tx,
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
        let s = get_session(&mut tx, id).await?;
        tx.commit().await?;
        Ok(CreateOutcome::Created(
            s,
            ev.into_iter().next().expect("one event"),
        ))
    }

    async fn get(&self, id: &str) -> Result<Session, StoreError> {
        let r = self
            .db
            .query_opt(BY_ID, args![id])
            .await?
            .ok_or_else(|| StoreError::NotFound(id.to_string()))?;
        Ok(Session::from_row(&r)?)
    }

    async fn list(&self, f: &ListFilter) -> Result<Vec<Session>, StoreError> {
        let mut sql = "SELECT * FROM sessions WHERE 1 = 1".to_string();
        let mut args: Vec<hatchery_db::Value> = vec![];
        if let Some(s) = f.state {
            args.push(s.as_str().into());
            sql += &format!(" AND state = ${}", args.len());
        }
        if let Some(r) = &f.repo {
            args.push(r.into());
            sql += &format!(" AND repo = ${}", args.len());
        }
        if let Some(a) = &f.after_id {
            args.push(a.into());
            sql += &format!(
                " AND ord > COALESCE((SELECT ord FROM sessions WHERE id = ${}), 0)",
                args.len()
            );
        }
        sql += &format!(" ORDER BY ord LIMIT {}", f.limit.max(1));
        sessions(self.db.query(&sql, &args).await?)
    }

    async fn with_sandbox(&self, sandbox_id: &str) -> Result<Option<Session>, StoreError> {
        // The filter is the partial index `sessions_live_sandbox`'s
        // predicate, word for word, so the index answers it.
        let sql = format!(
            "SELECT * FROM sessions WHERE sandbox_id = $1 AND {UNFINISHED} \
             ORDER BY ord LIMIT 1"
        );
        Ok(sessions(self.db.query(&sql, args![sandbox_id]).await?)?
            .into_iter()
            .next())
    }

    async fn unfinished(&self) -> Result<Vec<Session>, StoreError> {
        let sql =
            format!("SELECT * FROM sessions WHERE host_id = $1 AND {UNFINISHED} ORDER BY ord");
        sessions(self.db.query(&sql, args![&*self.host]).await?)
    }

    async fn append(
        &self,
        id: &str,
        events: Vec<NewEvent>,
        patch: Patch,
    ) -> Result<Vec<Event>, StoreError> {
        let out = self
            .append_joined(id, None, events, patch, &mut hatchery_db::Alone)
            .await?;
        Ok(out.unwrap_or_default())
    }

    async fn append_once(
        &self,
        id: &str,
        key: &str,
        events: Vec<NewEvent>,
        patch: Patch,
    ) -> Result<Option<Vec<Event>>, StoreError> {
        self.append_joined(id, Some(key), events, patch, &mut hatchery_db::Alone)
            .await
    }

    async fn append_joined(
        &self,
        id: &str,
        key: Option<&str>,
        events: Vec<NewEvent>,
        patch: Patch,
        joined: &mut dyn Joined,
    ) -> Result<Option<Vec<Event>>, StoreError> {
        let (mut tx, epoch) = self.write(id).await?;
        if let Some(key) = key {
            let fresh = tx
                .execute(
                    "INSERT INTO session_deliveries (session_id, key) VALUES ($1, $2) \
                     ON CONFLICT DO NOTHING",
                    args![id, key],
                )
                .await?;
            if fresh == 0 {
                return Ok(None);
            }
        }
        let out = append_tx(&mut tx, id, epoch, events).await?;
        apply_patch(&mut tx, id, &patch).await?;
        let seqs: Vec<u64> = out.iter().map(|e| e.seq).collect();
        if !joined.write(&mut tx, &seqs).await? {
            tx.rollback().await?;
            return Ok(None);
        }
        tx.commit().await?;
        Ok(Some(out))
    }

    async fn append_agent(
        &self,
        id: &str,
        line_end: u64,
        n: Option<u64>,
        events: Vec<NewEvent>,
        patch: Patch,
    ) -> Result<Option<Vec<Event>>, StoreError> {
        let (mut tx, epoch) = self.write(id).await?;
        let done: u64 = tx
            .query_opt(
                "SELECT output_offset FROM sessions WHERE id = $1",
                args![id],
            )
            .await?
            .ok_or_else(|| StoreError::NotFound(id.to_string()))?
            .get("output_offset")?;
        if line_end <= done {
            return Ok(None);
        }
        let out = append_tx(&mut tx, id, epoch, events).await?;
        apply_patch(&mut tx, id, &patch).await?;
        tx.execute(
            "UPDATE sessions SET output_offset = $2, \
             agent_seq = CASE WHEN agent_seq > $3 THEN agent_seq ELSE $3 END WHERE id = $1",
            args![id, line_end, n.unwrap_or(0)],
        )
        .await?;
        tx.commit().await?;
        Ok(Some(out))
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
        let (mut tx, epoch) = self.write(id).await?;
        let cur = get_session(&mut tx, id).await?;
        let conflict = || StoreError::StateConflict {
            id: id.to_string(),
            current: cur.state,
        };
        if !from.contains(&cur.state) || !cur.state.valid_transition(to) {
            return Err(conflict());
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
        let out = append_tx(&mut tx, id, epoch, evs).await?;
        apply_patch(&mut tx, id, &patch).await?;
        // Guarded: the UPDATE names the state it moves from and the owner
        // (both hold under the row lock; belt and braces).
        let n = tx
            .execute(
                "UPDATE sessions SET state = $2 WHERE id = $1 AND state = $3 AND host_id = $4",
                args![id, to.as_str(), cur.state.as_str(), &*self.host],
            )
            .await?;
        if n != 1 {
            return Err(conflict());
        }
        if to == SessionState::Running {
            tx.execute(
                "UPDATE sessions SET started_at = COALESCE(started_at, $2) WHERE id = $1",
                args![id, now()],
            )
            .await?;
        }
        if to.is_terminal() {
            tx.execute(
                "UPDATE sessions SET ended_at = $2, reason = $3, waiting = NULL WHERE id = $1",
                args![id, now(), reason],
            )
            .await?;
            tx.execute(
                "UPDATE session_approvals SET state = 'expired' \
                 WHERE session_id = $1 AND state = 'pending'",
                args![id],
            )
            .await?;
        }
        let s = get_session(&mut tx, id).await?;
        tx.commit().await?;
        Ok((s, out))
    }

    async fn events(&self, id: &str, after: u64, limit: usize) -> Result<Vec<Event>, StoreError> {
        self.db
            .query(
                "SELECT seq, at, actor, data FROM session_events WHERE session_id = $1 AND seq > $2 \
                 ORDER BY seq LIMIT $3",
                args![id, after, limit],
            )
            .await?
            .iter()
            .map(event_row)
            .collect()
    }

    async fn chain_heads(&self) -> Result<Vec<hatchery_audit::Head>, StoreError> {
        self.db
            .query(
                "SELECT e.session_id, e.seq, e.hash \
                 FROM session_events e JOIN sessions s ON s.id = e.session_id \
                 WHERE s.host_id = $1 \
                 AND e.seq = (SELECT MAX(seq) FROM session_events WHERE session_id = e.session_id) \
                 ORDER BY e.session_id",
                args![&*self.host],
            )
            .await?
            .iter()
            .map(|r| {
                Ok(hatchery_audit::Head {
                    chain: r.get("session_id")?,
                    seq: r.get("seq")?,
                    hash: r.get("hash")?,
                })
            })
            .collect()
    }

    async fn deliverables_after(&self, id: &str, after: u64) -> Result<Vec<Event>, StoreError> {
        self.db
            .query(
                "SELECT seq, at, actor, data FROM session_events WHERE session_id = $1 AND seq > $2 \
                 AND type IN ('message', 'approval_decided') ORDER BY seq",
                args![id, after],
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
        let (mut tx, epoch) = self.write(id).await?;
        let cur = get_session(&mut tx, id).await?;
        if !states.contains(&cur.state) {
            return Err(StoreError::StateConflict {
                id: id.to_string(),
                current: cur.state,
            });
        }
        let out = append_tx(&mut tx, id, epoch, events).await?;
        apply_patch(&mut tx, id, &patch).await?;
        tx.commit().await?;
        Ok(out)
    }

    async fn blob(&self, id: &str, blob_ref: &str) -> Result<Option<Vec<u8>>, StoreError> {
        match self
            .db
            .query_opt(
                "SELECT data FROM session_blobs WHERE session_id = $1 AND ref = $2",
                args![id, blob_ref],
            )
            .await?
        {
            Some(r) => Ok(Some(r.get("data")?)),
            None => Ok(None),
        }
    }

    async fn usage(&self, id: &str) -> Result<StorageUsage, StoreError> {
        let mut tx = self.db.read().await?;
        if tx
            .query_opt("SELECT 1 FROM sessions WHERE id = $1", args![id])
            .await?
            .is_none()
        {
            return Err(StoreError::NotFound(id.to_string()));
        }
        let r = tx
            .query_one(
                "SELECT CAST(COUNT(*) AS BIGINT), \
                 CAST(COALESCE(SUM(octet_length(data)), 0) AS BIGINT), \
                 CAST(COALESCE(SUM(CASE WHEN actor = 'agent' THEN octet_length(data) ELSE 0 END), 0) AS BIGINT) \
                 FROM session_events WHERE session_id = $1",
                args![id],
            )
            .await?;
        let ev = (r.get(0)?, r.get(1)?, r.get(2)?);
        let r = tx
            .query_one(
                "SELECT CAST(COUNT(*) AS BIGINT), CAST(COALESCE(SUM(octet_length(data)), 0) AS BIGINT) \
                 FROM session_blobs WHERE session_id = $1",
                args![id],
            )
            .await?;
        let bl = (r.get(0)?, r.get(1)?);
        let ap = tx
            .query_one(
                "SELECT CAST(COUNT(*) AS BIGINT) FROM session_approvals \
                 WHERE session_id = $1 AND state = 'pending'",
                args![id],
            )
            .await?
            .get(0)?;
        let markers = tx
            .query(
                "SELECT data FROM session_events WHERE session_id = $1 AND type = 'output_capped'",
                args![id],
            )
            .await?
            .iter()
            .map(|r| r.get::<String>(0))
            .collect::<Result<Vec<_>, _>>()?;
        tx.commit().await?;
        Ok(StorageUsage::from_parts(ev, bl, ap, markers))
    }

    async fn request_approval(
        &self,
        id: &str,
        approval_id: &str,
        action: &str,
        details: &str,
    ) -> Result<Vec<Event>, StoreError> {
        let (mut tx, epoch) = self.write(id).await?;
        open_approval(&mut tx, id, approval_id, action, details).await?;
        let out = append_tx(
            &mut tx,
            id,
            epoch,
            vec![(
                Actor::Agent,
                EventKind::ApprovalRequested {
                    approval_id: approval_id.to_string(),
                    action: action.to_string(),
                    details: details.to_string(),
                },
            )],
        )
        .await?;
        tx.commit().await?;
        Ok(out)
    }

    async fn pending_approval(&self, id: &str) -> Result<Option<Approval>, StoreError> {
        let r = self
            .db
            .query_opt(
                "SELECT id, action, details, state, created_at FROM session_approvals \
                 WHERE session_id = $1 AND state = 'pending' ORDER BY created_at, id LIMIT 1",
                args![id],
            )
            .await?;
        let Some(r) = r else { return Ok(None) };
        Ok(Some(Approval {
            approval_id: r.get("id")?,
            action: r.get("action")?,
            details: r.get("details")?,
            state: r.get("state")?,
            created_at: r.get("created_at")?,
        }))
    }

    async fn decide_approval(
        &self,
        id: &str,
        approval_id: &str,
        decision: &str,
        note: &str,
    ) -> Result<Vec<Event>, StoreError> {
        let (mut tx, epoch) = self.write(id).await?;
        let n = tx
            .execute(
                "UPDATE session_approvals SET state = 'decided', decision = $3, note = $4, decided_at = $5 \
                 WHERE id = $1 AND session_id = $2 AND state = 'pending'",
                args![approval_id, id, decision, note, now()],
            )
            .await?;
        if n == 0 {
            return Err(StoreError::ApprovalNotFound(approval_id.to_string()));
        }
        let out = append_tx(
            &mut tx,
            id,
            epoch,
            vec![(
                Actor::User,
                EventKind::ApprovalDecided {
                    approval_id: approval_id.to_string(),
                    decision: decision.to_string(),
                    note: note.to_string(),
                },
            )],
        )
        .await?;
        tx.commit().await?;
        Ok(out)
    }

    async fn take_over(
        &self,
        from_host: &str,
        to_host: &str,
        reason: &str,
    ) -> Result<Vec<(String, u64)>, StoreError> {
        check_host_id(to_host)?;
        let mut tx = self.db.begin().await?;
        // Locks in id order (no deadlock between two sweepers); on
        // PostgreSQL a row that another sweeper moved meanwhile is
        // re-checked after its lock is released and drops out (READ
        // COMMITTED re-evaluates the WHERE).
        let sql = format!(
            "SELECT id FROM sessions WHERE host_id = $1 AND {UNFINISHED} ORDER BY id FOR UPDATE"
        );
        let ids = tx
            .query(&sql, args![from_host])
            .await?
            .iter()
            .map(|r| r.get::<String>("id"))
            .collect::<Result<Vec<_>, _>>()?;
        let mut moved = Vec::with_capacity(ids.len());
        for id in ids {
            let Some(r) = tx
                .query_opt(
                    "UPDATE sessions SET host_id = $2, epoch = epoch + 1 \
                     WHERE id = $1 AND host_id = $3 RETURNING epoch",
                    args![&id, to_host, from_host],
                )
                .await?
            else {
                continue;
            };
            let epoch: u64 = r.get("epoch")?;
            append_tx(
                &mut tx,
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
        tx.commit().await?;
        Ok(moved)
    }

    fn host_id(&self) -> &str {
        &self.host
    }
}
