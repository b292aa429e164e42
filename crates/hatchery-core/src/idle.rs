//! Idle parking: a claimed sandbox that nobody uses is stopped whole until
//! the next request.
//!
//! Why: under this runsc's systrap platform an idle Sentry still wakes
//! every 400 µs (runtime-gvisor freezer.rs), about 3.5 % of a core per
//! sandbox. Pooled sandboxes are parked already; claimed ones are the
//! rest: fifty interview rooms whose candidates are typing (the room is in
//! the daemon, the sandbox waits for the next Run) took 1.5 of this host's
//! 2 cores and starved everything else (docs/benchmarks.md, "Idle CPU").
//!
//! The contract, for users: parking never changes what a sandbox does,
//! only when it burns CPU. A sandbox is parked only when all of these hold
//! for `Caps::idle_park_ms`:
//! - no channel to its agent is open (no request in flight, no terminal
//!   attached, no relayed connection either way), and no host operation
//!   holds it (a snapshot's checkpoint, [`IdleGate::hold`]);
//! - the agent reports the guest quiet: no process but its own (so a
//!   background job, a server, a daemon a command left behind or a child
//!   an interpreter started keeps it running; hatchery-agent quiet.rs).
//!
//! Every channel opened to the agent passes [`IdleGate::touch`], which
//! starts a parked sandbox again before the request is sent: there is no
//! path to the guest around it. Teardown thaws on its own (the runtime's
//! `destroy`), and a daemon restarting thaws before it reconnects.
//!
//! The race between a request and the parker is closed by a counter and a
//! flag checked in opposite orders (both `SeqCst`): the parker sets
//! `parked`, then re-reads `touched`; a request bumps `touched`, then
//! reads `parked`. At least one of them sees the other and unparks.

use crate::agent_client::AgentClient;
use crate::metrics::IdleMetrics;
use crate::Manager;
use hatchery_agent_proto::{Frame, Kind, QuietReport};
use hatchery_runtime::Runtime;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long the agent may take to say whether it is quiet; a guest that
/// takes longer is busy enough not to be parked.
const QUIET_TIMEOUT: Duration = Duration::from_secs(1);

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

    pub(crate) fn is_parked(&self) -> bool {
        self.parked.load(SeqCst)
    }

    /// Parks the sandbox if nothing touched it since the parker saw
    /// `seen` and nothing is open; true if it is parked now. Blocking.
    fn park_if_unused(&self, seen: u64, open: &dyn Fn() -> usize) -> bool {
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

/// What the parker last saw of one sandbox.
struct Seen {
    touched: u64,
    since: Instant,
    /// The guest was busy when last asked: not asked again before this.
    ask_after: Option<Instant>,
}

/// Asks the agent whether the guest is quiet; any failure counts as busy.
async fn quiet(client: &AgentClient) -> Result<QuietReport, &'static str> {
    let mut ch = client.open_unnoticed();
    client
        .send(&Frame::new(ch.id, Kind::Quiet, vec![]))
        .await
        .map_err(|_| "agent connection closed")?;
    match tokio::time::timeout(QUIET_TIMEOUT, ch.rx.recv()).await {
        Ok(Some(f)) if f.kind == Kind::Ok => f.parse().map_err(|_| "malformed answer"),
        Ok(_) => Err("the agent refused the question"),
        Err(_) => Err("the agent did not answer in time"),
    }
}

impl Manager {
    /// Parks claimed sandboxes nobody uses (see the module documentation).
    /// `None` when `Caps::idle_park_ms` is 0.
    pub fn spawn_idle_parker(self: &Arc<Self>) -> Option<tokio::task::JoinHandle<()>> {
        let after = Duration::from_millis(self.caps.idle_park_ms);
        if after.is_zero() {
            return None;
        }
        let tick = (after / 4).clamp(Duration::from_millis(100), Duration::from_secs(1));
        let me = Arc::downgrade(self);
        Some(tokio::spawn(async move {
            let mut seen: HashMap<String, Seen> = HashMap::new();
            loop {
                tokio::time::sleep(tick).await;
                let Some(m) = me.upgrade() else { return };
                if m.closing.load(SeqCst) {
                    return;
                }
                let lives: Vec<(String, Arc<crate::manager::Live>)> = m
                    .live
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .map(|(k, v)| (k.clone(), Arc::clone(v)))
                    .collect();
                seen.retain(|id, _| lives.iter().any(|(l, _)| l == id));
                for (id, live) in lives {
                    m.consider_parking(&id, &live, &mut seen, after).await;
                }
            }
        }))
    }

    async fn consider_parking(
        &self,
        id: &str,
        live: &crate::manager::Live,
        seen: &mut HashMap<String, Seen>,
        after: Duration,
    ) {
        let gate = &live.idle;
        if gate.is_parked() {
            seen.remove(id);
            return;
        }
        let now = Instant::now();
        let touched = gate.touched.load(SeqCst);
        let open = gate.holds.load(SeqCst) + live.client.open_channels();
        let s = seen.entry(id.to_string()).or_insert(Seen {
            touched,
            since: now,
            ask_after: None,
        });
        if open > 0 || s.touched != touched {
            *s = Seen {
                touched,
                since: now,
                ask_after: None,
            };
            return;
        }
        if now.duration_since(s.since) < after || s.ask_after.is_some_and(|t| now < t) {
            return;
        }
        match quiet(&live.client).await {
            Ok(r) if r.quiet => {}
            Ok(r) => {
                tracing::debug!(sandbox = %id, busy = r.busy.as_deref().unwrap_or(""), "not parked: the guest is busy");
                s.ask_after = Some(now + after);
                return;
            }
            Err(why) => {
                tracing::debug!(sandbox = %id, why, "not parked: no quiet answer");
                s.ask_after = Some(now + after);
                return;
            }
        }
        let gate = Arc::clone(&live.idle);
        let client = Arc::clone(&live.client);
        let parked = tokio::task::spawn_blocking(move || {
            gate.park_if_unused(touched, &|| client.open_channels())
        })
        .await
        .unwrap_or(false);
        if parked {
            tracing::debug!(sandbox = %id, "parked while idle");
            seen.remove(id);
        }
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
