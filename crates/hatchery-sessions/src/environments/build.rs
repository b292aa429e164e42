//! One build of an environment: a sandbox of its template with the
//! set-up's egress, the repository fetched on the host at the base ref
//! (the deploy credential stays on the host) and unpacked at
//! `/workspace`, the set-up script, the egress closed, the snapshot. The
//! building sandbox is deleted however the build ends, and a failed build
//! leaves no version (and no snapshot).

use super::models::*;
use super::progress::{BuildEvent, Progress};
use super::store::EnvRecord;
use super::EnvError;
use crate::config::SessionsConfig;
use crate::layout::{AGENT_DIR, TRACKED_FILE, WORKDIR};
use crate::sandbox::{NewSandbox, Sandboxes};
use std::collections::BTreeMap;

/// How long an environment's snapshot is kept: the core's most. A
/// version older than that must be rebuilt (docs/sessions.md).
pub const SNAPSHOT_RETENTION_S: u64 = 90 * 24 * 3600;
/// Lines of the set-up's output sent as `log` events (the tail).
const LOG_LINES: usize = 200;
/// Bytes of the set-up's output kept in a failure's reason.
const REASON_TAIL: usize = 2000;

/// What a build made: the snapshot and the commit it holds.
pub(crate) struct Built {
    pub snapshot_id: String,
    pub base_commit: String,
}

fn step(p: &Progress, step: &'static str, percent: u8) {
    p.send(BuildEvent::Step { step, percent });
}

fn tail(s: &str, max: usize) -> &str {
    let mut i = s.len().saturating_sub(max);
    while !s.is_char_boundary(i) {
        i += 1;
    }
    &s[i..]
}

/// The set-up's policy: deny-all but its own `allow` rules.
fn setup_network(spec: &EnvSpec) -> Option<serde_json::Value> {
    (!spec.setup_allow.is_empty())
        .then(|| serde_json::json!({"egress": "deny", "allow": spec.setup_allow}))
}

pub(crate) async fn run(
    sandboxes: &dyn Sandboxes,
    cfg: &SessionsConfig,
    env: &EnvRecord,
    p: &Progress,
) -> Result<Built, EnvError> {
    step(p, "sandbox", 5);
    let mut metadata = BTreeMap::new();
    metadata.insert("hatchery_environment".to_string(), env.id.clone());
    let info = sandboxes
        .create(NewSandbox {
            template: env.spec.template.clone(),
            ttl_s: env.spec.setup_timeout_s + 600,
            env: BTreeMap::new(),
            metadata: metadata.clone(),
            network: setup_network(&env.spec),
        })
        .await?;
    p.send(BuildEvent::Log {
        line: format!("sandbox {}", info.id),
    });
    let res = in_sandbox(sandboxes, cfg, env, p, &info.id, metadata).await;
    // The building sandbox is never handed to anyone.
    if let Err(e) = sandboxes.delete(&info.id).await {
        tracing::warn!(environment = %env.id, sandbox = %info.id, error = %e, "deleting an environment's build sandbox failed");
    }
    res
}

async fn in_sandbox(
    sandboxes: &dyn Sandboxes,
    cfg: &SessionsConfig,
    env: &EnvRecord,
    p: &Progress,
    sbx: &str,
    mut metadata: BTreeMap<String, String>,
) -> Result<Built, EnvError> {
    step(p, "fetch", 20);
    // A tenant's environment names its own repository: the credential
    // goes only to a host the operator listed (crate::git_cred).
    let cred = if crate::git_cred::allowed(
        &env.spec.repo,
        env.tenant.as_deref(),
        &cfg.git_credential_hosts,
    ) {
        crate::repo::read_credential(cfg.git_credential_file.as_deref()).map_err(EnvError::Fetch)?
    } else {
        None
    };
    let co = crate::repo::fetch_delta(
        &env.spec.repo,
        &env.spec.git_ref,
        None,
        cred.as_deref(),
        cfg.fetch,
        &cfg.fetch_root,
    )
    .await
    .map_err(EnvError::Fetch)?;
    p.send(BuildEvent::Log {
        line: format!("checked out {} ({} bytes)", co.commit, co.tar.len()),
    });
    let tar = format!("{AGENT_DIR}/env-checkout.tar");
    sandboxes.write_file(sbx, &tar, co.tar).await?;
    sandboxes.write_file(sbx, TRACKED_FILE, co.paths).await?;
    let sh = |cmd: String| vec!["/bin/sh".to_string(), "-c".into(), cmd];
    let x = sandboxes
        .exec(
            sbx,
            sh(format!(
                "mkdir -p {WORKDIR} && tar -xf {tar} -C {WORKDIR} && rm -f {tar}"
            )),
            "/",
            120,
        )
        .await?;
    if x.exit_code != 0 {
        return Err(EnvError::Invalid(format!(
            "unpacking the checkout in the sandbox: {}",
            tail(&x.stderr, REASON_TAIL)
        )));
    }

    step(p, "setup", 40);
    if !env.spec.setup.trim().is_empty() {
        let o = sandboxes
            .exec(
                sbx,
                sh(env.spec.setup.clone()),
                WORKDIR,
                env.spec.setup_timeout_s,
            )
            .await?;
        let lines: Vec<&str> = o.stdout.lines().chain(o.stderr.lines()).collect();
        for line in &lines[lines.len().saturating_sub(LOG_LINES)..] {
            p.send(BuildEvent::Log {
                line: line.to_string(),
            });
        }
        if o.exit_code != 0 {
            let both = format!("{}{}", o.stdout, o.stderr);
            return Err(EnvError::SetupFailed {
                exit_code: o.exit_code,
                output: tail(both.trim(), REASON_TAIL).to_string(),
            });
        }
    }

    // Closed before the snapshot, so no fork ever starts with the
    // set-up's holes (forks start deny-all anyway; this is the belt).
    step(p, "close_egress", 80);
    sandboxes
        .set_network(sbx, serde_json::json!({"egress": "deny"}))
        .await?;

    step(p, "snapshot", 90);
    // The base a session's final diff is made against: the checkout as
    // the set-up left it, so what the set-up wrote is not the agent's.
    let x = sandboxes
        .exec(
            sbx,
            sh(format!("tar -C {WORKDIR} -cf {AGENT_DIR}/base.tar .")),
            "/",
            300,
        )
        .await?;
    if x.exit_code != 0 {
        return Err(EnvError::Invalid(format!(
            "packing the set-up's checkout: {}",
            tail(&x.stderr, REASON_TAIL)
        )));
    }
    // The sessions' start applies its delta in the sandbox's warm
    // interpreter (runner/from_env.rs); importing tarfile was most of that
    // run (25-45 ms in gVisor) unless the snapshot already holds it. A
    // template without the interpreter fails at the session's start with
    // its reason; nothing to say here.
    match sandboxes
        .run_python(sbx, "import io, os, tarfile", 60)
        .await
    {
        Ok(o) if o.error.is_none() => {}
        Ok(o) => tracing::debug!(sandbox = %sbx, error = ?o.error, "interpreter not warmed"),
        Err(e) => tracing::debug!(sandbox = %sbx, error = %e, "interpreter not warmed"),
    }
    metadata.insert("hatchery_environment_commit".into(), co.commit.clone());
    let snapshot_id = sandboxes
        .snapshot(sbx, SNAPSHOT_RETENTION_S, metadata)
        .await?;
    Ok(Built {
        snapshot_id,
        base_commit: co.commit,
    })
}
