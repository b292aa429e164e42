//! [`DbTenantStore`]: tables `tenants` (one row per tenant, each limit a
//! nullable column) and `tenant_keys` (one row per key: its SHA-256, a
//! display prefix, revoked_at once revoked), the same SQL on SQLite and
//! PostgreSQL. Caps (tenants, unrevoked keys per tenant) are counted in
//! the transaction that writes, under a lock, so concurrent creates
//! cannot pass them.

use crate::model::{
    Limits, NewTenant, Tenant, TenantKey, TenantPatch, MAX_ACTIVE_KEYS, MAX_TENANTS,
};
use crate::store::{KeyOwner, StoreError, TenantStore};
use hatchery_db::{args, Db, Migrations, Row, Step, Tx, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// The tenant schema. Append only.
pub static SCHEMA: Migrations = Migrations {
    product: "tenant",
    steps: &[Step::Both(
        "CREATE TABLE tenants (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            limit_tokens BIGINT,
            limit_usd_cents BIGINT,
            limit_concurrent_sessions BIGINT,
            limit_live_sandboxes BIGINT,
            limit_wall_clock_seconds BIGINT,
            created_at TEXT NOT NULL
        );
        CREATE TABLE tenant_keys (
            id TEXT PRIMARY KEY,
            tenant_id TEXT NOT NULL REFERENCES tenants(id),
            hash TEXT NOT NULL UNIQUE,
            prefix TEXT NOT NULL,
            created_at TEXT NOT NULL,
            revoked_at TEXT
        );
        CREATE INDEX tenant_keys_by_tenant ON tenant_keys (tenant_id);",
    )],
};

#[derive(Clone)]
pub struct DbTenantStore {
    db: Db,
}

const TENANT_COLUMNS: &str = "id, name, limit_tokens, limit_usd_cents, limit_concurrent_sessions,
     limit_live_sandboxes, limit_wall_clock_seconds, created_at";
const KEY_COLUMNS: &str = "id, tenant_id, prefix, created_at, revoked_at";

fn now() -> String {
    OffsetDateTime::now_utc()
        .format(&Rfc3339)
        .unwrap_or_default()
}

/// A limit as a parameter: every limit is capped far below i64::MAX.
fn limit(v: Option<u64>) -> Value {
    v.map_or(Value::Null, |v| Value::Int(v.min(i64::MAX as u64) as i64))
}

fn limit_args(l: &Limits) -> [Value; 5] {
    [
        limit(l.tokens),
        limit(l.usd_cents),
        limit(l.concurrent_sessions),
        limit(l.live_sandboxes),
        limit(l.wall_clock_seconds),
    ]
}

fn read_tenant(r: &Row) -> Result<Tenant, StoreError> {
    Ok(Tenant {
        id: r.get("id")?,
        name: r.get("name")?,
        limits: Limits {
            tokens: r.get("limit_tokens")?,
            usd_cents: r.get("limit_usd_cents")?,
            concurrent_sessions: r.get("limit_concurrent_sessions")?,
            live_sandboxes: r.get("limit_live_sandboxes")?,
            wall_clock_seconds: r.get("limit_wall_clock_seconds")?,
        },
        created_at: r.get("created_at")?,
    })
}

fn read_key(r: &Row) -> Result<TenantKey, StoreError> {
    Ok(TenantKey {
        id: r.get("id")?,
        tenant: r.get("tenant_id")?,
        prefix: r.get("prefix")?,
        created_at: r.get("created_at")?,
        revoked_at: r.get("revoked_at")?,
    })
}

async fn tenant_in(tx: &mut Tx, id: &str, for_update: bool) -> Result<Tenant, StoreError> {
    let lock = if for_update { " FOR UPDATE" } else { "" };
    let sql = format!("SELECT {TENANT_COLUMNS} FROM tenants WHERE id = $1{lock}");
    match tx.query_opt(&sql, args![id]).await? {
        Some(r) => read_tenant(&r),
        None => Err(StoreError::NotFound(id.into())),
    }
}

impl DbTenantStore {
    /// Runs the tenant migrations not yet run.
    pub async fn open(db: Db) -> Result<Self, StoreError> {
        db.migrate(&SCHEMA).await?;
        Ok(DbTenantStore { db })
    }

    /// A scratch database (tests).
    pub async fn scratch() -> Result<Self, StoreError> {
        Self::open(Db::sqlite_memory()?).await
    }

    /// The tenant schema's version in the database.
    pub async fn schema_version(&self) -> Result<u64, StoreError> {
        Ok(SCHEMA.check(&self.db).await?)
    }
}

#[async_trait::async_trait]
impl TenantStore for DbTenantStore {
    async fn create(&self, req: NewTenant) -> Result<Tenant, StoreError> {
        req.validate()?;
        let mut tx = self.db.begin().await?;
        // Creates take turns, so the cap on the number of tenants is exact.
        tx.lock("tenants").await?;
        let n: u64 = tx
            .query_one("SELECT count(*) FROM tenants", args![])
            .await?
            .get(0)?;
        if n >= MAX_TENANTS {
            return Err(StoreError::TooManyTenants(n));
        }
        let t = Tenant {
            id: format!("ten_{:016x}", rand::random::<u64>()),
            name: req.name,
            limits: req.limits,
            created_at: now(),
        };
        let [a, b, c, d, e] = limit_args(&t.limits);
        let sql = format!(
            "INSERT INTO tenants ({TENANT_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
        );
        let a = args![&t.id, &t.name, a, b, c, d, e, &t.created_at];
        tx.execute(&sql, a).await?;
        tx.commit().await?;
        Ok(t)
    }

