//! [`DbStore`]: the daemon's state in the deployment's one database
//! (hatchery-db), the same SQL on SQLite and PostgreSQL. Tables
//! `core_sandboxes`, `core_events`, `core_snapshots`, `core_net`,
//! `core_leases`, `core_hosts` and `core_secrets`.
//!
//! Every change is one write transaction that first reads the writer's
//! lease row (`FOR SHARE` on PostgreSQL: a takeover, an UPDATE of that
//! row, waits for the write to commit, and a write after the takeover sees
//! the new epoch and is refused; on SQLite the write transaction holds
//! the only write lock), so no write of a fenced-off host lands after its
//! lease moved on (Temporal's `range_id` pattern). Leases use the
//! database's clock, never a host's.

use crate::rows::{
    Event, Fence, HostRow, Lease, NetRow, SandboxFilter, SandboxRow, SandboxState,
    SnapshotLocation, SnapshotPoolRow, SnapshotRow, StoppedRow,
};
use crate::HostHold;
use crate::{check_host_fence, to_json, warm_list, Result, Store, StoreError};
use async_trait::async_trait;
use hatchery_db::{
    args, copy_table, Db, Dialect, Import, Migrations, Record, Row, Step, Tx, Value,
};
use std::collections::BTreeMap;

/// The core's schema. Append only.
pub static SCHEMA: Migrations = Migrations {
    product: "core",
    steps: &[
        Step::Each {
            sqlite: SQLITE_SCHEMA,
            // A database of the previous release (the old PostgreSQL store,
            // all five of its migrations run) has the same tables without the
            // prefix: renamed in place, rows and indexes kept; then what is
            // missing is created. Metadata is JSONB with a GIN index there
            // (containment filters), text filtered with json_each on SQLite.
            postgres: PG_SCHEMA,
        },
        // 2: a host's lifecycle (starting until it has reconciled and
        // listens), the operator's hold (cordoned, draining) and its
        // version (crate::host_state). Hosts registered before this are
        // `starting` until they restart with it.
        Step::Both(
            "ALTER TABLE core_hosts ADD COLUMN state TEXT NOT NULL DEFAULT 'starting';
             ALTER TABLE core_hosts ADD COLUMN hold TEXT NOT NULL DEFAULT '';
             ALTER TABLE core_hosts ADD COLUMN version TEXT NOT NULL DEFAULT '';",
        ),
        // 3: what a sandbox was booted on (template version, rootfs,
        // limits), so its snapshots capture that and not a later rebuild;
        // rows from before keep '' and fall back to the template.
        Step::Both(
            "ALTER TABLE core_sandboxes ADD COLUMN template_version TEXT NOT NULL DEFAULT '';
             ALTER TABLE core_sandboxes ADD COLUMN rootfs TEXT NOT NULL DEFAULT '';
             ALTER TABLE core_sandboxes ADD COLUMN limits TEXT NOT NULL DEFAULT '';
             ALTER TABLE core_snapshots ADD COLUMN template_version TEXT NOT NULL DEFAULT '';",
        ),
        // 4: what a snapshot holds (memory and files, or files only: a
        // filesystem-only pause); every earlier one is a checkpoint.
        Step::Both("ALTER TABLE core_snapshots ADD COLUMN kind TEXT NOT NULL DEFAULT 'memory';"),
        // 5: the snapshots each host keeps a warm pool of (issue 40), so a
        // restarted daemon fills them again instead of waiting for the
        // next session to ask.
        Step::Both(
            "CREATE TABLE core_snapshot_pools (
               host_id TEXT NOT NULL, snapshot_id TEXT NOT NULL,
               size BIGINT NOT NULL, touched_at_ms BIGINT NOT NULL,
               PRIMARY KEY (host_id, snapshot_id)
             );",
        ),
    ],
};

