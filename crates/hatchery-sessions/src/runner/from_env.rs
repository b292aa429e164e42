//! A session's start from an environment (issue 40): a fork of the
//! version's snapshot (claimed from the daemon's warm pool of it when the
//! version is hot), brought to the session's ref by the files that changed
//! since the version's base commit.

use super::{
    credential, discard, ev, fail, fetch_failed, fork_bound, prepare_agent, Launch, R, WORKDIR,
};
use crate::events::{Actor, EventKind};
use crate::layout::AGENT_DIR;
use crate::session_core::SessionCore;
use crate::store::{Patch, Session};
use std::sync::Arc;

const ENV_DELTA: &str = include_str!("../../agent/env_delta.py");

/// The fork (the set-up done, its egress closed; the fork starts deny-all
/// and gets the session's own proxy binding), checked out at the
/// session's ref: the session's sandbox id, and how to start its agent.
pub(super) async fn from_environment(
    svc: &Arc<SessionCore>,
    s: &Session,
    pin: &crate::store::EnvPin,
) -> R<(String, Launch)> {
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
    // it runs while the fork restores or is claimed and while the agent's
    // files are written: one after the other, they were most of the start
    // (docs/benchmarks.md).
    let began = std::time::Instant::now();
    let fetch = async {
        let d = crate::repo::fetch_delta(
            &s.spec.repo,
            &s.spec.git_ref,
            Some(&pin.base_commit),
            cred.as_deref(),
            svc.cfg.fetch,
            &svc.cfg.fetch_root,
        )
        .await
        .map_err(|e| fetch_failed(svc, e))?;
        Ok::<_, super::RunError>((d, began.elapsed().as_millis() as u64))
    };
    let sandbox = async {
        let info = fork_bound(svc, s, &pin.snapshot_id).await?;
        let sbx = info.id.clone();
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
            // Not on the session's record: nothing else would delete it.
            discard(svc, id, &sbx).await;
            return Err(fail("store_error", e.to_string()));
        }
        // From here the sandbox is the session's: a failure releases it.
        let launch = prepare_agent(svc, s, &sbx).await?;
        Ok((
            sbx,
            launch,
            info.boot_mode,
            began.elapsed().as_millis() as u64,
        ))
    };
    let (sandbox, fetched) = tokio::join!(sandbox, fetch);
    let (sbx, launch, daemon_mode, sandbox_ms) = sandbox?;
    let (d, fetch_ms) = fetched?;
    let applying = std::time::Instant::now();
    let bytes = d.tar.len() as u64;
    let (delta, paths) = (
        format!("{AGENT_DIR}/delta.tar"),
        format!("{AGENT_DIR}/delta-paths"),
    );
    let sb = &svc.sandboxes;
    // Independent files: written at once rather than two round trips.
    tokio::try_join!(
        sb.write_file(&sbx, &delta, d.tar),
        sb.write_file(&sbx, &paths, d.paths),
    )?;
    // In the sandbox's warm interpreter: a `python3` process of its own
    // was the largest step left of a hot start (about 130 ms of gVisor
    // process start and imports).
    let code = delta_code(&[
        &delta,
        &paths,
        WORKDIR,
        &format!("{AGENT_DIR}/base.tar"),
        crate::layout::TRACKED_FILE,
    ]);
    let x = sb.run_python(&sbx, &code, 120).await?;
    if let Some(e) = x.error {
        return Err(fail(
            "checkout_failed",
            format!("applying the delta in the sandbox: {e}"),
        ));
    }
    // The start's steps, for operators (docs/benchmarks.md has the table).
    let apply_ms = applying.elapsed().as_millis() as u64;
    tracing::info!(session = %id, environment = %pin.environment_id, version = pin.version,
        from_base = d.from_base, changed = d.changed, bytes, applied = %x.stdout.trim(),
        sandbox_ms, fetch_ms, apply_ms,
        boot_mode = daemon_mode.as_deref().unwrap_or("fork"),
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
    Ok((sbx, launch))
}

/// The snippet that runs `env_delta.py`'s `main(*args)` in the sandbox's
/// interpreter, in a namespace of its own: the interpreter's globals
/// are left as they were, whatever happens.
fn delta_code(args: &[&str]) -> String {
    // A JSON string or list of strings is a Python literal too.
    let src = serde_json::to_string(ENV_DELTA).unwrap_or_default();
    let args = serde_json::to_string(args).unwrap_or_default();
    format!(
        "def __hatchery_env_delta(src, args):\n\
         \x20   ns = {{\"__name__\": \"hatchery_env_delta\"}}\n\
         \x20   exec(compile(src, \"env_delta.py\", \"exec\"), ns)\n\
         \x20   return ns[\"main\"](*args)\n\
         try:\n\
         \x20   print(__hatchery_env_delta({src}, {args}))\n\
         finally:\n\
         \x20   del __hatchery_env_delta\n"
    )
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

#[cfg(test)]
mod tests {
    use super::delta_code;

    /// The snippet runs `main` with the arguments given and leaves no
    /// name behind, run by the host's python3 as the sandbox's kernel
    /// would run it (the script's logic is tested end to end in
    /// tests/sessions/test_environments.py).
    #[test]
    fn the_snippet_calls_main_and_leaves_the_globals_alone() {
        let dir = tempfile::tempdir().unwrap();
        let tracked = "/nonexistent/a'b\"c\\n";
        let code = delta_code(&["/d.tar", "/new", "/w", "/base.tar", tracked]);
        let probe = format!(
            "import json\nbefore = set(globals())\ntry:\n{}\nexcept FileNotFoundError as e:\n    print(json.dumps([e.filename, sorted(set(globals()) - before - {{'e', 'before'}})]))\n",
            code.lines().map(|l| format!("    {l}")).collect::<Vec<_>>().join("\n")
        );
        let f = dir.path().join("probe.py");
        std::fs::write(&f, probe).unwrap();
        let out = std::process::Command::new("python3")
            .arg(&f)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        // main's first step reads `tracked`, its fifth argument: it
        // arrived in its place, quotes and backslash intact.
        assert_eq!(v[0], tracked, "{v}");
        assert_eq!(v[1], serde_json::json!([]), "{v}");
    }
}
