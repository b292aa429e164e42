//! Start-up reconciliation: make the state store and the host agree.
//! - known and alive and not expired: re-attach to its shim and keep it;
//! - known but expired or unreachable: mark stopped and destroy;
//! - on the host but unknown (a crash between runtime create and the state
//!   write): destroy.

use crate::store::SandboxState;
use crate::{now_ms, CoreError, Manager};
use std::collections::HashSet;
use std::sync::Arc;

/// How often a long reconcile logs its progress.
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

#[derive(Debug, Default, Clone, PartialEq)]
pub struct ReconcileReport {
    pub adopted: usize,
    pub stopped: usize,
    pub orphans_destroyed: usize,
}

impl Manager {
    pub async fn reconcile(self: &Arc<Self>) -> Result<ReconcileReport, CoreError> {
        let mut report = ReconcileReport::default();
        let mut keep = HashSet::new();
        let now = now_ms();
        // Only this host's rows: another host's sandboxes are not on this
        // machine, and must not be marked lost from here.
        let rows = self.store.list_unstopped(self.host_id()).await?;
        // Reconnecting to each shim takes time (seconds with many): an
        // operator sees it start, progress and end, and the host is not
        // `ready` (placed on, routed to) until it has.
        let started = std::time::Instant::now();
        let mut said = started;
        let total = rows.len();
        tracing::info!(
            rows = total,
            "reconciling this host's sandboxes with the store"
        );
        for (done, row) in rows.into_iter().enumerate() {
            if said.elapsed() >= PROGRESS_EVERY {
                said = std::time::Instant::now();
                tracing::info!(
                    done,
                    total,
                    adopted = report.adopted,
                    stopped = report.stopped,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "reconcile progress"
                );
            }
            // Pooled sandboxes are cheap to remake and their pool is gone
            // with the old process: discard them.
            if row.state != SandboxState::Pooled && row.expires_at_ms > now {
                if let Ok(client) = self.connect_agent(&row.id).await {
                    let moved = self
                        .store
                        .transition(
                            &self.fence,
                            &row.id,
                            &[SandboxState::Starting, SandboxState::Running],
                            SandboxState::Running,
                        )
                        .await?;
                    if !moved {
                        continue;
                    }
                    self.adopt(&row.id, client, row.env.clone());
                    keep.insert(row.id.clone());
                    report.adopted += 1;
                    continue;
                }
            }
            let reason = if row.expires_at_ms <= now {
                "ttl"
            } else {
                "lost"
            };
            self.store.stop(&self.fence, &row.id, reason, now).await?;
            self.runtime.destroy(&row.id).await?;
            report.stopped += 1;
        }
        for id in self.runtime.list().await? {
            if !keep.contains(&id) {
                self.runtime.destroy(&id).await?;
                report.orphans_destroyed += 1;
            }
        }
        // Only now, with every unknown sandbox gone, may their slots go.
        self.reclaim_slots(&keep).await?;
        self.restore_snapshot_pools().await;
        tracing::info!(
            adopted = report.adopted,
            stopped = report.stopped,
            orphans = report.orphans_destroyed,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "reconciled"
        );
        Ok(report)
    }
}
