//! The `secrets` table in the deployment's one database: name, the sealed
//! value, the sealing key's id, the value's length and times. The same SQL
//! on SQLite and PostgreSQL; one statement per change.

use crate::key::SecretKey;
use crate::seal::{self, SealError};
use hatchery_db::{args, Db, DbError, Migrations, Step};
use serde::Serialize;
use std::sync::Arc;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;
use utoipa::ToSchema;
use zeroize::Zeroizing;

/// Most secrets one deployment keeps.
pub const MAX_SECRETS: u64 = 1000;
/// Largest value, in bytes. Values go into request headers, so they are
/// printable ASCII (no CR, LF or other control bytes: a value cannot add
/// a header of its own).
pub const MAX_VALUE_BYTES: usize = 4096;

/// The secrets schema. Append only.
pub static SCHEMA: Migrations = Migrations {
    product: "secrets",
    steps: &[Step::Both(
        "CREATE TABLE secrets (
            name TEXT PRIMARY KEY,
            sealed BYTEA NOT NULL,
            key_id TEXT NOT NULL,
            bytes INTEGER NOT NULL,
            created_at TEXT NOT NULL
        );",
    )],
};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("secret {0:?} not found")]
    NotFound(String),
    #[error("secret {0:?} already exists; delete it first to replace it")]
    Exists(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0} secrets stored; at most {MAX_SECRETS}")]
    TooMany(u64),
    #[error("secret {name:?} was sealed with key {stored}, not the key file's {current}")]
    WrongKey {
        name: String,
        stored: String,
        current: String,
    },
    #[error("secret {0:?}")]
    Seal(String, #[source] SealError),
    #[error("secrets database")]
    Db(#[from] DbError),
    #[error("secrets schema")]
    Schema(#[from] hatchery_db::MigrateError),
}

/// What the API shows of a secret: never its value.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct SecretInfo {
    pub name: String,
    /// The value's length in bytes.
    pub bytes: u64,
    pub created_at: String,
}

/// The store and the key it seals with.
#[derive(Clone)]
pub struct Secrets {
    db: Db,
    key: Arc<SecretKey>,
}

/// The checks on a value at the edge.
pub fn check_value(value: &str) -> Result<(), StoreError> {
    if value.is_empty() || value.len() > MAX_VALUE_BYTES {
        return Err(StoreError::Invalid(format!(
            "value must be 1–{MAX_VALUE_BYTES} bytes"
        )));
    }
    if !value.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Err(StoreError::Invalid(
            "value must be printable ASCII (no control characters, no line breaks)".into(),
        ));
    }
    Ok(())
}

pub fn check_name(name: &str) -> Result<(), StoreError> {
    if hatchery_policy::credential::valid_secret_name(name) {
        Ok(())
    } else {
        Err(StoreError::Invalid(
            "name must be 1–64 characters of [A-Za-z0-9_.-]".into(),
        ))
    }
}

impl Secrets {
    /// Runs the migrations not yet run.
    pub async fn open(db: Db, key: SecretKey) -> Result<Secrets, StoreError> {
        db.migrate(&SCHEMA).await?;
        Ok(Secrets {
            db,
            key: Arc::new(key),
        })
    }

    pub async fn create(&self, name: &str, value: &str) -> Result<SecretInfo, StoreError> {
        check_name(name)?;
        check_value(value)?;
        let sealed = seal::seal(&self.key, name, value.as_bytes())
            .map_err(|e| StoreError::Seal(name.into(), e))?;
        let created_at = OffsetDateTime::now_utc()
            .format(&Rfc3339)
            .unwrap_or_default();
        let mut tx = self.db.begin().await?;
        // Creates take turns, so the cap is exact.
        tx.lock("secrets").await?;
        let n: u64 = tx
            .query_one("SELECT count(*) FROM secrets", args![])
            .await?
            .get(0)?;
        if n >= MAX_SECRETS {
            return Err(StoreError::TooMany(n));
        }
        let insert = "INSERT INTO secrets (name, sealed, key_id, bytes, created_at)
                      VALUES ($1, $2, $3, $4, $5)";
        let bytes = value.len() as u64;
        match tx
            .execute(
                insert,
                args![name, sealed, self.key.id(), bytes, &created_at],
            )
            .await
        {
            Err(e) if e.unique_violation() => return Err(StoreError::Exists(name.into())),
            r => r?,
        };
        tx.commit().await?;
        Ok(SecretInfo {
            name: name.into(),
            bytes,
            created_at,
        })
    }

    pub async fn list(&self) -> Result<Vec<SecretInfo>, StoreError> {
        let rows = self
            .db
            .query(
                "SELECT name, bytes, created_at FROM secrets ORDER BY name",
                args![],
            )
            .await?;
        rows.iter()
            .map(|r| {
                Ok(SecretInfo {
                    name: r.get("name")?,
                    bytes: r.get("bytes")?,
                    created_at: r.get("created_at")?,
                })
            })
            .collect()
    }

