//! [`DbPolicyStore`]: the policies in the deployment's one database
//! (hatchery-db), the same SQL on SQLite and PostgreSQL. Tables
//! `policy_heads` (one row per policy: name, latest version) and
//! `policy_versions` (immutable; a trigger refuses UPDATE and DELETE on
//! both databases, so immutability is the database's rule, not only this
//! code's). Every multi-step change is one transaction.

use crate::compile::Policy;
use crate::document::PolicyDocument;
use crate::standard::{standard_versions, STANDARD_ID};
use crate::store::{PolicyStore, PolicySummary, StoreError, StoredPolicy};
use hatchery_db::{args, copy_table, Db, Import, Migrations, Row, Step, Tx};
use sha2::{Digest, Sha256};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Most policies one store keeps.
pub const MAX_POLICIES: u64 = 10_000;
/// Most versions of one policy.
pub const MAX_VERSIONS: u32 = 10_000;

/// The two tables, the same on both databases.
macro_rules! tables {
    ($if_not_exists:literal) => {
        concat!(
            "CREATE TABLE ",
            $if_not_exists,
            "policy_heads (
                id TEXT PRIMARY KEY,
                name TEXT NOT NULL,
                latest_version INTEGER NOT NULL,
                builtin BOOLEAN NOT NULL DEFAULT FALSE,
                created_at TEXT NOT NULL,
                updated_at TEXT NOT NULL
            );
            CREATE TABLE ",
            $if_not_exists,
            "policy_versions (
                policy_id TEXT NOT NULL REFERENCES policy_heads(id),
                version INTEGER NOT NULL,
                document TEXT NOT NULL,
                sha256 TEXT NOT NULL,
                created_at TEXT NOT NULL,
                PRIMARY KEY (policy_id, version)
            );"
        )
    };
}

/// The policy schema. Append only.
pub static SCHEMA: Migrations = Migrations {
    product: "policy",
    steps: &[
        Step::Each {
            sqlite: concat!(
                tables!(""),
                "CREATE TRIGGER policy_versions_no_update BEFORE UPDATE ON policy_versions
              BEGIN SELECT RAISE(ABORT, 'policy versions are immutable'); END;
            CREATE TRIGGER policy_versions_no_delete BEFORE DELETE ON policy_versions
              BEGIN SELECT RAISE(ABORT, 'policy versions are immutable'); END;"
            ),
            // A database of the previous release already has `policies` and
            // `policy_versions` (and the trigger) from the old PostgreSQL
            // store: renamed and kept, rows included; a new one gets them.
            postgres: concat!(
                "ALTER TABLE IF EXISTS policies RENAME TO policy_heads;",
                tables!("IF NOT EXISTS "),
                "CREATE OR REPLACE FUNCTION policy_versions_immutable() RETURNS trigger
              LANGUAGE plpgsql AS $$
              BEGIN RAISE EXCEPTION 'policy versions are immutable'; END $$;
            DROP TRIGGER IF EXISTS policy_versions_no_change ON policy_versions;
            CREATE TRIGGER policy_versions_no_change BEFORE UPDATE OR DELETE ON policy_versions
              FOR EACH ROW EXECUTE FUNCTION policy_versions_immutable();"
            ),
        },
        // Issue 36: the tenant whose key made the policy (NULL: the
        // operator's, or built in).
        Step::Each {
            sqlite: "ALTER TABLE policy_heads ADD COLUMN tenant TEXT;",
            postgres: "ALTER TABLE policy_heads ADD COLUMN IF NOT EXISTS tenant TEXT;",
        },
    ],
};

/// A single-host data dir of the previous release: DATA_DIR/policies.db.
pub static IMPORT: Import = Import {
    file: "policies.db",
    copy: &[
        // The built-in policy is already there (inserted at open); the old
        // file's copy is the same document at version 1, so it is skipped.
        copy_table!(or ignore "policy_heads", "policies", "id, name, latest_version, builtin, created_at, updated_at"),
        copy_table!(or ignore "policy_versions", "policy_versions", "policy_id, version, document, sha256, created_at"),
    ],
};

#[derive(Clone)]
pub struct DbPolicyStore {
    db: Db,
}

const SELECT_VERSION: &str =
    "SELECT v.policy_id, v.version, v.document, v.sha256, v.created_at, p.builtin, p.tenant
     FROM policy_versions v JOIN policy_heads p ON p.id = v.policy_id";

fn read_version(r: &Row) -> Result<StoredPolicy, StoreError> {
    let id: String = r.get("policy_id")?;
    let version: u32 = r.get("version")?;
    let document = serde_json::from_str(&r.get::<String>("document")?)
        .map_err(|e| StoreError::Corrupt(format!("{id} v{version}: {e}")))?;
    Ok(StoredPolicy {
        id,
        version,
        created_at: r.get("created_at")?,
        sha256: r.get("sha256")?,
        builtin: r.get("builtin")?,
        tenant: r.get("tenant")?,
        document,
    })
}

