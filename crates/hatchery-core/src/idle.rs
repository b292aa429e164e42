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
//!   holds it (a snapshot's checkpoint, `IdleGate::hold`);
//! - the agent reports the guest quiet: no process but its own (so a
//!   background job, a server, a daemon a command left behind or a child
//!   an interpreter started keeps it running; hatchery-agent quiet.rs).
//!
//! Every channel opened to the agent passes `IdleGate::touch`
//! (idle_gate.rs), which
//! starts a parked sandbox again before the request is sent: there is no
//! path to the guest around it. Teardown thaws on its own (the runtime's
//! `destroy`), and a daemon restarting thaws before it reconnects.
//!
//! The race between a request and the parker is closed by a counter and a
//! flag checked in opposite orders (both `SeqCst`): the parker sets
//! `parked`, then re-reads `touched`; a request bumps `touched`, then
//! reads `parked`. At least one of them sees the other and unparks.

use crate::agent_client::AgentClient;
use crate::Manager;
use hatchery_agent_proto::{Frame, Kind, QuietReport};
use std::collections::HashMap;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the agent may take to say whether it is quiet; a guest that
/// takes longer is busy enough not to be parked.
const QUIET_TIMEOUT: Duration = Duration::from_secs(1);

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
        let touched = gate.touched();
        let open = gate.holds() + live.client.open_channels();
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
