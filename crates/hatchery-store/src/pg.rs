//! The shared backend: PostgreSQL through a deadpool pool of tokio-postgres
//! connections. Every change is one transaction that first reads the
//! writer's lease row `FOR SHARE`: a takeover (an UPDATE of that row)
//! waits for the write to commit, and a write after the takeover sees the
//! new epoch and is refused, so no write of a fenced-off host can land
//! after its lease moved on (Temporal's `range_id` pattern).

use crate::rows::{
    Event, Fence, HostRow, Lease, NetRow, SandboxFilter, SandboxRow, SandboxState, SnapshotRow,
};
use crate::{
    check_host_fence, check_transition, from_json, location_of, state_of, to_json, warm_json,
    warm_list, Result, Store, StoreError,
};
use async_trait::async_trait;
use deadpool_postgres::Pool;
use std::collections::BTreeMap;

/// Numbered migrations; `hatchery_schema` holds how many have run. Each
/// runs in the transaction that records it, under an advisory lock, so two
/// daemons starting at once both end up with one schema.
const MIGRATIONS: &[&str] = &[
    "CREATE TABLE sandboxes (
       id TEXT PRIMARY KEY,
       template TEXT NOT NULL,
       state TEXT NOT NULL,
       created_at_ms BIGINT NOT NULL,
       expires_at_ms BIGINT NOT NULL,
       ended_at_ms BIGINT,
       end_reason TEXT,
       metadata JSONB NOT NULL,
       env JSONB NOT NULL,
       host_id TEXT NOT NULL
     );
     CREATE INDEX sandboxes_state ON sandboxes(state, expires_at_ms);
     CREATE INDEX sandboxes_host ON sandboxes(host_id, state, expires_at_ms);
     CREATE INDEX sandboxes_metadata ON sandboxes USING GIN (metadata jsonb_path_ops);
     CREATE TABLE events (
       seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
       sandbox_id TEXT NOT NULL,
       at_ms BIGINT NOT NULL,
       kind TEXT NOT NULL,
       detail TEXT NOT NULL,
       epoch BIGINT NOT NULL
     );
     CREATE INDEX events_sandbox ON events(sandbox_id, seq);
     CREATE TABLE snapshots (
       id TEXT PRIMARY KEY,
       sandbox_id TEXT NOT NULL,
       template TEXT NOT NULL,
       created_at_ms BIGINT NOT NULL,
       expires_at_ms BIGINT NOT NULL,
       size_bytes BIGINT NOT NULL,
       metadata JSONB NOT NULL,
       env JSONB NOT NULL,
       rootfs TEXT NOT NULL,
       limits TEXT NOT NULL,
       host_id TEXT NOT NULL
     );
     CREATE INDEX snapshots_host ON snapshots(host_id, expires_at_ms);
     CREATE TABLE sandbox_net (
       id TEXT PRIMARY KEY,
       slot INTEGER NOT NULL,
       policy TEXT NOT NULL,
       host_id TEXT NOT NULL
     );
     CREATE TABLE leases (
       resource TEXT PRIMARY KEY,
       owner TEXT NOT NULL,
       epoch BIGINT NOT NULL,
       expires_at_ms BIGINT NOT NULL
     );",
    // Hosts registered with the control plane, and their heartbeats.
    "CREATE TABLE hosts (
       id TEXT PRIMARY KEY,
       address TEXT NOT NULL,
       capacity INTEGER NOT NULL,
       live INTEGER NOT NULL DEFAULT 0,
       epoch BIGINT NOT NULL,
       registered_at_ms BIGINT NOT NULL,
       heartbeat_at_ms BIGINT NOT NULL
     );",
    // Where a snapshot's image is (`local:<host>` or `shared`), not which
    // host wrote it: rows from before were all on their writer's disk.
    "ALTER TABLE snapshots ADD COLUMN location TEXT;
     UPDATE snapshots SET location = 'local:' || host_id;
     ALTER TABLE snapshots ALTER COLUMN location SET NOT NULL;
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

