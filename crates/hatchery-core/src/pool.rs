//! The warm pool: per template, a few sandboxes already restored from the
//! template's checkpoint, connected, and never touched by a request. A
//! create claims one (a database update and a TTL message to its shim) and
//! a background task restores a replacement. A claimed sandbox never comes
//! back: there is no return path into the pool.

use crate::agent_client::AgentClient;
use crate::ids::new_sandbox_id;
use crate::store::{SandboxRow, SandboxState};
use crate::{now_ms, Manager};
use prometheus::IntGauge;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Ready sandboxes kept per template.
    pub size: usize,
    /// Memory the whole pool may take, estimated per idle sandbox.
    pub memory_budget_mb: u64,
    /// Stop refilling (and drain) when the host's available memory falls
    /// below this fraction of its total.
    pub min_available_fraction: f64,
    /// A pooled sandbox older than this is recycled.
    pub max_age: Duration,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            size: 4,
            memory_budget_mb: 1024,
            min_available_fraction: 0.15,
            max_age: Duration::from_secs(3600),
        }
    }
}

/// Measured PSS of an idle restored sandbox is well under this (Sentry,
/// gofer, stubs, shim); the estimate errs high so the budget holds.
const IDLE_SANDBOX_MB: u64 = 64;

/// Ready sandboxes per template, oldest first.
type Ready = HashMap<String, VecDeque<(String, Arc<AgentClient>)>>;

pub struct WarmPool {
    pub cfg: PoolConfig,
    /// Keyed by template name, or by [`crate::snapshot_pool::key`] for a
    /// snapshot's forks (one store, so stops, drains, lease loss and
    /// shutdown reach both kinds the same way).
    ready: Mutex<Ready>,
    /// Kept exact on every change, so "ready" on /metrics can be trusted:
    /// templates' sandboxes, and snapshots' forks.
    gauge: IntGauge,
    snapshot_gauge: IntGauge,
}

impl WarmPool {
    pub fn new(cfg: PoolConfig, gauge: IntGauge, snapshot_gauge: IntGauge) -> Self {
        WarmPool {
            cfg,
            ready: Mutex::new(HashMap::new()),
            gauge,
            snapshot_gauge,
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Ready) -> T) -> T {
        let mut g = self.ready.lock().unwrap_or_else(|p| p.into_inner());
        let out = f(&mut g);
        let (mut templates, mut snapshots) = (0, 0);
        for (k, q) in g.iter() {
            match crate::snapshot_pool::snapshot_of(k) {
                Some(_) => snapshots += q.len(),
                None => templates += q.len(),
            }
        }
        self.gauge.set(templates as i64);
        self.snapshot_gauge.set(snapshots as i64);
        out
    }

    /// Every key with a sandbox ready.
    pub(crate) fn keys(&self) -> Vec<String> {
        self.with(|r| {
            r.iter()
                .filter(|(_, q)| !q.is_empty())
                .map(|(k, _)| k.clone())
                .collect()
        })
    }

    /// Sandboxes ready in all, whatever their key.
    pub(crate) fn total(&self) -> usize {
        self.with(|r| r.values().map(|q| q.len()).sum())
    }

    pub fn take(&self, template: &str) -> Option<(String, Arc<AgentClient>)> {
        self.with(|r| r.get_mut(template)?.pop_front())
    }

    pub(crate) fn put(&self, template: &str, id: String, client: Arc<AgentClient>) {
        self.with(|r| {
            r.entry(template.to_string())
                .or_default()
                .push_back((id, client))
        })
    }

    /// Drops `id` from the pool; true if it was there.
    pub fn remove(&self, id: &str) -> bool {
        self.with(|r| {
            r.values_mut()
                .any(|q| match q.iter().position(|(x, _)| x == id) {
                    Some(i) => q.remove(i).is_some(),
                    None => false,
                })
        })
    }

