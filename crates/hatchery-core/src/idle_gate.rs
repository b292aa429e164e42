//! One sandbox's idle-parking state (idle.rs has the why and the rules):
//! what its agent connection touches on every channel it opens, and what
//! the parker parks through. Apart from the parker so that the agent
//! connection depends on this and nothing else of the manager.

use crate::metrics::IdleMetrics;
use hatchery_runtime::Runtime;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

/// One sandbox's parking state, shared by its agent connection (every
/// channel opened touches it) and the parker.
pub(crate) struct IdleGate {
    id: String,
    runtime: Arc<dyn Runtime>,
    metrics: IdleMetrics,
    /// Channels opened and holds taken so far.
    touched: AtomicU64,
    parked: AtomicBool,
    holds: AtomicUsize,
    /// Serialises parking and unparking (never held across an await).
    gate: Mutex<()>,
}

impl IdleGate {
    pub(crate) fn new(id: &str, runtime: Arc<dyn Runtime>, metrics: IdleMetrics) -> Arc<IdleGate> {
        Arc::new(IdleGate {
            id: id.to_string(),
            runtime,
            metrics,
            touched: AtomicU64::new(0),
            parked: AtomicBool::new(false),
            holds: AtomicUsize::new(0),
            gate: Mutex::new(()),
        })
    }

    /// The sandbox is about to be used: counted, and started again first
    /// if it is parked. Waits (briefly, on this thread) for a park in
    /// progress to finish, so that what follows reaches a running guest.
    pub(crate) fn touch(&self) {
        self.touched.fetch_add(1, SeqCst);
        if self.parked.load(SeqCst) {
            self.unpark();
        }
    }

    fn unpark(&self) {
        let _g = self.gate.lock().unwrap_or_else(|p| p.into_inner());
        if self.parked.swap(false, SeqCst) {
            self.runtime.unpark(&self.id);
            self.metrics.unparks.inc();
            self.metrics.parked.dec();
        }
    }

    /// Keeps the sandbox running until the guard drops, for host
    /// operations that reach the guest without a channel (a checkpoint is
    /// an RPC to the Sentry).
    pub(crate) fn hold(self: &Arc<Self>) -> Hold {
        self.holds.fetch_add(1, SeqCst);
        self.touch();
        Hold(Arc::clone(self))
    }

    /// Channels opened and holds taken so far.
    pub(crate) fn touched(&self) -> u64 {
        self.touched.load(SeqCst)
    }

    /// Host operations holding the sandbox running now.
    pub(crate) fn holds(&self) -> usize {
        self.holds.load(SeqCst)
    }

    pub(crate) fn is_parked(&self) -> bool {
        self.parked.load(SeqCst)
    }

    /// Parks the sandbox if nothing touched it since the parker saw
    /// `seen` and nothing is open; true if it is parked now. Blocking.
    pub(crate) fn park_if_unused(&self, seen: u64, open: &dyn Fn() -> usize) -> bool {
        let _g = self.gate.lock().unwrap_or_else(|p| p.into_inner());
        let unused =
            || self.touched.load(SeqCst) == seen && self.holds.load(SeqCst) == 0 && open() == 0;
        if self.parked.load(SeqCst) || !unused() || !self.runtime.park_idle(&self.id) {
            return false;
        }
        self.parked.store(true, SeqCst);
        if !unused() {
            // A request came in while the freezer settled.
            self.parked.store(false, SeqCst);
            self.runtime.unpark(&self.id);
            return false;
        }
        self.metrics.parks.inc();
        self.metrics.parked.inc();
        true
    }

    /// The sandbox is going away: it leaves the gauge (its teardown thaws
    /// it, runtime `destroy`).
    pub(crate) fn retire(&self) {
        let _g = self.gate.lock().unwrap_or_else(|p| p.into_inner());
        if self.parked.swap(false, SeqCst) {
            self.metrics.parked.dec();
        }
    }
}

pub(crate) struct Hold(Arc<IdleGate>);

impl Drop for Hold {
    fn drop(&mut self) {
        // Counted as a touch too: the idle time starts when the hold ends.
        self.0.touched.fetch_add(1, SeqCst);
        self.0.holds.fetch_sub(1, SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hatchery_runtime::fake::FakeRuntime;

    fn gate(rt: &Arc<FakeRuntime>, id: &str) -> Arc<IdleGate> {
        let runtime: Arc<dyn Runtime> = rt.clone();
        IdleGate::new(id, runtime, crate::metrics::Metrics::new().idle)
    }

    async fn started(rt: &Arc<FakeRuntime>, id: &str) {
        let spec = hatchery_runtime::SandboxSpec {
            id: id.into(),
            rootfs: "/nonexistent".into(),
            limits: hatchery_runtime::Limits {
                cpus: 1.0,
                memory_mb: 64,
                pids_max: 16,
                disk_mb: 16,
            },
            expires_at_ms: u64::MAX,
            netns: None,
            background: false,
        };
        rt.create(&spec).await.unwrap();
    }

    #[tokio::test]
    async fn a_touch_after_the_parker_looked_keeps_the_sandbox_running() {
        // Fails if the parker parks on a stale view: a request that
        // started after it looked must find a running guest.
        let rt = FakeRuntime::new();
        started(&rt, "s1").await;
        let g = gate(&rt, "s1");
        let seen = g.touched.load(SeqCst);
        g.touch();
        assert!(!g.park_if_unused(seen, &|| 0));
        assert_eq!(rt.is_parked("s1"), Some(false));
        // Unchanged since: parked, then the next touch starts it again.
        let seen = g.touched.load(SeqCst);
        assert!(g.park_if_unused(seen, &|| 0));
        assert_eq!(rt.is_parked("s1"), Some(true));
        assert_eq!(g.metrics.parked.get(), 1);
        g.touch();
        assert_eq!(rt.is_parked("s1"), Some(false));
        assert_eq!(g.metrics.parked.get(), 0);
        assert_eq!(g.metrics.unparks.get(), 1);
    }

    #[tokio::test]
    async fn open_channels_and_holds_keep_the_sandbox_running() {
        let rt = FakeRuntime::new();
        started(&rt, "s2").await;
        let g = gate(&rt, "s2");
        let seen = g.touched.load(SeqCst);
        assert!(!g.park_if_unused(seen, &|| 1), "parked with a channel open");
        let h = g.hold();
        let seen = g.touched.load(SeqCst);
        assert!(!g.park_if_unused(seen, &|| 0), "parked during a hold");
        drop(h);
        assert!(!g.park_if_unused(seen, &|| 0), "the hold's end is a use");
        let seen = g.touched.load(SeqCst);
        assert!(g.park_if_unused(seen, &|| 0));
        // A hold on a parked sandbox starts it first.
        let _h = g.hold();
        assert_eq!(rt.is_parked("s2"), Some(false));
    }

    #[tokio::test]
    async fn retire_forgets_a_parked_sandbox() {
        let rt = FakeRuntime::new();
        started(&rt, "s3").await;
        let g = gate(&rt, "s3");
        assert!(g.park_if_unused(g.touched.load(SeqCst), &|| 0));
        g.retire();
        assert_eq!(g.metrics.parked.get(), 0);
        assert!(!g.is_parked());
    }
}
