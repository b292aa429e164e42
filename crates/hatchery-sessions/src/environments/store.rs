//! The environments' tables in the deployment's one database (SQLite or
//! PostgreSQL, the same SQL): `environments` (one row per environment, its
//! spec as JSON) and `environment_versions` (one immutable row per built
//! version). Product `environment` in hatchery-db's migration runner.

use super::models::*;
use super::EnvError;
use crate::state::SessionState;
use hatchery_db::{args, Db, Migrations, Row, Step};

/// Append only: a released step is never edited.
pub static SCHEMA: Migrations = Migrations {
    product: "environment",
    steps: &[
        Step::Both(
            "CREATE TABLE environments (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            spec TEXT NOT NULL,
            created_at TEXT NOT NULL,
            current_version BIGINT,
            last_version BIGINT NOT NULL DEFAULT 0,
            last_error TEXT
        );
        CREATE TABLE environment_versions (
            environment_id TEXT NOT NULL REFERENCES environments(id),
            version BIGINT NOT NULL,
            snapshot_id TEXT NOT NULL,
            base_commit TEXT NOT NULL,
            template TEXT NOT NULL,
            built_at TEXT NOT NULL,
            build_ms BIGINT NOT NULL,
            PRIMARY KEY (environment_id, version)
        );",
        ),
        // The template version a build started from and why it ran
        // (template-change rebuilds).
        Step::Both(
            "ALTER TABLE environment_versions ADD COLUMN template_version TEXT;
         ALTER TABLE environment_versions ADD COLUMN reason TEXT NOT NULL DEFAULT 'requested';",
        ),
        // Issue 36: the tenant whose key made the environment (NULL: the
        // operator's); a tenant key reaches only its own.
        Step::Each {
            sqlite: "ALTER TABLE environments ADD COLUMN tenant TEXT;",
            postgres: "ALTER TABLE environments ADD COLUMN IF NOT EXISTS tenant TEXT;",
        },
    ],
};

/// A row of `environments` with its kept versions.
#[derive(Debug, Clone)]
pub struct EnvRecord {
    pub id: String,
    pub name: String,
    pub spec: EnvSpec,
    pub created_at: String,
    /// The tenant whose key made it; `None`: the operator's.
    pub tenant: Option<String>,
    pub current_version: Option<u64>,
    pub last_error: Option<String>,
    /// Newest first.
    pub versions: Vec<EnvVersion>,
}

impl EnvRecord {
    pub fn current(&self) -> Option<&EnvVersion> {
        let v = self.current_version?;
        self.versions.iter().find(|x| x.version == v)
    }
}

#[derive(Clone)]
pub struct EnvStore {
    db: Db,
}

fn now() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

fn version_of(r: &Row) -> Result<EnvVersion, EnvError> {
    Ok(EnvVersion {
        version: r.get("version")?,
        snapshot_id: r.get("snapshot_id")?,
        base_commit: r.get("base_commit")?,
        template: r.get("template")?,
        built_at: r.get("built_at")?,
        build_ms: r.get("build_ms")?,
        template_version: r.get("template_version")?,
        reason: BuildReason::parse(&r.get::<String>("reason")?),
    })
}

/// What a build made, to record as a version.
#[derive(Debug, Clone)]
pub struct NewVersion<'a> {
    pub snapshot_id: &'a str,
    pub base_commit: &'a str,
    pub template: &'a str,
    pub template_version: Option<&'a str>,
    pub reason: BuildReason,
    pub build_ms: u64,
}

/// The states of sessions that may still start or resume.
fn unfinished_sql() -> String {
    let ended: Vec<String> = [
        SessionState::Completed,
        SessionState::Failed,
        SessionState::Cancelled,
    ]
    .iter()
    .map(|s| format!("'{}'", s.as_str()))
    .collect();
    format!("state NOT IN ({})", ended.join(","))
}

impl EnvStore {
    /// The store on `db`, its migrations run.
    pub async fn open(db: Db) -> Result<Self, EnvError> {
        db.migrate(&SCHEMA).await?;
        Ok(EnvStore { db })
    }