/// The tables, with the type of the metadata and env columns.
macro_rules! schema_tables {
    ($json:literal) => {
        concat!(
            "CREATE TABLE IF NOT EXISTS core_sandboxes (
       id TEXT PRIMARY KEY, template TEXT NOT NULL, state TEXT NOT NULL,
       created_at_ms BIGINT NOT NULL, expires_at_ms BIGINT NOT NULL,
       ended_at_ms BIGINT, end_reason TEXT,
       metadata ", $json, " NOT NULL, env ", $json, " NOT NULL, host_id TEXT NOT NULL);
     CREATE INDEX IF NOT EXISTS core_sandboxes_state ON core_sandboxes(state, expires_at_ms);
     CREATE INDEX IF NOT EXISTS core_sandboxes_host ON core_sandboxes(host_id, state, expires_at_ms);
     CREATE TABLE IF NOT EXISTS core_events (
       seq BIGSERIAL PRIMARY KEY, sandbox_id TEXT NOT NULL, at_ms BIGINT NOT NULL,
       kind TEXT NOT NULL, detail TEXT NOT NULL, epoch BIGINT NOT NULL);
     CREATE INDEX IF NOT EXISTS core_events_sandbox ON core_events(sandbox_id, seq);
     CREATE TABLE IF NOT EXISTS core_snapshots (
       id TEXT PRIMARY KEY, sandbox_id TEXT NOT NULL, template TEXT NOT NULL,
       created_at_ms BIGINT NOT NULL, expires_at_ms BIGINT NOT NULL, size_bytes BIGINT NOT NULL,
       metadata ", $json, " NOT NULL, env ", $json, " NOT NULL,
       rootfs TEXT NOT NULL, limits TEXT NOT NULL, host_id TEXT NOT NULL, location TEXT NOT NULL);
     CREATE INDEX IF NOT EXISTS core_snapshots_host ON core_snapshots(host_id, expires_at_ms);
     CREATE INDEX IF NOT EXISTS core_snapshots_location ON core_snapshots(location, expires_at_ms);
     CREATE TABLE IF NOT EXISTS core_net (
       id TEXT PRIMARY KEY, slot INTEGER NOT NULL, policy TEXT NOT NULL, host_id TEXT NOT NULL);
     CREATE TABLE IF NOT EXISTS core_leases (
       resource TEXT PRIMARY KEY, owner TEXT NOT NULL, epoch BIGINT NOT NULL,
       expires_at_ms BIGINT NOT NULL);
     CREATE TABLE IF NOT EXISTS core_hosts (
       id TEXT PRIMARY KEY, address TEXT NOT NULL, capacity INTEGER NOT NULL,
       live INTEGER NOT NULL DEFAULT 0, epoch BIGINT NOT NULL,
       registered_at_ms BIGINT NOT NULL, heartbeat_at_ms BIGINT NOT NULL,
       warm_templates TEXT NOT NULL DEFAULT '[]');
     CREATE TABLE IF NOT EXISTS core_secrets (name TEXT PRIMARY KEY, value TEXT NOT NULL);"
        )
    };
}

const SQLITE_SCHEMA: &str = schema_tables!("TEXT");
const PG_SCHEMA: &str = concat!(
    "ALTER TABLE IF EXISTS sandboxes RENAME TO core_sandboxes;
     ALTER INDEX IF EXISTS sandboxes_state RENAME TO core_sandboxes_state;
     ALTER INDEX IF EXISTS sandboxes_host RENAME TO core_sandboxes_host;
     ALTER INDEX IF EXISTS sandboxes_metadata RENAME TO core_sandboxes_metadata;
     ALTER TABLE IF EXISTS events RENAME TO core_events;
     ALTER INDEX IF EXISTS events_sandbox RENAME TO core_events_sandbox;
     ALTER TABLE IF EXISTS snapshots RENAME TO core_snapshots;
     ALTER INDEX IF EXISTS snapshots_host RENAME TO core_snapshots_host;
     ALTER INDEX IF EXISTS snapshots_location RENAME TO core_snapshots_location;
     ALTER TABLE IF EXISTS sandbox_net RENAME TO core_net;
     ALTER TABLE IF EXISTS leases RENAME TO core_leases;
     ALTER TABLE IF EXISTS hosts RENAME TO core_hosts;
     ALTER TABLE IF EXISTS deployment_secrets RENAME TO core_secrets;
     ",
    schema_tables!("JSONB"),
    "
     CREATE INDEX IF NOT EXISTS core_sandboxes_metadata ON core_sandboxes USING GIN (metadata jsonb_path_ops);"
);

/// A single-host data dir of the previous release: DATA_DIR/state.db (its
/// six SQLite migrations run), copied whole.
pub static IMPORT: Import = Import {
    file: "state.db",
    copy: &[
        copy_table!("core_sandboxes", "sandboxes", "id, template, state, created_at_ms, expires_at_ms, ended_at_ms, end_reason, metadata, env, host_id"),
        copy_table!("core_events", "events", "seq, sandbox_id, at_ms, kind, detail, epoch"),
        copy_table!("core_snapshots", "snapshots", "id, sandbox_id, template, created_at_ms, expires_at_ms, size_bytes, metadata, env, rootfs, limits, host_id, location"),
        copy_table!("core_net", "sandbox_net", "id, slot, policy, host_id"),
        // The daemon took its host lease before the import: the old epoch
        // is kept only where it is higher, so a write fenced by either
        // incarnation is judged against the newest.
        copy_table!("core_leases", "leases", "resource, owner, epoch, expires_at_ms",
            "WHERE true ON CONFLICT (resource) DO UPDATE SET epoch = max(core_leases.epoch, excluded.epoch)"),
        copy_table!(or ignore "core_hosts", "hosts", "id, address, capacity, live, epoch, registered_at_ms, heartbeat_at_ms, warm_templates"),
        copy_table!(or ignore "core_secrets", "deployment_secrets", "name, value"),
    ],
};

