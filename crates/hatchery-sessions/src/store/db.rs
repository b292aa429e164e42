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
use hatchery_db::{args, bind, copy_table, Db, Import, Imported, Joined, Record, Row, Tx, Value};
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

/// A session's counts for `usage` (no row for an unknown session).
const USAGE: &str = "SELECT e.*, b.*, a.* FROM sessions s, \
     (SELECT CAST(COUNT(*) AS BIGINT) AS events, \
      CAST(COALESCE(SUM(octet_length(data)), 0) AS BIGINT) AS event_bytes, \
      CAST(COALESCE(SUM(CASE WHEN actor = 'agent' THEN octet_length(data) ELSE 0 END), 0) \
      AS BIGINT) AS agent_event_bytes FROM session_events WHERE session_id = $1) e, \
     (SELECT CAST(COUNT(*) AS BIGINT) AS blobs, \
      CAST(COALESCE(SUM(octet_length(data)), 0) AS BIGINT) AS blob_bytes \
      FROM session_blobs WHERE session_id = $1) b, \
     (SELECT CAST(COUNT(*) AS BIGINT) AS open_approvals FROM session_approvals \
      WHERE session_id = $1 AND state = 'pending') a \
     WHERE s.id = $1";

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
    let ms = t.replace_nanosecond(t.millisecond() as u32 * 1_000_000);
    ms.unwrap_or(t).format(&f).unwrap_or_default()
}

fn data_err(e: impl std::fmt::Display) -> StoreError {
    StoreError::Data(e.to_string())
}

fn events(rows: Vec<Row>) -> Result<Vec<Event>, StoreError> {
    let event = |r: &Row| {
        let (data, actor): (String, String) = (r.get("data")?, r.get("actor")?);
        Ok(Event {
            seq: r.get("seq")?,
            at: r.get("at")?,
            actor: Actor::parse(&actor).unwrap_or(Actor::System),
            kind: serde_json::from_str(&data).map_err(data_err)?,
        })
    };
    rows.iter().map(event).collect()
}

fn sessions(rows: Vec<Row>) -> Result<Vec<Session>, StoreError> {
    rows.iter().map(|r| Ok(Session::from_row(r)?)).collect()
}

fn found(id: &str, r: Option<Row>) -> Result<Row, StoreError> {
    r.ok_or_else(|| StoreError::NotFound(id.to_string()))
}

async fn get_session(tx: &mut Tx, id: &str) -> Result<Session, StoreError> {
    let r = found(id, tx.query_opt(BY_ID, args![id]).await?)?;
    Ok(Session::from_row(&r)?)
}

fn conflict(id: &str, current: SessionState) -> StoreError {
    let id = id.to_string();
    StoreError::StateConflict { id, current }
}

/// The (locked) session, which must be in one of `states`.
async fn in_state(tx: &mut Tx, id: &str, states: &[SessionState]) -> Result<Session, StoreError> {
    let s = get_session(tx, id).await?;
    match states.contains(&s.state) {
        true => Ok(s),
        false => Err(conflict(id, s.state)),
    }
}

/// The fence: locks the session row and checks that `host` owns it;
/// returns the epoch this write's events record.
async fn fence(tx: &mut Tx, id: &str, host: &str) -> Result<u64, StoreError> {
    let sql = "SELECT host_id, epoch FROM sessions WHERE id = $1 FOR UPDATE";
    let r = found(id, tx.query_opt(sql, args![id]).await?)?;
    let (owner, epoch): (String, u64) = (r.get("host_id")?, r.get("epoch")?);
    if owner != host {
        let id = id.to_string();
        return Err(StoreError::Fenced { id, owner, epoch });
    }
    Ok(epoch)
}