    pub fn len(&self, template: &str) -> usize {
        self.with(|r| r.get(template).map_or(0, |q| q.len()))
    }

    pub fn ids_of(&self, template: &str) -> Vec<String> {
        self.with(|r| {
            r.get(template)
                .map(|q| q.iter().map(|(id, _)| id.clone()).collect())
                .unwrap_or_default()
        })
    }

    /// Whether pooled `id`'s agent connection is up; `None` if not pooled.
    #[cfg(test)]
    pub(crate) fn is_alive(&self, id: &str) -> Option<bool> {
        self.with(|r| {
            r.values()
                .flat_map(|q| q.iter())
                .find(|(x, _)| x == id)
                .map(|(_, c)| c.is_alive())
        })
    }

    pub fn ids(&self) -> Vec<String> {
        self.with(|r| {
            r.values()
                .flat_map(|q| q.iter().map(|(id, _)| id.clone()))
                .collect()
        })
    }

    /// Ready sandboxes to keep per template when `templates` share the
    /// memory budget.
    fn target_per(&self, templates: usize) -> usize {
        self.cfg.size.min(self.budget() / templates.max(1))
    }

    /// Idle sandboxes the memory budget has room for, both kinds together.
    pub(crate) fn budget(&self) -> usize {
        (self.cfg.memory_budget_mb / IDLE_SANDBOX_MB) as usize
    }
}

