//! Marks the sandboxes of lost hosts: a host whose heartbeat is older
//! than the lease TTL and whose lease has run out, by the database's
//! clock. The sweeper takes that host's lease (a new epoch, so anything
//! the stale host still writes is fenced), stops each of its unstopped
//! rows with reason `host_lost` (rows never leave `stopped`, so nothing
//! resurrects them), and releases the lease, so the host may come back
//! under its id. A paused host that wakes up finds itself fenced and
//! kills its sandboxes (hatchery-core's lease keeper).
//!
//! Snapshot rows are left alone: a lost host's shared snapshots stay
//! usable from every other host, and its local ones answer 503 host_lost
//! until it comes back (their images are on its disk).
//!
//! Every daemon on a shared store sweeps (the control role and hosts
//! alike), so hosts without a control plane still mark each other.
//! Several processes may sweep at once: the lease take is the
//! lock, and the stop is guarded by the state it moves from.

use crate::directory::alive;
use hatchery_store::{host_resource, Fence, Store, StoreError};
use std::sync::Arc;
use std::time::Duration;

/// How often the control role looks for lost hosts.
pub const SWEEP_EVERY: Duration = Duration::from_secs(3);
/// How long the sweeper holds a lost host's lease while it marks rows.
const SWEEP_LEASE_MS: u64 = 15_000;
pub const LOST_REASON: &str = "host_lost";

/// `hatchery_sandboxes_host_lost_total`, registered in `registry`.
pub fn counter(registry: &prometheus::Registry) -> prometheus::IntCounter {
    let c = prometheus::IntCounter::new(
        "hatchery_sandboxes_host_lost_total",
        "Sandboxes marked stopped because their host was lost",
    )
    .expect("valid metric");
    let _ = registry.register(Box::new(c.clone()));
    c
}

pub fn spawn(store: Arc<dyn Store>, lost: prometheus::IntCounter) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(SWEEP_EVERY).await;
            match sweep(store.as_ref()).await {
                Ok(0) => {}
                Ok(n) => {
                    lost.inc_by(n as u64);
                }
                Err(e) => tracing::warn!(error = %e, "lost-host sweep failed"),
            }
        }
    })
}

/// One pass; returns how many sandboxes were marked lost.
pub async fn sweep(store: &dyn Store) -> Result<usize, StoreError> {
    let mut marked = 0;
    for h in store.list_hosts().await? {
        if alive(h.silent_for_ms) {
            continue;
        }
        let rows = store.list_unstopped(&h.id).await?;
        if rows.is_empty() {
            continue;
        }
        let resource = host_resource(&h.id);
        match store.get_lease(&resource).await? {
            Some(l) if l.valid_for_ms > 0 => continue,
            _ => {}
        }
        // In the lost host's name: its rows are written only under its
        // own lease, and the new epoch fences its previous incarnation.
        let lease = match store.take_lease(&resource, &h.id, SWEEP_LEASE_MS).await {
            Ok(l) => l,
            Err(StoreError::LeaseHeld { .. }) => continue,
            Err(e) => return Err(e),
        };
        let f = Fence::of(&lease);
        let now = now_ms();
        let mut n = 0;
        for r in &rows {
            if store.stop(&f, &r.id, LOST_REASON, now).await? {
                n += 1;
            }
        }
        store.release_lease(&f).await?;
        tracing::warn!(host = %h.id, silent_ms = h.silent_for_ms, epoch = f.epoch, sandboxes = n, "host lost: its sandboxes marked stopped (host_lost)");
        marked += n;
    }
    Ok(marked)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
