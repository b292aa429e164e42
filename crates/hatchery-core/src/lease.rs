//! This host's lease in the state store. Taken at start (a new epoch,
//! which fences off any earlier incarnation with the same host id), then
//! renewed on the database's clock. If the lease is lost, or cannot be
//! renewed before it runs out, the host kills its own sandboxes, so that
//! nothing of it runs on once another incarnation may have taken over, and
//! refuses new work.

use crate::store::{host_resource, Fence, Store, StoreError};
use crate::{CoreError, Manager};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a host's lease lasts without renewal, by default.
pub const HOST_LEASE_TTL_MS: u64 = 30_000;
/// The shortest and longest `--host-lease-ttl`: under 6 s a renewal (every
/// third of it) would compete with the store's 5 s call bound.
pub const HOST_LEASE_TTL_RANGE_MS: std::ops::RangeInclusive<u64> = 6_000..=300_000;

static LEASE_TTL_MS: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(HOST_LEASE_TTL_MS);

/// The host lease TTL of this deployment (every daemon sharing a store
/// must use the same): how long a host may go unrenewed before another
/// daemon may take its lease, and how long a silent host still counts as
/// alive. Set once at start, before any lease is taken.
pub fn host_lease_ttl_ms() -> u64 {
    LEASE_TTL_MS.load(Ordering::Relaxed)
}

/// A host lease TTL outside what hosts can renew in time.
#[derive(Debug, thiserror::Error)]
#[error("host lease TTL {ms} ms: must be between {} and {} ms", HOST_LEASE_TTL_RANGE_MS.start(), HOST_LEASE_TTL_RANGE_MS.end())]
pub struct LeaseTtlError {
    pub ms: u64,
}

pub fn set_host_lease_ttl_ms(ms: u64) -> Result<(), LeaseTtlError> {
    if !HOST_LEASE_TTL_RANGE_MS.contains(&ms) {
        return Err(LeaseTtlError { ms });
    }
    LEASE_TTL_MS.store(ms, Ordering::Relaxed);
    Ok(())
}
/// How often the lease is read between renewals.
const CHECK_EVERY_MS: u64 = 2_000;

/// The state store as one host sees it: the store and the fence every
/// state write of this daemon carries.
pub struct HostStore {
    pub store: Arc<dyn Store>,
    pub fence: Fence,
}

/// Takes `host_id`'s lease.
pub async fn take_host_lease(
    store: Arc<dyn Store>,
    host_id: &str,
) -> Result<HostStore, StoreError> {
    if !hatchery_store::valid_host_id(host_id) {
        return Err(StoreError::Config(format!(
            "host id {host_id:?}: use 1 to 64 of a-z, 0-9 and '-', not starting with '-'"
        )));
    }
    let l = store
        .take_lease(&host_resource(host_id), host_id, host_lease_ttl_ms())
        .await?;
    tracing::info!(host = %host_id, epoch = l.epoch, backend = store.backend(), "host lease taken");
    Ok(HostStore {
        store,
        fence: Fence::of(&l),
    })
}

