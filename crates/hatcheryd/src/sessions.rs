//! Agent sessions (`/v1/sessions`): their own store (DATA_DIR/sessions.db),
//! and sandboxes through the daemon's own public API (hatchery-client).

use crate::config::DaemonArgs;
use hatchery_sessions::client_sandboxes::ClientSandboxes;
use hatchery_sessions::policy::PolicyCatalog;
use hatchery_sessions::scheduler::LocalScheduler;
use hatchery_sessions::store::SqliteStore;
use hatchery_sessions::{Sessions, SessionsConfig};
use std::sync::Arc;

pub fn build(
    args: &DaemonArgs,
    api_key: &str,
    registry: &prometheus::Registry,
    policies: Arc<dyn PolicyCatalog>,
) -> Result<(axum::Router, Arc<Sessions>), crate::DaemonError> {
    let err = |e: String| crate::DaemonError::Sessions(e);
    let store =
        SqliteStore::open(&args.data_dir.join("sessions.db")).map_err(|e| err(e.to_string()))?;
    let mut addr = args.listen;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let client = hatchery_client::Client::with_config(
        &format!("http://{addr}"),
        api_key,
        // Snapshots get runsc's 60 s checkpoint limit plus margin.
        hatchery_client::ClientConfig::default().call_timeout(std::time::Duration::from_secs(150)),
    )
    .map_err(|e| err(e.to_string()))?;
    let cfg = SessionsConfig::from(&args.sessions);
    let svc = Sessions::new(
        Arc::new(store),
        cfg.clone(),
        policies,
        Arc::new(ClientSandboxes::new(client)),
        Arc::new(LocalScheduler::new(cfg.max_running)),
    );
    svc.metrics()
        .register(registry)
        .map_err(|e| err(e.to_string()))?;
    Ok((hatchery_sessions::router(svc.clone(), api_key.into()), svc))
}