const LIVE: &str = "('starting', 'running')";
const UNSTOPPED: &str = "('pooled', 'starting', 'running')";

/// The database's clock in milliseconds (leases never use a host's).
fn db_now(d: Dialect) -> &'static str {
    d.pick(
        "CAST(unixepoch('subsec') * 1000 AS INTEGER)",
        "CAST(extract(epoch from clock_timestamp()) * 1000 AS BIGINT)",
    )
}

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The store's view of a database error: retryable when the database is
/// not there, named by what was being done otherwise.
fn db(op: &'static str) -> impl FnOnce(hatchery_db::DbError) -> StoreError {
    move |e| match e.unavailable() {
        true => StoreError::Unavailable(format!("{op}: {e}")),
        false => backend(op, e),
    }
}

fn backend(op: &'static str, e: impl std::error::Error + Send + Sync + 'static) -> StoreError {
    StoreError::Backend {
        op,
        source: Box::new(e),
    }
}

pub struct DbStore {
    db: Db,
}

impl DbStore {
    /// Runs the core's migrations not yet run.
    pub async fn open(db: Db) -> Result<DbStore> {
        db.migrate(&SCHEMA).await.map_err(|e| match e {
            hatchery_db::MigrateError::TooNew { found, known, .. } => {
                StoreError::SchemaTooNew { found, known }
            }
            e if e.unavailable() => StoreError::Unavailable(e.to_string()),
            e => backend("migrate", e),
        })?;
        Ok(DbStore { db })
    }

    /// A scratch SQLite database (tests).
    pub async fn scratch() -> Result<DbStore> {
        Self::open(Db::sqlite_memory().map_err(db("open"))?).await
    }

    /// How many of the core's migrations the database has recorded.
    pub async fn schema_version(&self) -> Result<u64> {
        let v = SCHEMA.check(&self.db).await;
        v.map_err(|e| backend("schema version", e))
    }

    async fn rows<T>(
        &self,
        sql: &str,
        args: &[Value],
        map: impl Fn(&Row) -> Result<T>,
    ) -> Result<Vec<T>> {
        let rows = self.db.query(sql, args).await.map_err(db("query"))?;
        rows.iter().map(map).collect()
    }

    /// The first row's, if any.
    async fn one<T>(
        &self,
        sql: &str,
        args: &[Value],
        map: impl Fn(&Row) -> Result<T>,
    ) -> Result<Option<T>> {
        Ok(self.rows(sql, args, map).await?.into_iter().next())
    }

    /// The `id` column of every row.
    async fn ids(&self, sql: &str, args: &[Value]) -> Result<Vec<String>> {
        self.rows(sql, args, |r| get(r, "id")).await
    }

    /// One fenced statement and, when it changed a row, the event that
    /// says so (`(sandbox, kind, detail)`), in one transaction. Whether it
    /// changed one.
    async fn change(
        &self,
        f: &Fence,
        op: &'static str,
        sql: &str,
        args: &[Value],
        event_of: Option<(&str, &str, &str)>,
    ) -> Result<bool> {
        let mut tx = self.fenced(f).await?;
        let n = tx.execute(sql, args).await.map_err(db(op))?;
        if let Some((id, kind, detail)) = event_of.filter(|_| n > 0) {
            event(&mut tx, f, id, kind, detail).await?;
        }
        commit(tx, n > 0).await
    }

    /// A write transaction with the fence checked in it. On SQLite its
    /// commit does not wait for the disk ([`Db::begin_relaxed`]): what it
    /// records (a sandbox's row and events, a slot, a heartbeat) a power
    /// loss of this host ends anyway, and reconcile rebuilds it from what
    /// runs; a snapshot's row ([`DbStore::fenced_durable`]) and a lease's
    /// new epoch do wait. On PostgreSQL every commit waits.
    async fn fenced(&self, f: &Fence) -> Result<Tx> {
        check_fence(self.db.begin_relaxed().await.map_err(db("begin"))?, f).await
    }

    /// The same, on disk when it commits.
    async fn fenced_durable(&self, f: &Fence) -> Result<Tx> {
        check_fence(self.db.begin().await.map_err(db("begin"))?, f).await
    }
}

async fn commit<T>(tx: Tx, out: T) -> Result<T> {
    tx.commit().await.map_err(db("commit"))?;
    Ok(out)
}

/// `tx`, if the fence holds in it.
async fn check_fence(mut tx: Tx, f: &Fence) -> Result<Tx> {
    let sql = "SELECT owner, epoch FROM core_leases WHERE resource = $1 FOR SHARE";
    let cur = tx.query_opt(sql, args![&f.resource]).await;
    let (owner, current) = match cur.map_err(db("fence check"))? {
        Some(r) => (get(&r, "owner")?, get::<u64>(&r, "epoch")?),
        None => (String::new(), 0),
    };
    if owner == f.owner && current == f.epoch {
        return Ok(tx);
    }
    let (resource, held) = (f.resource.clone(), f.epoch);
    Err(StoreError::Fenced {
        resource,
        owner,
        held,
        current,
    })
}