/// Applies a patch to the locked row: its plain fields in one UPDATE,
/// then what reads the row or another table.
async fn apply_patch(tx: &mut Tx, id: &str, p: &Patch) -> Result<(), StoreError> {
    let text = |v: &Option<Option<String>>| v.clone().map(Value::from);
    let add = |n: u64| (n > 0).then(|| Value::from(n));
    // `$v` is the value's parameter.
    let fields = [
        ("sandbox_id = $v", text(&p.sandbox_id)),
        ("process_id = $v", text(&p.process_id)),
        ("snapshot_id = $v", text(&p.snapshot_id)),
        ("review_snapshot_id = $v", text(&p.review_snapshot_id)),
        ("waiting = $v", text(&p.waiting)),
        (
            "delivered_seq = CASE WHEN delivered_seq > $v THEN delivered_seq ELSE $v END",
            p.delivered_seq.map(Value::from),
        ),
        ("spend_tokens = spend_tokens + $v", add(p.add_tokens)),
        (
            "spend_usd_cents = spend_usd_cents + $v",
            add(p.add_usd_cents),
        ),
        ("spend_wall_s = spend_wall_s + $v", add(p.add_wall_s)),
        ("cancel_requested = $v", p.cancel_requested.map(Value::from)),
    ];
    let mut args = vec![Value::from(id)];
    let sets = bind(&mut args, fields);
    if !sets.is_empty() {
        let sql = format!("UPDATE sessions SET {} WHERE id = $1", sets.join(", "));
        tx.execute(&sql, &args).await?;
    }
    if let Some(l) = &p.agent_line {
        // A number is handled once, so this replaces a record only for a
        // diverged re-run let go on (crate::replay).
        let sql = "INSERT INTO session_agent_lines (session_id, n, kind, asked) \
                   VALUES ($1, $2, $3, $4) ON CONFLICT (session_id, n) \
                   DO UPDATE SET kind = excluded.kind, asked = excluded.asked";
        tx.execute(sql, args![id, l.n, &l.kind, &l.asked]).await?;
    }
    if let Some((aid, action, details)) = &p.new_approval {
        // Once per id.
        let sql = "INSERT INTO session_approvals (id, session_id, action, details, state, \
                   created_at) VALUES ($1, $2, $3, $4, 'pending', $5) ON CONFLICT (id) DO NOTHING";
        let args = args![aid, id, action, details, now()];
        tx.execute(sql, args).await?;
    }
    if let Some(v) = p.policy_version {
        // Only this field of the spec ever changes; the row is locked.
        let mut s = get_session(tx, id).await?.spec;
        s.policy_version = v;
        let spec = serde_json::to_string(&s).map_err(data_err)?;
        let sql = "UPDATE sessions SET spec = $2 WHERE id = $1";
        tx.execute(sql, args![id, spec]).await?;
    }
    if let Some(r) = p.rewind {
        // Not the greater of: a rewind is the one change that moves these
        // back.
        let sql = "UPDATE sessions SET output_offset = $2, delivered_seq = $3, \
                   replay_through = CASE WHEN replay_through > agent_seq \
                   THEN replay_through ELSE agent_seq END WHERE id = $1";
        let args = args![id, r.output_offset, r.delivered_seq];
        tx.execute(sql, args).await?;
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
        let sql = "UPDATE sessions SET last_seq = last_seq + 1 WHERE id = $1 RETURNING last_seq";
        let seq: u64 = found(id, tx.query_opt(sql, args![id]).await?)?.get("last_seq")?;
        if prev.is_none() && seq > 1 {
            let sql = "SELECT hash FROM session_events WHERE session_id = $1 AND seq = $2";
            let r = tx.query_opt(sql, args![id, seq - 1]).await?;
            prev = r.map(|r| r.get("hash")).transpose()?;
        }
        for (n, (text, slot, truncated)) in kind.large_fields().into_iter().enumerate() {
            if text.len() <= INLINE_TEXT_BYTES {
                continue;
            }
            if let Some(slot) = slot {
                let blob_ref = format!("b{seq}.{n}");
                let whole = cut(text, MAX_BLOB_BYTES).as_bytes();
                let sql = "INSERT INTO session_blobs (session_id, ref, data) VALUES ($1, $2, $3)";
                tx.execute(sql, args![id, &blob_ref, whole]).await?;
                *slot = Some(blob_ref);
            }
            if let Some(t) = truncated {
                *t = true;
            }
            *text = cut(text, INLINE_TEXT_BYTES).to_string();
        }
        let at = now();
        let data = serde_json::to_string(&kind).map_err(data_err)?;
        let (who, what) = (actor.as_str(), kind.type_name());
        let (prev_hash, hash) =
            seal_after(prev.as_deref(), id, seq, &at, who, what, &data).map_err(data_err)?;
        let sql = "INSERT INTO session_events (session_id, seq, at, actor, type, data, prev_hash, \
                   hash, epoch) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)";
        let args = args![id, seq, &at, who, what, data, prev_hash, &hash, epoch];
        tx.execute(sql, args).await?;
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

/// A create with idempotency key `key` seen before: the same request is a
/// repeat, another one a conflict (`None`: no key, or a new one).
async fn repeat(
    tx: &mut Tx,
    key: Option<&str>,
    request_hash: &str,
) -> Result<Option<CreateOutcome>, StoreError> {
    let Some(k) = key else { return Ok(None) };
    let sql = "SELECT id, request_hash FROM sessions WHERE idempotency_key = $1";
    let Some(r) = tx.query_opt(sql, args![k]).await? else {
        return Ok(None);
    };
    let (sid, h): (String, String) = (r.get("id")?, r.get("request_hash")?);
    Ok(Some(if h == request_hash {
        CreateOutcome::Existing(get_session(tx, &sid).await?)
    } else {
        CreateOutcome::KeyConflict(sid)
    }))
}

impl DbSessionStore {
    /// The store on `db`, written as host `host_id` (fenced to its own
    /// sessions; [`LOCAL_HOST`] on a single host). Runs the migrations not
    /// yet run.
    pub async fn open(db: Db, host_id: &str) -> Result<Self, StoreError> {
        check_host_id(host_id)?;
        db.migrate(&SCHEMA).await?;
        let host = host_id.into();
        Ok(DbSessionStore { db, host })
    }

    /// Copies a single-host data dir's old `sessions.db` in, once (see
    /// [`IMPORT`]); run after [`DbSessionStore::open`].
    pub async fn import_sqlite(&self, data_dir: &Path) -> Result<Imported, StoreError> {
        Ok(self.db.import_sqlite(data_dir, &IMPORT).await?)
    }

    /// The same database, written as another host (tests and sweepers).
    pub fn as_host(&self, host_id: &str) -> Result<Self, StoreError> {
        check_host_id(host_id)?;
        let (db, host) = (self.db.clone(), host_id.into());
        Ok(DbSessionStore { db, host })
    }

    pub async fn schema_version(&self) -> Result<u64, StoreError> {
        Ok(SCHEMA.check(&self.db).await?)
    }

    /// The unfinished sessions whose `column` is `value`, oldest first.
    async fn unfinished_by(&self, column: &str, value: &str) -> Result<Vec<Session>, StoreError> {
        let sql =
            format!("SELECT * FROM sessions WHERE {column} = $1 AND {UNFINISHED} ORDER BY ord");
        sessions(self.db.query(&sql, args![value]).await?)
    }

    /// What `tenant` holds, in its limits' order (tokens, cents, sessions,
    /// wall seconds): an unfinished session its budget (or its spend, should
    /// that be more), a finished one what it spent; sessions count while
    /// unfinished.
    async fn tenant_held(tx: &mut Tx, tenant: &str) -> Result<[u64; 4], StoreError> {
        let held = |budget: &str, spend: &str| {
            format!(
                "CAST(COALESCE(SUM(CASE WHEN {UNFINISHED} AND {budget} > {spend} THEN {budget} \
             ELSE {spend} END), 0) AS BIGINT)"
            )
        };
        let sql = format!(
        "SELECT {}, {}, CAST(COALESCE(SUM(CASE WHEN {UNFINISHED} THEN 1 ELSE 0 END), 0) AS BIGINT), \
         {} FROM sessions WHERE tenant = $1",
        held("budget_tokens", "spend_tokens"),
        held("budget_usd_cents", "spend_usd_cents"),
        held("budget_wall_s", "spend_wall_s"),
    );
        let r = tx.query_one(&sql, args![tenant]).await?;
        Ok([r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?])
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
    async fn create_within(
        &self,
        id: &str,
        spec: &SessionSpec,
        idempotency_key: Option<&str>,
        request_hash: &str,
        limits: Option<&TenantLimits>,
    ) -> Result<CreateOutcome, StoreError> {
        let mut tx = self.db.begin().await?;
        if let (Some(t), Some(_)) = (&spec.tenant, limits) {
            // One tenant's creates take turns (PostgreSQL; SQLite's
            // write transaction already serialises them), so two cannot
            // both fit in the same room.
            tx.lock(&format!("session_tenant:{t}")).await?;
        }
        if let Some(seen) = repeat(&mut tx, idempotency_key, request_hash).await? {
            return Ok(seen);
        }
        if let (Some(t), Some(l)) = (&spec.tenant, limits) {
            let held = Self::tenant_held(&mut tx, t).await?;
            let asked = [
                spec.budget_tokens,
                spec.budget_usd_cents,
                1,
                spec.budget_wall_s,
            ];
            if let Some(no) = l.refuse(held, asked) {
                return Ok(CreateOutcome::NoRoom(no));
            }
        }
        let spec_json = serde_json::to_string(spec).map_err(data_err)?;
        // Two creates with one key at once (PostgreSQL): the second waits
        // for the first's commit, inserts nothing, and then answers as a
        // repeat.
        let sql = "INSERT INTO sessions (id, spec, state, repo, idempotency_key, request_hash, \
                   created_at, host_id, epoch, tenant, budget_tokens, budget_usd_cents, \
                   budget_wall_s) \
                   VALUES ($1, $2, 'queued', $3, $4, $5, $6, $7, 1, $8, $9, $10, $11) \
                   ON CONFLICT (idempotency_key) DO NOTHING RETURNING id";
        let (key, hash, host) = (idempotency_key, request_hash, &*self.host);
        let tenant = spec.tenant.as_deref();
        let args = args![
            id,
            spec_json,
            &spec.repo,
            key,
            hash,
            now(),
            host,
            tenant,
            spec.budget_tokens,
            spec.budget_usd_cents,
            spec.budget_wall_s
        ];
        if tx.query_opt(sql, args).await?.is_none() {
            let seen = repeat(&mut tx, idempotency_key, request_hash).await?;
            return seen.ok_or_else(|| data_err("idempotency key conflicted but no row holds it"));
        }
        let created = EventKind::SessionCreated {
            repo: spec.repo.clone(),
            git_ref: spec.git_ref.clone(),
            task: spec.task.clone(),
            policy_id: spec.policy_id.clone(),
            policy_version: spec.policy_version,
            template: spec.template.clone(),
        };
        let mut ev = append_tx(&mut tx, id, 1, vec![(Actor::User, created)]).await?;
        let s = get_session(&mut tx, id).await?;
        tx.commit().await?;
        Ok(CreateOutcome::Created(s, ev.remove(0)))
    }

    async fn get(&self, id: &str) -> Result<Session, StoreError> {
        let r = found(id, self.db.query_opt(BY_ID, args![id]).await?)?;
        Ok(Session::from_row(&r)?)
    }

    async fn list(&self, f: &ListFilter) -> Result<Vec<Session>, StoreError> {
        let text = |v: &Option<String>| v.clone().map(Value::from);
        let filters = [
            ("AND state = $v", f.state.map(|s| Value::from(s.as_str()))),
            ("AND repo = $v", text(&f.repo)),
            ("AND tenant = $v", text(&f.tenant)),
            (
                "AND ord > COALESCE((SELECT ord FROM sessions WHERE id = $v), 0)",
                text(&f.after_id),
            ),
        ];
        let mut args = vec![];
        let filters = bind(&mut args, filters).join(" ");
        let limit = f.limit.max(1);
        let sql =
            format!("SELECT * FROM sessions WHERE 1 = 1 {filters} ORDER BY ord LIMIT {limit}");
        sessions(self.db.query(&sql, &args).await?)
    }

    async fn with_sandbox(&self, sandbox_id: &str) -> Result<Option<Session>, StoreError> {
        // The filter is the partial index `sessions_live_sandbox`'s
        // predicate, word for word, so the index answers it.
        let live = self.unfinished_by("sandbox_id", sandbox_id).await?;
        Ok(live.into_iter().next())
    }

    async fn unfinished(&self) -> Result<Vec<Session>, StoreError> {
        self.unfinished_by("host_id", &self.host).await
    }

    async fn unfinished_of_tenant(&self, tenant: &str) -> Result<u64, StoreError> {
        let sql = format!(
            "SELECT CAST(COUNT(*) AS BIGINT) FROM sessions WHERE tenant = $1 AND {UNFINISHED}"
        );
        let rows = self.db.query(&sql, args![tenant]).await?;
        match rows.first() {
            Some(r) => Ok(r.get(0)?),
            None => Ok(0),
        }
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
            let sql = "INSERT INTO session_deliveries (session_id, key) VALUES ($1, $2) \
                       ON CONFLICT DO NOTHING";
            if tx.execute(sql, args![id, key]).await? == 0 {
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
        let sql = "SELECT output_offset FROM sessions WHERE id = $1";
        let done: u64 = found(id, tx.query_opt(sql, args![id]).await?)?.get("output_offset")?;
        if line_end <= done {
            return Ok(None);
        }
        let out = append_tx(&mut tx, id, epoch, events).await?;
        apply_patch(&mut tx, id, &patch).await?;
        let sql = "UPDATE sessions SET output_offset = $2, \
                   agent_seq = CASE WHEN agent_seq > $3 THEN agent_seq ELSE $3 END WHERE id = $1";
        tx.execute(sql, args![id, line_end, n.unwrap_or(0)]).await?;
        tx.commit().await?;
        Ok(Some(out))
    }

    async fn transition(
        &self,
        id: &str,
        from: &[SessionState],
        to: SessionState,
        reason: Option<String>,
        mut extra: Vec<NewEvent>,
        patch: Patch,
    ) -> Result<(Session, Vec<Event>), StoreError> {
        let (mut tx, epoch) = self.write(id).await?;
        let cur = in_state(&mut tx, id, from).await?.state;
        if !cur.valid_transition(to) {
            return Err(conflict(id, cur));
        }
        let changed = EventKind::StateChanged {
            from: cur,
            to,
            reason: reason.clone(),
        };
        extra.push((Actor::System, changed));
        let out = append_tx(&mut tx, id, epoch, extra).await?;
        apply_patch(&mut tx, id, &patch).await?;
        // Guarded: the UPDATE names the state it moves from and the owner
        // (both hold under the row lock; belt and braces).
        let sql = "UPDATE sessions SET state = $2 WHERE id = $1 AND state = $3 AND host_id = $4";
        let args = args![id, to.as_str(), cur.as_str(), &*self.host];
        if tx.execute(sql, args).await? != 1 {
            return Err(conflict(id, cur));
        }
        if to == SessionState::Running {
            let sql = "UPDATE sessions SET started_at = COALESCE(started_at, $2) WHERE id = $1";
            tx.execute(sql, args![id, now()]).await?;
        }
        if to.is_terminal() {
            let sql = "UPDATE sessions SET ended_at = $2, reason = $3, waiting = NULL \
                       WHERE id = $1";
            tx.execute(sql, args![id, now(), reason]).await?;
            let sql = "UPDATE session_approvals SET state = 'expired' \
                       WHERE session_id = $1 AND state = 'pending'";
            tx.execute(sql, args![id]).await?;
        }
        let s = get_session(&mut tx, id).await?;
        tx.commit().await?;
        Ok((s, out))
    }

    async fn events(&self, id: &str, after: u64, limit: usize) -> Result<Vec<Event>, StoreError> {
        let sql = "SELECT seq, at, actor, data FROM session_events \
                   WHERE session_id = $1 AND seq > $2 ORDER BY seq LIMIT $3";
        events(self.db.query(sql, args![id, after, limit]).await?)
    }

    async fn chain_heads(&self) -> Result<Vec<hatchery_audit::Head>, StoreError> {
        let sql = "SELECT e.session_id, e.seq, e.hash \
                   FROM session_events e JOIN sessions s ON s.id = e.session_id \
                   WHERE s.host_id = $1 \
                   AND e.seq = (SELECT MAX(seq) FROM session_events WHERE session_id = e.session_id) \
                   ORDER BY e.session_id";
        let head = |r: &Row| -> Result<_, StoreError> {
            let (chain, seq, hash) = (r.get("session_id")?, r.get("seq")?, r.get("hash")?);
            Ok(hatchery_audit::Head { chain, seq, hash })
        };
        let rows = self.db.query(sql, args![&*self.host]).await?;
        rows.iter().map(head).collect()
    }

    async fn deliverables_after(&self, id: &str, after: u64) -> Result<Vec<Event>, StoreError> {
        let sql = "SELECT seq, at, actor, data FROM session_events WHERE session_id = $1 \
                   AND seq > $2 AND type IN ('message', 'approval_decided') ORDER BY seq";
        events(self.db.query(sql, args![id, after]).await?)
    }

    async fn append_if_state(
        &self,
        id: &str,
        states: &[SessionState],
        events: Vec<NewEvent>,
        patch: Patch,
    ) -> Result<Vec<Event>, StoreError> {
        let (mut tx, epoch) = self.write(id).await?;
        in_state(&mut tx, id, states).await?;
        let out = append_tx(&mut tx, id, epoch, events).await?;
        apply_patch(&mut tx, id, &patch).await?;
        tx.commit().await?;
        Ok(out)
    }

    async fn blob(&self, id: &str, blob_ref: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let sql = "SELECT data FROM session_blobs WHERE session_id = $1 AND ref = $2";
        let r = self.db.query_opt(sql, args![id, blob_ref]).await?;
        Ok(r.map(|r| r.get("data")).transpose()?)
    }

    async fn usage(&self, id: &str) -> Result<StorageUsage, StoreError> {
        let mut tx = self.db.read().await?;
        let r = found(id, tx.query_opt(USAGE, args![id]).await?)?;
        let sql =
            "SELECT data FROM session_events WHERE session_id = $1 AND type = 'output_capped'";
        let markers = tx.query(sql, args![id]).await?;
        tx.commit().await?;
        let mut capped = vec![];
        for m in markers {
            let d: serde_json::Value =
                serde_json::from_str(&m.get::<String>("data")?).unwrap_or_default();
            capped.extend(d.get("cap").and_then(|c| c.as_str()).map(str::to_string));
        }
        Ok(StorageUsage {
            events: r.get("events")?,
            event_bytes: r.get("event_bytes")?,
            blobs: r.get("blobs")?,
            blob_bytes: r.get("blob_bytes")?,
            agent_event_bytes: r.get("agent_event_bytes")?,
            open_approvals: r.get("open_approvals")?,
            capped,
        })
    }

    async fn agent_line(&self, id: &str, n: u64) -> Result<Option<AgentLine>, StoreError> {
        let sql = "SELECT kind, asked FROM session_agent_lines WHERE session_id = $1 AND n = $2";
        let Some(r) = self.db.query_opt(sql, args![id, n]).await? else {
            return Ok(None);
        };
        Ok(Some(AgentLine {
            n,
            kind: r.get("kind")?,
            asked: r.get("asked")?,
        }))
    }

    async fn pending_approval(&self, id: &str) -> Result<Option<Approval>, StoreError> {
        let sql = "SELECT *, id AS approval_id FROM session_approvals \
                   WHERE session_id = $1 AND state = 'pending' ORDER BY created_at, id LIMIT 1";
        let r = self.db.query_opt(sql, args![id]).await?;
        Ok(r.as_ref().map(Approval::from_row).transpose()?)
    }

    async fn approval(&self, id: &str, approval_id: &str) -> Result<Option<Approval>, StoreError> {
        let sql = "SELECT *, id AS approval_id FROM session_approvals \
                   WHERE session_id = $1 AND id = $2";
        let r = self.db.query_opt(sql, args![id, approval_id]).await?;
        Ok(r.as_ref().map(Approval::from_row).transpose()?)
    }

    async fn decide_approval(
        &self,
        id: &str,
        approval_id: &str,
        d: Decided<'_>,
    ) -> Result<Vec<Event>, StoreError> {
        let (mut tx, epoch) = self.write(id).await?;
        let sql = "UPDATE session_approvals SET state = 'decided', decision = $3, note = $4, \
                   decided_at = $5 WHERE id = $1 AND session_id = $2 AND state = 'pending'";
        let args = args![approval_id, id, d.decision, d.note, now()];
        if tx.execute(sql, args).await? == 0 {
            return Err(StoreError::ApprovalNotFound(approval_id.to_string()));
        }
        let decided = EventKind::ApprovalDecided {
            approval_id: approval_id.to_string(),
            decision: d.decision.to_string(),
            note: d.note.to_string(),
            remember: d.remember.map(str::to_string),
        };
        let out = append_tx(&mut tx, id, epoch, vec![(d.actor, decided)]).await?;
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
        let mut moved = vec![];
        for r in tx.query(&sql, args![from_host]).await? {
            let id: String = r.get("id")?;
            let sql = "UPDATE sessions SET host_id = $2, epoch = epoch + 1 \
                       WHERE id = $1 AND host_id = $3 RETURNING epoch";
            let Some(r) = tx.query_opt(sql, args![&id, to_host, from_host]).await? else {
                continue;
            };
            let epoch: u64 = r.get("epoch")?;
            let changed = EventKind::HostChanged {
                from: from_host.to_string(),
                to: to_host.to_string(),
                epoch,
                reason: reason.to_string(),
            };
            append_tx(&mut tx, &id, epoch, vec![(Actor::System, changed)]).await?;
            moved.push((id, epoch));
        }
        tx.commit().await?;
        Ok(moved)
    }

    async fn hand_over(
        &self,
        id: &str,
        to_host: &str,
        reason: &str,
    ) -> Result<Option<u64>, StoreError> {
        check_host_id(to_host)?;
        if to_host == &*self.host {
            return Ok(None);
        }
        let mut tx = self.db.begin().await?;
        let sql = format!(
            "UPDATE sessions SET host_id = $2, epoch = epoch + 1 \
             WHERE id = $1 AND host_id = $3 AND {UNFINISHED} RETURNING epoch"
        );
        let Some(r) = tx.query_opt(&sql, args![id, to_host, &*self.host]).await? else {
            return Ok(None);
        };
        let epoch: u64 = r.get("epoch")?;
        let changed = EventKind::HostChanged {
            from: self.host.to_string(),
            to: to_host.to_string(),
            epoch,
            reason: reason.to_string(),
        };
        append_tx(&mut tx, id, epoch, vec![(Actor::System, changed)]).await?;
        tx.commit().await?;
        Ok(Some(epoch))
    }

    fn host_id(&self) -> &str {
        &self.host
    }
}
