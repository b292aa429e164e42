//! The runner's step when its host sheds its sessions (crate::handoff):
//! a fresh checkpoint of a running session, its sandbox let go, then the
//! session handed to another host in the store.

use super::{checkpoint, ev, R};
use crate::events::EventKind;
use crate::scheduler::Lease;
use crate::session_core::SessionCore;
use crate::state::SessionState as S;
use crate::store::Session;
use std::sync::Arc;
use std::time::Instant;

/// Hands `s` to another host if this host sheds its sessions and `s` can
/// go now. `Ok(true)`: it went, and this runner stops (the session is
/// another host's). `Ok(false)`: it stays here for now (not shedding, a
/// session being started, no host to take it, or no checkpoint to
/// resume from); the runner carries on and is asked again.
pub(super) async fn hand_off(
    svc: &Arc<SessionCore>,
    s: &Session,
    lease: &mut Option<Lease>,
) -> R<bool> {
    let Some((targets, why)) = svc.handoff.shedding() else {
        return Ok(false);
    };
    if !matches!(
        s.state,
        S::Queued | S::Idle | S::Running | S::WaitingApproval
    ) {
        return Ok(false);
    }
    let t0 = Instant::now();
    let Some(to) = targets.pick().await else {
        tracing::warn!(session = %s.id, "no other host can take the session now; it stays here");
        return Ok(false);
    };
    if matches!(s.state, S::Running | S::WaitingApproval) {
        let Some(sbx) = s.sandbox_id.clone() else {
            return Ok(false);
        };
        // Everything recorded so far is in this checkpoint's offsets or
        // before them, so the next owner replays nothing twice.
        checkpoint(svc, &s.id, &sbx).await?;
        let cur = svc.store.get(&s.id).await?;
        if cur.snapshot_id.is_none() || cur.state != s.state || cur.cancel_requested {
            tracing::warn!(session = %s.id, state = %cur.state, "not handed over: no checkpoint to resume from, or it changed meanwhile");
            return Ok(false);
        }
        ev(
            svc,
            &s.id,
            EventKind::SandboxReleased {
                sandbox_id: sbx.clone(),
            },
        )
        .await?;
        svc.hooks().unbind(&s.id, &sbx).await;
        // Before the hand-over: the new owner must find it gone (and
        // resume from the checkpoint), not attach to it beside this host.
        if let Err(e) = svc.sandboxes.delete(&sbx).await {
            tracing::warn!(session = %s.id, sandbox = %sbx, error = %e, "sandbox of a handed-over session not deleted");
        }
    }
    match svc.store.hand_over(&s.id, &to, why.as_str()).await? {
        Some(epoch) => {
            *lease = None;
            svc.metrics.handed_over.inc();
            tracing::info!(session = %s.id, to = %to, epoch, state = %s.state, reason = why.as_str(),
                           ms = t0.elapsed().as_millis() as u64, "session handed to another host");
            Ok(true)
        }
        None => Ok(false),
    }
}