/// `MemAvailable / MemTotal` from /proc/meminfo.
pub fn available_fraction() -> f64 {
    let Ok(s) = std::fs::read_to_string("/proc/meminfo") else {
        return 1.0;
    };
    let field = |name: &str| -> f64 {
        s.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    let total = field("MemTotal:");
    if total <= 0.0 {
        return 1.0;
    }
    field("MemAvailable:") / total
}

impl Manager {
    /// For a graceful stop: no more refills (an in-flight one finishes),
    /// running bakes finish, and pooled sandboxes are destroyed (a restart
    /// would discard them anyway; live sandboxes are left to their shims
    /// on purpose).
    pub async fn shutdown(self: &Arc<Self>) {
        self.closing.store(true, Ordering::SeqCst);
        self.close_terminals().await;
        let _no_refill = self.filling.lock().await;
        for _ in 0..300 {
            if self
                .baking
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_empty()
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for id in self.pool.ids() {
            self.pool.remove(&id);
            let _ = self
                .store
                .stop(&self.fence, &id, "pool_discard", now_ms())
                .await;
            if let Err(e) = self.runtime.destroy(&id).await {
                tracing::warn!(sandbox = %id, error = %e, "could not destroy pooled sandbox");
            }
            self.release_slot(&id).await;
        }
        // Deletes answered just before the stop are still tearing down.
        for _ in 0..300 {
            if self.teardowns.load(Ordering::SeqCst) == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let me = Arc::clone(self);
        let _ = tokio::task::spawn_blocking(move || me.shutdown_network()).await;
        self.shut_down.store(true, Ordering::SeqCst);
    }

    /// Keeps every template's pool full, within the memory budget, and
    /// drains it when the host runs short of memory.
    pub fn spawn_pool_filler(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                let Some(m) = me.upgrade() else { return };
                let _filling = m.filling.lock().await;
                if m.closing.load(Ordering::SeqCst) {
                    return;
                }
                if available_fraction() < m.pool.cfg.min_available_fraction {
                    for id in m.pool.ids() {
                        tracing::warn!(sandbox = %id, "memory pressure: draining warm pool");
                        m.stop(&id, "pool_pressure").await;
                    }
                    continue;
                }
                if m.pool.cfg.size > 0 {
                    m.fill_template_pools().await;
                }
                // After the templates': a fresh create must not wait
                // behind a hot snapshot's refill.
                m.fill_snapshot_pools().await;
            }
        })
    }

    /// One round of template refills: one sandbox per template short of
    /// its share of the budget.
    async fn fill_template_pools(self: &Arc<Self>) {
        let m = self;
        let templates = m.templates().list();
        let target = m.pool.target_per(templates.len());
        for template in templates {
            // Cheap check first: verifying an image hashes it.
            if m.pool.len(&template.spec.name) >= target {
                continue;
            }
            let Some(image) = m.template_image(&template) else {
                m.spawn_bake(&template);
                continue;
            };
            match m.add_pooled(&template, &image).await {
                Ok(()) => {}
                // The same rule as a create's restore: without it
                // the pool stayed empty, retrying the refused image
                // every 2 s, until a create happened to rebake it.
                Err(crate::CoreError::Runtime(e)) => {
                    tracing::warn!(template = %template.spec.name, error = %e,
                        "pool refill: template checkpoint refused by the runtime; baking it again");
                    m.rebake_refused(&template);
                }
                Err(e) => {
                    tracing::warn!(template = %template.spec.name, error = %e, "pool refill failed");
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            }
        }
    }

    async fn add_pooled(
        self: &Arc<Self>,
        template: &hatchery_templates::Template,
        image: &std::path::Path,
    ) -> Result<(), crate::CoreError> {
        let now = now_ms();
        let row = SandboxRow {
            id: new_sandbox_id(),
            template: template.spec.name.clone(),
            state: SandboxState::Pooled,
            created_at_ms: now,
            expires_at_ms: now + self.pool.cfg.max_age.as_millis() as u64,
            metadata: BTreeMap::new(),
            env: BTreeMap::new(),
            host_id: self.host_id().to_string(),
            template_version: template.version.clone(),
            rootfs: template.rootfs.to_string_lossy().into_owned(),
            limits: template.limits_json(),
        };
        let client = self
            .start_row(&row, &Default::default(), template, Some(image), None)
            .await?;
        // A restored interpreter's memory is paged in on first use, which
        // made the first run in a claimed sandbox about 12 ms slower than
        // the next (measured). A warm-up run, which leaves the default
        // context's namespace and count untouched, pays for it here, off
        // the request path.
        crate::code::warm(&client).await;
        if !self.still_pooled(&row.id).await? {
            return Ok(());
        }
        // Stopped outright until claimed (warm-up done): an idle Sentry
        // costs 3 % of a core on this runsc (hatchery-runtime-gvisor's
        // freezer.rs). Parked before it is in the pool, so no claim can
        // see it unparked-then-parked.
        self.runtime.park(&row.id).await;
        self.pool.put(&template.spec.name, row.id, client);
        Ok(())
    }
}

impl Manager {
    /// Whether a sandbox restored for a pool is still the pool's: one
    /// stopped while it restored (a drain, a shutdown) is torn down here,
    /// not pooled.
    pub(crate) async fn still_pooled(&self, id: &str) -> Result<bool, crate::CoreError> {
        let still = self
            .store
            .transition(
                &self.fence,
                id,
                &[SandboxState::Pooled],
                SandboxState::Pooled,
            )
            .await?;
        if !still {
            let _ = self.runtime.destroy(id).await;
            self.release_slot(id).await;
        }
        Ok(still)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_is_shared_between_templates() {
        let g = IntGauge::new("g", "g").unwrap();
        let p = WarmPool::new(
            PoolConfig {
                size: 8,
                memory_budget_mb: 512,
                ..Default::default()
            },
            g,
            IntGauge::new("s", "s").unwrap(),
        );
        assert_eq!(p.target_per(1), 8);
        assert_eq!(p.target_per(2), 4);
        assert_eq!(p.target_per(16), 0);
        let p0 = WarmPool::new(
            PoolConfig {
                size: 0,
                ..Default::default()
            },
            IntGauge::new("h", "h").unwrap(),
            IntGauge::new("s", "s").unwrap(),
        );
        assert_eq!(p0.target_per(1), 0);
    }
}
