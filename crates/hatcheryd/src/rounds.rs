//! Interview rounds inside the daemon: their state in the deployment's
//! one database (tables `rounds`, `round_*`; a single host's old
//! DATA_DIR/rounds.db is copied in once at start), and sandboxes through
//! the daemon's own public API on loopback (hatchery-client with the API
//! key), never the core. On the control role that API places and routes
//! to the hosts, so rounds run there (docs/interviews.md, "Rounds on many
//! hosts").

use crate::DaemonError;
use hatchery_config::DaemonArgs;
use hatchery_rounds::client_backend::ClientSandboxes;
use hatchery_rounds::store::{DbStore, StoreError, IMPORT};
use hatchery_rounds::{Rounds, RoundsConfig};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

pub async fn start(
    args: &DaemonArgs,
    data: &Path,
    db: &hatchery_db::Db,
    key: &str,
    registry: &prometheus::Registry,
) -> Result<Arc<Rounds>, DaemonError> {
    let store = hatchery_db::retry_while_unreachable(
        "rounds",
        || DbStore::open(db.clone()),
        StoreError::unavailable,
    )
    .await?;
    // A single-host data dir of the previous release: its rounds.db, once.
    db.import_sqlite(data, &IMPORT)
        .await
        .map_err(|source| DaemonError::Db {
            what: format!("import of {}", data.join(IMPORT.file).display()),
            source,
        })?;
    let mut addr = args.listen;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let sandboxes = ClientSandboxes::new(&format!("http://{addr}"), key)?;
    Ok(Rounds::new(
        Arc::new(store),
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
