//! What a host does when told to stop (SIGTERM), before its listeners
//! close: it stops taking new work (`/readyz` fails, and the store shows
//! it `draining`, so nothing is placed on it while requests for what it
//! runs are still routed to it), moves its sessions to other hosts
//! ([`crate::shedding`]) for up to the grace, and tells its runners that
//! the daemon goes away. The caller then drains requests in flight
//! (running commands) for up to the grace again, and exits.
//!
//! Without a place to move them (one host, no shared snapshot store),
//! sessions stay and are resumed by the host's next start; none is failed
//! because the daemon went away.
//!
//! Sandboxes without a session are not moved: they keep running under
//! their shims, and the host's next start re-adopts them (after the host
//! lease TTL without a start, the host-loss sweep marks them lost).

use crate::readiness::HostChecks;
use crate::shedding::{Shedder, Shedding};
use hatchery_sessions::handoff::ShedReason;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Contract: marks this host `stopping` in the shared store under its
/// lease (hatchery-core `Manager::mark_stopping`).
#[async_trait::async_trait]
pub trait MarkStopping: Send + Sync {
    async fn mark_stopping(&self) -> Result<(), hatchery_core::CoreError>;
}

#[async_trait::async_trait]
impl MarkStopping for hatchery_core::Manager {
    async fn mark_stopping(&self) -> Result<(), hatchery_core::CoreError> {
        hatchery_core::Manager::mark_stopping(self).await
    }
}

/// Runs the stop up to the point where the listeners may close; returns
/// how many sessions are still this host's (0 when all moved).
/// `shedder` is `None` where sessions cannot move (one host, or no
/// shared snapshot store): they are then only told that the daemon goes
/// away, so that none is failed for it, and the next start resumes them.
pub async fn prepare(
    host: &dyn MarkStopping,
    checks: &HostChecks,
    sessions: &dyn Shedding,
    shedder: Option<&Arc<Shedder>>,
    grace: Duration,
) -> usize {
    let t0 = std::time::Instant::now();
    tracing::info!(
        grace_s = grace.as_secs(),
        "stop requested: taking no new work, moving sessions to other hosts"
    );
    checks.stopping.store(true, Ordering::SeqCst);
    if let Err(e) = host.mark_stopping().await {
        // The local checks still refuse new work; placement learns it
        // from the heartbeat's absence at worst.
        tracing::warn!(error = %e, "could not mark the host stopping in the store");
    }
    let left = match shedder {
        Some(s) => {
            s.shed_until(
                ShedReason::HostStopping,
                tokio::time::Instant::now() + grace,
            )
            .await
        }
        None => sessions.owned().await.unwrap_or(0),
    };
    // Before the listeners close: a runner's call to this daemon's API
    // that fails from now on stops the runner, not the session.
    sessions.halt();
    tracing::info!(
        sessions_left = left,
        ms = t0.elapsed().as_millis() as u64,
        "sessions moved; closing the listeners after requests in flight"
    );
    left
}
