//! Control-plane metrics of the hosts: how many are in each state, and
//! each host's load (sandboxes, sessions, capacity), refreshed from the
//! shared store.

use crate::sessions_count::SessionCounts;
use hatchery_store::{HostState, SandboxFilter, Store, StoreError};
use prometheus::{IntGaugeVec, Opts, Registry};
use std::sync::Arc;
use std::time::Duration;

/// How often the gauges are read from the store.
pub const REFRESH_EVERY: Duration = Duration::from_secs(5);

#[derive(Clone)]
pub struct HostGauges {
    /// `hatchery_hosts{state}`.
    pub by_state: IntGaugeVec,
    /// `hatchery_host_live_sandboxes{host}`.
    pub live: IntGaugeVec,
    /// `hatchery_host_live_sessions{host}`.
    pub sessions: IntGaugeVec,
    /// `hatchery_host_capacity{host}`.
    pub capacity: IntGaugeVec,
}

impl HostGauges {
    pub fn new(registry: &Registry) -> HostGauges {
        let vec = |name: &str, help: &str, label: &str| {
            let g = IntGaugeVec::new(Opts::new(name, help), &[label]).expect("valid metric");
            // A second registration keeps the first; this handle still works.
            let _ = registry.register(Box::new(g.clone()));
            g
        };
        HostGauges {
            by_state: vec("hatchery_hosts", "Registered hosts, by state", "state"),
            live: vec(
                "hatchery_host_live_sandboxes",
                "Starting and running sandboxes, by host",
                "host",
            ),
            sessions: vec(
                "hatchery_host_live_sessions",
                "Sessions not yet completed, failed or cancelled, by owning host",
                "host",
            ),
            capacity: vec(
                "hatchery_host_capacity",
                "Most sandboxes a host runs at once, by host",
                "host",
            ),
        }
    }

    /// One read of the store into the gauges.
    /// Without `sessions` (no session store), the sessions gauge stays
    /// empty.
    pub async fn refresh(
        &self,
        store: &dyn Store,
        sessions: Option<&dyn SessionCounts>,
        lease_ttl_ms: u64,
    ) -> Result<(), StoreError> {
        let hosts = store.list_hosts().await?;
        let live = store.live_per_host(&SandboxFilter::default()).await?;
        let per_host = match sessions {
            Some(s) => match s.per_host().await {
                Ok(n) => Some(n),
                Err(e) => {
                    tracing::debug!(error = %e, "host session gauge not refreshed");
                    None
                }
            },
            None => None,
        };
        for s in HostState::ALL {
            let n = hosts
                .iter()
                .filter(|h| h.state(crate::alive(h.silent_for_ms, lease_ttl_ms)) == s)
                .count();
            self.by_state.with_label_values(&[s.as_str()]).set(n as i64);
        }
        // Hosts that left the table leave the gauge.
        self.live.reset();
        self.capacity.reset();
        for h in &hosts {
            let n = live.get(&h.id).copied().unwrap_or(0);
            self.live.with_label_values(&[&h.id]).set(n as i64);
            self.capacity
                .with_label_values(&[&h.id])
                .set(h.capacity as i64);
        }
        if let Some(per_host) = per_host {
            self.sessions.reset();
            for h in &hosts {
                let n = per_host.get(&h.id).copied().unwrap_or(0);
                self.sessions.with_label_values(&[&h.id]).set(n as i64);
            }
        }
        Ok(())
    }

    pub fn spawn(
        self,
        store: Arc<dyn Store>,
        sessions: Option<Arc<dyn SessionCounts>>,
        lease_ttl_ms: u64,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            loop {
                if let Err(e) = self
                    .refresh(store.as_ref(), sessions.as_deref(), lease_ttl_ms)
                    .await
                {
                    tracing::debug!(error = %e, "host gauges not refreshed");
                }
                tokio::time::sleep(REFRESH_EVERY).await;
            }
        })
    }
}