/// Writes `version` of policy `id`, and at version 1 its head (a later
/// version's head is the caller's).
async fn insert_version(
    tx: &mut Tx,
    id: &str,
    version: u32,
    document: PolicyDocument,
    builtin: bool,
    tenant: Option<&str>,
) -> Result<StoredPolicy, StoreError> {
    let json = serde_json::to_string(&document).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let digest = Sha256::digest(json.as_bytes());
    let sha256 = digest.iter().map(|b| format!("{b:02x}")).collect();
    let now = OffsetDateTime::now_utc();
    let created_at = now.format(&Rfc3339).unwrap_or_default();
    if version == 1 {
        tx.execute(
            "INSERT INTO policy_heads (id, name, latest_version, builtin, created_at, updated_at,
             tenant) VALUES ($1, $2, 1, $3, $4, $4, $5)",
            args![id, &document.name, builtin, &created_at, tenant],
        )
        .await?;
    }
    tx.execute(
        "INSERT INTO policy_versions (policy_id, version, document, sha256, created_at)
         VALUES ($1, $2, $3, $4, $5)",
        args![id, version, json, &sha256, &created_at],
    )
    .await?;
    Ok(StoredPolicy {
        id: id.into(),
        version,
        created_at,
        sha256,
        builtin,
        tenant: tenant.map(str::to_string),
        document,
    })
}

/// Writes the versions of `pol_standard` the database lacks (all of
/// them in a new one; a database of an older build gets the newer ones),
/// so version N is the same document on every deployment. Sessions pinned
/// to an older version keep it; new sessions get the latest.
async fn standard_versions_in(tx: &mut Tx) -> Result<(), StoreError> {
    let head = "SELECT latest_version FROM policy_heads WHERE id = $1";
    let have: u32 = match tx.query_opt(head, args![STANDARD_ID]).await? {
        Some(r) => r.get(0)?,
        None => 0,
    };
    let versions = standard_versions();
    for (i, doc) in versions.into_iter().enumerate() {
        let version = i as u32 + 1;
        if version <= have {
            continue;
        }
        let p = insert_version(tx, STANDARD_ID, version, doc, true, None).await?;
        if version > 1 {
            let set = "UPDATE policy_heads SET latest_version = $2, name = $3, updated_at = $4 \
                       WHERE id = $1";
            tx.execute(
                set,
                args![STANDARD_ID, version, &p.document.name, &p.created_at],
            )
            .await?;
            tracing::info!(version, "pol_standard: version added");
        }
    }
    Ok(())
}

async fn exists(tx: &mut Tx, id: &str) -> Result<bool, StoreError> {
    let sql = "SELECT 1 FROM policy_heads WHERE id = $1";
    Ok(tx.query_opt(sql, args![id]).await?.is_some())
}

impl DbPolicyStore {
    /// Runs the policy migrations not yet run and makes sure
    /// `pol_standard` version 1 exists (once, however many daemons start
    /// at the same time).
    pub async fn open(db: Db) -> Result<Self, StoreError> {
        db.migrate(&SCHEMA).await?;
        let mut tx = db.begin().await?;
        tx.lock("policy_heads").await?;
        standard_versions_in(&mut tx).await?;
        tx.commit().await?;
        Ok(DbPolicyStore { db })
    }

    /// A scratch database (tests).
    pub async fn scratch() -> Result<Self, StoreError> {
        Self::open(hatchery_db::Db::sqlite_memory()?).await
    }

    /// The policy schema's version in the database.
    pub async fn schema_version(&self) -> Result<u64, StoreError> {
        Ok(SCHEMA.check(&self.db).await?)
    }
}

#[async_trait::async_trait]
impl PolicyStore for DbPolicyStore {
    async fn create(
        &self,
        doc: PolicyDocument,
        tenant: Option<&str>,
    ) -> Result<StoredPolicy, StoreError> {
        Policy::compile(&doc)?;
        let mut tx = self.db.begin().await?;
        // Creates take turns, so the cap on the number of policies is exact.
        tx.lock("policy_heads").await?;
        let count = "SELECT count(*) FROM policy_heads";
        let n: u64 = tx.query_one(count, args![]).await?.get(0)?;
        if n >= MAX_POLICIES {
            return Err(StoreError::TooMany(n, MAX_POLICIES));
        }
        let id = format!("pol_{:016x}", rand::random::<u64>());
        let p = insert_version(&mut tx, &id, 1, doc, false, tenant).await?;
        tx.commit().await?;
        Ok(p)
    }

