//! The `secrets` table in the deployment's one database: owner, name, the
//! sealed value, the sealing key's id, the value's length and times. The
//! same SQL on SQLite and PostgreSQL; one statement per change.
//!
//! Every secret has an owner: the operator or one tenant. Each owner has
//! its own names (tenant A's `GH_TOKEN` and the operator's are two
//! secrets), and every read names the owner, so a tenant's store, list or
//! lookup never reaches another's. In the table the operator's owner is
//! `''` (a NULL would not be unique in the key on either database).

use crate::key::SecretKey;
use crate::seal::{self, SealError};
use hatchery_db::{args, Db, DbError, Migrations, Step};
use serde::Serialize;
use std::sync::Arc;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;
use utoipa::ToSchema;
use zeroize::Zeroizing;

/// Most secrets one owner (the operator, or one tenant) keeps: a tenant
/// filling its own leaves the others' room.
pub const MAX_SECRETS: u64 = 1000;
/// Largest value, in bytes. Values go into request headers, so they are
/// printable ASCII (no CR, LF or other control bytes: a value cannot add
/// a header of its own).
pub const MAX_VALUE_BYTES: usize = 4096;

/// The secrets schema. Append only.
pub static SCHEMA: Migrations = Migrations {
    product: "secrets",
    steps: &[
        Step::Both(
            "CREATE TABLE secrets (
            name TEXT PRIMARY KEY,
            sealed BYTEA NOT NULL,
            key_id TEXT NOT NULL,
            bytes INTEGER NOT NULL,
            created_at TEXT NOT NULL
        );",
        ),
        // Tenants' secrets (issue 39): the owner joins the key. Rebuilt, not
        // altered: SQLite cannot change a table's primary key. Every secret
        // stored before is the operator's.
        Step::Both(
            "CREATE TABLE secrets_v2 (
            tenant TEXT NOT NULL,
            name TEXT NOT NULL,
            sealed BYTEA NOT NULL,
            key_id TEXT NOT NULL,
            bytes INTEGER NOT NULL,
            created_at TEXT NOT NULL,
            PRIMARY KEY (tenant, name)
        );
        INSERT INTO secrets_v2 (tenant, name, sealed, key_id, bytes, created_at)
            SELECT '', name, sealed, key_id, bytes, created_at FROM secrets;
        DROP TABLE secrets;
        ALTER TABLE secrets_v2 RENAME TO secrets;",
        ),
    ],
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

/// Whose secrets: the operator's (`None`) or one tenant's.
pub type Owner<'a> = Option<&'a str>;

/// The owner as the table keeps it.
fn owner_key(owner: Owner<'_>) -> &str {
    owner.unwrap_or("")
}

/// What a value is sealed to: its name, and a tenant's id too, so a
/// sealed value copied onto another owner's row does not open. (The
/// operator's stay sealed to the name alone, as before tenants had any.)
fn sealed_to(owner: Owner<'_>, name: &str) -> String {
    match owner {
        None => name.to_string(),
        Some(t) => format!("{t}/{name}"),
    }
}

