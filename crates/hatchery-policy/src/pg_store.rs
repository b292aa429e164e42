//! The PostgreSQL [`PolicyStore`], for many hosts on one database: every
//! daemon reads and writes the same policies, so a session pinned to
//! `(id, version)` finds it on whichever host runs it, before and after a
//! move. Same contract as the SQLite store (crate::conformance): numbered
//! migrations under an advisory lock, every multi-step change in one
//! transaction, and a trigger that makes a written version impossible to
//! update or delete.

use crate::compile::Policy;
use crate::document::PolicyDocument;
use crate::record::{
    decode, encode, new_id, now, VersionRow, MAX_POLICIES, MAX_VERSIONS, SELECT_VERSION,
};
use crate::standard::{standard_document, STANDARD_ID};
use crate::store::{PolicyStore, PolicySummary, StoreError, StoredPolicy};
use deadpool_postgres::{GenericClient, Pool};
use tokio_postgres::Row;

/// Numbered migrations; `policy_schema` holds one row per migration run.
/// Append only.
const MIGRATIONS: &[&str] = &[
    // 1: policies and their versions, versions immutable.
    "CREATE TABLE policies (
         id TEXT PRIMARY KEY,
         name TEXT NOT NULL,
         latest_version INTEGER NOT NULL,
         builtin BOOLEAN NOT NULL DEFAULT false,
         created_at TEXT NOT NULL,
         updated_at TEXT NOT NULL
     );
     CREATE TABLE policy_versions (
         policy_id TEXT NOT NULL REFERENCES policies(id),
         version INTEGER NOT NULL,
         document TEXT NOT NULL,
         sha256 TEXT NOT NULL,
         created_at TEXT NOT NULL,
         PRIMARY KEY (policy_id, version)
     );
     CREATE FUNCTION policy_versions_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
       BEGIN RAISE EXCEPTION 'policy versions are immutable'; END $$;
     CREATE TRIGGER policy_versions_no_change BEFORE UPDATE OR DELETE ON policy_versions
       FOR EACH ROW EXECUTE FUNCTION policy_versions_immutable();",
];

/// Serializes migrations (and the built-in's insert) across daemons that
/// start at once. Any fixed number not used by another store.
const MIGRATION_LOCK: i64 = 0x6873_706f_6c69_6379;
const SCHEMA: hatchery_store::PgMigrations = hatchery_store::PgMigrations {
    name: "policies",
    table: "policy_schema",
    lock: MIGRATION_LOCK,
    steps: MIGRATIONS,
};

fn migrate_err(e: hatchery_store::MigrateError) -> StoreError {
    if e.unavailable() {
        StoreError::Unavailable(e.to_string())
    } else {
        StoreError::Backend(e.to_string())
    }
}

/// Serializes creates, so the cap on the number of policies is exact.
const CREATE_LOCK: i64 = 0x6873_706f_6c63_7265;

#[derive(Clone)]
pub struct PgPolicyStore {
    pool: Pool,
}

/// A driver error, named by what was being done: `Unavailable` (503,
/// retryable) when the database is not there, `Backend` otherwise.
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

fn read_version(r: &Row) -> Result<VersionRow, StoreError> {
    let version: i32 = r.try_get("version").map_err(pg("read version"))?;
    Ok(VersionRow {
        id: r.try_get("policy_id").map_err(pg("read version"))?,
        version: version.max(0) as u32,
        document: r.try_get("document").map_err(pg("read version"))?,
        sha256: r.try_get("sha256").map_err(pg("read version"))?,
        created_at: r.try_get("created_at").map_err(pg("read version"))?,
        builtin: r.try_get("builtin").map_err(pg("read version"))?,
    })
}

async fn insert_policy(
    tx: &deadpool_postgres::Transaction<'_>,
    id: &str,
    doc: &PolicyDocument,
    builtin: bool,
) -> Result<StoredPolicy, StoreError> {
    let (json, sha) = encode(doc)?;
    let ts = now();
    tx.execute(
        "INSERT INTO policies (id, name, latest_version, builtin, created_at, updated_at)
         VALUES ($1, $2, 1, $3, $4, $4)",
        &[&id, &doc.name, &builtin, &ts],
    )
    .await
    .map_err(pg("insert policy"))?;
    tx.execute(
        "INSERT INTO policy_versions (policy_id, version, document, sha256, created_at)
         VALUES ($1, 1, $2, $3, $4)",
        &[&id, &json, &sha, &ts],
    )
    .await
    .map_err(pg("insert version"))?;
    Ok(StoredPolicy {
        id: id.to_string(),
        version: 1,
        created_at: ts,
        sha256: sha,
        builtin,
        document: doc.clone(),
    })
}

impl PgPolicyStore {
    /// `dsn`: a `postgres://` URL or a libpq string. Connects, runs the
    /// migrations not yet run and makes sure `pol_standard` version 1
    /// exists. A server that is not there is `Unavailable` within the
    /// pool's connect timeout, never a hang.
    pub async fn connect(dsn: &str, pool_size: usize) -> Result<Self, StoreError> {
        let pool = hatchery_store::pg_pool(dsn, pool_size)
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        let s = PgPolicyStore { pool };
        s.migrate().await?;
        Ok(s)
    }