    pub async fn delete(&self, name: &str) -> Result<(), StoreError> {
        check_name(name).map_err(|_| StoreError::NotFound(name.into()))?;
        let n = self
            .db
            .execute("DELETE FROM secrets WHERE name = $1", args![name])
            .await?;
        if n == 0 {
            return Err(StoreError::NotFound(name.into()));
        }
        Ok(())
    }

    /// The value, for the egress proxy only (it goes into one request and
    /// is zeroed when dropped).
    pub async fn reveal(&self, name: &str) -> Result<Zeroizing<Vec<u8>>, StoreError> {
        let row = self
            .db
            .query_opt(
                "SELECT sealed, key_id FROM secrets WHERE name = $1",
                args![name],
            )
            .await?
            .ok_or_else(|| StoreError::NotFound(name.into()))?;
        let key_id: String = row.get("key_id")?;
        if key_id != self.key.id() {
            return Err(StoreError::WrongKey {
                name: name.into(),
                stored: key_id,
                current: self.key.id(),
            });
        }
        let sealed: Vec<u8> = row.get("sealed")?;
        seal::open(&self.key, name, &sealed).map_err(|e| StoreError::Seal(name.into(), e))
    }

    /// Which of `names` are not stored.
    pub async fn missing(&self, names: &[String]) -> Result<Vec<String>, StoreError> {
        let mut out = Vec::new();
        for n in names {
            let q = "SELECT 1 FROM secrets WHERE name = $1";
            if self.db.query_opt(q, args![n.as_str()]).await?.is_none() {
                out.push(n.clone());
            }
        }
        Ok(out)
    }
}

/// The policy API's check that every secret a credential rule names exists.
#[async_trait::async_trait]
impl hatchery_policy::http::SecretNames for Secrets {
    async fn missing(
        &self,
        names: Vec<String>,
    ) -> Result<Vec<String>, Box<dyn std::error::Error + Send + Sync>> {
        Ok(Secrets::missing(self, &names).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn scratch() -> Secrets {
        Secrets::open(Db::sqlite_memory().unwrap(), SecretKey::from_bytes([1; 32]))
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn values_are_sealed_and_write_only() {
        let s = scratch().await;
        let info = s.create("GH_TOKEN", "ghp_supersecret").await.unwrap();
        assert_eq!(info.bytes, 15);
        assert!(matches!(
            s.create("GH_TOKEN", "x").await,
            Err(StoreError::Exists(_))
        ));
        // The row holds no byte run of the value.
        let row =
            s.db.query_opt("SELECT sealed FROM secrets", args![])
                .await
                .unwrap()
                .unwrap();
        let sealed: Vec<u8> = row.get("sealed").unwrap();
        assert!(!sealed.windows(6).any(|w| w == b"ghp_su"));
        assert_eq!(&s.reveal("GH_TOKEN").await.unwrap()[..], b"ghp_supersecret");
        assert_eq!(s.list().await.unwrap(), vec![info]);
        assert_eq!(
            s.missing(&["GH_TOKEN".into(), "NOPE".into()])
                .await
                .unwrap(),
            vec!["NOPE".to_string()]
        );
        s.delete("GH_TOKEN").await.unwrap();
        assert!(matches!(
            s.reveal("GH_TOKEN").await,
            Err(StoreError::NotFound(_))
        ));
        assert!(matches!(
            s.delete("GH_TOKEN").await,
            Err(StoreError::NotFound(_))
        ));
    }

    #[tokio::test]
    async fn caps_at_the_boundary() {
        let s = scratch().await;
        let max = "a".repeat(MAX_VALUE_BYTES);
        assert!(s.create("big", &max).await.is_ok());
        let over = "a".repeat(MAX_VALUE_BYTES + 1);
        assert!(matches!(
            s.create("bigger", &over).await,
            Err(StoreError::Invalid(_))
        ));
        for bad in ["", "a\r\nX-Evil: 1", "tab\there", "é"] {
            assert!(
                matches!(s.create("v", bad).await, Err(StoreError::Invalid(_))),
                "{bad:?}"
            );
        }
        for bad in ["", "a b", "x/y", &"n".repeat(65)] {
            assert!(
                matches!(s.create(bad, "v").await, Err(StoreError::Invalid(_))),
                "{bad:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_value_sealed_under_another_key_is_reported() {
        let db = Db::sqlite_memory().unwrap();
        let a = Secrets::open(db.clone(), SecretKey::from_bytes([1; 32]))
            .await
            .unwrap();
        a.create("K", "v").await.unwrap();
        let b = Secrets::open(db, SecretKey::from_bytes([2; 32]))
            .await
            .unwrap();
        assert!(matches!(
            b.reveal("K").await,
            Err(StoreError::WrongKey { .. })
        ));
    }
}