/// What the API shows of a secret: never its value.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct SecretInfo {
    pub name: String,
    /// The tenant whose secret it is; null for the operator's. A tenant's
    /// policies bind only its own, and its sessions get only its own.
    pub tenant: Option<String>,
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

    pub async fn create(
        &self,
        owner: Owner<'_>,
        name: &str,
        value: &str,
    ) -> Result<SecretInfo, StoreError> {
        check_name(name)?;
        check_value(value)?;
        let sealed = seal::seal(&self.key, &sealed_to(owner, name), value.as_bytes())
            .map_err(|e| StoreError::Seal(name.into(), e))?;
        let created_at = OffsetDateTime::now_utc()
            .format(&Rfc3339)
            .unwrap_or_default();
        let mut tx = self.db.begin().await?;
        // Creates take turns, so the cap is exact.
        tx.lock("secrets").await?;
        let n: u64 = tx
            .query_one(
                "SELECT count(*) FROM secrets WHERE tenant = $1",
                args![owner_key(owner)],
            )
            .await?
            .get(0)?;
        if n >= MAX_SECRETS {
            return Err(StoreError::TooMany(n));
        }
        let insert = "INSERT INTO secrets (tenant, name, sealed, key_id, bytes, created_at)
                      VALUES ($1, $2, $3, $4, $5, $6)";
        let bytes = value.len() as u64;
        match tx
            .execute(
                insert,
                args![
                    owner_key(owner),
                    name,
                    sealed,
                    self.key.id(),
                    bytes,
                    &created_at
                ],
            )
            .await
        {
            Err(e) if e.unique_violation() => return Err(StoreError::Exists(name.into())),
            r => r?,
        };
        tx.commit().await?;
        Ok(SecretInfo {
            name: name.into(),
            tenant: owner.map(str::to_string),
            bytes,
            created_at,
        })
    }

    /// `owner`'s secrets, or with [`Listing::All`] everyone's (the
    /// operator's view), by owner then name.
    pub async fn list(&self, which: Listing<'_>) -> Result<Vec<SecretInfo>, StoreError> {
        let cols = "SELECT tenant, name, bytes, created_at FROM secrets";
        let rows = match which {
            Listing::All => {
                let q = format!("{cols} ORDER BY tenant, name");
                self.db.query(&q, args![]).await?
            }
            Listing::Of(owner) => {
                let q = format!("{cols} WHERE tenant = $1 ORDER BY name");
                self.db.query(&q, args![owner_key(owner)]).await?
            }
        };
        rows.iter()
            .map(|r| {
                let tenant: String = r.get("tenant")?;
                Ok(SecretInfo {
                    name: r.get("name")?,
                    tenant: Some(tenant).filter(|t| !t.is_empty()),
                    bytes: r.get("bytes")?,
                    created_at: r.get("created_at")?,
                })
            })
            .collect()
    }

    /// Deletes `owner`'s secret `name` (another owner's of the same name
    /// is not there for this one: NotFound).
    pub async fn delete(&self, owner: Owner<'_>, name: &str) -> Result<(), StoreError> {
        check_name(name).map_err(|_| StoreError::NotFound(name.into()))?;
        let n = self
            .db
            .execute(
                "DELETE FROM secrets WHERE tenant = $1 AND name = $2",
                args![owner_key(owner), name],
            )
            .await?;
        if n == 0 {
            return Err(StoreError::NotFound(name.into()));
        }
        Ok(())
    }

    /// `owner`'s value of `name`, for the egress proxy only (it goes into
    /// one request and is zeroed when dropped). The proxy asks in the
    /// session's owner: never another's secret of the same name.
    pub async fn reveal(
        &self,
        owner: Owner<'_>,
        name: &str,
    ) -> Result<Zeroizing<Vec<u8>>, StoreError> {
        let row = self
            .db
            .query_opt(
                "SELECT sealed, key_id FROM secrets WHERE tenant = $1 AND name = $2",
                args![owner_key(owner), name],
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
        seal::open(&self.key, &sealed_to(owner, name), &sealed)
            .map_err(|e| StoreError::Seal(name.into(), e))
    }

    /// Which of `names` `owner` has not stored.
    pub async fn missing(
        &self,
        owner: Owner<'_>,
        names: &[String],
    ) -> Result<Vec<String>, StoreError> {
        let mut out = Vec::new();
        for n in names {
            let q = "SELECT 1 FROM secrets WHERE tenant = $1 AND name = $2";
            let a = args![owner_key(owner), n.as_str()];
            if self.db.query_opt(q, a).await?.is_none() {
                out.push(n.clone());
            }
        }
        Ok(out)
    }
}

/// Which secrets [`Secrets::list`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listing<'a> {
    /// Every owner's (the operator's view).
    All,
    /// One owner's.
    Of(Owner<'a>),
}