impl Manager {
    /// Renews the host lease every third of its lifetime, and between
    /// renewals reads it every 2 s, so a takeover is noticed within
    /// seconds rather than at the next renewal.
    pub fn spawn_lease_keeper(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            let ttl = host_lease_ttl_ms();
            let period = Duration::from_millis(ttl / 3);
            let tick = Duration::from_millis(CHECK_EVERY_MS);
            // By this host's monotonic clock: how long the lease surely
            // lasts (the database said how long was left when it renewed).
            let mut valid_until = Instant::now() + Duration::from_millis(ttl);
            let mut last_renewal = Instant::now();
            let mut reported_warm: Option<Vec<String>> = None;
            loop {
                tokio::time::sleep(tick).await;
                let Some(m) = me.upgrade() else { return };
                // Renewed (and heartbeating) until the stop has finished,
                // not merely begun: see `Manager::shut_down`.
                if m.shut_down.load(Ordering::SeqCst) {
                    return;
                }
                let asked = Instant::now();
                // A checkpoint baked or removed, or a snapshot's warm pool
                // filled or emptied, is reported at once, not at the next
                // renewal: placement prefers warm hosts.
                let warm = {
                    let m = Arc::clone(&m);
                    tokio::task::spawn_blocking(move || m.warm_keys())
                        .await
                        .unwrap_or_default()
                };
                let due = asked.duration_since(last_renewal) >= period
                    || reported_warm.as_ref() != Some(&warm);
                let res = if due {
                    let res = m.store.renew_lease(&m.fence, ttl).await.map(|l| {
                        last_renewal = asked;
                        valid_until = asked + Duration::from_millis(l.valid_for_ms);
                    });
                    // The heartbeat rides on the renewal.
                    match res {
                        Ok(()) => {
                            let beat = m
                                .store
                                .heartbeat(&m.fence, m.live_count() as u32, &warm)
                                .await;
                            if beat.is_ok() {
                                reported_warm = Some(warm);
                            }
                            beat.map(drop)
                        }
                        e => e,
                    }
                } else {
                    m.store
                        .get_lease(&m.fence.resource)
                        .await
                        .and_then(|l| m.still_ours(l))
                };
                match res {
                    Ok(()) => {}
                    Err(e) if e.is_fenced() => {
                        tracing::error!(error = %e, "host lease taken over: killing this host's sandboxes");
                        m.lose_lease().await;
                        return;
                    }
                    Err(e) => {
                        // Give up a margin before the lease runs out, so
                        // the sandboxes are gone before anyone can take it.
                        let left = valid_until.saturating_duration_since(Instant::now());
                        crate::limited_warn!(m.logs, "lease", error = %e, left_ms = left.as_millis() as u64, "host lease check failed");
                        if left < period {
                            tracing::error!("host lease about to expire unrenewed: killing this host's sandboxes");
                            m.lose_lease().await;
                            return;
                        }
                    }
                }
            }
        })
    }

    fn still_ours(&self, l: Option<crate::store::Lease>) -> Result<(), StoreError> {
        match l {
            Some(l) if l.owner == self.fence.owner && l.epoch == self.fence.epoch => Ok(()),
            other => Err(StoreError::Fenced {
                resource: self.fence.resource.clone(),
                owner: other.as_ref().map(|l| l.owner.clone()).unwrap_or_default(),
                held: self.fence.epoch,
                current: other.map(|l| l.epoch).unwrap_or(0),
            }),
        }
    }

    /// Registers this host in the store: where its API listens and how
    /// many sandboxes it takes. Heartbeats follow with every renewal.
    pub async fn register_host(&self, address: &str) -> Result<(), CoreError> {
        let cap = self.caps.max_live_sandboxes.min(u32::MAX as usize) as u32;
        let version = env!("CARGO_PKG_VERSION");
        self.store
            .register_host(&self.fence, address, cap, version)
            .await?;
        tracing::info!(host = %self.host_id(), address, capacity = cap, version, "host registered (starting: not placed on or routed to until ready)");
        Ok(())
    }

    /// Marks this host ready in the store: called once it has reconciled
    /// and listens, so nothing is placed on or routed to it before.
    pub async fn mark_ready(&self) -> Result<(), CoreError> {
        let now = self.store.host_ready(&self.fence).await?;
        tracing::info!(host = %self.host_id(), changed = now, "host ready: placed on and routed to");
        Ok(())
    }

    /// Marks this host stopping in the store (SIGTERM): it is no longer
    /// placed on, and requests for what it runs are still routed to it
    /// while it hands its sessions to other hosts.
    pub async fn mark_stopping(&self) -> Result<(), CoreError> {
        let now = self.store.host_stopping(&self.fence).await?;
        tracing::info!(host = %self.host_id(), changed = now, "host stopping: no longer placed on; still routed to until it exits");
        Ok(())
    }

    /// Whether this process still holds its host lease (it stops serving
    /// once it does not).
    pub fn lease_held(&self) -> bool {
        !self.fenced_off.load(Ordering::SeqCst)
    }

    /// Stops serving: no new sandboxes, and every live one destroyed on
    /// the host. The rows stay as they are (writes are fenced now); the
    /// lease's next holder reconciles them.
    pub(crate) async fn lose_lease(self: &Arc<Self>) {
        self.fenced_off.store(true, Ordering::SeqCst);
        self.metrics.sandboxes_live.set(0);
        let ids: Vec<String> = self
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .map(|(id, _)| id)
            .collect();
        for id in ids.into_iter().chain(self.pool.ids()) {
            self.pool.remove(&id);
            if let Err(e) = self.runtime.destroy(&id).await {
                tracing::warn!(sandbox = %id, error = %e, "teardown after lease loss failed");
            }
            self.release_slot(&id).await;
        }
    }

    /// Refuses work once the lease is gone.
    pub(crate) fn check_lease(&self) -> Result<(), CoreError> {
        if self.fenced_off.load(Ordering::SeqCst) {
            return Err(CoreError::Store(StoreError::Fenced {
                resource: self.fence.resource.clone(),
                owner: String::new(),
                held: self.fence.epoch,
                current: 0,
            }));
        }
        Ok(())
    }
}
