//! The store's one error type. Backend errors are carried as boxed
//! sources, so no rusqlite or postgres type shows in this crate's API.

use crate::rows::SandboxState;
use crate::HostHold;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{op}: {source}")]
    Backend {
        op: &'static str,
        #[source]
        source: BoxError,
    },
    /// The database cannot be reached (pool exhausted, connection down).
    #[error("database unavailable: {0}")]
    Unavailable(String),
    #[error("fenced: lease {resource} is at epoch {current} (owner {owner}), this writer holds epoch {held}")]
    Fenced {
        resource: String,
        owner: String,
        held: u64,
        current: u64,
    },
    #[error("lease {resource} is held by {owner} for another {for_ms} ms")]
    LeaseHeld {
        resource: String,
        owner: String,
        for_ms: u64,
    },
    #[error("invalid state transition {from} -> {to}")]
    InvalidTransition {
        from: SandboxState,
        to: SandboxState,
    },
    #[error("invalid host hold {from} -> {to}")]
    InvalidHold { from: HostHold, to: HostHold },
    #[error("corrupt row: {0}")]
    Corrupt(String),
    #[error("bad database address: {0}")]
    Config(String),
    #[error("the database's schema is at version {found}, newer than this build knows ({known})")]
    SchemaTooNew { found: u64, known: u64 },
}

impl StoreError {
    /// Worth retrying later (and answering 503 for).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }

    pub fn is_fenced(&self) -> bool {
        matches!(self, StoreError::Fenced { .. })
    }
}

pub type Result<T> = std::result::Result<T, StoreError>;
