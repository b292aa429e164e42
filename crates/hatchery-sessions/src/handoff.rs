//! Moving this host's sessions to other hosts while it still runs: a
//! graceful stop (SIGTERM) or an operator's drain. It is the host-loss
//! path made immediate: each runner takes a fresh checkpoint of its
//! running session, lets its sandbox go, and hands the session to another
//! host in the store (epoch + 1, a `host_changed` event), which fences
//! this host's writes; the new owner's runner finds the sandbox gone and
//! resumes from that checkpoint, replaying none of the events already
//! recorded (`replay_through`). Queued and idle sessions are handed as
//! they are. A session whose runner is starting it is handed once it
//! runs.
//!
//! The new owner learns of the session by polling its own unfinished
//! sessions ([`crate::service::Sessions::adopt`]), so nothing has to be
//! sent between hosts. Where a session goes is the daemon's choice
//! ([`HandoffTargets`], hatchery-hosts picks a ready host).
//!
//! Trusts: the store's fencing (a session handed twice moves once) and
//! the target's word that it is ready.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

/// Contract: a host other than this one that may take a session now
/// (ready, not held, alive); `None` when there is none (the session then
/// stays here, and the caller asks again later).
#[async_trait::async_trait]
pub trait HandoffTargets: Send + Sync {
    async fn pick(&self) -> Option<String>;
}

/// Why sessions are being moved, as the `host_changed` event says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShedReason {
    /// The daemon was told to stop (SIGTERM).
    HostStopping,
    /// The operator drains the host (`POST /v1/hosts/{id}:drain`).
    HostDraining,
}

impl ShedReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ShedReason::HostStopping => "host_stopping",
            ShedReason::HostDraining => "host_draining",
        }
    }
}

/// The runners' shared word on shedding: set by the service, read by
/// each runner between its steps.
#[derive(Default)]
pub(crate) struct Handoff {
    shedding: RwLock<Option<(Arc<dyn HandoffTargets>, ShedReason)>>,
    /// The daemon is going away: a runner whose sandbox calls fail now
    /// stops without recording a failure (the next owner resumes it).
    halted: AtomicBool,
}

impl Handoff {
    pub(crate) fn start(&self, targets: Arc<dyn HandoffTargets>, why: ShedReason) {
        *self.shedding.write().unwrap_or_else(|p| p.into_inner()) = Some((targets, why));
    }

    pub(crate) fn stop(&self) {
        *self.shedding.write().unwrap_or_else(|p| p.into_inner()) = None;
    }

    pub(crate) fn shedding(&self) -> Option<(Arc<dyn HandoffTargets>, ShedReason)> {
        self.shedding
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn is_shedding(&self) -> bool {
        self.shedding
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    pub(crate) fn halt(&self) {
        self.halted.store(true, Ordering::SeqCst);
    }

    pub(crate) fn halted(&self) -> bool {
        self.halted.load(Ordering::SeqCst)
    }
}
