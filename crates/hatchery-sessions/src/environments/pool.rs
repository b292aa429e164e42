//! Keeping an environment's current version warm (issue 40): the daemon
//! keeps `pool_size` forks of the version's snapshot restored and parked
//! (hatchery-core's snapshot_pool.rs), so a session claims one instead of
//! restoring. Asked for when a build makes a version current and each
//! time a session pins it; the superseded version's pool is dropped at
//! once; a deleted snapshot's goes with it, and one nobody forked for 15
//! minutes goes cold in the daemon on its own.

use crate::sandbox::Sandboxes;
use std::sync::Arc;

/// Sets the pool of `snapshot` to `size` forks (0 drops it), in the
/// background: never on a session's start path, and a daemon that does
/// not answer costs a log line, not a start (the session then restores).
pub(crate) fn warm(sandboxes: &Arc<dyn Sandboxes>, snapshot: &str, size: u64) {
    let (sb, snap) = (Arc::clone(sandboxes), snapshot.to_string());
    tokio::spawn(async move {
        if let Err(e) = sb.set_snapshot_pool(&snap, size).await {
            tracing::warn!(snapshot = %snap, size, error = %e, "setting an environment version's warm pool failed");
        }
    });
}
