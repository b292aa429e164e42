//! Tenants and their keys behind an async trait ([`DbTenantStore`] in the
//! deployment's one database, SQLite or PostgreSQL), one contract for
//! both ([`conformance`]).

pub mod conformance;
mod db;

pub use db::{DbTenantStore, SCHEMA};

use crate::model::{Limits, NewTenant, Tenant, TenantKey, TenantPatch, ValidationError};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("tenant {0} not found")]
    NotFound(String),
    #[error("key {key} of tenant {tenant} not found")]
    KeyNotFound { tenant: String, key: String },
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    #[error("{0} tenants stored; at most {max}", max = crate::model::MAX_TENANTS)]
    TooManyTenants(u64),
    #[error("tenant {0} has {1} unrevoked keys; at most {max}; revoke one first", max = crate::model::MAX_ACTIVE_KEYS)]
    TooManyKeys(String, u64),
    /// The database is not reachable now (retryable: 503).
    #[error("tenant store unavailable")]
    Unavailable(#[source] hatchery_db::DbError),
    /// The database refused or failed a statement.
    #[error("tenant store")]
    Db(#[source] hatchery_db::DbError),
    #[error("tenant schema")]
    Schema(#[from] hatchery_db::MigrateError),
}

impl From<hatchery_db::DbError> for StoreError {
    fn from(e: hatchery_db::DbError) -> Self {
        if e.unavailable() {
            StoreError::Unavailable(e)
        } else {
            StoreError::Db(e)
        }
    }
}

/// Who a stored, unrevoked key belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyOwner {
    pub tenant: String,
    pub key_id: String,
}

#[async_trait::async_trait]
pub trait TenantStore: Send + Sync + 'static {
    async fn create(&self, req: NewTenant) -> Result<Tenant, StoreError>;
    async fn list(&self) -> Result<Vec<Tenant>, StoreError>;
    async fn get(&self, id: &str) -> Result<Tenant, StoreError>;
    async fn update(&self, id: &str, patch: TenantPatch) -> Result<Tenant, StoreError>;
    /// Removes the tenant and every key of it (revoked or not).
    async fn delete(&self, id: &str) -> Result<(), StoreError>;
    /// Stores a key by its hash; `prefix` is what listings show of it.
    async fn add_key(
        &self,
        tenant: &str,
        hash: &str,
        prefix: &str,
    ) -> Result<TenantKey, StoreError>;
    async fn list_keys(&self, tenant: &str) -> Result<Vec<TenantKey>, StoreError>;
    /// Marks a key revoked (idempotent: a revoked key stays as it was).
    async fn revoke_key(&self, tenant: &str, key: &str) -> Result<TenantKey, StoreError>;
    /// The owner of the unrevoked key whose hash is `hash`, if any.
    async fn owner(&self, hash: &str) -> Result<Option<KeyOwner>, StoreError>;
}

/// Limits with every one absent (a tenant made without `limits`).
pub fn unlimited() -> Limits {
    Limits::default()
}
