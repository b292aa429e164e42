//! The daemon's start-up errors: each names what failed and keeps its
//! cause as the source (hatcheryd's main prints the chain).

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("data dir {0}")]
    DataDir(PathBuf, #[source] std::io::Error),
    #[error("{0} not found: {1}. Run `make run` (or scripts/setup-host.sh) to install it")]
    Missing(&'static str, String),
    #[error(transparent)]
    Runtime(#[from] hatchery_runtime::RuntimeError),
    #[error(transparent)]
    Core(#[from] hatchery_core::CoreError),
    #[error("network")]
    Network(#[from] hatchery_net::NetError),
    #[error("listen on {0}")]
    Listen(std::net::SocketAddr, #[source] std::io::Error),
    #[error("--preview-listen: the API's port {0} has no next port; give the preview listener an address")]
    NoPreviewPort(u16),
    #[error("policy store")]
    Policy(#[from] hatchery_policy::StoreError),
    #[error("tenant store")]
    Tenants(#[from] hatchery_tenants::StoreError),
    #[error("server")]
    Serve(#[source] std::io::Error),
    #[error("interview rounds' store")]
    RoundsStore(#[from] hatchery_rounds::store::StoreError),
    #[error("interview rounds' client of this daemon's API")]
    RoundsApi(#[from] hatchery_rounds::sandbox::SandboxError),
    #[error("database {what}")]
    Db {
        what: String,
        #[source]
        source: hatchery_db::DbError,
    },
    #[error("agent platform")]
    Agents(#[from] hatchery_agents::AgentsError),
    #[error("--host-lease-ttl")]
    LeaseTtl(#[from] hatchery_core::lease::LeaseTtlError),
    #[error("--snapshot-store")]
    SnapshotStore(#[from] hatchery_templates::SnapshotStoreError),
    #[error("--metrics-token-file")]
    MetricsToken(#[from] hatchery_serve::metrics_token::MetricsTokenError),
    #[error("the daemon key in the state database")]
    DaemonKey(#[source] hatchery_store::StoreError),
}