    /// Inserts a new environment; refused past [`MAX_ENVIRONMENTS`]
    /// (counted in the writing transaction).
    pub async fn insert(
        &self,
        id: &str,
        name: &str,
        spec: &EnvSpec,
        tenant: Option<&str>,
    ) -> Result<(), EnvError> {
        let mut tx = self.db.begin().await?;
        tx.lock("environments").await?;
        let n: u64 = tx
            .query_one("SELECT COUNT(*) AS n FROM environments", args![])
            .await?
            .get("n")?;
        if n >= MAX_ENVIRONMENTS {
            return Err(EnvError::TooMany(n));
        }
        let spec = serde_json::to_string(spec).map_err(EnvError::Data)?;
        tx.execute(
            "INSERT INTO environments (id, name, spec, created_at, tenant) \
             VALUES ($1, $2, $3, $4, $5)",
            args![id, name, spec, now(), tenant],
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    pub async fn get(&self, id: &str) -> Result<Option<EnvRecord>, EnvError> {
        let Some(r) = self
            .db
            .query_opt("SELECT * FROM environments WHERE id = $1", args![id])
            .await?
        else {
            return Ok(None);
        };
        Ok(Some(self.record(&r).await?))
    }

    pub async fn list(&self) -> Result<Vec<EnvRecord>, EnvError> {
        let rows = self
            .db
            .query(
                "SELECT * FROM environments ORDER BY created_at, id",
                args![],
            )
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            out.push(self.record(r).await?);
        }
        Ok(out)
    }

    async fn record(&self, r: &Row) -> Result<EnvRecord, EnvError> {
        let id: String = r.get("id")?;
        let spec: String = r.get("spec")?;
        let versions = self
            .db
            .query(
                "SELECT * FROM environment_versions WHERE environment_id = $1 ORDER BY version DESC",
                args![&id],
            )
            .await?
            .iter()
            .map(version_of)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(EnvRecord {
            name: r.get("name")?,
            spec: serde_json::from_str(&spec).map_err(EnvError::Data)?,
            created_at: r.get("created_at")?,
            tenant: r.get("tenant")?,
            current_version: r.get("current_version")?,
            last_error: r.get("last_error")?,
            versions,
            id,
        })
    }

    /// Records a built version and makes it current, in one transaction;
    /// returns its number. `Ok(None)` when the environment was deleted
    /// meanwhile (the caller then deletes the snapshot).
    pub async fn add_version(
        &self,
        id: &str,
        n: NewVersion<'_>,
    ) -> Result<Option<EnvVersion>, EnvError> {
        let mut tx = self.db.begin().await?;
        let Some(r) = tx
            .query_opt(
                "SELECT last_version FROM environments WHERE id = $1 FOR UPDATE",
                args![id],
            )
            .await?
        else {
            return Ok(None);
        };
        let last: u64 = r.get("last_version")?;
        let v = EnvVersion {
            version: last + 1,
            snapshot_id: n.snapshot_id.into(),
            base_commit: n.base_commit.into(),
            template: n.template.into(),
            template_version: n.template_version.map(str::to_string),
            reason: n.reason,
            built_at: now(),
            build_ms: n.build_ms,
        };
        tx.execute(
            "INSERT INTO environment_versions (environment_id, version, snapshot_id, base_commit, \
             template, built_at, build_ms, template_version, reason) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            args![
                id,
                v.version as i64,
                n.snapshot_id,
                n.base_commit,
                n.template,
                v.built_at.clone(),
                n.build_ms as i64,
                v.template_version.clone(),
                n.reason.as_str()
            ],
        )
        .await?;
        tx.execute(
            "UPDATE environments SET last_version = $2, current_version = $2, last_error = NULL \
             WHERE id = $1",
            args![id, v.version as i64],
        )
        .await?;
        tx.commit().await?;
        Ok(Some(v))
    }

