//! The SQLite [`PolicyStore`]: one file, numbered migrations, every
//! multi-step change in one transaction, and triggers that make a written
//! version impossible to update or delete (immutability is enforced by the
//! database, not only by this code).

use crate::compile::Policy;
use crate::document::PolicyDocument;
use crate::record::{decode, encode, new_id, now, VersionRow, SELECT_VERSION};
use crate::standard::{standard_document, STANDARD_ID};
use crate::store::{PolicyStore, PolicySummary, StoreError, StoredPolicy};
use rusqlite::{params, Connection, OptionalExtension, Row};
use std::path::Path;
use std::sync::{Arc, Mutex};

pub use crate::record::{MAX_POLICIES, MAX_VERSIONS};

/// Numbered migrations; `schema_migrations` records which ran. Append only.
const MIGRATIONS: &[&str] = &[
    // 1: policies and their versions.
    "CREATE TABLE policies (
         id TEXT PRIMARY KEY,
         name TEXT NOT NULL,
         latest_version INTEGER NOT NULL,
         builtin INTEGER NOT NULL DEFAULT 0,
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
     CREATE TRIGGER policy_versions_no_update BEFORE UPDATE ON policy_versions
       BEGIN SELECT RAISE(ABORT, 'policy versions are immutable'); END;
     CREATE TRIGGER policy_versions_no_delete BEFORE DELETE ON policy_versions
       BEGIN SELECT RAISE(ABORT, 'policy versions are immutable'); END;",
];

#[derive(Clone)]
pub struct SqlitePolicyStore {
    conn: Arc<Mutex<Connection>>,
}

impl SqlitePolicyStore {
    /// Opens (creating) the file, runs pending migrations and makes sure
    /// `pol_standard` version 1 exists.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let conn = Connection::open(path)?;
        Self::init(conn)
    }

    pub fn open_in_memory() -> Result<Self, StoreError> {
        Self::init(Connection::open_in_memory()?)
    }

    fn init(mut conn: Connection) -> Result<Self, StoreError> {
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "foreign_keys", true)?;
        migrate(&mut conn)?;
        let tx = conn.transaction()?;
        let have: bool = tx
            .query_row(
                "SELECT 1 FROM policies WHERE id = ?1",
                [STANDARD_ID],
                |_| Ok(()),
            )
            .optional()?
            .is_some();
        if !have {
            insert_policy(&tx, STANDARD_ID, &standard_document(), true)?;
        }
        tx.commit()?;
        Ok(SqlitePolicyStore {
            conn: Arc::new(Mutex::new(conn)),
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
        .map_err(|e| StoreError::Task(e.to_string()))?
    }
}

fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)",
    )?;
    let done: i64 = conn.query_row(
        "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
        [],
        |r| r.get(0),
    )?;
    for (i, sql) in MIGRATIONS.iter().enumerate() {
        let n = i as i64 + 1;
        if n <= done {
            continue;
        }
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        tx.execute(
            "INSERT INTO schema_migrations (version, applied_at) VALUES (?1, ?2)",
            params![n, now()],
        )?;
        tx.commit()?;
    }
    Ok(())
}

fn insert_policy(
    tx: &rusqlite::Transaction<'_>,
    id: &str,
    doc: &PolicyDocument,
    builtin: bool,
) -> Result<StoredPolicy, StoreError> {
    let (json, sha) = encode(doc)?;
    let ts = now();
    tx.execute(
        "INSERT INTO policies (id, name, latest_version, builtin, created_at, updated_at)
         VALUES (?1, ?2, 1, ?3, ?4, ?4)",
        params![id, doc.name, builtin, ts],
    )?;
    tx.execute(
        "INSERT INTO policy_versions (policy_id, version, document, sha256, created_at)
         VALUES (?1, 1, ?2, ?3, ?4)",
        params![id, json, sha, ts],
    )?;
    Ok(StoredPolicy {
        id: id.to_string(),
        version: 1,
        created_at: ts,
        sha256: sha,
        builtin,
        document: doc.clone(),
    })
}

fn read_version(r: &Row<'_>) -> rusqlite::Result<VersionRow> {
    Ok(VersionRow {
        id: r.get("policy_id")?,
        version: r.get("version")?,
        document: r.get("document")?,
        sha256: r.get("sha256")?,
        created_at: r.get("created_at")?,
        builtin: r.get("builtin")?,
    })
}

#[async_trait::async_trait]
impl PolicyStore for SqlitePolicyStore {
    async fn create(&self, doc: PolicyDocument) -> Result<StoredPolicy, StoreError> {
        Policy::compile(&doc)?;
        self.with(move |c| {
            let tx = c.transaction()?;
            let n: u64 = tx.query_row("SELECT COUNT(*) FROM policies", [], |r| r.get(0))?;
            if n >= MAX_POLICIES {
                return Err(StoreError::TooMany(n, MAX_POLICIES));
            }
            let p = insert_policy(&tx, &new_id(), &doc, false)?;
            tx.commit()?;
            Ok(p)
        })
        .await
    }

