//! Interview rounds inside the daemon: their own SQLite file in the data
//! dir, and sandboxes through the daemon's own public API on loopback
//! (hatchery-client with the API key), never the core.

use crate::{DaemonArgs, DaemonError};
use hatchery_rounds::client_backend::ClientSandboxes;
use hatchery_rounds::store::SqliteStore;
use hatchery_rounds::{Rounds, RoundsConfig};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

pub fn start(
    args: &DaemonArgs,
    data: &Path,
    key: &str,
    registry: &prometheus::Registry,
) -> Result<Arc<Rounds>, DaemonError> {
    let store = SqliteStore::open(&data.join("rounds.db"))
        .map_err(|e| DaemonError::Rounds(format!("{}: {e}", data.join("rounds.db").display())))?;
    let mut addr = args.listen;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let sandboxes = ClientSandboxes::new(&format!("http://{addr}"), key)
        .map_err(|e| DaemonError::Rounds(e.to_string()))?;
    Ok(Rounds::new(
        Arc::new(store),
        Arc::new(sandboxes),
        key.into(),
        RoundsConfig {
            public_url: args.public_url.clone(),
            reap_interval: Duration::from_secs(args.rounds_reap_interval),
        },
        registry,
    ))
}