/// The policy API's check that every secret a credential rule names
/// exists among the policy owner's.
#[async_trait::async_trait]
impl hatchery_policy::http::SecretNames for Secrets {
    async fn missing(
        &self,
        owner: Option<String>,
        names: Vec<String>,
    ) -> Result<Vec<String>, Box<dyn std::error::Error + Send + Sync>> {
        Ok(Secrets::missing(self, owner.as_deref(), &names).await?)
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
        let info = s.create(None, "GH_TOKEN", "ghp_supersecret").await.unwrap();
        assert_eq!(info.bytes, 15);
        assert!(matches!(
            s.create(None, "GH_TOKEN", "x").await,
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
        assert_eq!(
            &s.reveal(None, "GH_TOKEN").await.unwrap()[..],
            b"ghp_supersecret"
        );
        assert_eq!(s.list(Listing::All).await.unwrap(), vec![info]);
        assert_eq!(
            s.missing(None, &["GH_TOKEN".into(), "NOPE".into()])
                .await
                .unwrap(),
            vec!["NOPE".to_string()]
        );
        s.delete(None, "GH_TOKEN").await.unwrap();
        assert!(matches!(
            s.reveal(None, "GH_TOKEN").await,
            Err(StoreError::NotFound(_))
        ));
        assert!(matches!(
            s.delete(None, "GH_TOKEN").await,
            Err(StoreError::NotFound(_))
        ));
    }

    #[tokio::test]
    async fn caps_at_the_boundary() {
        let s = scratch().await;
        let max = "a".repeat(MAX_VALUE_BYTES);
        assert!(s.create(None, "big", &max).await.is_ok());
        let over = "a".repeat(MAX_VALUE_BYTES + 1);
        assert!(matches!(
            s.create(None, "bigger", &over).await,
            Err(StoreError::Invalid(_))
        ));
        for bad in ["", "a\r\nX-Evil: 1", "tab\there", "é"] {
            assert!(
                matches!(s.create(None, "v", bad).await, Err(StoreError::Invalid(_))),
                "{bad:?}"
            );
        }
        for bad in ["", "a b", "x/y", &"n".repeat(65)] {
            assert!(
                matches!(s.create(None, bad, "v").await, Err(StoreError::Invalid(_))),
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
        a.create(None, "K", "v").await.unwrap();
        let b = Secrets::open(db, SecretKey::from_bytes([2; 32]))
            .await
            .unwrap();
        assert!(matches!(
            b.reveal(None, "K").await,
            Err(StoreError::WrongKey { .. })
        ));
    }

    #[tokio::test]
    async fn each_owner_has_its_own_names_and_reaches_no_other() {
        let s = scratch().await;
        s.create(None, "TOKEN", "operator-value").await.unwrap();
        let a = s.create(Some("ten_a"), "TOKEN", "a-value").await.unwrap();
        assert_eq!(a.tenant.as_deref(), Some("ten_a"));
        s.create(Some("ten_b"), "B_ONLY", "b-value").await.unwrap();
        assert!(matches!(
            s.create(Some("ten_a"), "TOKEN", "again").await,
            Err(StoreError::Exists(_))
        ));
        // Each lookup is in one owner: the same name is another value,
        // and another owner's name is not there.
        assert_eq!(
            &s.reveal(None, "TOKEN").await.unwrap()[..],
            b"operator-value"
        );
        assert_eq!(
            &s.reveal(Some("ten_a"), "TOKEN").await.unwrap()[..],
            b"a-value"
        );
        for (owner, name) in [
            (Some("ten_b"), "TOKEN"),
            (Some("ten_a"), "B_ONLY"),
            (None, "B_ONLY"),
        ] {
            assert!(
                matches!(s.reveal(owner, name).await, Err(StoreError::NotFound(_))),
                "{owner:?} {name}"
            );
        }
        assert_eq!(
            s.missing(Some("ten_a"), &["TOKEN".into(), "B_ONLY".into()])
                .await
                .unwrap(),
            vec!["B_ONLY".to_string()]
        );
        let names = |v: Vec<SecretInfo>| -> Vec<(Option<String>, String)> {
            v.into_iter().map(|i| (i.tenant, i.name)).collect()
        };
        assert_eq!(
            names(s.list(Listing::Of(Some("ten_a"))).await.unwrap()),
            vec![(Some("ten_a".into()), "TOKEN".into())]
        );
        assert_eq!(
            names(s.list(Listing::Of(None)).await.unwrap()),
            vec![(None, "TOKEN".into())]
        );
        assert_eq!(s.list(Listing::All).await.unwrap().len(), 3);
        // Deleting is in one owner too.
        assert!(matches!(
            s.delete(Some("ten_b"), "TOKEN").await,
            Err(StoreError::NotFound(_))
        ));
        s.delete(Some("ten_a"), "TOKEN").await.unwrap();
        assert_eq!(
            &s.reveal(None, "TOKEN").await.unwrap()[..],
            b"operator-value"
        );
    }

    #[tokio::test]
    async fn a_tenants_sealed_value_moved_to_another_owner_does_not_open() {
        let s = scratch().await;
        s.create(Some("ten_a"), "K", "a-value").await.unwrap();
        s.create(Some("ten_b"), "K", "b-value").await.unwrap();
        // As a database edit would: ten_a's sealed bytes on ten_b's row.
        s.db.execute(
            "UPDATE secrets SET sealed = (SELECT sealed FROM secrets WHERE tenant = 'ten_a') WHERE tenant = 'ten_b'",
            args![],
        )
        .await
        .unwrap();
        assert!(matches!(
            s.reveal(Some("ten_b"), "K").await,
            Err(StoreError::Seal(..))
        ));
    }

    #[tokio::test]
    async fn the_cap_is_per_owner() {
        let s = scratch().await;
        // Filled by hand: MAX_SECRETS creates would be slow for nothing.
        for i in 0..MAX_SECRETS {
            s.db.execute(
                "INSERT INTO secrets (tenant, name, sealed, key_id, bytes, created_at) VALUES ('ten_a', $1, $2, 'k', 1, 'now')",
                args![format!("n{i}"), vec![0u8]],
            )
            .await
            .unwrap();
        }
        assert!(matches!(
            s.create(Some("ten_a"), "one_more", "v").await,
            Err(StoreError::TooMany(MAX_SECRETS))
        ));
        s.create(Some("ten_b"), "one_more", "v").await.unwrap();
        s.create(None, "one_more", "v").await.unwrap();
    }

    #[tokio::test]
    async fn secrets_stored_before_tenants_had_any_are_the_operators() {
        crate::conformance::owners_and_the_migration(Db::sqlite_memory().unwrap()).await;
    }
}