    /// Notes why the last build failed (the current version stays).
    pub async fn set_error(&self, id: &str, message: &str) -> Result<(), EnvError> {
        self.db
            .execute(
                "UPDATE environments SET last_error = $2 WHERE id = $1",
                args![id, message],
            )
            .await?;
        Ok(())
    }

    /// The snapshots unfinished sessions pinned, of environment `id`
    /// (every unfinished session's spec is read: they are bounded by the
    /// hosts' capacity, and the pin lives in the spec's JSON).
    async fn pinned(tx: &mut hatchery_db::Tx, id: &str) -> Result<Vec<(String, EnvPin)>, EnvError> {
        let sql = format!("SELECT id, spec FROM sessions WHERE {}", unfinished_sql());
        let mut out = Vec::new();
        for r in tx.query(&sql, args![]).await? {
            let spec: String = r.get("spec")?;
            let v: serde_json::Value = serde_json::from_str(&spec).map_err(EnvError::Data)?;
            let Some(pin) = v.get("environment") else {
                continue;
            };
            if pin.is_null() {
                continue;
            }
            let pin: EnvPin = serde_json::from_value(pin.clone()).map_err(EnvError::Data)?;
            if pin.environment_id == id {
                out.push((r.get("id")?, pin));
            }
        }
        Ok(out)
    }

    /// Deletes the environment and its version rows unless an unfinished
    /// session uses it (409); returns the snapshots to delete.
    pub async fn delete(&self, id: &str) -> Result<Vec<String>, EnvError> {
        let mut tx = self.db.begin().await?;
        if tx
            .query_opt(
                "SELECT id FROM environments WHERE id = $1 FOR UPDATE",
                args![id],
            )
            .await?
            .is_none()
        {
            return Err(EnvError::NotFound(id.into()));
        }
        let users = Self::pinned(&mut tx, id).await?;
        if let Some((session, _)) = users.first() {
            return Err(EnvError::Conflict(format!(
                "environment {id} is used by {} unfinished session(s), {session} first",
                users.len()
            )));
        }
        let snaps: Vec<String> = tx
            .query(
                "SELECT snapshot_id FROM environment_versions WHERE environment_id = $1",
                args![id],
            )
            .await?
            .iter()
            .map(|r| r.get("snapshot_id"))
            .collect::<Result<_, _>>()?;
        tx.execute(
            "DELETE FROM environment_versions WHERE environment_id = $1",
            args![id],
        )
        .await?;
        tx.execute("DELETE FROM environments WHERE id = $1", args![id])
            .await?;
        tx.commit().await?;
        Ok(snaps)
    }

    /// Drops the versions older than the newest [`KEEP_VERSIONS`] that no
    /// unfinished session pinned; returns their snapshots.
    pub async fn prune(&self, id: &str) -> Result<Vec<String>, EnvError> {
        let mut tx = self.db.begin().await?;
        let Some(r) = tx
            .query_opt(
                "SELECT last_version FROM environments WHERE id = $1 FOR UPDATE",
                args![id],
            )
            .await?
        else {
            return Ok(vec![]);
        };
        let last: u64 = r.get("last_version")?;
        let keep_from = last.saturating_sub(KEEP_VERSIONS - 1);
        let pinned: Vec<u64> = Self::pinned(&mut tx, id)
            .await?
            .into_iter()
            .map(|(_, p)| p.version)
            .collect();
        let old = tx
            .query(
                "SELECT * FROM environment_versions WHERE environment_id = $1 AND version < $2",
                args![id, keep_from as i64],
            )
            .await?;
        let mut gone = Vec::new();
        for r in &old {
            let v = version_of(r)?;
            if pinned.contains(&v.version) {
                continue;
            }
            tx.execute(
                "DELETE FROM environment_versions WHERE environment_id = $1 AND version = $2",
                args![id, v.version as i64],
            )
            .await?;
            gone.push(v.snapshot_id);
        }
        tx.commit().await?;
        Ok(gone)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::store::{DbSessionStore, SessionStore};

    /// An environment's spec for tests (also the service's).
    pub(crate) fn spec() -> EnvSpec {
        EnvSpec {
            repo: "git://127.0.0.1/r.git".into(),
            git_ref: "main".into(),
            template: "code-interpreter".into(),
            setup: String::new(),
            setup_allow: vec![],
            setup_timeout_s: 60,
            pool_size: DEFAULT_POOL_SIZE,
        }
    }

    fn nv(snapshot_id: &str) -> NewVersion<'_> {
        NewVersion {
            snapshot_id,
            base_commit: "c0ffee",
            template: "code-interpreter",
            template_version: Some("7"),
            reason: BuildReason::Requested,
            build_ms: 5,
        }
    }

