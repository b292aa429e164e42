//! Marks the sandboxes of lost hosts: a host whose heartbeat is older
//! than the lease TTL and whose lease has run out, by the database's
//! clock. The sweeper takes that host's lease (a new epoch, so anything
//! the stale host still writes is fenced), stops each of its unstopped
//! rows with reason `host_lost` (rows never leave `stopped`, so nothing
//! resurrects them), and releases the lease, so the host may come back
//! under its id. A paused host that wakes up finds itself fenced and
//! kills its sandboxes (hatchery-core's lease keeper).
//!
//! A host that runs sessions (roles `all` and `host`) then takes the lost
//! host's unfinished sessions over (hatchery-sessions `take_over_from`):
//! their epoch grows, and their runners start here, resuming a running
//! session from its last checkpoint.
//!
//! Snapshot rows are left alone: a lost host's shared snapshots stay
//! usable from every other host, and its local ones answer 503 host_lost
//! until it comes back (their images are on its disk).
//!
//! Every daemon on a shared store sweeps (the control role and hosts
//! alike), so hosts without a control plane still mark each other.
//! Several processes may sweep at once: the lease take is the
//! lock, and the stop is guarded by the state it moves from.

use crate::takeover::SessionTakeover;
use hatchery_store::{host_resource, Fence, Store, StoreError};
use std::sync::Arc;
use std::time::Duration;

/// How often the control role looks for lost hosts.
pub const SWEEP_EVERY: Duration = Duration::from_secs(3);
/// How long the sweeper holds a lost host's lease while it marks rows.
const SWEEP_LEASE_MS: u64 = 15_000;
pub const LOST_REASON: &str = hatchery_store::HOST_LOST;

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

/// Sweeps every [`SWEEP_EVERY`]; a host silent past `lease_ttl_ms` is
/// lost. With `sessions`, this host takes lost hosts' sessions over.
pub fn spawn(
    store: Arc<dyn Store>,
    lease_ttl_ms: u64,
    lost: prometheus::IntCounter,
    sessions: Option<Arc<dyn SessionTakeover>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(SWEEP_EVERY).await;
            match sweep(store.as_ref(), lease_ttl_ms, sessions.as_deref()).await {
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
pub async fn sweep(
    store: &dyn Store,
    lease_ttl_ms: u64,
    sessions: Option<&dyn SessionTakeover>,
) -> Result<usize, StoreError> {
    let mut marked = 0;
    for h in store.list_hosts().await? {
        if crate::alive(h.silent_for_ms, lease_ttl_ms) {
            continue;
        }
        let resource = host_resource(&h.id);
        match store.get_lease(&resource).await? {
            Some(l) if l.valid_for_ms > 0 => continue,
            _ => {}
        }
        let rows = store.list_unstopped(&h.id).await?;
        if !rows.is_empty() {
            marked += mark_lost(store, &h, &resource, &rows).await?;
        }
        // After its sandboxes are marked: a session's runner here then
        // finds its sandbox gone and resumes from the checkpoint.
        if let Some(s) = sessions {
            if let Err(e) = s.take_over_from(&h.id).await {
                tracing::warn!(host = %h.id, error = %e, "taking over a lost host's sessions failed; next sweep retries");
            }
        }
    }
    Ok(marked)
}

async fn mark_lost(
    store: &dyn Store,
    h: &hatchery_store::HostRow,
    resource: &str,
    rows: &[hatchery_store::SandboxRow],
) -> Result<usize, StoreError> {
    // In the lost host's name: its rows are written only under its own
    // lease, and the new epoch fences its previous incarnation.
    let lease = match store.take_lease(resource, &h.id, SWEEP_LEASE_MS).await {
        Ok(l) => l,
        Err(StoreError::LeaseHeld { .. }) => return Ok(0),
        Err(e) => return Err(e),
    };
    let f = Fence::of(&lease);
    let now = now_ms();
    let mut n = 0;
    for r in rows {
        if store.stop(&f, &r.id, LOST_REASON, now).await? {
            n += 1;
        }
    }
    store.release_lease(&f).await?;
    tracing::warn!(host = %h.id, silent_ms = h.silent_for_ms, epoch = f.epoch, sandboxes = n, "host lost: its sandboxes marked stopped (host_lost)");
    Ok(n)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