    async fn add_version(&self, id: &str, doc: PolicyDocument) -> Result<StoredPolicy, StoreError> {
        Policy::compile(&doc)?;
        let mut tx = self.db.begin().await?;
        let head =
            "SELECT latest_version, builtin, tenant FROM policy_heads WHERE id = $1 FOR UPDATE";
        let row = tx.query_opt(head, args![id]).await?;
        let row = row.ok_or_else(|| StoreError::NotFound(id.into()))?;
        let (latest, builtin): (u32, bool) = (row.get(0)?, row.get(1)?);
        let tenant: Option<String> = row.get(2)?;
        if builtin {
            return Err(StoreError::ReadOnly(id.into()));
        }
        if latest >= MAX_VERSIONS {
            return Err(StoreError::TooManyVersions(id.into(), latest, MAX_VERSIONS));
        }
        let p = insert_version(&mut tx, id, latest + 1, doc, false, tenant.as_deref()).await?;
        // Names the version it moves from, so two writers cannot both
        // think they made version N+1.
        let set = "UPDATE policy_heads SET latest_version = $2, name = $3, updated_at = $4
             WHERE id = $1 AND latest_version = $5";
        let a = args![id, p.version, &p.document.name, &p.created_at, latest];
        if tx.execute(set, a).await? != 1 {
            return Err(StoreError::Raced(id.into()));
        }
        tx.commit().await?;
        Ok(p)
    }

    async fn list(&self) -> Result<Vec<PolicySummary>, StoreError> {
        let order = "ORDER BY created_at, id";
        Ok(self.db.select(order, args![]).await?)
    }

    async fn latest(&self, id: &str) -> Result<StoredPolicy, StoreError> {
        let sql =
            format!("{SELECT_VERSION} WHERE v.policy_id = $1 AND v.version = p.latest_version");
        match self.db.query_opt(&sql, args![id]).await? {
            Some(r) => read_version(&r),
            None => Err(StoreError::NotFound(id.into())),
        }
    }

    async fn version(&self, id: &str, version: u32) -> Result<StoredPolicy, StoreError> {
        let mut tx = self.db.read().await?;
        let sql = format!("{SELECT_VERSION} WHERE v.policy_id = $1 AND v.version = $2");
        if let Some(r) = tx.query_opt(&sql, args![id, version]).await? {
            return read_version(&r);
        }
        Err(if exists(&mut tx, id).await? {
            StoreError::VersionNotFound(id.into(), version)
        } else {
            StoreError::NotFound(id.into())
        })
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

    /// The previous release's DATA_DIR/policies.db (its final schema, as
    /// the old SQLite store made it), imported whole, once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_previous_release_policies_file_is_imported() {
        let dir = tempfile::tempdir().unwrap();
        let old = rusqlite::Connection::open(dir.path().join("policies.db")).unwrap();
        let a = r#"{"name":"a","rules":[{"id":"r","effect":"allow"}]}"#;
        let b = r#"{"name":"b","rules":[{"id":"r","effect":"deny"}]}"#;
        let id = "pol_00000000000000aa";
        old.execute_batch(&format!(
            "CREATE TABLE policies (id TEXT PRIMARY KEY, name TEXT NOT NULL,
                 latest_version INTEGER NOT NULL, builtin INTEGER NOT NULL DEFAULT 0,
                 created_at TEXT NOT NULL, updated_at TEXT NOT NULL);
             CREATE TABLE policy_versions (policy_id TEXT NOT NULL REFERENCES policies(id),
                 version INTEGER NOT NULL, document TEXT NOT NULL, sha256 TEXT NOT NULL,
                 created_at TEXT NOT NULL, PRIMARY KEY (policy_id, version));
             INSERT INTO policies VALUES ('{id}', 'b', 2, 0, 't1', 't2');
             INSERT INTO policy_versions VALUES ('{id}', 1, '{a}', 'x', 't'),
                 ('{id}', 2, '{b}', 'x', 't');"
        ))
        .unwrap();
        drop(old);
        let db = Db::sqlite(&dir.path().join("hatchery.db")).await.unwrap();
        let s = DbPolicyStore::open(db.clone()).await.unwrap();
        let import = || db.import_sqlite(dir.path(), &IMPORT);
        assert_eq!(import().await.unwrap(), hatchery_db::Imported::Now);
        assert_eq!(import().await.unwrap(), hatchery_db::Imported::Before);
        let (v1, p) = (s.version(id, 1).await.unwrap(), s.latest(id).await.unwrap());
        assert_eq!((v1.document.name.as_str(), v1.version), ("a", 1));
        assert_eq!((p.document.name.as_str(), p.version), ("b", 2));
        let listed = s.list().await.unwrap();
        assert_eq!(listed.len(), 2, "the import and pol_standard");
    }
}
