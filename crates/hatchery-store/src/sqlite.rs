//! The embedded backend: one SQLite file, one connection behind a mutex
//! (writes are a few per sandbox lifetime). Every change runs in a
//! `BEGIN IMMEDIATE` transaction, so the fence check and the write it
//! guards see the same database; SQLite has one writer at a time, which
//! is what makes the check hold until commit.

use crate::rows::{
    Event, Fence, HostRow, Lease, NetRow, SandboxFilter, SandboxRow, SandboxState, SnapshotRow,
};
use crate::{
    check_host_fence, check_transition, from_json, location_of, state_of, to_json, warm_json,
    warm_list, Result, Store, StoreError,
};
use async_trait::async_trait;
use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

/// Numbered migrations; `PRAGMA user_version` holds how many have run.
/// The first is the schema from before migrations existed (hence IF NOT
/// EXISTS: a state.db of that time adopts it unchanged).
const MIGRATIONS: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS sandboxes (
       id TEXT PRIMARY KEY,
       template TEXT NOT NULL,
       state TEXT NOT NULL,
       created_at_ms INTEGER NOT NULL,
       expires_at_ms INTEGER NOT NULL,
       ended_at_ms INTEGER,
       end_reason TEXT,
       metadata TEXT NOT NULL,
       env TEXT NOT NULL
     );
     CREATE INDEX IF NOT EXISTS sandboxes_state ON sandboxes(state, expires_at_ms);
     CREATE TABLE IF NOT EXISTS events (
       seq INTEGER PRIMARY KEY AUTOINCREMENT,
       sandbox_id TEXT NOT NULL,
       at_ms INTEGER NOT NULL,
       kind TEXT NOT NULL,
       detail TEXT NOT NULL
     );
     CREATE INDEX IF NOT EXISTS events_sandbox ON events(sandbox_id, seq);
     CREATE TABLE IF NOT EXISTS snapshots (
       id TEXT PRIMARY KEY,
       sandbox_id TEXT NOT NULL,
       template TEXT NOT NULL,
       created_at_ms INTEGER NOT NULL,
       expires_at_ms INTEGER NOT NULL,
       size_bytes INTEGER NOT NULL,
       metadata TEXT NOT NULL,
       env TEXT NOT NULL,
       rootfs TEXT NOT NULL,
       limits TEXT NOT NULL
     );
     CREATE TABLE IF NOT EXISTS sandbox_net (
       id TEXT PRIMARY KEY,
       slot INTEGER NOT NULL,
       policy TEXT NOT NULL
     );",
    // Hosts and leases. Rows from before belong to the default host id.
    "ALTER TABLE sandboxes ADD COLUMN host_id TEXT NOT NULL DEFAULT 'local';
     ALTER TABLE snapshots ADD COLUMN host_id TEXT NOT NULL DEFAULT 'local';
     ALTER TABLE sandbox_net ADD COLUMN host_id TEXT NOT NULL DEFAULT 'local';
     ALTER TABLE events ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;
     CREATE INDEX sandboxes_host ON sandboxes(host_id, state, expires_at_ms);
     CREATE INDEX snapshots_host ON snapshots(host_id, expires_at_ms);
     CREATE TABLE leases (
       resource TEXT PRIMARY KEY,
       owner TEXT NOT NULL,
       epoch INTEGER NOT NULL,
       expires_at_ms INTEGER NOT NULL
     );",
    // Hosts registered with the control plane, and their heartbeats.
    "CREATE TABLE hosts (
       id TEXT PRIMARY KEY,
       address TEXT NOT NULL,
       capacity INTEGER NOT NULL,
       live INTEGER NOT NULL DEFAULT 0,
       epoch INTEGER NOT NULL,
       registered_at_ms INTEGER NOT NULL,
       heartbeat_at_ms INTEGER NOT NULL
     );",
    // Where a snapshot's image is (`local:<host>` or `shared`), not which
    // host wrote it: rows from before were all on their writer's disk.
    "ALTER TABLE snapshots ADD COLUMN location TEXT NOT NULL DEFAULT '';
     UPDATE snapshots SET location = 'local:' || host_id;
     CREATE INDEX snapshots_location ON snapshots(location, expires_at_ms);",
    // Which templates a host has warm checkpoints of (a JSON array), for
    // placement.
    "ALTER TABLE hosts ADD COLUMN warm_templates TEXT NOT NULL DEFAULT '[]';",
    // Secrets the daemons of one deployment share (the daemon key).
    "CREATE TABLE deployment_secrets (
       name TEXT PRIMARY KEY,
       value TEXT NOT NULL
     );",
];