fn get<T: hatchery_db::FromValue>(r: &Row, col: &str) -> Result<T> {
    r.get(col).map_err(db("read row"))
}

async fn event(tx: &mut Tx, f: &Fence, id: &str, kind: &str, detail: &str) -> Result<u64> {
    let sql = "INSERT INTO core_events (sandbox_id, at_ms, kind, detail, epoch)
               VALUES ($1, $2, $3, $4, $5) RETURNING seq";
    let a = args![id, wall_ms(), kind, detail, f.epoch];
    let r = tx.query_one(sql, a).await;
    get(&r.map_err(db("append event"))?, "seq")
}

const SELECT: &str = "SELECT * FROM core_sandboxes";
const SNAP_SELECT: &str = "SELECT * FROM core_snapshots";

/// A row as its record; a value that is none of the field's (an unknown
/// state or location, metadata that is not a JSON object) is `Corrupt`.
fn record<T: Record>(r: &Row) -> Result<T> {
    T::from_row(r).map_err(|e| match e {
        hatchery_db::DbError::Type { .. } => StoreError::Corrupt(e.to_string()),
        e => db("read row")(e),
    })
}

/// A stopped sandbox's row and when and why it ended.
fn stopped_row(r: &Row) -> Result<(SandboxRow, StoppedRow)> {
    let sandbox: SandboxRow = record(r)?;
    let stopped = StoppedRow {
        id: sandbox.id.clone(),
        host_id: sandbox.host_id.clone(),
        ended_at_ms: get::<Option<i64>>(r, "ended_at_ms")?.unwrap_or(0).max(0) as u64,
        end_reason: get::<Option<String>>(r, "end_reason")?.unwrap_or_default(),
    };
    Ok((sandbox, stopped))
}

fn lease_row(r: &Row) -> Result<Lease> {
    let expires: i64 = get(r, "expires_at_ms")?;
    let now: i64 = get(r, "now_ms")?;
    Ok(Lease {
        resource: get(r, "resource")?,
        owner: get(r, "owner")?,
        epoch: get(r, "epoch")?,
        expires_at_ms: expires.max(0) as u64,
        valid_for_ms: (expires - now).max(0) as u64,
    })
}

fn lease_cols(d: Dialect) -> String {
    format!(
        "resource, owner, epoch, expires_at_ms, {} AS now_ms",
        db_now(d)
    )
}

fn states_list(from: &[SandboxState]) -> String {
    let v: Vec<String> = from.iter().map(|s| format!("'{}'", s.as_str())).collect();
    v.join(", ")
}

/// `AND` conditions on `table` for a metadata filter, its parameters
/// appended to `args`: JSONB containment on PostgreSQL (its GIN index
/// answers it), one json_each match per pair on SQLite (exact keys,
/// whatever characters they hold).
fn metadata_clause(
    d: Dialect,
    table: &str,
    filter: &BTreeMap<String, String>,
    args: &mut Vec<Value>,
) -> String {
    if filter.is_empty() {
        return String::new();
    }
    match d {
        Dialect::Postgres => {
            args.push(to_json(filter).into());
            format!(" AND {table}.metadata @> ${}", args.len())
        }
        Dialect::Sqlite => {
            let mut sql = String::new();
            for (k, v) in filter {
                args.push(k.into());
                let kn = args.len();
                args.push(v.into());
                let vn = args.len();
                sql.push_str(&format!(
                    " AND EXISTS (SELECT 1 FROM json_each({table}.metadata) j WHERE j.key = ${kn} AND j.type = 'text' AND j.value = ${vn})"
                ));
            }
            sql
        }
    }
}

/// `AND` conditions on `core_sandboxes` for a filter: its template and
/// every metadata pair.
fn filter_clause(d: Dialect, filter: &SandboxFilter, args: &mut Vec<Value>) -> String {
    let mut sql = String::new();
    if let Some(t) = &filter.template {
        args.push(t.into());
        sql.push_str(&format!(" AND template = ${}", args.len()));
    }
    sql + &metadata_clause(d, "core_sandboxes", &filter.metadata, args)
}

