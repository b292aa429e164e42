//! Wire types of `/v1/environments`, and the caps on what a create may ask.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Bytes of an environment's name.
pub const MAX_NAME_BYTES: usize = 64;
/// Bytes of the set-up script.
pub const MAX_SETUP_BYTES: usize = 64 << 10;
/// NetworkPolicy `allow` rules of the set-up's egress.
pub const MAX_SETUP_ALLOW: usize = 64;
/// The set-up's time limit: default and most.
pub const DEFAULT_SETUP_TIMEOUT_S: u64 = 600;
pub const MAX_SETUP_TIMEOUT_S: u64 = 3600;
/// Environments in the deployment.
pub const MAX_ENVIRONMENTS: u64 = 256;
/// Forks of the current version kept restored and parked on the host (the
/// warm pool, environments/pool.rs): default and most.
pub const DEFAULT_POOL_SIZE: u64 = 2;
pub const MAX_POOL_SIZE: u64 = 8;

fn default_pool_size() -> u64 {
    DEFAULT_POOL_SIZE
}

/// Versions kept per environment: the current one and the one before it
/// (older ones are deleted once no unfinished session pinned them).
pub const KEEP_VERSIONS: u64 = 2;

#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateEnvironment {
    /// 1-64 bytes, for people (ids are what the API takes).
    pub name: String,
    /// The repository, under the sessions' URL rules.
    pub repo: String,
    /// The base ref the set-up runs on (default `main`).
    #[serde(rename = "ref")]
    pub git_ref: Option<String>,
    /// Default `code-interpreter`.
    pub template: Option<String>,
    /// Run once per build as `/bin/sh -c` in the checkout (`/workspace`),
    /// for example `pip install -r requirements.txt`. Up to 64 KiB; empty
    /// is allowed (the environment is then the checkout alone).
    #[serde(default)]
    pub setup: String,
    /// The egress the set-up may use: NetworkPolicy `allow` rules (at most
    /// 64), open only while the set-up runs and closed before the
    /// snapshot. Sessions never get them.
    #[serde(default)]
    #[schema(value_type = Vec<Object>)]
    pub setup_allow: Vec<serde_json::Value>,
    /// 1..3600 (default 600).
    pub setup_timeout_s: Option<u64>,
    /// Sandboxes already restored from the current version that the host
    /// keeps ready while the environment is hot (built, or a session
    /// started from it in the last 15 minutes): a session claims one
    /// instead of restoring. 0..8 (default 2); 0 turns the pool off.
    pub pool_size: Option<u64>,
}

/// What a create was normalised to; stored as JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EnvSpec {
    pub repo: String,
    #[serde(rename = "ref")]
    pub git_ref: String,
    pub template: String,
    pub setup: String,
    #[schema(value_type = Vec<Object>)]
    pub setup_allow: Vec<serde_json::Value>,
    pub setup_timeout_s: u64,
    /// Forks of the current version kept warm (0: none). Environments
    /// created before it existed read as the default.
    #[serde(default = "default_pool_size")]
    pub pool_size: u64,
}

/// Why a version was built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BuildReason {
    /// `POST /v1/environments/{id}:build`.
    Requested,
    /// The template was rebuilt since the current version was built: the
    /// daemon started this build itself.
    TemplateChanged,
    /// The current version's snapshot nears the end of its retention in
    /// the snapshot store: the daemon rebuilt it before the snapshot is
    /// deleted under the environment.
    SnapshotExpiring,
}

impl BuildReason {
    pub fn as_str(self) -> &'static str {
        match self {
            BuildReason::Requested => "requested",
            BuildReason::TemplateChanged => "template_changed",
            BuildReason::SnapshotExpiring => "snapshot_expiring",
        }
    }

    /// A stored reason; anything unknown reads as `requested` (the
    /// column's default, what versions built before reasons were).
    pub fn parse(s: &str) -> BuildReason {
        match s {
            "template_changed" => BuildReason::TemplateChanged,
            "snapshot_expiring" => BuildReason::SnapshotExpiring,
            _ => BuildReason::Requested,
        }
    }
}

/// One built version: immutable once made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EnvVersion {
    pub version: u64,
    pub snapshot_id: String,
    /// The commit the set-up ran on.
    pub base_commit: String,
    pub template: String,
    /// The template's version the build started from (read just before
    /// its sandbox was made); null for versions built before it was
    /// recorded, which are never considered stale.
    pub template_version: Option<String>,
    pub reason: BuildReason,
    pub built_at: String,
    pub build_ms: u64,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EnvironmentView {
    pub environment_id: String,
    pub name: String,
    #[serde(flatten)]
    pub spec: EnvSpec,
    pub created_at: String,
    /// The tenant whose key created it (absent: the operator's). A tenant
    /// key sees and uses only its own tenant's environments.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The version new sessions start from; null until a build succeeds.
    pub current: Option<EnvVersion>,
    /// Versions kept (newest first), the current one included.
    pub versions: Vec<EnvVersion>,
    /// The template's version now; null when it cannot be read (no such
    /// template any more, or the daemon did not answer).
    pub template_version: Option<String>,
    /// The current version was built from another version of the
    /// template than today's: a rebuild (reason `template_changed`) is
    /// due or running, and sessions start from the current version until
    /// it is ready.
    pub stale: bool,
    /// A build is running on this host.
    pub building: bool,
    /// Why the running build was started (null when none runs).
    pub building_reason: Option<BuildReason>,
    /// Why the last build failed, until one succeeds.
    pub last_error: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EnvironmentList {
    pub environments: Vec<EnvironmentView>,
}

pub use crate::store::EnvPin;
