//! Opens the state store `--db` names (default: DATA_DIR/state.db). A
//! PostgreSQL that is not up yet is retried with backoff for a while, each
//! attempt logged, before the daemon gives up with the last error.

use crate::config::DaemonArgs;
use crate::serve::DaemonError;
use hatchery_store::{Store, StoreError};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a daemon waits for its database at start.
const STARTUP_WAIT: Duration = Duration::from_secs(60);

pub async fn open(args: &DaemonArgs, data: &Path) -> Result<Arc<dyn Store>, DaemonError> {
    let db = args
        .db
        .clone()
        .unwrap_or_else(|| data.join("state.db").to_string_lossy().into_owned());
    let shown = hatchery_store::redact(&db);
    let started = Instant::now();
    let mut delay = Duration::from_millis(250);
    loop {
        match hatchery_store::open(&db, args.db_pool).await {
            Ok(s) => {
                tracing::info!(db = %shown, backend = s.backend(), host = %args.host_id, "state store open");
                return Ok(s);
            }
            Err(e @ StoreError::Unavailable(_)) if started.elapsed() < STARTUP_WAIT => {
                tracing::warn!(db = %shown, error = %e, retry_in_ms = delay.as_millis() as u64, "state store not reachable yet");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            Err(e) => return Err(DaemonError::Core(e.into())),
        }
    }
}