    async fn add_version(&self, id: &str, doc: PolicyDocument) -> Result<StoredPolicy, StoreError> {
        Policy::compile(&doc)?;
        let id = id.to_string();
        self.with(move |c| {
            let tx = c.transaction()?;
            let row: Option<(u32, bool)> = tx
                .query_row(
                    "SELECT latest_version, builtin FROM policies WHERE id = ?1",
                    [&id],
                    |r| Ok((r.get("latest_version")?, r.get("builtin")?)),
                )
                .optional()?;
            let (latest, builtin) = row.ok_or_else(|| StoreError::NotFound(id.clone()))?;
            if builtin {
                return Err(StoreError::ReadOnly(id));
            }
            if latest >= MAX_VERSIONS {
                return Err(StoreError::TooManyVersions(id, latest, MAX_VERSIONS));
            }
            let version = latest + 1;
            let (json, sha) = encode(&doc)?;
            let ts = now();
            tx.execute(
                "INSERT INTO policy_versions (policy_id, version, document, sha256, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![id, version, json, sha, ts],
            )?;
            // Names the version it moves from, so two writers cannot both
            // think they made version N+1.
            let moved = tx.execute(
                "UPDATE policies SET latest_version = ?2, name = ?3, updated_at = ?4
                 WHERE id = ?1 AND latest_version = ?5",
                params![id, version, doc.name, ts, latest],
            )?;
            if moved != 1 {
                return Err(StoreError::Task(format!(
                    "{id}: latest version moved under us"
                )));
            }
            tx.commit()?;
            Ok(StoredPolicy {
                id,
                version,
                created_at: ts,
                sha256: sha,
                builtin: false,
                document: doc,
            })
        })
        .await
    }

    async fn list(&self) -> Result<Vec<PolicySummary>, StoreError> {
        self.with(|c| {
            let mut st = c.prepare(
                "SELECT id, name, latest_version, builtin, created_at, updated_at
                 FROM policies ORDER BY created_at, id",
            )?;
            let rows = st.query_map([], |r| {
                Ok(PolicySummary {
                    id: r.get("id")?,
                    name: r.get("name")?,
                    latest_version: r.get("latest_version")?,
                    builtin: r.get("builtin")?,
                    created_at: r.get("created_at")?,
                    updated_at: r.get("updated_at")?,
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    async fn latest(&self, id: &str) -> Result<StoredPolicy, StoreError> {
        let id = id.to_string();
        self.with(move |c| {
            let sql =
                format!("{SELECT_VERSION} WHERE v.policy_id = ?1 AND v.version = p.latest_version");
            let row = c.query_row(&sql, [&id], read_version).optional()?;
            decode(row.ok_or(StoreError::NotFound(id))?)
        })
        .await
    }

    async fn version(&self, id: &str, version: u32) -> Result<StoredPolicy, StoreError> {
        let id = id.to_string();
        self.with(move |c| {
            let sql = format!("{SELECT_VERSION} WHERE v.policy_id = ?1 AND v.version = ?2");
            match c
                .query_row(&sql, params![id, version], read_version)
                .optional()?
            {
                Some(row) => decode(row),
                None => {
                    let exists = c
                        .query_row("SELECT 1 FROM policies WHERE id = ?1", [&id], |_| Ok(()))
                        .optional()?
                        .is_some();
                    Err(if exists {
                        StoreError::VersionNotFound(id, version)
                    } else {
                        StoreError::NotFound(id)
                    })
                }
            }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn versions_are_numbered_and_immutable() {
        let dir = std::env::temp_dir().join(format!("hatchery-policy-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("policies.db");
        let s = SqlitePolicyStore::open(&path).unwrap();
        let id = crate::conformance::versions(&s).await;
        drop(s);

        // The database itself refuses to rewrite or drop a version.
        let c = Connection::open(&path).unwrap();
        let e = c
            .execute(
                "UPDATE policy_versions SET document = '{}' WHERE policy_id = ?1",
                [&id],
            )
            .unwrap_err();
        assert!(e.to_string().contains("immutable"), "{e}");
        assert!(c.execute("DELETE FROM policy_versions", []).is_err());
        drop(c);
        // Reopening runs no migration twice and keeps the data.
        let s = SqlitePolicyStore::open(&path).unwrap();
        assert_eq!(s.latest(&id).await.unwrap().version, 2);
        assert_eq!(s.latest(STANDARD_ID).await.unwrap().version, 1);
        assert_eq!(s.list().await.unwrap().len(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn concurrent_versions_do_not_collide() {
        let s = SqlitePolicyStore::open_in_memory().unwrap();
        crate::conformance::concurrent_versions(Arc::new(s)).await;
    }
}