/// The database's clock in milliseconds: leases never use a host's clock.
const DB_NOW: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

const LIVE: &str = "('starting', 'running')";
const UNSTOPPED: &str = "('pooled', 'starting', 'running')";

pub struct SqliteStore {
    conn: Mutex<Connection>,
}

fn sq(op: &'static str) -> impl FnOnce(rusqlite::Error) -> StoreError {
    move |e| match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
            StoreError::Unavailable(format!("{op}: {e}"))
        }
        _ => StoreError::Backend {
            op,
            source: Box::new(e),
        },
    }
}

fn i(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}

fn u(v: i64) -> u64 {
    v.max(0) as u64
}

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl SqliteStore {
    pub fn open(path: &Path) -> Result<SqliteStore> {
        let conn = Connection::open(path).map_err(sq("open"))?;
        Self::init(conn)
    }

    pub fn open_in_memory() -> Result<SqliteStore> {
        Self::init(Connection::open_in_memory().map_err(sq("open"))?)
    }

    fn init(mut conn: Connection) -> Result<SqliteStore> {
        conn.execute_batch(
            "PRAGMA journal_mode=WAL;
             PRAGMA synchronous=NORMAL;
             PRAGMA busy_timeout=5000;",
        )
        .map_err(sq("pragmas"))?;
        migrate(&mut conn)?;
        Ok(SqliteStore {
            conn: Mutex::new(conn),
        })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` in an immediate transaction after checking `fence`.
    fn fenced<T>(&self, fence: &Fence, f: impl FnOnce(&Transaction<'_>) -> Result<T>) -> Result<T> {
        let mut c = self.conn();
        let tx = c
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sq("begin"))?;
        check_fence(&tx, fence)?;
        let out = f(&tx)?;
        tx.commit().map_err(sq("commit"))?;
        Ok(out)
    }

    fn query_rows<T>(
        &self,
        sql: &str,
        args: &[&dyn rusqlite::ToSql],
        map: impl Fn(&rusqlite::Row<'_>) -> Result<T>,
    ) -> Result<Vec<T>> {
        let c = self.conn();
        let mut st = c.prepare(sql).map_err(sq("prepare"))?;
        let mut rows = st.query(args).map_err(sq("query"))?;
        let mut out = Vec::new();
        while let Some(r) = rows.next().map_err(sq("read row"))? {
            out.push(map(r)?);
        }
        Ok(out)
    }
}

/// Applies the migrations not yet run, each in the transaction that
/// records it; `BEGIN IMMEDIATE` makes a second process wait, then find
/// them done.
fn migrate(conn: &mut Connection) -> Result<()> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(sq("begin migration"))?;
    let done: i64 = tx
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(sq("schema version"))?;
    let done = u(done);
    if done > MIGRATIONS.len() as u64 {
        return Err(StoreError::SchemaTooNew {
            found: done,
            known: MIGRATIONS.len() as u64,
        });
    }
    for (n, m) in MIGRATIONS.iter().enumerate().skip(done as usize) {
        tx.execute_batch(m).map_err(sq("migration"))?;
        tx.execute_batch(&format!("PRAGMA user_version = {}", n + 1))
            .map_err(sq("record migration"))?;
        tracing::info!(version = n + 1, "sqlite state store migrated");
    }
    tx.commit().map_err(sq("commit migration"))
}

fn check_fence(tx: &Transaction<'_>, f: &Fence) -> Result<()> {
    let cur: Option<(String, i64)> = tx
        .query_row(
            "SELECT owner, epoch FROM leases WHERE resource = ?1",
            params![f.resource],
            |r| Ok((r.get("owner")?, r.get("epoch")?)),
        )
        .optional()
        .map_err(sq("fence check"))?;
    match cur {
        Some((owner, epoch)) if owner == f.owner && u(epoch) == f.epoch => Ok(()),
        Some((owner, epoch)) => Err(StoreError::Fenced {
            resource: f.resource.clone(),
            owner,
            held: f.epoch,
            current: u(epoch),
        }),
        None => Err(StoreError::Fenced {
            resource: f.resource.clone(),
            owner: String::new(),
            held: f.epoch,
            current: 0,
        }),
    }
}

fn event(tx: &Transaction<'_>, f: &Fence, id: &str, kind: &str, detail: &str) -> Result<u64> {
    tx.execute(
        "INSERT INTO events (sandbox_id, at_ms, kind, detail, epoch) VALUES (?1, ?2, ?3, ?4, ?5)",
        params![id, i(wall_ms()), kind, detail, i(f.epoch)],
    )
    .map_err(sq("append event"))?;
    Ok(u(tx.last_insert_rowid()))
}

const SELECT: &str = "SELECT id, template, state, created_at_ms, expires_at_ms, metadata, env, host_id FROM sandboxes";

fn row(r: &rusqlite::Row<'_>) -> Result<SandboxRow> {
    let g = |e| sq("read sandbox")(e);
    let metadata: String = r.get("metadata").map_err(g)?;
    let env: String = r.get("env").map_err(g)?;
    let state: String = r.get("state").map_err(g)?;
    Ok(SandboxRow {
        id: r.get("id").map_err(g)?,
        template: r.get("template").map_err(g)?,
        state: state_of(&state)?,
        created_at_ms: u(r.get("created_at_ms").map_err(g)?),
        expires_at_ms: u(r.get("expires_at_ms").map_err(g)?),
        metadata: from_json("metadata", &metadata)?,
        env: from_json("env", &env)?,
        host_id: r.get("host_id").map_err(g)?,
    })
}

const SNAP_SELECT: &str = "SELECT id, sandbox_id, template, created_at_ms, expires_at_ms, size_bytes, metadata, env, rootfs, limits, host_id, location FROM snapshots";

fn snap_row(r: &rusqlite::Row<'_>) -> Result<SnapshotRow> {
    let g = |e| sq("read snapshot")(e);
    let metadata: String = r.get("metadata").map_err(g)?;
    let env: String = r.get("env").map_err(g)?;
    Ok(SnapshotRow {
        id: r.get("id").map_err(g)?,
        sandbox_id: r.get("sandbox_id").map_err(g)?,
        template: r.get("template").map_err(g)?,
        created_at_ms: u(r.get("created_at_ms").map_err(g)?),
        expires_at_ms: u(r.get("expires_at_ms").map_err(g)?),
        size_bytes: u(r.get("size_bytes").map_err(g)?),
        metadata: from_json("metadata", &metadata)?,
        env: from_json("env", &env)?,
        rootfs: r.get("rootfs").map_err(g)?,
        limits: r.get("limits").map_err(g)?,
        host_id: r.get("host_id").map_err(g)?,
        location: location_of(&r.get::<_, String>("location").map_err(g)?)?,
    })
}

fn lease_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Lease> {
    let expires: i64 = r.get("expires_at_ms")?;
    let now: i64 = r.get("now_ms")?;
    Ok(Lease {
        resource: r.get("resource")?,
        owner: r.get("owner")?,
        epoch: u(r.get("epoch")?),
        expires_at_ms: u(expires),
        valid_for_ms: u(expires - now),
    })
}

/// `AND EXISTS …` per metadata pair, with its parameters. json_each
/// matches keys exactly, whatever characters they hold.
/// `AND` conditions on the `sandboxes` table for a filter: its template
/// and every metadata pair, bound as numbered parameters after `args`.
fn filter_clause(filter: &SandboxFilter, args: &mut Vec<String>) -> String {
    let mut sql = String::new();
    if let Some(t) = &filter.template {
        args.push(t.clone());
        sql.push_str(&format!(" AND template = ?{}", args.len()));
    }
    sql + &metadata_clause("sandboxes", &filter.metadata, args)
}

fn metadata_clause(
    table: &str,
    filter: &BTreeMap<String, String>,
    args: &mut Vec<String>,
) -> String {
    let mut sql = String::new();
    for (k, v) in filter {
        args.push(k.clone());
        let kn = args.len();
        args.push(v.clone());
        let vn = args.len();
        sql.push_str(&format!(
            " AND EXISTS (SELECT 1 FROM json_each({table}.metadata) j WHERE j.key = ?{kn} AND j.type = 'text' AND j.value = ?{vn})"
        ));
    }
    sql
}

#[async_trait]
impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    async fn insert_sandbox(&self, f: &Fence, r: &SandboxRow) -> Result<()> {
        self.fenced(f, |tx| {
            tx.execute(
                "INSERT INTO sandboxes (id, template, state, created_at_ms, expires_at_ms, metadata, env, host_id)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    r.id,
                    r.template,
                    r.state.as_str(),
                    i(r.created_at_ms),
                    i(r.expires_at_ms),
                    to_json(&r.metadata),
                    to_json(&r.env),
                    f.owner
                ],
            )
            .map_err(sq("insert sandbox"))?;
            event(tx, f, &r.id, "created", &r.template).map(|_| ())
        })
    }

    async fn transition(
        &self,
        f: &Fence,
        id: &str,
        from: &[SandboxState],
        to: SandboxState,
    ) -> Result<bool> {
        check_transition(from, to)?;
        let from: Vec<String> = from.iter().map(|s| format!("'{}'", s.as_str())).collect();
        let sql = format!(
            "UPDATE sandboxes SET state = ?1 WHERE id = ?2 AND host_id = ?3 AND state IN ({})",
            from.join(", ")
        );
        self.fenced(f, |tx| {
            let n = tx
                .execute(&sql, params![to.as_str(), id, f.owner])
                .map_err(sq("transition"))?;
            if n > 0 {
                event(tx, f, id, to.as_str(), "")?;
            }
            Ok(n > 0)
        })
    }

    async fn stop(&self, f: &Fence, id: &str, reason: &str, now_ms: u64) -> Result<bool> {
        self.fenced(f, |tx| {
            let n = tx
                .execute(
                    &format!(
                        "UPDATE sandboxes SET state = 'stopped', ended_at_ms = ?2, end_reason = ?3
                         WHERE id = ?1 AND host_id = ?4 AND state IN {UNSTOPPED}"
                    ),
                    params![id, i(now_ms), reason, f.owner],
                )
                .map_err(sq("stop"))?;
            if n > 0 {
                event(tx, f, id, "stopped", reason)?;
            }
            Ok(n > 0)
        })
    }

    async fn claim(&self, f: &Fence, r: &SandboxRow) -> Result<bool> {
        self.fenced(f, |tx| {
            let n = tx
                .execute(
                    "UPDATE sandboxes SET state = 'running', created_at_ms = ?2, expires_at_ms = ?3, metadata = ?4, env = ?5
                     WHERE id = ?1 AND host_id = ?6 AND state = 'pooled'",
                    params![
                        r.id,
                        i(r.created_at_ms),
                        i(r.expires_at_ms),
                        to_json(&r.metadata),
                        to_json(&r.env),
                        f.owner
                    ],
                )
                .map_err(sq("claim"))?;
            if n > 0 {
                event(tx, f, &r.id, "claimed", "")?;
            }
            Ok(n > 0)
        })
    }

    async fn set_expiry(&self, f: &Fence, id: &str, expires_at_ms: u64) -> Result<bool> {
        self.fenced(f, |tx| {
            let n = tx
                .execute(
                    &format!(
                        "UPDATE sandboxes SET expires_at_ms = ?2 WHERE id = ?1 AND host_id = ?3 AND state IN {UNSTOPPED}"
                    ),
                    params![id, i(expires_at_ms), f.owner],
                )
                .map_err(sq("set expiry"))?;
            if n > 0 {
                event(tx, f, id, "ttl", &expires_at_ms.to_string())?;
            }
            Ok(n > 0)
        })
    }

    async fn get_live(&self, id: &str) -> Result<Option<SandboxRow>> {
        let mut v = self.query_rows(
            &format!("{SELECT} WHERE id = ?1 AND state IN {LIVE}"),
            &[&id],
            row,
        )?;
        Ok(v.pop())
    }

    async fn list_live(&self, filter: &SandboxFilter) -> Result<Vec<SandboxRow>> {
        let mut args: Vec<String> = Vec::new();
        let mut sql = format!("{SELECT} WHERE state IN {LIVE}");
        sql.push_str(&filter_clause(filter, &mut args));
        sql.push_str(" ORDER BY created_at_ms, id");
        let refs: Vec<&dyn rusqlite::ToSql> = args.iter().map(|a| a as _).collect();
        self.query_rows(&sql, &refs, row)
    }

    async fn list_unstopped(&self, host: &str) -> Result<Vec<SandboxRow>> {
        self.query_rows(
            &format!(
                "{SELECT} WHERE host_id = ?1 AND state IN {UNSTOPPED} ORDER BY created_at_ms, id"
            ),
            &[&host],
            row,
        )
    }

    async fn expired(&self, host: &str, now_ms: u64) -> Result<Vec<String>> {
        self.query_rows(
            &format!("SELECT id FROM sandboxes WHERE host_id = ?1 AND state IN {UNSTOPPED} AND expires_at_ms <= ?2 ORDER BY id"),
            &[&host, &i(now_ms)],
            |r| r.get("id").map_err(sq("read id")),
        )
    }

    async fn append_event(&self, f: &Fence, id: &str, kind: &str, detail: &str) -> Result<u64> {
        self.fenced(f, |tx| event(tx, f, id, kind, detail))
    }

    async fn events(&self, id: &str) -> Result<Vec<Event>> {
        self.query_rows(
            "SELECT seq, sandbox_id, at_ms, kind, detail, epoch FROM events WHERE sandbox_id = ?1 ORDER BY seq",
            &[&id],
            |r| {
                let g = |e| sq("read event")(e);
                Ok(Event {
                    seq: u(r.get("seq").map_err(g)?),
                    sandbox_id: r.get("sandbox_id").map_err(g)?,
                    at_ms: u(r.get("at_ms").map_err(g)?),
                    kind: r.get("kind").map_err(g)?,
                    detail: r.get("detail").map_err(g)?,
                    epoch: u(r.get("epoch").map_err(g)?),
                })
            },
        )
    }

    async fn insert_snapshot(&self, f: &Fence, s: &SnapshotRow) -> Result<()> {
        self.fenced(f, |tx| {
            tx.execute(
                "INSERT INTO snapshots (id, sandbox_id, template, created_at_ms, expires_at_ms, size_bytes, metadata, env, rootfs, limits, host_id, location)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
                params![
                    s.id,
                    s.sandbox_id,
                    s.template,
                    i(s.created_at_ms),
                    i(s.expires_at_ms),
                    i(s.size_bytes),
                    to_json(&s.metadata),
                    to_json(&s.env),
                    s.rootfs,
                    s.limits,
                    f.owner,
                    s.location.written_by(&f.owner)
                ],
            )
            .map_err(sq("insert snapshot"))?;
            event(tx, f, &s.sandbox_id, "snapshot", &s.id).map(|_| ())
        })
    }

    async fn get_snapshot(&self, id: &str) -> Result<Option<SnapshotRow>> {
        let mut v = self.query_rows(&format!("{SNAP_SELECT} WHERE id = ?1"), &[&id], snap_row)?;
        Ok(v.pop())
    }

    async fn list_snapshots(&self, filter: &BTreeMap<String, String>) -> Result<Vec<SnapshotRow>> {
        let mut args = Vec::new();
        let sql = format!(
            "{SNAP_SELECT} WHERE 1 = 1{} ORDER BY created_at_ms, id",
            metadata_clause("snapshots", filter, &mut args)
        );
        let refs: Vec<&dyn rusqlite::ToSql> = args.iter().map(|a| a as _).collect();
        self.query_rows(&sql, &refs, snap_row)
    }

    async fn count_snapshots_of(&self, template: &str) -> Result<u64> {
        let v = self.query_rows(
            "SELECT COUNT(*) AS n FROM snapshots WHERE template = ?1",
            &[&template],
            |r| r.get::<_, i64>("n").map_err(sq("count")),
        )?;
        Ok(u(v.first().copied().unwrap_or(0)))
    }

    async fn delete_snapshot(&self, f: &Fence, id: &str) -> Result<bool> {
        self.fenced(f, |tx| {
            let n = tx
                .execute(
                    "DELETE FROM snapshots WHERE id = ?1 AND (location = ?2 OR location = 'shared')",
                    params![id, format!("local:{}", f.owner)],
                )
                .map_err(sq("delete snapshot"))?;
            Ok(n > 0)
        })
    }

    async fn expired_snapshots(&self, host: &str, now_ms: u64) -> Result<Vec<String>> {
        self.query_rows(
            "SELECT id FROM snapshots WHERE location = ?1 AND expires_at_ms <= ?2 ORDER BY id",
            &[&format!("local:{host}"), &i(now_ms)],
            |r| r.get("id").map_err(sq("read id")),
        )
    }

    async fn expired_shared_snapshots(&self, now_ms: u64) -> Result<Vec<String>> {
        self.query_rows(
            "SELECT id FROM snapshots WHERE location = 'shared' AND expires_at_ms <= ?1 ORDER BY id",
            &[&i(now_ms)],
            |r| r.get("id").map_err(sq("read id")),
        )
    }

    async fn set_net(
        &self,
        f: &Fence,
        id: &str,
        slot: u32,
        policy: &str,
        record: bool,
    ) -> Result<()> {
        self.fenced(f, |tx| {
            tx.execute(
                "INSERT INTO sandbox_net (id, slot, policy, host_id) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT(id) DO UPDATE SET slot = ?2, policy = ?3, host_id = ?4",
                params![id, slot, policy, f.owner],
            )
            .map_err(sq("set net"))?;
            if record {
                event(tx, f, id, "network_policy", policy)?;
            }
            Ok(())
        })
    }

    async fn clear_net(&self, f: &Fence, id: &str) -> Result<()> {
        self.fenced(f, |tx| {
            tx.execute(
                "DELETE FROM sandbox_net WHERE id = ?1 AND host_id = ?2",
                params![id, f.owner],
            )
            .map_err(sq("clear net"))?;
            Ok(())
        })
    }

    async fn all_net(&self, host: &str) -> Result<Vec<NetRow>> {
        self.query_rows(
            "SELECT id, slot, policy FROM sandbox_net WHERE host_id = ?1 ORDER BY slot",
            &[&host],
            |r| {
                let g = |e| sq("read net")(e);
                Ok(NetRow {
                    sandbox_id: r.get("id").map_err(g)?,
                    slot: r.get("slot").map_err(g)?,
                    policy: r.get("policy").map_err(g)?,
                })
            },
        )
    }

    async fn take_lease(&self, resource: &str, owner: &str, ttl_ms: u64) -> Result<Lease> {
        let mut c = self.conn();
        let tx = c
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sq("begin"))?;
        tx.execute(
            "INSERT INTO leases (resource, owner, epoch, expires_at_ms) VALUES (?1, '', 0, 0)
             ON CONFLICT(resource) DO NOTHING",
            params![resource],
        )
        .map_err(sq("lease row"))?;
        let cur = tx
            .query_row(
                &format!("SELECT resource, owner, epoch, expires_at_ms, {DB_NOW} AS now_ms FROM leases WHERE resource = ?1"),
                params![resource],
                lease_row,
            )
            .map_err(sq("read lease"))?;
        if cur.owner != owner && cur.valid_for_ms > 0 {
            return Err(StoreError::LeaseHeld {
                resource: resource.into(),
                owner: cur.owner,
                for_ms: cur.valid_for_ms,
            });
        }
        let l = tx
            .query_row(
                &format!(
                    "UPDATE leases SET owner = ?2, epoch = epoch + 1, expires_at_ms = {DB_NOW} + ?3
                     WHERE resource = ?1
                     RETURNING resource, owner, epoch, expires_at_ms, {DB_NOW} AS now_ms"
                ),
                params![resource, owner, i(ttl_ms)],
                lease_row,
            )
            .map_err(sq("take lease"))?;
        tx.commit().map_err(sq("commit"))?;
        Ok(l)
    }

    async fn renew_lease(&self, f: &Fence, ttl_ms: u64) -> Result<Lease> {
        self.fenced(f, |tx| {
            tx.query_row(
                &format!(
                    "UPDATE leases SET expires_at_ms = {DB_NOW} + ?2 WHERE resource = ?1
                     RETURNING resource, owner, epoch, expires_at_ms, {DB_NOW} AS now_ms"
                ),
                params![f.resource, i(ttl_ms)],
                lease_row,
            )
            .map_err(sq("renew lease"))
        })
    }

    async fn release_lease(&self, f: &Fence) -> Result<bool> {
        match self.fenced(f, |tx| {
            tx.execute(
                "UPDATE leases SET expires_at_ms = 0 WHERE resource = ?1",
                params![f.resource],
            )
            .map_err(sq("release lease"))
        }) {
            Ok(n) => Ok(n > 0),
            Err(StoreError::Fenced { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn get_lease(&self, resource: &str) -> Result<Option<Lease>> {
        let mut v = self.query_rows(
            &format!("SELECT resource, owner, epoch, expires_at_ms, {DB_NOW} AS now_ms FROM leases WHERE resource = ?1 AND owner != ''"),
            &[&resource],
            |r| lease_row(r).map_err(sq("read lease")),
        )?;
        Ok(v.pop())
    }

    async fn deployment_secret(&self, name: &str, candidate: &str) -> Result<String> {
        let c = self.conn();
        c.execute(
            "INSERT INTO deployment_secrets (name, value) VALUES (?1, ?2) ON CONFLICT(name) DO NOTHING",
            params![name, candidate],
        )
        .map_err(sq("keep secret"))?;
        c.query_row(
            "SELECT value FROM deployment_secrets WHERE name = ?1",
            params![name],
            |r| r.get::<_, String>("value"),
        )
        .map_err(sq("read secret"))
    }

    async fn register_host(&self, f: &Fence, address: &str, capacity: u32) -> Result<()> {
        check_host_fence(f)?;
        self.fenced(f, |tx| {
            tx.execute(
                &format!(
                    "INSERT INTO hosts (id, address, capacity, live, epoch, registered_at_ms, heartbeat_at_ms)
                     VALUES (?1, ?2, ?3, 0, ?4, {DB_NOW}, {DB_NOW})
                     ON CONFLICT(id) DO UPDATE SET address = ?2, capacity = ?3, live = 0, epoch = ?4,
                       registered_at_ms = {DB_NOW}, heartbeat_at_ms = {DB_NOW}"
                ),
                params![f.owner, address, capacity, i(f.epoch)],
            )
            .map_err(sq("register host"))?;
            Ok(())
        })
    }

    async fn heartbeat(&self, f: &Fence, live: u32, warm_templates: &[String]) -> Result<bool> {
        check_host_fence(f)?;
        let warm = warm_json(warm_templates);
        self.fenced(f, |tx| {
            let n = tx
                .execute(
                    &format!(
                        "UPDATE hosts SET live = ?2, epoch = ?3, warm_templates = ?4, heartbeat_at_ms = {DB_NOW} WHERE id = ?1"
                    ),
                    params![f.owner, live, i(f.epoch), warm],
                )
                .map_err(sq("heartbeat"))?;
            Ok(n > 0)
        })
    }

    async fn live_per_host(&self, filter: &SandboxFilter) -> Result<BTreeMap<String, u32>> {
        let mut args: Vec<String> = Vec::new();
        let mut sql = format!("SELECT host_id, count(*) AS n FROM sandboxes WHERE state IN {LIVE}");
        sql.push_str(&filter_clause(filter, &mut args));
        sql.push_str(" GROUP BY host_id");
        let refs: Vec<&dyn rusqlite::ToSql> = args.iter().map(|a| a as _).collect();
        let rows = self.query_rows(&sql, &refs, |r| {
            Ok((
                r.get::<_, String>("host_id").map_err(sq("host_id"))?,
                r.get::<_, i64>("n").map_err(sq("n"))?.max(0) as u32,
            ))
        })?;
        Ok(rows.into_iter().collect())
    }

    async fn list_hosts(&self) -> Result<Vec<HostRow>> {
        self.query_rows(
            &format!(
                "SELECT id, address, capacity, live, epoch, registered_at_ms, warm_templates,
                   {DB_NOW} - heartbeat_at_ms AS silent
                 FROM hosts ORDER BY id"
            ),
            &[],
            |r| {
                let g = |e| sq("read host")(e);
                Ok(HostRow {
                    id: r.get("id").map_err(g)?,
                    address: r.get("address").map_err(g)?,
                    capacity: r.get("capacity").map_err(g)?,
                    live: r.get("live").map_err(g)?,
                    epoch: u(r.get("epoch").map_err(g)?),
                    registered_at_ms: u(r.get("registered_at_ms").map_err(g)?),
                    silent_for_ms: u(r.get("silent").map_err(g)?),
                    warm_templates: warm_list(&r.get::<_, String>("warm_templates").map_err(g)?),
                })
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_run_once_and_adopt_the_old_schema() {
        let dir = std::env::temp_dir().join(format!("hx-store-mig-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.db");
        // A state.db as written before migrations existed, with one row.
        let c = Connection::open(&path).unwrap();
        c.execute_batch(MIGRATIONS[0]).unwrap();
        c.execute(
            "INSERT INTO sandboxes (id, template, state, created_at_ms, expires_at_ms, metadata, env)
             VALUES ('sbx_old', 't', 'running', 1, 2, '{}', '{}')",
            [],
        )
        .unwrap();
        c.execute(
            "INSERT INTO snapshots (id, sandbox_id, template, created_at_ms, expires_at_ms, size_bytes, metadata, env, rootfs, limits)
             VALUES ('snap_old', 'sbx_old', 't', 1, 2, 3, '{}', '{}', '/r', '{}')",
            [],
        )
        .unwrap();
        drop(c);
        let s = SqliteStore::open(&path).unwrap();
        drop(s);
        let s = SqliteStore::open(&path).unwrap(); // twice: a no-op
        let v: i64 = s
            .conn()
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(v as usize, MIGRATIONS.len());
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let rows = rt.block_on(s.list_unstopped("local")).unwrap();
        assert_eq!(rows.len(), 1, "the old row belongs to the default host");
        let snap = rt.block_on(s.get_snapshot("snap_old")).unwrap().unwrap();
        assert_eq!(
            snap.location,
            crate::SnapshotLocation::Local {
                host: "local".into()
            },
            "an old snapshot is on its writer's disk"
        );
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn newer_schema_is_refused() {
        let dir = std::env::temp_dir().join(format!("hx-store-new-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.db");
        let c = Connection::open(&path).unwrap();
        c.execute_batch("PRAGMA user_version = 99").unwrap();
        drop(c);
        assert!(matches!(
            SqliteStore::open(&path),
            Err(StoreError::SchemaTooNew { found: 99, .. })
        ));
        std::fs::remove_dir_all(dir).ok();
    }
}
