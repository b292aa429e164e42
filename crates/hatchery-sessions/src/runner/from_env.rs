//! A session's start from an environment (issue 40): a fork of the
//! version's snapshot (claimed from the daemon's warm pool of it when the
//! version is hot), brought to the session's ref by the files that changed
//! since the version's base commit.

use super::{credential, discard, ev, fail, fetch_failed, fork_bound, ENV_DELTA, R, WORKDIR};
use crate::events::{Actor, EventKind};
use crate::layout::AGENT_DIR;
use crate::session_core::SessionCore;
use crate::store::{Patch, Session};
use std::sync::Arc;

/// The fork (the set-up done, its egress closed; the fork starts deny-all
/// and gets the session's own proxy binding), checked out at the
/// session's ref: the session's sandbox id.
pub(super) async fn from_environment(
    svc: &Arc<SessionCore>,
    s: &Session,
    pin: &crate::store::EnvPin,
) -> R<String> {
    let id = &s.id;
    ev(
        svc,
        id,
        EventKind::RepoFetchStarted {
            repo: s.spec.repo.clone(),
            git_ref: s.spec.git_ref.clone(),
        },
    )
    .await?;
    let cred = credential(svc, s)?;
    // The delta is fetched host-side and needs nothing of the sandbox, so
    // it runs while the fork restores or is claimed: they were the two
    // largest steps of the start, one after the other (docs/benchmarks.md).
    let fetch = async {
        crate::repo::fetch_delta(
            &s.spec.repo,
            &s.spec.git_ref,
            Some(&pin.base_commit),
            cred.as_deref(),
            svc.cfg.fetch,
            &svc.cfg.fetch_root,
        )
        .await
        .map_err(|e| fetch_failed(svc, e))
    };
    let (forked, fetched) = tokio::join!(fork_bound(svc, s, &pin.snapshot_id), fetch);
    let info = forked?;
    let sbx = info.id.clone();
    let d = match fetched {
        Ok(d) => d,
        Err(e) => {
            // Not on the session's record yet: nothing else would delete it.
            discard(svc, id, &sbx).await;
            return Err(e);
        }
    };
    let recorded = svc
        .append(
            id,
            vec![(
                Actor::System,
                EventKind::SandboxReady {
                    sandbox_id: sbx.clone(),
                    boot_mode: Some(boot_mode(pin, info.boot_mode.as_deref())),
                    boot_ms: info.boot_ms,
                },
            )],
            Patch {
                sandbox_id: Some(Some(sbx.clone())),
                ..Default::default()
            },
        )
        .await;
    if let Err(e) = recorded {
        discard(svc, id, &sbx).await;
        return Err(fail("store_error", e.to_string()));
    }
    let bytes = d.tar.len() as u64;
    let (delta, paths) = (
        format!("{AGENT_DIR}/delta.tar"),
        format!("{AGENT_DIR}/delta-paths"),
    );
    let script = format!("{AGENT_DIR}/env_delta.py");
    let sb = &svc.sandboxes;
    // Independent files: written at once rather than three round trips.
    tokio::try_join!(
        sb.write_file(&sbx, &delta, d.tar),
        sb.write_file(&sbx, &paths, d.paths),
        sb.write_file(&sbx, &script, ENV_DELTA.as_bytes().to_vec()),
    )?;
    let x = sb
        .exec(
            &sbx,
            vec![
                "python3".into(),
                script,
                delta,
                paths,
                WORKDIR.into(),
                format!("{AGENT_DIR}/base.tar"),
                crate::layout::TRACKED_FILE.into(),
            ],
            "/",
            120,
        )
        .await?;
    if x.exit_code != 0 {
        return Err(fail(
            "checkout_failed",
            format!("applying the delta in the sandbox: {}", x.stderr),
        ));
    }
    tracing::info!(session = %id, environment = %pin.environment_id, version = pin.version,
        from_base = d.from_base, changed = d.changed, bytes, boot_mode = info.boot_mode.as_deref().unwrap_or("fork"),
        "session checked out from its environment");
    ev(
        svc,
        id,
        EventKind::RepoCheckedOut {
            commit: d.commit,
            path: WORKDIR.into(),
            bytes,
        },
    )
    .await?;
    Ok(sbx)
}

/// What `sandbox_ready` says of a start from `pin`: the environment, its
/// version, and how the daemon made the sandbox (`pool`: claimed from
/// the version's warm pool; `fork`: restored from its snapshot).
pub(crate) fn boot_mode(pin: &crate::store::EnvPin, daemon: Option<&str>) -> String {
    format!(
        "environment {} v{} {}",
        pin.environment_id,
        pin.version,
        daemon.unwrap_or("fork")
    )
}