/// Any fixed number: the advisory lock that serializes migrations.
const MIGRATION_LOCK: i64 = 0x6861_7463_6873_7431;

const SCHEMA: crate::PgMigrations = crate::PgMigrations {
    name: "state",
    table: "hatchery_schema",
    lock: MIGRATION_LOCK,
    steps: MIGRATIONS,
};

fn migrate_err(e: crate::MigrateError) -> StoreError {
    match e {
        crate::MigrateError::TooNew { found, known, .. } => {
            StoreError::SchemaTooNew { found, known }
        }
        e if e.unavailable() => StoreError::Unavailable(e.to_string()),
        crate::MigrateError::Pg { what, source, .. } => StoreError::Backend {
            op: what,
            source: Box::new(source),
        },
        e @ crate::MigrateError::Missing { .. } => StoreError::Config(e.to_string()),
    }
}

/// The database's clock in milliseconds (leases never use a host's).
const DB_NOW: &str = "(extract(epoch from clock_timestamp()) * 1000)::BIGINT";

const LIVE: &str = "('starting', 'running')";
const UNSTOPPED: &str = "('pooled', 'starting', 'running')";

pub struct PgStore {
    pool: Pool,
}

fn pg(op: &'static str) -> impl FnOnce(tokio_postgres::Error) -> StoreError {
    move |e| {
        // A dropped connection or a server that went away: retryable.
        if crate::pg_unavailable(&e) {
            StoreError::Unavailable(format!("{op}: {e}"))
        } else {
            StoreError::Backend {
                op,
                source: Box::new(e),
            }
        }
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

type Tx<'a> = deadpool_postgres::Transaction<'a>;

impl PgStore {
    /// `dsn`: a `postgres://` URL or a libpq connection string. Connects,
    /// then runs the migrations not yet run.
    pub async fn connect(dsn: &str, pool_size: usize) -> Result<PgStore> {
        let pool = crate::pg_pool(dsn, pool_size).map_err(|e| StoreError::Config(e.0))?;
        let s = PgStore { pool };
        s.migrate().await?;
        Ok(s)
    }

    async fn client(&self) -> Result<deadpool_postgres::Object> {
        self.pool
            .get()
            .await
            .map_err(|e| StoreError::Unavailable(e.to_string()))
    }

    async fn migrate(&self) -> Result<()> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(pg("begin migration"))?;
        SCHEMA.run(&tx).await.map_err(migrate_err)?;
        tx.commit().await.map_err(pg("commit migration"))
    }

    /// How many migrations the database has recorded.
    pub async fn schema_version(&self) -> Result<u64> {
        let c = self.client().await?;
        SCHEMA.version(&c).await.map_err(migrate_err)
    }

    async fn query_rows<T>(
        &self,
        sql: &str,
        args: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        map: impl Fn(&tokio_postgres::Row) -> Result<T>,
    ) -> Result<Vec<T>> {
        let c = self.client().await?;
        let rows = c.query(sql, args).await.map_err(pg("query"))?;
        rows.iter().map(map).collect()
    }
}

async fn check_fence(tx: &Tx<'_>, f: &Fence) -> Result<()> {
    let cur = tx
        .query_opt(
            "SELECT owner, epoch FROM leases WHERE resource = $1 FOR SHARE",
            &[&f.resource],
        )
        .await
        .map_err(pg("fence check"))?;
    let (owner, epoch) = match cur {
        Some(r) => (r.get::<_, String>("owner"), u(r.get::<_, i64>("epoch"))),
        None => (String::new(), 0),
    };
    if owner == f.owner && epoch == f.epoch {
        Ok(())
    } else {
        Err(StoreError::Fenced {
            resource: f.resource.clone(),
            owner,
            held: f.epoch,
            current: epoch,
        })
    }
}

async fn event(tx: &Tx<'_>, f: &Fence, id: &str, kind: &str, detail: &str) -> Result<u64> {
    let r = tx
        .query_one(
            "INSERT INTO events (sandbox_id, at_ms, kind, detail, epoch) VALUES ($1, $2, $3, $4, $5) RETURNING seq",
            &[&id, &i(wall_ms()), &kind, &detail, &i(f.epoch)],
        )
        .await
        .map_err(pg("append event"))?;
    Ok(u(r.get("seq")))
}

/// Begins a transaction on `c` and checks `f` in it.
macro_rules! fenced {
    ($self:ident, $f:expr, |$tx:ident| $body:block) => {{
        let mut c = $self.client().await?;
        let $tx = c.transaction().await.map_err(pg("begin"))?;
        check_fence(&$tx, $f).await?;
        let out = $body;
        $tx.commit().await.map_err(pg("commit"))?;
        Ok(out)
    }};
}

const SELECT: &str = "SELECT id, template, state, created_at_ms, expires_at_ms, metadata::text AS metadata, env::text AS env, host_id FROM sandboxes";

fn row(r: &tokio_postgres::Row) -> Result<SandboxRow> {
    Ok(SandboxRow {
        id: r.get("id"),
        template: r.get("template"),
        state: state_of(r.get("state"))?,
        created_at_ms: u(r.get("created_at_ms")),
        expires_at_ms: u(r.get("expires_at_ms")),
        metadata: from_json("metadata", r.get("metadata"))?,
        env: from_json("env", r.get("env"))?,
        host_id: r.get("host_id"),
    })
}

const SNAP_SELECT: &str = "SELECT id, sandbox_id, template, created_at_ms, expires_at_ms, size_bytes, metadata::text AS metadata, env::text AS env, rootfs, limits, host_id, location FROM snapshots";

fn snap_row(r: &tokio_postgres::Row) -> Result<SnapshotRow> {
    Ok(SnapshotRow {
        id: r.get("id"),
        sandbox_id: r.get("sandbox_id"),
        template: r.get("template"),
        created_at_ms: u(r.get("created_at_ms")),
        expires_at_ms: u(r.get("expires_at_ms")),
        size_bytes: u(r.get("size_bytes")),
        metadata: from_json("metadata", r.get("metadata"))?,
        env: from_json("env", r.get("env"))?,
        rootfs: r.get("rootfs"),
        limits: r.get("limits"),
        host_id: r.get("host_id"),
        location: location_of(r.get("location"))?,
    })
}

fn lease_row(r: &tokio_postgres::Row) -> Lease {
    let expires: i64 = r.get("expires_at_ms");
    let now: i64 = r.get("now_ms");
    Lease {
        resource: r.get("resource"),
        owner: r.get("owner"),
        epoch: u(r.get("epoch")),
        expires_at_ms: u(expires),
        valid_for_ms: u(expires - now),
    }
}

fn lease_cols() -> String {
    format!("resource, owner, epoch, expires_at_ms, {DB_NOW} AS now_ms")
}

fn states_list(from: &[SandboxState]) -> String {
    let v: Vec<String> = from.iter().map(|s| format!("'{}'", s.as_str())).collect();
    v.join(", ")
}

#[async_trait]
impl Store for PgStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    async fn insert_sandbox(&self, f: &Fence, r: &SandboxRow) -> Result<()> {
        fenced!(self, f, |tx| {
            tx.execute(
                "INSERT INTO sandboxes (id, template, state, created_at_ms, expires_at_ms, metadata, env, host_id)
                 VALUES ($1, $2, $3, $4, $5, $6::text::jsonb, $7::text::jsonb, $8)",
                &[
                    &r.id,
                    &r.template,
                    &r.state.as_str(),
                    &i(r.created_at_ms),
                    &i(r.expires_at_ms),
                    &to_json(&r.metadata),
                    &to_json(&r.env),
                    &f.owner,
                ],
            )
            .await
            .map_err(pg("insert sandbox"))?;
            event(&tx, f, &r.id, "created", &r.template).await?;
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
        let sql = format!(
            "UPDATE sandboxes SET state = $1 WHERE id = $2 AND host_id = $3 AND state IN ({})",
            states_list(from)
        );
        fenced!(self, f, |tx| {
            let n = tx
                .execute(&sql, &[&to.as_str(), &id, &f.owner])
                .await
                .map_err(pg("transition"))?;
            if n > 0 {
                event(&tx, f, id, to.as_str(), "").await?;
            }
            n > 0
        })
    }

    async fn stop(&self, f: &Fence, id: &str, reason: &str, now_ms: u64) -> Result<bool> {
        fenced!(self, f, |tx| {
            let n = tx
                .execute(
                    &format!(
                        "UPDATE sandboxes SET state = 'stopped', ended_at_ms = $2, end_reason = $3
                         WHERE id = $1 AND host_id = $4 AND state IN {UNSTOPPED}"
                    ),
                    &[&id, &i(now_ms), &reason, &f.owner],
                )
                .await
                .map_err(pg("stop"))?;
            if n > 0 {
                event(&tx, f, id, "stopped", reason).await?;
            }
            n > 0
        })
    }

    async fn claim(&self, f: &Fence, r: &SandboxRow) -> Result<bool> {
        fenced!(self, f, |tx| {
            let n = tx
                .execute(
                    "UPDATE sandboxes SET state = 'running', created_at_ms = $2, expires_at_ms = $3,
                       metadata = $4::text::jsonb, env = $5::text::jsonb
                     WHERE id = $1 AND host_id = $6 AND state = 'pooled'",
                    &[
                        &r.id,
                        &i(r.created_at_ms),
                        &i(r.expires_at_ms),
                        &to_json(&r.metadata),
                        &to_json(&r.env),
                        &f.owner,
                    ],
                )
                .await
                .map_err(pg("claim"))?;
            if n > 0 {
                event(&tx, f, &r.id, "claimed", "").await?;
            }
            n > 0
        })
    }

    async fn set_expiry(&self, f: &Fence, id: &str, expires_at_ms: u64) -> Result<bool> {
        fenced!(self, f, |tx| {
            let n = tx
                .execute(
                    &format!(
                        "UPDATE sandboxes SET expires_at_ms = $2 WHERE id = $1 AND host_id = $3 AND state IN {UNSTOPPED}"
                    ),
                    &[&id, &i(expires_at_ms), &f.owner],
                )
                .await
                .map_err(pg("set expiry"))?;
            if n > 0 {
                event(&tx, f, id, "ttl", &expires_at_ms.to_string()).await?;
            }
            n > 0
        })
    }

    async fn get_live(&self, id: &str) -> Result<Option<SandboxRow>> {
        let mut v = self
            .query_rows(
                &format!("{SELECT} WHERE id = $1 AND state IN {LIVE}"),
                &[&id],
                row,
            )
            .await?;
        Ok(v.pop())
    }

    async fn list_live(&self, filter: &SandboxFilter) -> Result<Vec<SandboxRow>> {
        // Containment on JSONB: the GIN index answers it.
        let md = to_json(&filter.metadata);
        let mut sql = format!("{SELECT} WHERE state IN {LIVE} AND metadata @> $1::text::jsonb");
        let mut args: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![&md];
        if let Some(t) = &filter.template {
            sql.push_str(" AND template = $2");
            args.push(t);
        }
        sql.push_str(" ORDER BY created_at_ms, id");
        self.query_rows(&sql, &args, row).await
    }

    async fn list_unstopped(&self, host: &str) -> Result<Vec<SandboxRow>> {
        self.query_rows(
            &format!(
                "{SELECT} WHERE host_id = $1 AND state IN {UNSTOPPED} ORDER BY created_at_ms, id"
            ),
            &[&host],
            row,
        )
        .await
    }

    async fn expired(&self, host: &str, now_ms: u64) -> Result<Vec<String>> {
        self.query_rows(
            &format!("SELECT id FROM sandboxes WHERE host_id = $1 AND state IN {UNSTOPPED} AND expires_at_ms <= $2 ORDER BY id"),
            &[&host, &i(now_ms)],
            |r| Ok(r.get("id")),
        )
        .await
    }

    async fn append_event(&self, f: &Fence, id: &str, kind: &str, detail: &str) -> Result<u64> {
        fenced!(self, f, |tx| { event(&tx, f, id, kind, detail).await? })
    }

    async fn events(&self, id: &str) -> Result<Vec<Event>> {
        self.query_rows(
            "SELECT seq, sandbox_id, at_ms, kind, detail, epoch FROM events WHERE sandbox_id = $1 ORDER BY seq",
            &[&id],
            |r| {
                Ok(Event {
                    seq: u(r.get("seq")),
                    sandbox_id: r.get("sandbox_id"),
                    at_ms: u(r.get("at_ms")),
                    kind: r.get("kind"),
                    detail: r.get("detail"),
                    epoch: u(r.get("epoch")),
                })
            },
        )
        .await
    }

    async fn insert_snapshot(&self, f: &Fence, s: &SnapshotRow) -> Result<()> {
        fenced!(self, f, |tx| {
            tx.execute(
                "INSERT INTO snapshots (id, sandbox_id, template, created_at_ms, expires_at_ms, size_bytes, metadata, env, rootfs, limits, host_id, location)
                 VALUES ($1, $2, $3, $4, $5, $6, $7::text::jsonb, $8::text::jsonb, $9, $10, $11, $12)",
                &[
                    &s.id,
                    &s.sandbox_id,
                    &s.template,
                    &i(s.created_at_ms),
                    &i(s.expires_at_ms),
                    &i(s.size_bytes),
                    &to_json(&s.metadata),
                    &to_json(&s.env),
                    &s.rootfs,
                    &s.limits,
                    &f.owner,
                    &s.location.written_by(&f.owner),
                ],
            )
            .await
            .map_err(pg("insert snapshot"))?;
            event(&tx, f, &s.sandbox_id, "snapshot", &s.id).await?;
        })
    }

    async fn get_snapshot(&self, id: &str) -> Result<Option<SnapshotRow>> {
        let mut v = self
            .query_rows(&format!("{SNAP_SELECT} WHERE id = $1"), &[&id], snap_row)
            .await?;
        Ok(v.pop())
    }

    async fn list_snapshots(&self, filter: &BTreeMap<String, String>) -> Result<Vec<SnapshotRow>> {
        let md = to_json(filter);
        self.query_rows(
            &format!("{SNAP_SELECT} WHERE metadata @> $1::text::jsonb ORDER BY created_at_ms, id"),
            &[&md],
            snap_row,
        )
        .await
    }

    async fn count_snapshots_of(&self, template: &str) -> Result<u64> {
        let v = self
            .query_rows(
                "SELECT COUNT(*) AS n FROM snapshots WHERE template = $1",
                &[&template],
                |r| Ok(u(r.get("n"))),
            )
            .await?;
        Ok(v.first().copied().unwrap_or(0))
    }

    async fn delete_snapshot(&self, f: &Fence, id: &str) -> Result<bool> {
        fenced!(self, f, |tx| {
            tx.execute(
                "DELETE FROM snapshots WHERE id = $1 AND (location = $2 OR location = 'shared')",
                &[&id, &format!("local:{}", f.owner)],
            )
            .await
            .map_err(pg("delete snapshot"))?
                > 0
        })
    }

    async fn expired_snapshots(&self, host: &str, now_ms: u64) -> Result<Vec<String>> {
        self.query_rows(
            "SELECT id FROM snapshots WHERE location = $1 AND expires_at_ms <= $2 ORDER BY id",
            &[&format!("local:{host}"), &i(now_ms)],
            |r| Ok(r.get("id")),
        )
        .await
    }

    async fn expired_shared_snapshots(&self, now_ms: u64) -> Result<Vec<String>> {
        self.query_rows(
            "SELECT id FROM snapshots WHERE location = 'shared' AND expires_at_ms <= $1 ORDER BY id",
            &[&i(now_ms)],
            |r| Ok(r.get("id")),
        )
        .await
    }

    async fn set_net(
        &self,
        f: &Fence,
        id: &str,
        slot: u32,
        policy: &str,
        record: bool,
    ) -> Result<()> {
        let slot = slot as i32;
        fenced!(self, f, |tx| {
            tx.execute(
                "INSERT INTO sandbox_net (id, slot, policy, host_id) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (id) DO UPDATE SET slot = $2, policy = $3, host_id = $4",
                &[&id, &slot, &policy, &f.owner],
            )
            .await
            .map_err(pg("set net"))?;
            if record {
                event(&tx, f, id, "network_policy", policy).await?;
            }
        })
    }

    async fn clear_net(&self, f: &Fence, id: &str) -> Result<()> {
        fenced!(self, f, |tx| {
            tx.execute(
                "DELETE FROM sandbox_net WHERE id = $1 AND host_id = $2",
                &[&id, &f.owner],
            )
            .await
            .map_err(pg("clear net"))?;
        })
    }

    async fn all_net(&self, host: &str) -> Result<Vec<NetRow>> {
        self.query_rows(
            "SELECT id, slot, policy FROM sandbox_net WHERE host_id = $1 ORDER BY slot",
            &[&host],
            |r| {
                Ok(NetRow {
                    sandbox_id: r.get("id"),
                    slot: r.get::<_, i32>("slot").max(0) as u32,
                    policy: r.get("policy"),
                })
            },
        )
        .await
    }

    async fn take_lease(&self, resource: &str, owner: &str, ttl_ms: u64) -> Result<Lease> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(pg("begin"))?;
        tx.execute(
            "INSERT INTO leases (resource, owner, epoch, expires_at_ms) VALUES ($1, '', 0, 0)
             ON CONFLICT (resource) DO NOTHING",
            &[&resource],
        )
        .await
        .map_err(pg("lease row"))?;
        // The row lock orders racing takes: the second sees the first's.
        let cur = tx
            .query_one(
                &format!(
                    "SELECT {} FROM leases WHERE resource = $1 FOR UPDATE",
                    lease_cols()
                ),
                &[&resource],
            )
            .await
            .map_err(pg("read lease"))?;
        let cur = lease_row(&cur);
        if cur.owner != owner && cur.valid_for_ms > 0 {
            return Err(StoreError::LeaseHeld {
                resource: resource.into(),
                owner: cur.owner,
                for_ms: cur.valid_for_ms,
            });
        }
        let r = tx
            .query_one(
                &format!(
                    "UPDATE leases SET owner = $2, epoch = epoch + 1, expires_at_ms = {DB_NOW} + $3
                     WHERE resource = $1 RETURNING {}",
                    lease_cols()
                ),
                &[&resource, &owner, &i(ttl_ms)],
            )
            .await
            .map_err(pg("take lease"))?;
        tx.commit().await.map_err(pg("commit"))?;
        Ok(lease_row(&r))
    }

    async fn renew_lease(&self, f: &Fence, ttl_ms: u64) -> Result<Lease> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(pg("begin"))?;
        check_fence(&tx, f).await?;
        let r = tx
            .query_one(
                &format!(
                    "UPDATE leases SET expires_at_ms = {DB_NOW} + $2 WHERE resource = $1 RETURNING {}",
                    lease_cols()
                ),
                &[&f.resource, &i(ttl_ms)],
            )
            .await
            .map_err(pg("renew lease"))?;
        tx.commit().await.map_err(pg("commit"))?;
        Ok(lease_row(&r))
    }

    async fn release_lease(&self, f: &Fence) -> Result<bool> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(pg("begin"))?;
        match check_fence(&tx, f).await {
            Ok(()) => {}
            Err(StoreError::Fenced { .. }) => return Ok(false),
            Err(e) => return Err(e),
        }
        let n = tx
            .execute(
                "UPDATE leases SET expires_at_ms = 0 WHERE resource = $1",
                &[&f.resource],
            )
            .await
            .map_err(pg("release lease"))?;
        tx.commit().await.map_err(pg("commit"))?;
        Ok(n > 0)
    }

    async fn get_lease(&self, resource: &str) -> Result<Option<Lease>> {
        let c = self.client().await?;
        let r = c
            .query_opt(
                &format!(
                    "SELECT {} FROM leases WHERE resource = $1 AND owner != ''",
                    lease_cols()
                ),
                &[&resource],
            )
            .await
            .map_err(pg("read lease"))?;
        Ok(r.as_ref().map(lease_row))
    }

    async fn deployment_secret(&self, name: &str, candidate: &str) -> Result<String> {
        let c = self.client().await?;
        c.execute(
            "INSERT INTO deployment_secrets (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
            &[&name, &candidate],
        )
        .await
        .map_err(pg("keep secret"))?;
        let r = c
            .query_one(
                "SELECT value FROM deployment_secrets WHERE name = $1",
                &[&name],
            )
            .await
            .map_err(pg("read secret"))?;
        Ok(r.get("value"))
    }

    async fn register_host(&self, f: &Fence, address: &str, capacity: u32) -> Result<()> {
        check_host_fence(f)?;
        let capacity = capacity.min(i32::MAX as u32) as i32;
        fenced!(self, f, |tx| {
            tx.execute(
                &format!(
                    "INSERT INTO hosts (id, address, capacity, live, epoch, registered_at_ms, heartbeat_at_ms)
                     VALUES ($1, $2, $3, 0, $4, {DB_NOW}, {DB_NOW})
                     ON CONFLICT (id) DO UPDATE SET address = $2, capacity = $3, live = 0, epoch = $4,
                       registered_at_ms = {DB_NOW}, heartbeat_at_ms = {DB_NOW}"
                ),
                &[&f.owner, &address, &capacity, &i(f.epoch)],
            )
            .await
            .map_err(pg("register host"))?;
        })
    }

    async fn heartbeat(&self, f: &Fence, live: u32, warm_templates: &[String]) -> Result<bool> {
        check_host_fence(f)?;
        let live = live.min(i32::MAX as u32) as i32;
        let warm = warm_json(warm_templates);
        fenced!(self, f, |tx| {
            tx.execute(
                &format!(
                    "UPDATE hosts SET live = $2, epoch = $3, warm_templates = $4, heartbeat_at_ms = {DB_NOW} WHERE id = $1"
                ),
                &[&f.owner, &live, &i(f.epoch), &warm],
            )
            .await
            .map_err(pg("heartbeat"))?
                > 0
        })
    }

    async fn live_per_host(&self, filter: &SandboxFilter) -> Result<BTreeMap<String, u32>> {
        // Containment on JSONB: the GIN index answers it.
        let md = to_json(&filter.metadata);
        let mut sql = format!(
            "SELECT host_id, count(*) AS n FROM sandboxes WHERE state IN {LIVE} AND metadata @> $1::text::jsonb"
        );
        let mut args: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![&md];
        if let Some(t) = &filter.template {
            sql.push_str(" AND template = $2");
            args.push(t);
        }
        sql.push_str(" GROUP BY host_id");
        let rows = self
            .query_rows(&sql, &args, |r| {
                Ok((
                    r.get::<_, String>("host_id"),
                    r.get::<_, i64>("n").max(0) as u32,
                ))
            })
            .await?;
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
                Ok(HostRow {
                    id: r.get("id"),
                    address: r.get("address"),
                    capacity: r.get::<_, i32>("capacity").max(0) as u32,
                    live: r.get::<_, i32>("live").max(0) as u32,
                    epoch: u(r.get("epoch")),
                    registered_at_ms: u(r.get("registered_at_ms")),
                    silent_for_ms: u(r.get("silent")),
                    warm_templates: warm_list(&r.get::<_, String>("warm_templates")),
                })
            },
        )
        .await
    }
}
