//! Start-up reconciliation: make the state store and the host agree.
//! - known and alive and not expired: re-attach to its shim and keep it;
//! - known but expired or unreachable: mark stopped and destroy;
//! - on the host but unknown (a crash between runtime create and the state
//!   write): destroy.

use crate::{now_ms, CoreError, Manager};
use std::collections::HashSet;
use std::sync::Arc;

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
        for row in self.store.list_unstopped()? {
            // Pooled sandboxes are cheap to remake and their pool is gone
            // with the old process: discard them.
            if row.state != crate::store::STATE_POOLED && row.expires_at_ms > now {
                if let Ok(client) = self.connect_agent(&row.id).await {
                    self.store.set_running(&row.id)?;
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
            self.store.stop(&row.id, reason, now)?;
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
        self.reclaim_slots(&keep)?;
        tracing::info!(
            adopted = report.adopted,
            stopped = report.stopped,
            orphans = report.orphans_destroyed,
            "reconciled"
        );
        Ok(report)
    }
}
