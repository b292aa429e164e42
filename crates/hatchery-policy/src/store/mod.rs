//! Policies with immutable, numbered versions behind an async trait
//! ([`DbPolicyStore`] in the deployment's one database, SQLite or
//! PostgreSQL, and test doubles), one contract for all ([`conformance`]).
//! A version, once written, never changes: sessions pin `(id, version)` and
//! must see the same rules for as long as they live.

pub mod conformance;
mod db;

pub use db::{DbPolicyStore, IMPORT, MAX_POLICIES, MAX_VERSIONS, SCHEMA};

use crate::compile::ValidationError;
use crate::document::PolicyDocument;
use serde::Serialize;
use utoipa::ToSchema;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("policy {0} not found")]
    NotFound(String),
    #[error("policy {0} has no version {1}")]
    VersionNotFound(String, u32),
    #[error("{0}")]
    Invalid(#[from] ValidationError),
    /// A stored version binds a secret no stored policy may bind (an E2B
    /// sandbox's own, written before `/v1/policies` refused it): not used.
    #[error("policy {id} version {version} is not used")]
    OutOfScope {
        id: String,
        version: u32,
        #[source]
        source: crate::secret_scope::ScopeError,
    },
    #[error("policy {0} is built in and read-only; create a policy of your own")]
    ReadOnly(String),
    #[error("{0} policies stored; at most {1}")]
    TooMany(u64, u64),
    #[error("policy {0} has {1} versions; at most {2}")]
    TooManyVersions(String, u32, u32),
    /// The database is not reachable now (retryable: 503).
    #[error("policy store unavailable: {0}")]
    Unavailable(#[source] hatchery_db::DbError),
    /// The database refused or failed a statement.
    #[error("policy store: {0}")]
    Db(#[source] hatchery_db::DbError),
    #[error("policy schema: {0}")]
    Schema(#[from] hatchery_db::MigrateError),
    #[error("stored document: {0}")]
    Corrupt(String),
    /// Two writers raced for the same next version.
    #[error("{0}: the latest version moved under this write")]
    Raced(String),
}

/// One version of one policy.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct StoredPolicy {
    /// `pol_` and 16 hex digits, or `pol_standard`.
    pub id: String,
    /// 1 for the first; each new version adds one.
    pub version: u32,
    /// RFC 3339, UTC.
    pub created_at: String,
    /// SHA-256 (hex) of the stored document's JSON, to compare versions.
    pub sha256: String,
    pub builtin: bool,
    /// The tenant whose key made the policy; absent for the operator's and
    /// the built-in one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    pub document: PolicyDocument,
}

// A policy's row in `policy_heads` (a plain comment: a doc comment would
// become the API schema's description).
hatchery_db::record! {
    #[derive(Debug, Clone, Serialize, ToSchema)]
    pub struct PolicySummary in "policy_heads" {
        pub id: String,
        pub name: String,
        pub latest_version: u32,
        pub created_at: String,
        pub updated_at: String,
        pub builtin: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub tenant: Option<String>,
    }
}

/// Whether `caller` reaches a policy owned by `owner`: the operator
/// (`None`) every one; a tenant the built-in ones and its own (issue 36).
pub fn reachable(builtin: bool, owner: Option<&str>, caller: Option<&str>) -> bool {
    match caller {
        None => true,
        Some(t) => builtin || owner == Some(t),
    }
}

#[async_trait::async_trait]
pub trait PolicyStore: Send + Sync + 'static {
    /// Validates and stores a new policy at version 1, `tenant`'s (`None`:
    /// the operator's).
    async fn create(
        &self,
        doc: PolicyDocument,
        tenant: Option<&str>,
    ) -> Result<StoredPolicy, StoreError>;
    /// Validates and stores the next version of an existing policy.
    async fn add_version(&self, id: &str, doc: PolicyDocument) -> Result<StoredPolicy, StoreError>;
    async fn list(&self) -> Result<Vec<PolicySummary>, StoreError>;
    async fn latest(&self, id: &str) -> Result<StoredPolicy, StoreError>;
    async fn version(&self, id: &str, version: u32) -> Result<StoredPolicy, StoreError>;
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