    async fn list(&self) -> Result<Vec<Tenant>, StoreError> {
        let sql = format!("SELECT {TENANT_COLUMNS} FROM tenants ORDER BY created_at, id");
        let rows = self.db.query(&sql, args![]).await?;
        rows.iter().map(read_tenant).collect()
    }

    async fn get(&self, id: &str) -> Result<Tenant, StoreError> {
        let mut tx = self.db.read().await?;
        tenant_in(&mut tx, id, false).await
    }

    async fn update(&self, id: &str, patch: TenantPatch) -> Result<Tenant, StoreError> {
        patch.validate()?;
        let mut tx = self.db.begin().await?;
        let mut t = tenant_in(&mut tx, id, true).await?;
        if let Some(n) = patch.name {
            t.name = n;
        }
        if let Some(l) = patch.limits {
            t.limits = l;
        }
        let [a, b, c, d, e] = limit_args(&t.limits);
        let sql = "UPDATE tenants SET name = $2, limit_tokens = $3, limit_usd_cents = $4,
                 limit_concurrent_sessions = $5, limit_live_sandboxes = $6,
                 limit_wall_clock_seconds = $7 WHERE id = $1";
        tx.execute(sql, args![id, &t.name, a, b, c, d, e]).await?;
        tx.commit().await?;
        Ok(t)
    }

    async fn delete(&self, id: &str) -> Result<(), StoreError> {
        let mut tx = self.db.begin().await?;
        tenant_in(&mut tx, id, true).await?;
        tx.execute("DELETE FROM tenant_keys WHERE tenant_id = $1", args![id])
            .await?;
        tx.execute("DELETE FROM tenants WHERE id = $1", args![id])
            .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn add_key(
        &self,
        tenant: &str,
        hash: &str,
        prefix: &str,
    ) -> Result<TenantKey, StoreError> {
        let mut tx = self.db.begin().await?;
        // The tenant's row, locked: its key creates take turns, so the cap
        // on unrevoked keys is exact, and a delete cannot interleave.
        tenant_in(&mut tx, tenant, true).await?;
        let count = "SELECT count(*) FROM tenant_keys WHERE tenant_id = $1 AND revoked_at IS NULL";
        let n: u64 = tx.query_one(count, args![tenant]).await?.get(0)?;
        if n >= MAX_ACTIVE_KEYS {
            return Err(StoreError::TooManyKeys(tenant.into(), n));
        }
        let k = TenantKey {
            id: format!("key_{:016x}", rand::random::<u64>()),
            tenant: tenant.into(),
            prefix: prefix.into(),
            created_at: now(),
            revoked_at: None,
        };
        let sql = "INSERT INTO tenant_keys (id, tenant_id, hash, prefix, created_at)
             VALUES ($1, $2, $3, $4, $5)";
        tx.execute(sql, args![&k.id, tenant, hash, prefix, &k.created_at])
            .await?;
        tx.commit().await?;
        Ok(k)
    }

    async fn list_keys(&self, tenant: &str) -> Result<Vec<TenantKey>, StoreError> {
        let mut tx = self.db.read().await?;
        tenant_in(&mut tx, tenant, false).await?;
        let sql = format!(
            "SELECT {KEY_COLUMNS} FROM tenant_keys WHERE tenant_id = $1 ORDER BY created_at, id"
        );
        let rows = tx.query(&sql, args![tenant]).await?;
        rows.iter().map(read_key).collect()
    }

    async fn revoke_key(&self, tenant: &str, key: &str) -> Result<TenantKey, StoreError> {
        let mut tx = self.db.begin().await?;
        let sql = "UPDATE tenant_keys SET revoked_at = $3
             WHERE id = $1 AND tenant_id = $2 AND revoked_at IS NULL";
        tx.execute(sql, args![key, tenant, now()]).await?;
        let read =
            format!("SELECT {KEY_COLUMNS} FROM tenant_keys WHERE id = $1 AND tenant_id = $2");
        let k = match tx.query_opt(&read, args![key, tenant]).await? {
            Some(r) => read_key(&r)?,
            None => {
                return Err(StoreError::KeyNotFound {
                    tenant: tenant.into(),
                    key: key.into(),
                })
            }
        };
        tx.commit().await?;
        Ok(k)
    }

    async fn owner(&self, hash: &str) -> Result<Option<KeyOwner>, StoreError> {
        let sql = "SELECT k.id, k.tenant_id FROM tenant_keys k JOIN tenants t ON t.id = k.tenant_id
             WHERE k.hash = $1 AND k.revoked_at IS NULL";
        let row = self.db.query_opt(sql, args![hash]).await?;
        row.map(|r| {
            Ok(KeyOwner {
                key_id: r.get("id")?,
                tenant: r.get("tenant_id")?,
            })
        })
        .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The contract on a SQLite file, opened as two daemons would.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn conformance_on_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hatchery.db");
        crate::store::conformance::run_all(async || Db::sqlite(&path).await.unwrap()).await;
    }
}