    #[tokio::test]
    async fn versions_prune_and_a_pinned_environment_is_not_deleted() {
        let d = tempfile::tempdir().unwrap();
        let db = Db::sqlite(&d.path().join("hatchery.db")).await.unwrap();
        let sessions = DbSessionStore::open(db.clone(), "local").await.unwrap();
        let s = EnvStore::open(db).await.unwrap();
        s.insert("env_a", "a", &spec(), None).await.unwrap();
        s.insert("env_b", "b", &spec(), Some("ten_b"))
            .await
            .unwrap();
        let r = s.get("env_a").await.unwrap().unwrap();
        assert!(r.current().is_none() && r.versions.is_empty());
        // Who made it is stored (issue 36): NULL is the operator.
        assert_eq!(r.tenant, None);
        let b = s.get("env_b").await.unwrap().unwrap();
        assert_eq!(b.tenant.as_deref(), Some("ten_b"));
        for i in 1..=3 {
            let v = s
                .add_version("env_a", nv(&format!("snap{i}")))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(v.version, i);
        }
        // The newest two stay.
        assert_eq!(s.prune("env_a").await.unwrap(), vec!["snap1".to_string()]);
        let r = s.get("env_a").await.unwrap().unwrap();
        assert_eq!(r.current().unwrap().version, 3);
        assert_eq!(
            r.versions.iter().map(|v| v.version).collect::<Vec<_>>(),
            [3, 2]
        );
        // A queued session pinned version 2: the environment cannot be
        // deleted, and version 2 outlives its turn.
        let mut spec = crate::store::conformance::spec("git://127.0.0.1/r.git");
        spec.environment = Some(EnvPin {
            environment_id: "env_a".into(),
            version: 2,
            snapshot_id: "snap2".into(),
            base_commit: "c0ffee".into(),
        });
        sessions.create("ses_x", &spec, None, "h").await.unwrap();
        assert!(matches!(
            s.delete("env_a").await,
            Err(EnvError::Conflict(_))
        ));
        s.add_version("env_a", nv("snap4")).await.unwrap();
        assert!(s.prune("env_a").await.unwrap().is_empty());
        assert_eq!(s.get("env_a").await.unwrap().unwrap().versions.len(), 3);
        // Another environment is not held by it; its rows go.
        s.add_version("env_b", nv("snapb")).await.unwrap();
        assert_eq!(s.delete("env_b").await.unwrap(), vec!["snapb".to_string()]);
        assert!(s.get("env_b").await.unwrap().is_none());
        assert!(matches!(
            s.delete("env_b").await,
            Err(EnvError::NotFound(_))
        ));
        // A version for a deleted environment is not recorded.
        assert!(s.add_version("env_b", nv("late")).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn the_environment_cap_is_exact() {
        let d = tempfile::tempdir().unwrap();
        let db = Db::sqlite(&d.path().join("hatchery.db")).await.unwrap();
        let s = EnvStore::open(db).await.unwrap();
        for i in 0..MAX_ENVIRONMENTS {
            s.insert(&format!("env_{i}"), "n", &spec(), None)
                .await
                .unwrap();
        }
        assert!(matches!(
            s.insert("env_over", "n", &spec(), None).await,
            Err(EnvError::TooMany(_))
        ));
        assert_eq!(s.list().await.unwrap().len() as u64, MAX_ENVIRONMENTS);
    }
}
