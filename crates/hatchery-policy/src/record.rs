//! What both policy stores write and read the same way: ids, timestamps,
//! the stored JSON and its digest, and the caps. Kept in one place so a
//! policy written by one backend reads the same from the other.

use crate::document::PolicyDocument;
use crate::store::{StoreError, StoredPolicy};
use sha2::{Digest, Sha256};

/// Most policies one store keeps.
pub const MAX_POLICIES: u64 = 10_000;
/// Most versions of one policy.
pub const MAX_VERSIONS: u32 = 10_000;

pub(crate) fn now() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

pub(crate) fn new_id() -> String {
    format!("pol_{:016x}", rand::random::<u64>())
}

/// The stored JSON of a document and its SHA-256 (hex).
pub(crate) fn encode(doc: &PolicyDocument) -> Result<(String, String), StoreError> {
    let json = serde_json::to_string(doc).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let sha = Sha256::digest(json.as_bytes());
    let hex = sha.iter().map(|b| format!("{b:02x}")).collect();
    Ok((json, hex))
}

/// One stored version's columns, as both backends read them.
pub(crate) struct VersionRow {
    pub id: String,
    pub version: u32,
    pub document: String,
    pub sha256: String,
    pub created_at: String,
    pub builtin: bool,
}

pub(crate) fn decode(row: VersionRow) -> Result<StoredPolicy, StoreError> {
    let document = serde_json::from_str(&row.document)
        .map_err(|e| StoreError::Corrupt(format!("{} v{}: {e}", row.id, row.version)))?;
    Ok(StoredPolicy {
        id: row.id,
        version: row.version,
        created_at: row.created_at,
        sha256: row.sha256,
        builtin: row.builtin,
        document,
    })
}

/// The SELECT both backends read a version with (a join for `builtin`).
pub(crate) const SELECT_VERSION: &str =
    "SELECT v.policy_id, v.version, v.document, v.sha256, v.created_at, p.builtin
     FROM policy_versions v JOIN policies p ON p.id = v.policy_id";
