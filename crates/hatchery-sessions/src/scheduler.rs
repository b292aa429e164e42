//! Placement. One host for now: a lease is a slot of this daemon's
//! capacity (`--sessions-max-running`). The multi-host issue replaces
//! [`LocalScheduler`] with one that picks a host.

use async_trait::async_trait;
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Held while a session holds a sandbox; dropping it frees the place.
pub struct Lease {
    _permit: OwnedSemaphorePermit,
}

#[async_trait]
pub trait Scheduler: Send + Sync + 'static {
    /// Waits until the session may have a sandbox. FIFO among waiters.
    async fn acquire(&self, session_id: &str) -> Lease;
    /// For a session that already holds a sandbox (found after a restart).
    fn try_acquire(&self, session_id: &str) -> Option<Lease>;
    fn available(&self) -> usize;
}

pub struct LocalScheduler {
    slots: Arc<Semaphore>,
}

impl LocalScheduler {
    pub fn new(capacity: usize) -> Self {
        LocalScheduler {
            slots: Arc::new(Semaphore::new(capacity.max(1))),
        }
    }
}

#[async_trait]
impl Scheduler for LocalScheduler {
    async fn acquire(&self, _session_id: &str) -> Lease {
        // tokio's semaphore is fair: the first to wait is the first served.
        let p = self
            .slots
            .clone()
            .acquire_owned()
            .await
            .expect("never closed");
        Lease { _permit: p }
    }
    fn try_acquire(&self, _session_id: &str) -> Option<Lease> {
        self.slots
            .clone()
            .try_acquire_owned()
            .ok()
            .map(|p| Lease { _permit: p })
    }
    fn available(&self) -> usize {
        self.slots.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn capacity_and_release() {
        let s = LocalScheduler::new(1);
        let a = s.acquire("a").await;
        assert!(s.try_acquire("b").is_none());
        drop(a);
        assert!(s.try_acquire("b").is_some());
    }
}