#[async_trait]
impl Store for DbStore {
    fn backend(&self) -> &'static str {
        self.db.dialect().pick("sqlite", "postgres")
    }

    async fn insert_sandbox(&self, f: &Fence, r: &SandboxRow) -> Result<()> {
        let mut tx = self.fenced(f).await?;
        let host_id = f.owner.clone();
        let mine = SandboxRow {
            host_id,
            ..r.clone()
        };
        tx.insert(&mine).await.map_err(db("insert sandbox"))?;
        event(&mut tx, f, &r.id, "created", &r.template).await?;
        commit(tx, ()).await
    }

    async fn transition(
        &self,
        f: &Fence,
        id: &str,
        from: &[SandboxState],
        to: SandboxState,
    ) -> Result<bool> {
        // Refused before any SQL runs.
        if let Some(&from) = from.iter().find(|f| !f.valid_transition(to)) {
            return Err(StoreError::InvalidTransition { from, to });
        }
        let sql = format!(
            "UPDATE core_sandboxes SET state = $1 WHERE id = $2 AND host_id = $3 AND state IN ({})",
            states_list(from)
        );
        let (a, to) = (args![to.as_str(), id, &f.owner], to.as_str());
        self.change(f, "transition", &sql, a, Some((id, to, "")))
            .await
    }

    async fn stop(&self, f: &Fence, id: &str, reason: &str, now_ms: u64) -> Result<bool> {
        let sql = format!(
            "UPDATE core_sandboxes SET state = 'stopped', ended_at_ms = $2, end_reason = $3
             WHERE id = $1 AND host_id = $4 AND state IN {UNSTOPPED}"
        );
        let a = args![id, now_ms, reason, &f.owner];
        self.change(f, "stop", &sql, a, Some((id, "stopped", reason)))
            .await
    }

    async fn claim(&self, f: &Fence, r: &SandboxRow) -> Result<bool> {
        let sql =
            "UPDATE core_sandboxes SET state = 'running', created_at_ms = $2, expires_at_ms = $3,
               metadata = $4, env = $5
             WHERE id = $1 AND host_id = $6 AND state = 'pooled'";
        let (md, env) = (to_json(&r.metadata), to_json(&r.env));
        let a = args![&r.id, r.created_at_ms, r.expires_at_ms, md, env, &f.owner];
        self.change(f, "claim", sql, a, Some((&r.id, "claimed", "")))
            .await
    }

    async fn set_expiry(&self, f: &Fence, id: &str, expires_at_ms: u64) -> Result<bool> {
        let sql = format!(
            "UPDATE core_sandboxes SET expires_at_ms = $2
             WHERE id = $1 AND host_id = $3 AND state IN {UNSTOPPED}"
        );
        let ms = expires_at_ms.to_string();
        let a = args![id, expires_at_ms, &f.owner];
        self.change(f, "set expiry", &sql, a, Some((id, "ttl", &ms)))
            .await
    }

    async fn get_live(&self, id: &str) -> Result<Option<SandboxRow>> {
        let sql = format!("{SELECT} WHERE id = $1 AND state IN {LIVE}");
        self.one(&sql, args![id], record).await
    }

    async fn get_stopped(&self, id: &str) -> Result<Option<(SandboxRow, StoppedRow)>> {
        let sql = format!("{SELECT} WHERE id = $1 AND state = 'stopped'");
        self.one(&sql, args![id], stopped_row).await
    }

    async fn list_live(&self, filter: &SandboxFilter) -> Result<Vec<SandboxRow>> {
        let mut args = Vec::new();
        let mut sql = format!("{SELECT} WHERE state IN {LIVE}");
        sql.push_str(&filter_clause(self.db.dialect(), filter, &mut args));
        sql.push_str(" ORDER BY created_at_ms, id");
        self.rows(&sql, &args, record).await
    }

    async fn list_stopped(
        &self,
        reason: &str,
        filter: &SandboxFilter,
        limit: usize,
    ) -> Result<Vec<(SandboxRow, StoppedRow)>> {
        let mut args: Vec<Value> = vec![reason.into()];
        let mut sql = format!("{SELECT} WHERE state = 'stopped' AND end_reason = $1");
        sql.push_str(&filter_clause(self.db.dialect(), filter, &mut args));
        args.push((limit.min(i64::MAX as usize) as i64).into());
        sql.push_str(&format!(
            " ORDER BY ended_at_ms DESC, id LIMIT ${}",
            args.len()
        ));
        self.rows(&sql, &args, stopped_row).await
    }

    async fn list_unstopped(&self, host: &str) -> Result<Vec<SandboxRow>> {
        let sql = format!(
            "{SELECT} WHERE host_id = $1 AND state IN {UNSTOPPED} ORDER BY created_at_ms, id"
        );
        self.rows(&sql, args![host], record).await
    }

    async fn expired(&self, host: &str, now_ms: u64) -> Result<Vec<String>> {
        let sql = format!(
            "SELECT id FROM core_sandboxes
             WHERE host_id = $1 AND state IN {UNSTOPPED} AND expires_at_ms <= $2 ORDER BY id"
        );
        self.ids(&sql, args![host, now_ms]).await
    }

    async fn append_event(&self, f: &Fence, id: &str, kind: &str, detail: &str) -> Result<u64> {
        let mut tx = self.fenced(f).await?;
        let seq = event(&mut tx, f, id, kind, detail).await?;
        commit(tx, seq).await
    }

    async fn events(&self, id: &str) -> Result<Vec<Event>> {
        let sql = "SELECT * FROM core_events WHERE sandbox_id = $1 ORDER BY seq";
        self.rows(sql, args![id], record::<Event>).await
    }

    async fn insert_snapshot(&self, f: &Fence, s: &SnapshotRow) -> Result<()> {
        let mut tx = self.fenced_durable(f).await?;
        let (host_id, location) = (f.owner.clone(), s.location.written_by(&f.owner));
        let mine = SnapshotRow {
            host_id,
            location,
            ..s.clone()
        };
        tx.insert(&mine).await.map_err(db("insert snapshot"))?;
        event(&mut tx, f, &s.sandbox_id, "snapshot", &s.id).await?;
        commit(tx, ()).await
    }

    async fn get_snapshot(&self, id: &str) -> Result<Option<SnapshotRow>> {
        let sql = format!("{SNAP_SELECT} WHERE id = $1");
        self.one(&sql, args![id], record).await
    }

    async fn list_snapshots(&self, filter: &BTreeMap<String, String>) -> Result<Vec<SnapshotRow>> {
        let mut args = Vec::new();
        let sql = format!(
            "{SNAP_SELECT} WHERE true{} ORDER BY created_at_ms, id",
            metadata_clause(self.db.dialect(), "core_snapshots", filter, &mut args)
        );
        self.rows(&sql, &args, record).await
    }

    async fn snapshot_bytes(&self, location: &SnapshotLocation) -> Result<u64> {
        // CAST: SUM of a BIGINT is NUMERIC on PostgreSQL.
        let sql = "SELECT CAST(COALESCE(SUM(size_bytes), 0) AS BIGINT) AS n
             FROM core_snapshots WHERE location = $1";
        let n = self
            .one(sql, args![location.as_string()], |r| get(r, "n"))
            .await?;
        Ok(n.unwrap_or(0))
    }

    async fn count_snapshots_of(&self, template: &str) -> Result<u64> {
        let sql = "SELECT count(*) AS n FROM core_snapshots WHERE template = $1";
        let n = self.one(sql, args![template], |r| get(r, "n")).await?;
        Ok(n.unwrap_or(0))
    }

    async fn delete_snapshot(&self, f: &Fence, id: &str) -> Result<bool> {
        let mut tx = self.fenced_durable(f).await?;
        let sql =
            "DELETE FROM core_snapshots WHERE id = $1 AND (location = $2 OR location = 'shared')";
        let local = format!("local:{}", f.owner);
        let n = tx.execute(sql, args![id, local]).await;
        commit(tx, n.map_err(db("delete snapshot"))? > 0).await
    }

    async fn expired_snapshots(&self, host: &str, now_ms: u64) -> Result<Vec<String>> {
        let sql =
            "SELECT id FROM core_snapshots WHERE location = $1 AND expires_at_ms <= $2 ORDER BY id";
        self.ids(sql, args![format!("local:{host}"), now_ms]).await
    }

    async fn expired_shared_snapshots(&self, now_ms: u64) -> Result<Vec<String>> {
        let sql = "SELECT id FROM core_snapshots WHERE location = 'shared' AND expires_at_ms <= $1 ORDER BY id";
        self.ids(sql, args![now_ms]).await
    }

    async fn set_net(
        &self,
        f: &Fence,
        id: &str,
        slot: u32,
        policy: &str,
        record: bool,
    ) -> Result<()> {
        let sql = "INSERT INTO core_net (id, slot, policy, host_id) VALUES ($1, $2, $3, $4)
             ON CONFLICT (id) DO UPDATE SET slot = $2, policy = $3, host_id = $4";
        let a = args![id, slot, policy, &f.owner];
        // The upsert always writes its row, so the event goes with it.
        let event = record.then_some((id, "network_policy", policy));
        self.change(f, "set net", sql, a, event).await.map(drop)
    }

    async fn clear_net(&self, f: &Fence, id: &str) -> Result<()> {
        let sql = "DELETE FROM core_net WHERE id = $1 AND host_id = $2";
        self.change(f, "clear net", sql, args![id, &f.owner], None)
            .await
            .map(drop)
    }

    async fn all_net(&self, host: &str) -> Result<Vec<NetRow>> {
        let sql = "SELECT id, slot, policy FROM core_net WHERE host_id = $1 ORDER BY slot";
        let row = |r: &Row| {
            let (sandbox_id, slot, policy) = (get(r, "id")?, get(r, "slot")?, get(r, "policy")?);
            Ok(NetRow {
                sandbox_id,
                slot,
                policy,
            })
        };
        self.rows(sql, args![host], row).await
    }

    async fn set_snapshot_pool(
        &self,
        f: &Fence,
        snapshot: &str,
        size: u32,
        touched_at_ms: u64,
    ) -> Result<()> {
        if size == 0 {
            let sql = "DELETE FROM core_snapshot_pools WHERE host_id = $1 AND snapshot_id = $2";
            let a = args![&f.owner, snapshot];
            return self
                .change(f, "forget snapshot pool", sql, a, None)
                .await
                .map(drop);
        }
        let sql = "INSERT INTO core_snapshot_pools (host_id, snapshot_id, size, touched_at_ms)
             VALUES ($1, $2, $3, $4)
             ON CONFLICT (host_id, snapshot_id) DO UPDATE SET size = $3, touched_at_ms = $4";
        let a = args![&f.owner, snapshot, size, touched_at_ms];
        self.change(f, "set snapshot pool", sql, a, None)
            .await
            .map(drop)
    }

    async fn snapshot_pools(&self, host: &str) -> Result<Vec<SnapshotPoolRow>> {
        let sql = "SELECT snapshot_id, size, touched_at_ms FROM core_snapshot_pools
             WHERE host_id = $1 ORDER BY snapshot_id";
        let row = |r: &Row| {
            Ok(SnapshotPoolRow {
                snapshot_id: get(r, "snapshot_id")?,
                size: get(r, "size")?,
                touched_at_ms: get(r, "touched_at_ms")?,
            })
        };
        self.rows(sql, args![host], row).await
    }

    async fn take_lease(&self, resource: &str, owner: &str, ttl_ms: u64) -> Result<Lease> {
        let d = self.db.dialect();
        let mut tx = self.db.begin().await.map_err(db("begin"))?;
        let sql =
            "INSERT INTO core_leases (resource, owner, epoch, expires_at_ms) VALUES ($1, '', 0, 0)
             ON CONFLICT (resource) DO NOTHING";
        let made = tx.execute(sql, args![resource]).await;
        made.map_err(db("lease row"))?;
        // The row lock orders racing takes: the second sees the first's.
        let sql = format!(
            "SELECT {} FROM core_leases WHERE resource = $1 FOR UPDATE",
            lease_cols(d)
        );
        let cur = tx.query_one(&sql, args![resource]).await;
        let cur = lease_row(&cur.map_err(db("read lease"))?)?;
        if cur.owner != owner && cur.valid_for_ms > 0 {
            return Err(StoreError::LeaseHeld {
                resource: resource.into(),
                owner: cur.owner,
                for_ms: cur.valid_for_ms,
            });
        }
        let sql = format!(
            "UPDATE core_leases SET owner = $2, epoch = epoch + 1, expires_at_ms = {} + $3
             WHERE resource = $1 RETURNING {}",
            db_now(d),
            lease_cols(d)
        );
        let r = tx.query_one(&sql, args![resource, owner, ttl_ms]).await;
        let l = lease_row(&r.map_err(db("take lease"))?)?;
        commit(tx, l).await
    }

    async fn renew_lease(&self, f: &Fence, ttl_ms: u64) -> Result<Lease> {
        let d = self.db.dialect();
        let mut tx = self.fenced(f).await?;
        let sql = format!(
            "UPDATE core_leases SET expires_at_ms = {} + $2 WHERE resource = $1 RETURNING {}",
            db_now(d),
            lease_cols(d)
        );
        let r = tx.query_one(&sql, args![&f.resource, ttl_ms]).await;
        let l = lease_row(&r.map_err(db("renew lease"))?)?;
        commit(tx, l).await
    }

    async fn release_lease(&self, f: &Fence) -> Result<bool> {
        let mut tx = match self.fenced(f).await {
            Ok(tx) => tx,
            Err(StoreError::Fenced { .. }) => return Ok(false),
            Err(e) => return Err(e),
        };
        let sql = "UPDATE core_leases SET expires_at_ms = 0 WHERE resource = $1";
        let n = tx.execute(sql, args![&f.resource]).await;
        commit(tx, n.map_err(db("release lease"))? > 0).await
    }

    async fn get_lease(&self, resource: &str) -> Result<Option<Lease>> {
        let cols = lease_cols(self.db.dialect());
        let sql = format!("SELECT {cols} FROM core_leases WHERE resource = $1 AND owner != ''");
        self.one(&sql, args![resource], lease_row).await
    }

    async fn deployment_secret(&self, name: &str, candidate: &str) -> Result<String> {
        let sql =
            "INSERT INTO core_secrets (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING";
        let kept = self.db.execute(sql, args![name, candidate]).await;
        kept.map_err(db("keep secret"))?;
        let sql = "SELECT value FROM core_secrets WHERE name = $1";
        let value = self.one(sql, args![name], |r| get(r, "value")).await?;
        value.ok_or_else(|| StoreError::Corrupt(format!("secret {name} vanished")))
    }

    async fn register_host(
        &self,
        f: &Fence,
        address: &str,
        capacity: u32,
        version: &str,
    ) -> Result<()> {
        check_host_fence(f)?;
        let now = db_now(self.db.dialect());
        let capacity = capacity.min(i32::MAX as u32);
        // `hold` is left as it was: an operator's cordon outlives a restart.
        let sql = format!(
            "INSERT INTO core_hosts (id, address, capacity, live, epoch, registered_at_ms, heartbeat_at_ms, state, version)
             VALUES ($1, $2, $3, 0, $4, {now}, {now}, 'starting', $5)
             ON CONFLICT (id) DO UPDATE SET address = $2, capacity = $3, live = 0, epoch = $4,
               registered_at_ms = {now}, heartbeat_at_ms = {now}, state = 'starting', version = $5"
        );
        let a = args![&f.owner, address, capacity, f.epoch, version];
        self.change(f, "register host", &sql, a, None).await?;
        Ok(())
    }

    async fn host_ready(&self, f: &Fence) -> Result<bool> {
        check_host_fence(f)?;
        let sql = "UPDATE core_hosts SET state = 'ready' WHERE id = $1 AND epoch = $2 AND state = 'starting'";
        self.change(f, "host ready", sql, args![&f.owner, f.epoch], None)
            .await
    }

    async fn host_stopping(&self, f: &Fence) -> Result<bool> {
        check_host_fence(f)?;
        let sql = "UPDATE core_hosts SET state = 'stopping' WHERE id = $1 AND epoch = $2 AND state IN ('starting', 'ready')";
        self.change(f, "host stopping", sql, args![&f.owner, f.epoch], None)
            .await
    }

    async fn hold_host(&self, id: &str, from: &[HostHold], to: HostHold) -> Result<bool> {
        // Refused before any SQL runs.
        if let Some(&from) = from.iter().find(|f| **f != to && !f.valid_transition(to)) {
            return Err(StoreError::InvalidHold { from, to });
        }
        let list = from
            .iter()
            .map(|h| format!("'{}'", h.as_str()))
            .collect::<Vec<_>>()
            .join(", ");
        if list.is_empty() {
            return Ok(false);
        }
        let sql = format!("UPDATE core_hosts SET hold = $1 WHERE id = $2 AND hold IN ({list})");
        let n = self.db.execute(&sql, args![to.as_str(), id]).await;
        Ok(n.map_err(db("hold host"))? > 0)
    }

    async fn heartbeat(&self, f: &Fence, live: u32, warm_templates: &[String]) -> Result<bool> {
        check_host_fence(f)?;
        let now = db_now(self.db.dialect());
        let live = live.min(i32::MAX as u32);
        let sql = format!(
            "UPDATE core_hosts SET live = $2, epoch = $3, warm_templates = $4, heartbeat_at_ms = {now} WHERE id = $1"
        );
        let warm = serde_json::to_string(warm_templates).unwrap_or_default();
        let a = args![&f.owner, live, f.epoch, warm];
        self.change(f, "heartbeat", &sql, a, None).await
    }

    async fn live_per_host(&self, filter: &SandboxFilter) -> Result<BTreeMap<String, u32>> {
        let mut args = Vec::new();
        let mut sql =
            format!("SELECT host_id, count(*) AS n FROM core_sandboxes WHERE state IN {LIVE}");
        sql.push_str(&filter_clause(self.db.dialect(), filter, &mut args));
        sql.push_str(" GROUP BY host_id");
        let row = |r: &Row| Ok((get::<String>(r, "host_id")?, get::<u32>(r, "n")?));
        Ok(self.rows(&sql, &args, row).await?.into_iter().collect())
    }

    async fn list_hosts(&self) -> Result<Vec<HostRow>> {
        let sql = format!(
            "SELECT id, address, capacity, live, epoch, registered_at_ms, warm_templates,
               state, hold, version, {} - heartbeat_at_ms AS silent
             FROM core_hosts ORDER BY id",
            db_now(self.db.dialect())
        );
        let row = |r: &Row| {
            Ok(HostRow {
                id: get(r, "id")?,
                address: get(r, "address")?,
                capacity: get(r, "capacity")?,
                live: get(r, "live")?,
                epoch: get(r, "epoch")?,
                registered_at_ms: get(r, "registered_at_ms")?,
                silent_for_ms: get::<i64>(r, "silent")?.max(0) as u64,
                warm_templates: warm_list(&get::<String>(r, "warm_templates")?),
                ready: matches!(&*get::<String>(r, "state")?, "ready" | "stopping"),
                stopping: get::<String>(r, "state")? == "stopping",
                hold: {
                    let h: String = get(r, "hold")?;
                    HostHold::parse(&h)
                        .ok_or_else(|| StoreError::Corrupt(format!("host hold {h:?}")))?
                },
                version: get(r, "version")?,
            })
        };
        self.rows(&sql, args![], row).await
    }
}
