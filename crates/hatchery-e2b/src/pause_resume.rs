//! Pausing a running sandbox and resuming a paused one, under the guards
//! that keep two of either from running at once (this daemon's, and the
//! store's resume claim across hosts). Used by the control plane's
//! `pause`, `resume` and `connect`, by the auto-pause sweep
//! (`auto_pause`) and by a request to an auto-resuming sandbox
//! (`sandbox`), so none of those needs another for it.

use crate::api_error::{ApiError, ApiResult};
use crate::backend::SandboxView;
use crate::state::{Paused, Shared, ALIAS_KEY, MAX_PAUSED};
use axum::http::StatusCode;

/// What a resume found: the sandbox it restored, or one that another
/// resume (on this host or another) restored first.
pub(crate) enum Resumed {
    Restored(SandboxView),
    AlreadyRunning(SandboxView),
}

/// Resumes paused sandbox `id` with an E2B timeout of `ttl` seconds.
pub(crate) async fn resume_paused(s: &Shared, id: &str, ttl: u64) -> ApiResult<Resumed> {
    if s.paused(id).await?.is_none() {
        return Err(ApiError::not_found(id));
    }
    let being_resumed = || {
        ApiError::new(
            StatusCode::CONFLICT,
            format!("sandbox \"{id}\" is being resumed already"),
        )
    };
    if !s.begin_resume(id) {
        return Err(being_resumed());
    }
    let claim = match s.backend.claim_resume(id).await {
        Ok(Some(c)) => c,
        Ok(None) => {
            s.end_resume(id);
            return Err(being_resumed());
        }
        Err(e) => {
            s.end_resume(id);
            return Err(e.into());
        }
    };
    let out = resume_claimed(s, id, ttl).await;
    s.backend.release_resume(claim).await;
    s.end_resume(id);
    out
}

/// Under the claim: a resume that finished before it was taken left a
/// running sandbox (and, if its snapshot delete failed, the snapshot too),
/// so that is looked for before anything is restored.
async fn resume_claimed(s: &Shared, id: &str, ttl: u64) -> ApiResult<Resumed> {
    if let Some((_, v)) = s.live(id).await? {
        return Ok(Resumed::AlreadyRunning(v));
    }
    let Some(p) = s.paused(id).await? else {
        return Err(ApiError::not_found(id));
    };
    // The new sandbox answers to the E2B id from its metadata on, on any
    // host and after a restart; the snapshot goes once it runs.
    let mut meta = p.view.metadata.clone();
    meta.extend(p.view.lifecycle.keys());
    meta.insert(ALIAS_KEY.into(), id.into());
    let ttl = p.view.lifecycle.hatchery_ttl(ttl);
    let v = s.backend.restore(&p.snapshot, ttl, meta, None).await?;
    if p.view.lifecycle.auto_pause {
        s.sweep_wake.notify_one();
    }
    s.set_alias(id, &v.id);
    s.backend.delete_snapshot(&p.snapshot).await;
    Ok(Resumed::Restored(v))
}

/// Pauses running sandbox `h` (E2B id `id`, client view `v`): a snapshot
/// that is the pause record (`state`), then the sandbox is stopped. Also
/// the auto-pause at a timeout (`auto_pause::sweep`). With `memory`
/// false only its files are kept (a filesystem-only pause): the resume
/// boots the template with them, and no process survives.
pub(crate) async fn pause_live(
    s: &Shared,
    id: &str,
    h: &str,
    v: &SandboxView,
    memory: bool,
) -> ApiResult<()> {
    if !s.begin_pause(id) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("sandbox \"{id}\" is being paused already"),
        ));
    }
    let out = async {
        if s.all_paused().await?.len() >= MAX_PAUSED {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!("{MAX_PAUSED} sandboxes are paused already; kill or resume one first"),
            ));
        }
        let record = Paused::record(id, v, memory);
        if memory {
            s.backend.snapshot(h, record).await?;
        } else {
            s.backend.snapshot_files(h, record).await?;
        }
        s.backend.kill(h).await;
        s.forget(id, h);
        Ok(())
    }
    .await;
    s.end_pause(id);
    out
}