    async fn client(&self) -> Result<deadpool_postgres::Client, StoreError> {
        self.pool
            .get()
            .await
            .map_err(|e| StoreError::Unavailable(format!("policy store: {e}")))
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(pg("begin migration"))?;
        SCHEMA.run(&tx).await.map_err(migrate_err)?;
        let have = tx
            .query_opt("SELECT 1 FROM policies WHERE id = $1", &[&STANDARD_ID])
            .await
            .map_err(pg("find built-in"))?
            .is_some();
        if !have {
            insert_policy(&tx, STANDARD_ID, &standard_document(), true).await?;
        }
        tx.commit().await.map_err(pg("commit migration"))
    }

    /// How many migrations the database has recorded.
    pub async fn schema_version(&self) -> Result<u64, StoreError> {
        let c = self.client().await?;
        SCHEMA.version(&c).await.map_err(migrate_err)
    }
}

#[async_trait::async_trait]
impl PolicyStore for PgPolicyStore {
    async fn create(&self, doc: PolicyDocument) -> Result<StoredPolicy, StoreError> {
        Policy::compile(&doc)?;
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(pg("begin"))?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&CREATE_LOCK])
            .await
            .map_err(pg("create lock"))?;
        let n: i64 = tx
            .query_one("SELECT count(*) AS n FROM policies", &[])
            .await
            .map_err(pg("count policies"))?
            .get("n");
        let n = n.max(0) as u64;
        if n >= MAX_POLICIES {
            return Err(StoreError::TooMany(n, MAX_POLICIES));
        }
        let p = insert_policy(&tx, &new_id(), &doc, false).await?;
        tx.commit().await.map_err(pg("commit"))?;
        Ok(p)
    }

    async fn add_version(&self, id: &str, doc: PolicyDocument) -> Result<StoredPolicy, StoreError> {
        Policy::compile(&doc)?;
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(pg("begin"))?;
        // The row lock orders concurrent writers of one policy: each reads
        // the version the previous one committed, so none collide.
        let row = tx
            .query_opt(
                "SELECT latest_version, builtin FROM policies WHERE id = $1 FOR UPDATE",
                &[&id],
            )
            .await
            .map_err(pg("lock policy"))?
            .ok_or_else(|| StoreError::NotFound(id.to_string()))?;
        let latest: i32 = row.get("latest_version");
        let builtin: bool = row.get("builtin");
        if builtin {
            return Err(StoreError::ReadOnly(id.to_string()));
        }
        let latest = latest.max(0) as u32;
        if latest >= MAX_VERSIONS {
            return Err(StoreError::TooManyVersions(
                id.to_string(),
                latest,
                MAX_VERSIONS,
            ));
        }
        let version = latest + 1;
        let (json, sha) = encode(&doc)?;
        let ts = now();
        tx.execute(
            "INSERT INTO policy_versions (policy_id, version, document, sha256, created_at)
             VALUES ($1, $2, $3, $4, $5)",
            &[&id, &(version as i32), &json, &sha, &ts],
        )
        .await
        .map_err(pg("insert version"))?;
        tx.execute(
            "UPDATE policies SET latest_version = $2, name = $3, updated_at = $4
             WHERE id = $1 AND latest_version = $5",
            &[&id, &(version as i32), &doc.name, &ts, &(latest as i32)],
        )
        .await
        .map_err(pg("move latest"))?;
        tx.commit().await.map_err(pg("commit"))?;
        Ok(StoredPolicy {
            id: id.to_string(),
            version,
            created_at: ts,
            sha256: sha,
            builtin: false,
            document: doc,
        })
    }

    async fn list(&self) -> Result<Vec<PolicySummary>, StoreError> {
        let c = self.client().await?;
        let rows = c
            .query(
                "SELECT id, name, latest_version, builtin, created_at, updated_at
                 FROM policies ORDER BY created_at, id",
                &[],
            )
            .await
            .map_err(pg("list policies"))?;
        rows.iter()
            .map(|r| {
                let v: i32 = r.try_get("latest_version").map_err(pg("read policy"))?;
                Ok(PolicySummary {
                    id: r.try_get("id").map_err(pg("read policy"))?,
                    name: r.try_get("name").map_err(pg("read policy"))?,
                    latest_version: v.max(0) as u32,
                    builtin: r.try_get("builtin").map_err(pg("read policy"))?,
                    created_at: r.try_get("created_at").map_err(pg("read policy"))?,
                    updated_at: r.try_get("updated_at").map_err(pg("read policy"))?,
                })
            })
            .collect()
    }

    async fn latest(&self, id: &str) -> Result<StoredPolicy, StoreError> {
        let c = self.client().await?;
        let sql =
            format!("{SELECT_VERSION} WHERE v.policy_id = $1 AND v.version = p.latest_version");
        let row = c
            .query_opt(&sql, &[&id])
            .await
            .map_err(pg("read latest"))?
            .ok_or_else(|| StoreError::NotFound(id.to_string()))?;
        decode(read_version(&row)?)
    }

    async fn version(&self, id: &str, version: u32) -> Result<StoredPolicy, StoreError> {
        let c = self.client().await?;
        let sql = format!("{SELECT_VERSION} WHERE v.policy_id = $1 AND v.version = $2");
        let v = i32::try_from(version).unwrap_or(i32::MAX);
        if let Some(row) = c
            .query_opt(&sql, &[&id, &v])
            .await
            .map_err(pg("read version"))?
        {
            return decode(read_version(&row)?);
        }
        let exists = c
            .query_opt("SELECT 1 FROM policies WHERE id = $1", &[&id])
            .await
            .map_err(pg("find policy"))?
            .is_some();
        Err(if exists {
            StoreError::VersionNotFound(id.to_string(), version)
        } else {
            StoreError::NotFound(id.to_string())
        })
    }
}
