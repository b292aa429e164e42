//! TTL enforcement in the daemon. The shim enforces the same deadline on its
//! own, so expiry holds while the daemon is down; this loop keeps the state
//! store and metrics truthful and catches anything the shim missed.

use crate::{now_ms, Manager};
use std::sync::Arc;
use std::time::Duration;

impl Manager {
    pub fn spawn_reaper(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            loop {
                tick.tick().await;
                let Some(m) = me.upgrade() else { return };
                match m.store.expired(m.host_id(), now_ms()).await {
                    Ok(ids) => {
                        for id in ids {
                            m.stop(&id, "ttl").await;
                        }
                    }
                    Err(e) => tracing::error!(error = %e, "reaper could not read state"),
                }
                m.expire_snapshots().await;
            }
        })
    }
}
