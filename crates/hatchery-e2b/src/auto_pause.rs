//! The auto-pause sweep: pauses sandboxes created with `autoPause` (see
//! [`crate::lifecycle`]) when their E2B timeout comes. Apart from
//! `lifecycle` because it needs the adapter's state and the pause
//! (`pause_resume`), while the settings sit below both (every sandbox
//! view carries them).

use crate::lifecycle::AUTO_PAUSE_KEY;
use crate::state::{present, Shared};
use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// How often auto-pausing sandboxes are checked while there are any.
const TICK: Duration = Duration::from_secs(1);
/// How often when none were seen (other hosts', or ones from before a
/// restart, are found this way).
const IDLE_TICK: Duration = Duration::from_secs(15);

/// Pauses auto-pausing sandboxes whose E2B timeout has come, until the
/// adapter is dropped. Woken early by a create that asks for auto-pause.
pub async fn sweep(s: Weak<Shared>) {
    let mut busy = false;
    loop {
        let wake = match s.upgrade() {
            Some(s) => Arc::clone(&s.sweep_wake),
            None => return,
        };
        let wait = if busy { TICK } else { IDLE_TICK };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = wake.notified() => {}
        }
        let Some(s) = s.upgrade() else { return };
        busy = sweep_once(&s).await;
    }
}

/// One pass; whether any auto-pausing sandbox runs (on any host).
async fn sweep_once(s: &Shared) -> bool {
    let filter = BTreeMap::from([(AUTO_PAUSE_KEY.to_string(), "1".to_string())]);
    let found = match s.backend.find(filter).await {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(error = %e.message, "e2b auto-pause: cannot list sandboxes");
            return true;
        }
    };
    let now = crate::now_ms();
    for raw in &found {
        let (e2b_id, v) = present(raw.clone());
        if v.expires_at_ms > now {
            continue;
        }
        // Another host's sandbox fails here (its own sweep pauses it).
        if let Err(e) =
            crate::pause_resume::pause_live(s, &e2b_id, &raw.id, &v, !v.lifecycle.files_only).await
        {
            tracing::debug!(sandbox = %e2b_id, error = %e.message, "e2b auto-pause: not paused here");
        } else {
            tracing::info!(sandbox = %e2b_id, "e2b auto-pause: paused at its timeout");
        }
    }
    !found.is_empty()
}
