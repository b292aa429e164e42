//! Interview rounds inside the daemon: their state in DATA_DIR/rounds.db
//! on one host, or in the shared database on `--db postgres://` (tables
//! `rounds`, `round_*`), and sandboxes through the daemon's own public API
//! on loopback (hatchery-client with the API key), never the core. On the
//! control role that API places and routes to the hosts, so rounds run
//! there (docs/interviews.md, "Rounds on many hosts").

use crate::DaemonError;
use hatchery_config::DaemonArgs;
use hatchery_rounds::client_backend::ClientSandboxes;
use hatchery_rounds::store::{PgStore, RoundStore, SqliteStore, StoreError};
use hatchery_rounds::{Rounds, RoundsConfig};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

pub async fn start(
    args: &DaemonArgs,
    data: &Path,
    key: &str,
    registry: &prometheus::Registry,
) -> Result<Arc<Rounds>, DaemonError> {
    let store: Arc<dyn RoundStore> = match args.shared_db() {
        Some(dsn) => Arc::new(
            crate::state_db::retry_while_unreachable(
                "rounds",
                || PgStore::connect(dsn, args.db_pool),
                |e| matches!(e, StoreError::Unavailable(_)),
            )
            .await
            .map_err(|e| DaemonError::Rounds(format!("shared database: {e}")))?,
        ),
        None => Arc::new(SqliteStore::open(&data.join("rounds.db")).map_err(|e| {
            DaemonError::Rounds(format!("{}: {e}", data.join("rounds.db").display()))
        })?),
    };
    let mut addr = args.listen;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let sandboxes = ClientSandboxes::new(&format!("http://{addr}"), key)
        .map_err(|e| DaemonError::Rounds(e.to_string()))?;
    Ok(Rounds::new(
        store,
        Arc::new(sandboxes),
        key.into(),
        RoundsConfig {
            public_url: args.public_url.clone(),
            reap_interval: Duration::from_secs(args.rounds_reap_interval),
            process: args.host_id.clone(),
        },
        registry,
    ))
}
