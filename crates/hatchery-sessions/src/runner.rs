//! One task per unfinished session drives it through its states. It reads
//! the session from the store at every step, so a restarted daemon picks
//! up where the last one stopped: queued sessions wait again, running ones
//! re-attach to their agent from the stored output offset, idle ones wait
//! for a message. Every effect is preceded by its event. It acts through
//! the [`SessionCore`] the service hands it, not the service itself.

use crate::agent_proto::{self, Effect, LineSplitter};
use crate::events::{Actor, EventKind};
use crate::sandbox::{NewSandbox, OutputItem, ProcState, SandboxError, SandboxInfo};
use crate::scheduler::Lease;
use crate::session_core::SessionCore;
use crate::state::SessionState as S;
use crate::store::{Patch, Session, StoreError};
use futures::StreamExt;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

mod from_env;
mod guest_ca;
mod handoff;

use crate::layout::AGENT_DIR;
pub use crate::layout::WORKDIR;
const REFERENCE_AGENT: &str = include_str!("../agent/reference_agent.py");
const WORKSPACE_DIFF: &str = include_str!("../agent/workspace_diff.py");
/// Snapshots (idle and review) are kept this long.
const SNAPSHOT_RETENTION_S: u64 = 7 * 86_400;
/// Sandboxes outlive the session's wall budget by this much, so the
/// runner (not the TTL) ends them.
const TTL_MARGIN_S: u64 = 900;
const MAX_TTL_S: u64 = 86_400;
/// How much of the agent's stderr a failure reason quotes.
const STDERR_TAIL: usize = 2048;

#[derive(Debug, thiserror::Error)]
enum RunError {
    #[error("{0}")]
    Sandbox(#[from] SandboxError),
    #[error("{0}")]
    Store(#[from] StoreError),
    /// Ends the session as failed with this code and reason.
    #[error("{code}: {message}")]
    Fail { code: &'static str, message: String },
}

fn fail(code: &'static str, message: impl Into<String>) -> RunError {
    RunError::Fail {
        code,
        message: message.into(),
    }
}

type R<T> = Result<T, RunError>;

/// A hook that could not serve the session fails it, with the hook's whole
/// error chain as the reason.
fn hook_failed(e: crate::hooks::HookError) -> RunError {
    fail(
        "services_unavailable",
        hatchery_serve::error_text::with_causes(&*e),
    )
}

pub(crate) async fn run(svc: Arc<SessionCore>, id: String, notify: Arc<Notify>) {
    let mut lease: Option<Lease> = None;
    loop {
        let s = match svc.store.get(&id).await {
            Ok(s) => s,
            Err(StoreError::NotFound(_)) => return,
            Err(e) => {
                tracing::error!(session = %id, error = %e, "session runner: store read failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if s.state.is_terminal() {
            return;
        }
        if s.host_id != svc.store.host_id() {
            // Taken over by another host (however this runner noticed):
            // it drives the session now.
            tracing::warn!(session = %id, owner = %s.host_id, epoch = s.epoch, "session is another host's; runner stops");
            return;
        }
        // This host sheds its sessions (stopping or drained): hand this
        // one over between steps, where nothing of it is in flight.
        let handed = match handoff::hand_off(&svc, &s, &mut lease).await {
            Ok(true) => return,
            Ok(false) => None,
            Err(e) => Some(Err(e)),
        };
        let r = match (handed, s.state) {
            (Some(e), _) => e,
            (None, S::Queued) => queued(&svc, &s, &notify, &mut lease).await,
            (None, S::Starting) => Err(fail(
                "interrupted_start",
                "the daemon stopped while the session was starting; its sandbox was released",
            )),
            (None, S::Running | S::WaitingApproval) => attached(&svc, s, &notify, &mut lease).await,
            (None, S::Idle) => idle(&svc, s, &notify, &mut lease).await,
            _ => return,
        };
        match r {
            Ok(()) => {}
            Err(RunError::Store(StoreError::StateConflict { .. })) => {
                // Someone else moved it (cancel of a queued session); re-read.
            }
            Err(RunError::Store(StoreError::Fenced { owner, epoch, .. })) => {
                // Taken over by another host: it drives the session now;
                // this host must not write for it again.
                tracing::warn!(session = %id, owner = %owner, epoch, "session moved to another host; runner stops");
                return;
            }
            Err(RunError::Store(StoreError::Unavailable(e))) => {
                // The database is away: retry rather than fail the session.
                tracing::warn!(session = %id, error = %e, "session store unavailable; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) if svc.handoff.halted() => {
                // The daemon is going away (its API may already be
                // closed): not the session's failure. Whoever owns it
                // next resumes it.
                tracing::warn!(session = %id, error = %e, "daemon stopping: runner stops without ending the session");
                return;
            }
            Err(e) => {
                let (code, message) = match e {
                    RunError::Fail { code, message } => (code, message),
                    RunError::Sandbox(e) => ("sandbox_error", e.to_string()),
                    RunError::Store(e) => ("store_error", e.to_string()),
                };
                tracing::warn!(session = %id, code, %message, "session failed");
                if let Err(e) = end_failed(&svc, &id, code, &message).await {
                    tracing::error!(session = %id, error = %e, "could not record the failure; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                lease = None;
            }
        }
        if let Ok(s) = svc.store.get(&id).await {
            if !s.state.holds_sandbox() {
                lease = None;
            }
        }
    }
}

async fn end_failed(svc: &Arc<SessionCore>, id: &str, code: &str, message: &str) -> R<()> {
    let s = svc.store.get(id).await?;
    if s.state.is_terminal() {
        return Ok(());
    }
    svc.append(
        id,
        vec![(
            Actor::System,
            EventKind::Error {
                code: code.to_string(),
                message: message.to_string(),
            },
        )],
        Patch::default(),
    )
    .await
    .map_err(|e| fail("store_error", e.to_string()))?;
    release(svc, &s).await;
    svc.transition(
        id,
        S::Failed,
        Some(format!("{code}: {message}")),
        vec![],
        Patch {
            sandbox_id: Some(None),
            ..Default::default()
        },
    )
    .await
    .map_err(|e| fail("store_error", e.to_string()))?;
    Ok(())
}

/// Deletes the session's sandbox, after saying so, and its last
/// checkpoint (of no use once the sandbox is let go).
async fn release(svc: &Arc<SessionCore>, s: &Session) {
    if s.state.holds_sandbox() {
        if let Some(ckpt) = &s.snapshot_id {
            if let Err(e) = svc.sandboxes.delete_snapshot(ckpt).await {
                tracing::warn!(session = %s.id, snapshot = %ckpt, error = %e, "checkpoint not deleted");
            }
            let _ = svc
                .append(
                    &s.id,
                    vec![],
                    Patch {
                        snapshot_id: Some(None),
                        ..Default::default()
                    },
                )
                .await;
        }
    }
    if let Some(sbx) = &s.sandbox_id {
        let _ = svc
            .append(
                &s.id,
                vec![(
                    Actor::System,
                    EventKind::SandboxReleased {
                        sandbox_id: sbx.clone(),
                    },
                )],
                Patch::default(),
            )
            .await;
        svc.hooks().unbind(&s.id, sbx).await;
        if let Err(e) = svc.sandboxes.delete(sbx).await {
            tracing::warn!(session = %s.id, sandbox = %sbx, error = %e, "sandbox delete failed");
        }
    }
    // Before the caller reports the session's spend (its end, or idle):
    // calls still in flight are settled into it first (issue 36).
    svc.hooks().settle_calls(&s.id).await;
}

/// Gateway binding and egress identity for the sandbox (hooks.rs).
async fn bind(svc: &Arc<SessionCore>, s: &Session, sbx: &str) -> R<()> {
    svc.hooks().bind(s, sbx).await.map_err(hook_failed)
}

fn ttl_for(s: &Session) -> u64 {
    let left = s
        .spec
        .budget_wall_s
        .saturating_sub(crate::models::wall_s(s));
    (left + TTL_MARGIN_S).min(MAX_TTL_S)
}

async fn ev(svc: &Arc<SessionCore>, id: &str, kind: EventKind) -> R<()> {
    svc.append(id, vec![(Actor::System, kind)], Patch::default())
        .await
        .map_err(|e| fail("store_error", e.to_string()))?;
    Ok(())
}

async fn to_state(
    svc: &Arc<SessionCore>,
    id: &str,
    to: S,
    reason: Option<String>,
    extra: Vec<EventKind>,
    patch: Patch,
) -> R<Session> {
    svc.transition(
        id,
        to,
        reason,
        extra.into_iter().map(|k| (Actor::System, k)).collect(),
        patch,
    )
    .await
    .map_err(|e| match e {
        crate::error::SessionError::Conflict(m) => fail("state_conflict", m),
        e => fail("store_error", e.to_string()),
    })
}

async fn queued(
    svc: &Arc<SessionCore>,
    s: &Session,
    notify: &Notify,
    lease: &mut Option<Lease>,
) -> R<()> {
    if s.cancel_requested {
        to_state(
            svc,
            &s.id,
            S::Cancelled,
            Some("cancelled before it started".into()),
            vec![],
            Patch::default(),
        )
        .await?;
        return Ok(());
    }
    if lease.is_none() {
        tokio::select! {
            l = svc.scheduler.acquire(&s.id) => *lease = Some(l),
            _ = notify.notified() => return Ok(()),
        }
    }
    let s = svc.store.get(&s.id).await?;
    if s.cancel_requested || s.state != S::Queued {
        return Ok(());
    }
    to_state(svc, &s.id, S::Starting, None, vec![], Patch::default()).await?;
    let t0 = Instant::now();
    start(svc, &s).await?;
    svc.metrics
        .start_seconds
        .observe(t0.elapsed().as_secs_f64());
    Ok(())
}

/// A fetch that failed fails the session `repo_fetch_failed`; a cap it
/// hit is counted.
fn fetch_failed(svc: &SessionCore, e: crate::repo::RepoError) -> RunError {
    if let Some(cap) = e.cap() {
        svc.metrics
            .caps_hit
            .with_label_values(&[cap_label(cap)])
            .inc();
    }
    fail("repo_fetch_failed", e.to_string())
}

fn cap_label(c: &str) -> &'static str {
    match c {
        "disk" => "repo_disk",
        "files" => "repo_files",
        "timeout" => "repo_timeout",
        _ => "repo_bytes",
    }
}

/// A sandbox of the template and the whole checkout: the session's
/// sandbox id.
async fn bare(svc: &Arc<SessionCore>, s: &Session) -> R<(String, Launch)> {
    let id = &s.id;
    ev(
        svc,
        id,
        EventKind::SandboxRequested {
            template: s.spec.template.clone(),
        },
    )
    .await?;
    let meta = sandbox_metadata(s);
    let info = svc
        .sandboxes
        .create(NewSandbox {
            template: s.spec.template.clone(),
            ttl_s: ttl_for(s),
            env: BTreeMap::new(),
            metadata: meta,
            network: None,
        })
        .await?;
    let sbx = info.id.clone();
    svc.append(
        id,
        vec![(
            Actor::System,
            EventKind::SandboxReady {
                sandbox_id: sbx.clone(),
                boot_mode: info.boot_mode,
                boot_ms: info.boot_ms,
            },
        )],
        Patch {
            sandbox_id: Some(Some(sbx.clone())),
            ..Default::default()
        },
    )
    .await
    .map_err(|e| fail("store_error", e.to_string()))?;
    bind(svc, s, &sbx).await?;

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
    let checkout = async {
        let co = crate::repo::fetch(
            &s.spec.repo,
            &s.spec.git_ref,
            cred.as_deref(),
            svc.cfg.fetch,
            &svc.cfg.fetch_root,
        )
        .await
        .map_err(|e| fetch_failed(svc, e))?;
        let bytes = co.tar.len() as u64;
        // The tar stays as the base the final diff is made against.
        svc.sandboxes
            .write_file(&sbx, &format!("{AGENT_DIR}/base.tar"), co.tar)
            .await?;
        let x = svc
            .sandboxes
            .exec(
                &sbx,
                vec![
                    "/bin/sh".into(),
                    "-c".into(),
                    format!("mkdir -p {WORKDIR} && tar -xf {AGENT_DIR}/base.tar -C {WORKDIR}"),
                ],
                "/",
                120,
            )
            .await?;
        if x.exit_code != 0 {
            return Err(fail(
                "checkout_failed",
                format!("unpacking in the sandbox: {}", x.stderr),
            ));
        }
        Ok((co.commit, bytes))
    };
    let ((commit, bytes), launch) = tokio::try_join!(checkout, prepare_agent(svc, s, &sbx))?;
    ev(
        svc,
        id,
        EventKind::RepoCheckedOut {
            commit,
            path: WORKDIR.into(),
            bytes,
        },
    )
    .await?;
    Ok((sbx, launch))
}

/// The operator's git credential for session `s`'s fetch, read at each
/// fetch: none for a tenant's session whose repository's host the
/// operator did not list (crate::git_cred).
fn credential(svc: &Arc<SessionCore>, s: &Session) -> R<Option<String>> {
    let cfg = &svc.cfg;
    if !crate::git_cred::allowed(
        &s.spec.repo,
        s.spec.tenant.as_deref(),
        &cfg.git_credential_hosts,
    ) {
        return Ok(None);
    }
    crate::repo::read_credential(cfg.git_credential_file.as_deref()).map_err(|e| {
        fail(
            "repo_fetch_failed",
            hatchery_serve::error_text::with_causes(&e),
        )
    })
}

/// What starts the agent once its files are in the sandbox.
struct Launch {
    argv: Vec<String>,
    env: BTreeMap<String, String>,
    name: String,
}

/// Sandbox, checkout, agent; then running.
async fn start(svc: &Arc<SessionCore>, s: &Session) -> R<()> {
    let id = &s.id;
    let (sbx, launch) = match &s.spec.environment {
        Some(pin) => from_env::from_environment(svc, s, pin).await?,
        None => bare(svc, s).await?,
    };
    // A cancel that came in while starting is taken by the attached loop
    // (its nudge is kept), which stops the agent and snapshots.
    let pid = svc
        .sandboxes
        .start_process(&sbx, launch.argv, WORKDIR, launch.env)
        .await?;
    to_state(
        svc,
        id,
        S::Running,
        None,
        vec![EventKind::AgentStarted {
            process_id: pid.clone(),
            agent: launch.name,
        }],
        Patch {
            process_id: Some(Some(pid)),
            ..Default::default()
        },
    )
    .await?;
    Ok(())
}

/// The agent's files, the egress CA and the agent's environment in
/// sandbox `sbx`. Nothing here reads the checkout, so it runs while the
/// repository is fetched: both are on every session's start path.
async fn prepare_agent(svc: &Arc<SessionCore>, s: &Session, sbx: &str) -> R<Launch> {
    let id = &s.id;
    let conf = serde_json::json!({
        "session_id": id,
        "task": s.spec.task,
        "model_url": s.spec.agent.model_url,
        "model": s.spec.agent.model,
        "max_steps": s.spec.agent.max_steps,
        "workdir": WORKDIR,
    });
    let sb = &svc.sandboxes;
    let reference = s.spec.agent.command.is_none();
    let (diff_py, conf_json, agent_py) = (
        format!("{AGENT_DIR}/workspace_diff.py"),
        format!("{AGENT_DIR}/session.json"),
        format!("{AGENT_DIR}/reference_agent.py"),
    );
    let ca = svc.hooks().guest_ca();
    // Independent files: written at once rather than one round trip each.
    let files = async {
        tokio::try_join!(
            sb.write_file(sbx, &diff_py, WORKSPACE_DIFF.as_bytes().to_vec()),
            sb.write_file(
                sbx,
                &conf_json,
                serde_json::to_vec(&conf).unwrap_or_default(),
            ),
            async {
                if reference {
                    sb.write_file(sbx, &agent_py, REFERENCE_AGENT.as_bytes().to_vec())
                        .await?;
                }
                Ok(())
            },
        )?;
        Ok::<(), RunError>(())
    };
    let trust = async {
        if let Some(pem) = ca.clone() {
            guest_ca::install(svc, sbx, pem).await?;
        }
        Ok::<(), RunError>(())
    };
    tokio::try_join!(files, trust)?;
    let (argv, name) = match s.spec.agent.command.as_deref() {
        None => (
            vec!["python3".to_string(), "-u".into(), agent_py, conf_json],
            "reference".to_string(),
        ),
        Some(cmd) => (
            vec!["/bin/sh".into(), "-c".into(), cmd.to_string()],
            "command".to_string(),
        ),
    };
    let mut env = s.spec.env.clone();
    env.extend(svc.hooks().agent_env(s));
    if ca.is_some() {
        guest_ca::add_trust_env(&mut env);
    }
    env.extend(svc.hooks().placeholder_env(s).await.map_err(hook_failed)?);
    env.insert("OPENAI_BASE_URL".into(), s.spec.agent.model_url.clone());
    env.insert("OPENAI_API_KEY".into(), "unused-inside-the-sandbox".into());
    env.insert("HATCHERY_SESSION_ID".into(), id.clone());
    env.insert(
        "HATCHERY_TASK_FILE".into(),
        format!("{AGENT_DIR}/session.json"),
    );
    Ok(Launch { argv, env, name })
}

/// Attached to a running agent: its output becomes events; steering
/// messages and approval decisions go to its stdin.
async fn attached(
    svc: &Arc<SessionCore>,
    s: Session,
    notify: &Notify,
    lease: &mut Option<Lease>,
) -> R<()> {
    let id = s.id.clone();
    let (Some(sbx), Some(pid)) = (s.sandbox_id.clone(), s.process_id.clone()) else {
        return Err(fail(
            "lost_sandbox",
            "the session has no sandbox or agent process on record",
        ));
    };
    if lease.is_none() {
        // After a restart: the session already holds its sandbox.
        *lease = Some(match svc.scheduler.try_acquire(&id) {
            Some(l) => l,
            None => svc.scheduler.acquire(&id).await,
        });
    }
    if !svc.sandboxes.exists(&sbx).await? {
        return resume_from_checkpoint(svc, &s, &sbx).await;
    }
    // Again after a restart (idempotent): the proxy's map is in memory.
    if let Err(e) = bind(svc, &s, &sbx).await {
        return lost_or(svc, &id, &sbx, e).await;
    }
    if let Some(why) = svc.take_exhausted(&id) {
        return Err(fail("budget_exhausted", why));
    }
    // A line handled before a crash may still wait for its ack. Not one
    // handled before a rewind: the agent restored from the checkpoint has
    // not sent it yet, and an ack waiting in its stdin would let whatever
    // it sends under that number act unchecked (crate::replay).
    if s.agent_seq > 0 && handled_in_this_run(svc, &s).await? {
        let _ = svc
            .sandboxes
            .write_stdin(&sbx, &pid, agent_proto::ack(s.agent_seq))
            .await;
    }
    if s.state == S::Running {
        // Recorded before a crash, state change not yet made.
        if svc.store.pending_approval(&id).await?.is_some() {
            to_state(svc, &id, S::WaitingApproval, None, vec![], Patch::default()).await?;
        }
    }
    if let Err(e) = deliver(svc, &id, &sbx, &pid).await {
        return lost_or(svc, &id, &sbx, e).await;
    }
    let offset = svc.store.get(&id).await?.output_offset;
    let mut stream = match svc.sandboxes.follow_output(&sbx, &pid, offset).await {
        Ok(st) => st,
        Err(e) => return lost_or(svc, &id, &sbx, e.into()).await,
    };
    let mut lines = LineSplitter::default();
    // What the session stored before (a restart, a resume) counts.
    let usage = svc.store.usage(&id).await?;
    let mut guard = crate::caps::OutputGuard::new(svc.cfg.output, &usage, Instant::now());
    let mut waiting_since: Option<tokio::time::Instant> =
        s.waiting.as_ref().map(|_| tokio::time::Instant::now());
    if s.state == S::WaitingApproval {
        waiting_since.get_or_insert_with(tokio::time::Instant::now);
    }
    let mut summary = String::new();
    let mut stderr_tail: Vec<u8> = Vec::new();
    let replay_through = s.replay_through;
    let every = svc.cfg.checkpoint_every;
    let mut next_checkpoint = every.map(|d| tokio::time::Instant::now() + d);
    let wall_left = s
        .spec
        .budget_wall_s
        .saturating_sub(crate::models::wall_s(&s));
    let wall_deadline = tokio::time::Instant::now() + Duration::from_secs(wall_left);
    loop {
        let idle_at = waiting_since.map(|t| t + svc.cfg.idle_timeout);
        tokio::select! {
            item = stream.next() => match item {
                Some(Ok(OutputItem::Chunk { stdout: true, offset: o, data })) => {
                    for (line, end) in lines.feed(o, &data) {
                        // An ack the sandbox cannot take (deleted under
                        // the session) is a lost sandbox, not a failure.
                        let effect = match handle_line(svc, &id, (&sbx, &pid), &line, end, replay_through, &mut guard).await {
                            Ok(effect) => effect,
                            Err(e) => return lost_or(svc, &id, &sbx, e).await,
                        };
                        match effect {
                            Effect::Waiting(_) => waiting_since = Some(tokio::time::Instant::now()),
                            Effect::ApprovalRequest { .. } => waiting_since = Some(tokio::time::Instant::now()),
                            Effect::Busy => waiting_since = None,
                            Effect::Done(sm) => summary = sm,
                            Effect::None => {}
                        }
                    }
                }
                Some(Ok(OutputItem::Chunk { data, .. })) => {
                    // stderr: the agent's own log; the tail explains a crash.
                    stderr_tail.extend_from_slice(&data);
                    if stderr_tail.len() > STDERR_TAIL {
                        stderr_tail.drain(..stderr_tail.len() - STDERR_TAIL);
                    }
                }
                Some(Ok(OutputItem::Exit(st))) => return finish(svc, &id, st, summary, &stderr_tail).await,
                Some(Err(_)) | None => {
                    // The follow broke (daemon-side hiccup): re-check and
                    // read again from the last handled line.
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    if !svc.sandboxes.exists(&sbx).await? {
                        let s = svc.store.get(&id).await?;
                        return resume_from_checkpoint(svc, &s, &sbx).await;
                    }
                    let offset = svc.store.get(&id).await?.output_offset;
                    lines.clear();
                    stream = match svc.sandboxes.follow_output(&sbx, &pid, offset).await {
                        Ok(st) => st,
                        Err(e) => return lost_or(svc, &id, &sbx, e.into()).await,
                    };
                }
            },
            _ = notify.notified() => {
                let cur = svc.store.get(&id).await?;
                if cur.cancel_requested {
                    return cancel_running(svc, &cur).await;
                }
                if svc.handoff.is_shedding() {
                    // Back to the runner's loop, which hands it over.
                    return Ok(());
                }
                if let Some(why) = svc.take_exhausted(&id) {
                    return Err(fail("budget_exhausted", why));
                }
                match deliver(svc, &id, &sbx, &pid).await {
                    Ok(true) => waiting_since = None,
                    Ok(false) => {}
                    Err(e) => return lost_or(svc, &id, &sbx, e).await,
                }
            }
            _ = sleep_opt(idle_at) => {
                return go_idle(svc, &id, lease).await;
            }
            _ = sleep_opt(next_checkpoint) => {
                checkpoint(svc, &id, &sbx).await?;
                next_checkpoint = every.map(|d| tokio::time::Instant::now() + d);
            }
            _ = tokio::time::sleep_until(wall_deadline) => {
                return Err(fail("budget_exhausted", format!("wall_s budget of {} s used up", s.spec.budget_wall_s)));
            }
        }
    }
}

/// Whether the agent's last handled message (`agent_seq`) was handled in
/// the agent's current run: after a resume from a checkpoint, only if the
/// re-run sent it (a matching `replayed` after the resume, among the last
/// events) or it is past `replay_through`.
async fn handled_in_this_run(svc: &SessionCore, s: &Session) -> R<bool> {
    if s.agent_seq > s.replay_through {
        return Ok(true);
    }
    const TAIL: u64 = 64;
    let tail = svc
        .store
        .events(&s.id, s.last_seq.saturating_sub(TAIL), TAIL as usize)
        .await?;
    for e in tail.iter().rev() {
        match &e.kind {
            EventKind::Replayed { n, matches, .. } if *n == s.agent_seq => {
                return Ok(*matches != Some(false))
            }
            EventKind::ResumedFromCheckpoint { .. } => return Ok(false),
            _ => {}
        }
    }
    Ok(false)
}

async fn sleep_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => futures::future::pending().await,
    }
}

/// The re-run of message `n`, handled before the rewind: its event is in
/// the log already and its effects happened. It is logged as `replayed`
/// and compared with what it asked then (crate::replay). The same: an
/// agent that waits for the ack gets it again. Not the same: the session's
/// pinned policy decides, and the `replayed` event (with what an approval
/// or the new line needs, in the same commit) is logged before anything
/// acts on it.
async fn handle_rerun(
    svc: &Arc<SessionCore>,
    id: &str,
    (sbx, pid): (&str, &str),
    p: agent_proto::Parsed,
    n: u64,
    end: u64,
) -> R<Effect> {
    use crate::replay::{Held, Verdict};
    let original = svc.store.agent_line(id, n).await?;
    let (event, matches) = crate::replay::replayed(n, &p.event, original.as_ref());
    let verdict = match matches {
        Some(false) => {
            let cur = svc.store.get(id).await?;
            let asked = crate::replay::asked(&p.event);
            let v = svc
                .hooks()
                .replay_diverged(&cur, n, p.event.type_name(), &asked)
                .await
                .map_err(hook_failed)?;
            Some(v)
        }
        _ => None,
    };
    let mut events = vec![(Actor::System, event)];
    let mut patch = Patch::default();
    let mut effect = Effect::None;
    match &verdict {
        Some(Verdict::Continue { .. }) => {
            // Message n is this one from now on (a later resume compares
            // with it).
            patch.agent_line = Some(crate::replay::line(n, &p.event));
        }
        Some(Verdict::Ask { rule }) => {
            let held = Held::new(n, &p.event, rule.clone());
            let aid = prefixed_approval_id(crate::replay::APPROVAL_PREFIX, id, n);
            let details = serde_json::to_string(&held).unwrap_or_default();
            let action = crate::replay::APPROVAL_ACTION.to_string();
            events.push((
                Actor::System,
                EventKind::ApprovalRequested {
                    approval_id: aid.clone(),
                    action: action.clone(),
                    details: details.clone(),
                },
            ));
            patch.new_approval = Some((aid, action.clone(), details.clone()));
            effect = Effect::ApprovalRequest { action, details };
        }
        _ => {}
    }
    let Some(evs) = svc.store.append_agent(id, end, p.n, events, patch).await? else {
        return Ok(Effect::None);
    };
    svc.bus.publish(id, &evs);
    match verdict {
        Some(Verdict::Fail { rule }) => {
            let by = rule
                .map(|r| format!(", denied by rule {r}"))
                .unwrap_or_default();
            return Err(fail(
                "replay_diverged",
                format!(
                    "agent message {n} asked for something else after the resume than before it ({}){by}",
                    p.event.type_name()
                ),
            ));
        }
        Some(Verdict::Ask { .. }) => {
            // Unacknowledged until a person decides (deliver).
            wait_for_approval(svc, id).await?;
            return Ok(effect);
        }
        _ => {}
    }
    if p.wants_ack {
        svc.sandboxes
            .write_stdin(sbx, pid, agent_proto::ack(n))
            .await?;
    }
    Ok(Effect::None)
}

/// A person's decision on a diverged re-run held for approval: approved,
/// its line becomes message `n` and the agent gets the ack it waits for
/// (at least once: the ack goes before `delivered_seq` moves); denied or
/// timed out, the session ends `replay_diverged`.
async fn replay_decided(
    svc: &Arc<SessionCore>,
    id: &str,
    (sbx, pid): (&str, &str),
    seq: u64,
    approval_id: &str,
    decision: &str,
) -> R<()> {
    let approval = svc.store.approval(id, approval_id).await?;
    let held: Option<crate::replay::Held> = approval
        .as_ref()
        .and_then(|a| serde_json::from_str(&a.details).ok());
    let Some(held) = held.filter(|_| decision == "approve") else {
        return Err(fail(
            "replay_diverged",
            format!("the re-run's different request was not approved ({decision})"),
        ));
    };
    svc.sandboxes
        .write_stdin(sbx, pid, agent_proto::ack(held.n))
        .await?;
    svc.store
        .append(
            id,
            vec![],
            Patch {
                delivered_seq: Some(seq),
                agent_line: Some(held.line()),
                ..Default::default()
            },
        )
        .await?;
    leave_waiting(svc, id).await
}

/// One line of agent stdout: an event (exactly once, with the offset), an
/// ack if the agent waits for one, and the effect on the session.
async fn handle_line(
    svc: &Arc<SessionCore>,
    id: &str,
    (sbx, pid): (&str, &str),
    line: &[u8],
    end: u64,
    replay_through: u64,
    guard: &mut crate::caps::OutputGuard,
) -> R<Effect> {
    let mut p = agent_proto::parse(line);
    if let Some(n) = p.n.filter(|n| *n <= replay_through) {
        return handle_rerun(svc, id, (sbx, pid), p, n, end).await;
    }
    match guard.check(&mut p.event, p.wants_ack, Instant::now()) {
        crate::caps::Verdict::Keep { blob_cut } => {
            if blob_cut {
                svc.metrics
                    .caps_hit
                    .with_label_values(&[crate::caps::CAP_BLOB])
                    .inc();
            }
        }
        crate::caps::Verdict::Drop { cap, marker, bytes } => {
            svc.metrics
                .output_dropped_lines
                .with_label_values(&[cap])
                .inc();
            svc.metrics
                .output_dropped_bytes
                .with_label_values(&[cap])
                .inc_by(bytes);
            let events: Vec<_> = marker.into_iter().map(|m| (Actor::System, m)).collect();
            if !events.is_empty() {
                svc.metrics.caps_hit.with_label_values(&[cap]).inc();
                tracing::warn!(session = %id, cap, "session output cap reached; further output is dropped");
            }
            // The offset moves past the line (and `n` is marked handled),
            // so neither a re-read nor a restart brings it back.
            if let Some(evs) = svc
                .store
                .append_agent(id, end, p.n, events, Patch::default())
                .await?
            {
                svc.bus.publish(id, &evs);
            }
            if p.wants_ack {
                // Only the byte cap drops a line that waits for its ack:
                // acking it unrecorded would break "the event is in the
                // log before the effect", and not acking leaves the agent
                // waiting until the wall budget ends. The session ends.
                return Err(fail(
                    "output_capped",
                    format!(
                        "the agent's output reached the session's cap of {} stored bytes and it asked to act again",
                        svc.cfg.output.max_bytes
                    ),
                ));
            }
            return Ok(Effect::None);
        }
    }
    if let Effect::ApprovalRequest { .. } = &p.effect {
        if refuse_approval(svc, id, &p, end).await? {
            if let (true, Some(n)) = (p.wants_ack, p.n) {
                svc.sandboxes
                    .write_stdin(sbx, pid, agent_proto::ack(n))
                    .await?;
            }
            // The denial goes to the agent like any decision.
            deliver(svc, id, sbx, pid).await?;
            return Ok(Effect::None);
        }
    }
    if svc.hooks().meters_spend() {
        // The gateway records what calls cost; the agent's word is not spend.
        p.tokens = 0;
    }
    let mut patch = Patch {
        add_tokens: p.tokens,
        // Kept to compare a re-run of this message with (crate::replay).
        agent_line: p.n.map(|n| crate::replay::line(n, &p.event)),
        ..Default::default()
    };
    match &p.effect {
        Effect::Waiting(w) => patch.waiting = Some(Some(w.clone())),
        Effect::Busy => patch.waiting = Some(None),
        Effect::ApprovalRequest { action, details } => {
            let aid = approval_id(id, p.n.unwrap_or(end));
            if let EventKind::ApprovalRequested { approval_id, .. } = &mut p.event {
                *approval_id = aid.clone();
            }
            patch.new_approval = Some((aid, action.clone(), details.clone()));
        }
        _ => {}
    }
    let appended = svc
        .store
        .append_agent(id, end, p.n, vec![(Actor::Agent, p.event)], patch)
        .await?;
    let Some(evs) = appended else {
        return Ok(Effect::None);
    };
    svc.bus.publish(id, &evs);
    if p.wants_ack {
        if let Some(n) = p.n {
            svc.sandboxes
                .write_stdin(sbx, pid, agent_proto::ack(n))
                .await?;
        }
    }
    if p.tokens > 0 {
        let s = svc.store.get(id).await?;
        if s.spend_tokens > s.spec.budget_tokens {
            return Err(fail(
                "budget_exhausted",
                format!(
                    "{} tokens used of a budget of {}",
                    s.spend_tokens, s.spec.budget_tokens
                ),
            ));
        }
        ev(
            svc,
            id,
            EventKind::Budget {
                tokens: s.spend_tokens,
                usd_cents: s.spend_usd_cents,
                wall_s: crate::models::wall_s(&s),
            },
        )
        .await?;
    }
    if let Effect::ApprovalRequest { .. } = p.effect {
        wait_for_approval(svc, id).await?;
    }
    Ok(p.effect)
}

/// To `waiting_approval`, unless already there: a second approval while
/// one is open (moving to the same state again was a state conflict that
/// failed the session).
async fn wait_for_approval(svc: &Arc<SessionCore>, id: &str) -> R<()> {
    if svc.store.get(id).await?.state != S::WaitingApproval {
        to_state(svc, id, S::WaitingApproval, None, vec![], Patch::default()).await?;
    }
    Ok(())
}

/// An approval the agent asks for while the session already has
/// `max_open_approvals` open is refused: its request is logged with a
/// system denial right after it (which the agent gets like any decision),
/// no approval row is opened and the session does not wait. The first
/// refusal writes the `output_capped {cap: "open_approvals"}` marker.
async fn refuse_approval(
    svc: &Arc<SessionCore>,
    id: &str,
    p: &agent_proto::Parsed,
    end: u64,
) -> R<bool> {
    let max = svc.cfg.max_open_approvals;
    let usage = svc.store.usage(id).await?;
    if usage.open_approvals < max {
        return Ok(false);
    }
    let aid = approval_id(id, p.n.unwrap_or(end));
    let mut request = p.event.clone();
    if let EventKind::ApprovalRequested { approval_id, .. } = &mut request {
        *approval_id = aid.clone();
    }
    let mut events = vec![
        (Actor::Agent, request),
        (
            Actor::System,
            EventKind::ApprovalDecided {
                approval_id: aid,
                decision: "deny".into(),
                note: format!(
                    "refused: the session has {} approvals open, its cap (session_approval_cap)",
                    usage.open_approvals
                ),
                remember: None,
            },
        ),
    ];
    if !usage.capped.iter().any(|c| c == crate::caps::CAP_APPROVALS) {
        events.push((
            Actor::System,
            EventKind::OutputCapped {
                cap: crate::caps::CAP_APPROVALS.into(),
                limit: max,
                message: format!("the agent asked for an approval with {max} open; it was denied"),
            },
        ));
    }
    svc.metrics
        .caps_hit
        .with_label_values(&[crate::caps::CAP_APPROVALS])
        .inc();
    if let Some(evs) = svc
        .store
        .append_agent(id, end, p.n, events, Patch::default())
        .await?
    {
        svc.bus.publish(id, &evs);
    }
    Ok(true)
}

fn approval_id(session: &str, n: u64) -> String {
    prefixed_approval_id("apr_", session, n)
}

/// An approval id derived from the session and message number, so a
/// re-read line opens the same approval.
fn prefixed_approval_id(prefix: &str, session: &str, n: u64) -> String {
    use sha2::{Digest, Sha256};
    let h = Sha256::digest(format!("{session}/{n}").as_bytes());
    let alpha = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let tail: String = h
        .iter()
        .take(16)
        .map(|b| alpha[*b as usize % alpha.len()] as char)
        .collect();
    format!("{prefix}{tail}")
}

/// Hands the agent every message and decision after the last delivered
/// one. True if anything was delivered.
async fn deliver(svc: &Arc<SessionCore>, id: &str, sbx: &str, pid: &str) -> R<bool> {
    let s = svc.store.get(id).await?;
    let pending = svc.store.deliverables_after(id, s.delivered_seq).await?;
    let mut any = false;
    for e in pending {
        let Some(bytes) = agent_proto::deliverable(e.seq, &e.kind) else {
            if let EventKind::ApprovalDecided {
                approval_id,
                decision,
                ..
            } = &e.kind
            {
                if approval_id.starts_with(crate::replay::APPROVAL_PREFIX) {
                    replay_decided(svc, id, (sbx, pid), e.seq, approval_id, decision).await?;
                    any = true;
                    continue;
                }
                // An egress hold's decision is not the agent's, but the
                // session leaves `waiting_approval` all the same.
                leave_waiting(svc, id).await?;
            }
            continue;
        };
        svc.sandboxes.write_stdin(sbx, pid, bytes).await?;
        any = true;
        svc.store
            .append(
                id,
                vec![],
                Patch {
                    delivered_seq: Some(e.seq),
                    waiting: Some(None),
                    ..Default::default()
                },
            )
            .await?;
        if matches!(e.kind, EventKind::ApprovalDecided { .. }) {
            leave_waiting(svc, id).await?;
        }
    }
    Ok(any)
}

/// Back to `running` once no approval is pending.
async fn leave_waiting(svc: &Arc<SessionCore>, id: &str) -> R<()> {
    let cur = svc.store.get(id).await?;
    if cur.state == S::WaitingApproval && svc.store.pending_approval(id).await?.is_none() {
        to_state(svc, id, S::Running, None, vec![], Patch::default()).await?;
    }
    Ok(())
}

/// What changed in the checkout against the fetched tree, as an event.
async fn record_diff(svc: &Arc<SessionCore>, id: &str, sbx: &str) {
    let cmd = format!("python3 {AGENT_DIR}/workspace_diff.py {AGENT_DIR}/base.tar {WORKDIR}");
    if let Ok(x) = svc
        .sandboxes
        .exec(sbx, vec!["/bin/sh".into(), "-c".into(), cmd], "/", 60)
        .await
    {
        if x.exit_code != 0 {
            tracing::warn!(session = %id, stderr = %crate::events::cut(&x.stderr, 500), "workspace diff failed");
            return;
        }
        let (stat, patch) = x
            .stdout
            .split_once("@@HATCHERY@@\n")
            .unwrap_or((&x.stdout, ""));
        let _ = ev(
            svc,
            id,
            EventKind::WorkspaceDiff {
                stat: crate::events::cut(stat, 8192).to_string(),
                patch: patch.to_string(),
                patch_ref: None,
                truncated: false,
            },
        )
        .await;
    }
}

async fn finish(
    svc: &Arc<SessionCore>,
    id: &str,
    st: ProcState,
    summary: String,
    stderr_tail: &[u8],
) -> R<()> {
    let (code, why) = match st {
        ProcState::Exited { exit_code, reason } => (exit_code, reason),
        ProcState::Running => (None, None),
    };
    let cur = svc.store.get(id).await?;
    if cur.cancel_requested {
        return cancel_running(svc, &cur).await;
    }
    ev(
        svc,
        id,
        EventKind::AgentExited {
            exit_code: code,
            reason: why.clone(),
        },
    )
    .await?;
    if let Some(sbx) = &cur.sandbox_id {
        record_diff(svc, id, sbx).await;
    }
    crate::held_approvals::close_for_exit(svc, id).await?;
    leave_waiting(svc, id).await?;
    // An agent told that its budget is spent usually exits at once, often
    // before this runner read the gateway's mark: the session ends for
    // the budget, not for how the agent took the refusal.
    if let Some(why) = svc.take_exhausted(id) {
        return Err(fail("budget_exhausted", why));
    }
    let cur = svc.store.get(id).await?;
    if code == Some(0) && cur.state == S::Running {
        release(svc, &cur).await;
        let reason = if summary.is_empty() {
            "agent finished".to_string()
        } else {
            format!("agent finished: {}", crate::events::cut(&summary, 500))
        };
        to_state(
            svc,
            id,
            S::Completed,
            Some(reason),
            vec![],
            Patch {
                sandbox_id: Some(None),
                ..Default::default()
            },
        )
        .await?;
        Ok(())
    } else {
        let tail = String::from_utf8_lossy(stderr_tail);
        let tail = tail.trim();
        Err(fail(
            "agent_failed",
            format!(
                "agent exited with code {}{}{}",
                code.map(|c| c.to_string()).unwrap_or_else(|| "none".into()),
                why.map(|r| format!(" ({r})")).unwrap_or_default(),
                if tail.is_empty() {
                    String::new()
                } else {
                    format!("; stderr: {tail}")
                }
            ),
        ))
    }
}

/// Stop the agent, keep a snapshot for review, release, cancelled.
async fn cancel_running(svc: &Arc<SessionCore>, s: &Session) -> R<()> {
    let id = &s.id;
    let mut reason = "cancelled by the user".to_string();
    let mut review = None;
    if let Some(sbx) = &s.sandbox_id {
        if let Some(pid) = &s.process_id {
            let _ = svc.sandboxes.kill_process(sbx, pid).await;
        }
        record_diff(svc, id, sbx).await;
        ev(
            svc,
            id,
            EventKind::SnapshotStarted {
                purpose: "review".into(),
            },
        )
        .await?;
        let mut meta = BTreeMap::new();
        meta.insert("hatchery_session".to_string(), id.clone());
        meta.insert("purpose".to_string(), "review".to_string());
        match svc
            .sandboxes
            .snapshot(sbx, SNAPSHOT_RETENTION_S, meta)
            .await
        {
            Ok(snap) => {
                ev(
                    svc,
                    id,
                    EventKind::SnapshotTaken {
                        purpose: "review".into(),
                        snapshot_id: snap.clone(),
                    },
                )
                .await?;
                review = Some(snap);
            }
            Err(e) => reason = format!("cancelled by the user (no review snapshot: {e})"),
        }
        release(svc, s).await;
    }
    to_state(
        svc,
        id,
        S::Cancelled,
        Some(reason),
        vec![],
        Patch {
            sandbox_id: Some(None),
            review_snapshot_id: Some(review),
            ..Default::default()
        },
    )
    .await?;
    Ok(())
}

/// Where a checkpoint left the runner's reading of the agent, in the
/// snapshot's metadata (written by `checkpoint`, read on resume).
const CKPT_OFFSET: &str = "output_offset";
const CKPT_DELIVERED: &str = "delivered_seq";

/// A snapshot of the running sandbox, agent included, to resume from if
/// the sandbox is lost. It records where the runner's reading of the
/// agent stood; the previous checkpoint is deleted once this one is on
/// record. A failed checkpoint is logged and the previous one stands.
async fn checkpoint(svc: &Arc<SessionCore>, id: &str, sbx: &str) -> R<()> {
    let s = svc.store.get(id).await?;
    let mut meta = BTreeMap::new();
    meta.insert("hatchery_session".to_string(), id.to_string());
    meta.insert("purpose".to_string(), "checkpoint".to_string());
    meta.insert(CKPT_OFFSET.to_string(), s.output_offset.to_string());
    meta.insert(CKPT_DELIVERED.to_string(), s.delivered_seq.to_string());
    // For an operator reading the snapshot; the resume takes the number
    // from the session row, which may be higher.
    meta.insert("agent_seq".to_string(), s.agent_seq.to_string());
    let t0 = Instant::now();
    let snap = match svc
        .sandboxes
        .snapshot(sbx, SNAPSHOT_RETENTION_S, meta)
        .await
    {
        Ok(snap) => snap,
        Err(e) => {
            tracing::warn!(session = %id, sandbox = %sbx, error = %e, "checkpoint failed; the previous one stands");
            return Ok(());
        }
    };
    let recorded = svc
        .append_if_state(
            id,
            &[S::Running, S::WaitingApproval],
            vec![(
                Actor::System,
                EventKind::SnapshotTaken {
                    purpose: "checkpoint".into(),
                    snapshot_id: snap.clone(),
                },
            )],
            Patch {
                snapshot_id: Some(Some(snap.clone())),
                ..Default::default()
            },
        )
        .await;
    let stale = match recorded {
        Ok(_) => s.snapshot_id,
        Err(_) => Some(snap),
    };
    if let Some(old) = stale {
        if let Err(e) = svc.sandboxes.delete_snapshot(&old).await {
            tracing::warn!(session = %id, snapshot = %old, error = %e, "old checkpoint not deleted");
        }
    }
    svc.metrics
        .checkpoint_seconds
        .observe(t0.elapsed().as_secs_f64());
    Ok(())
}

/// A sandbox call of the attach failed: if the sandbox is gone (lost
/// between the check and the call), that is a lost sandbox, resumed from
/// its checkpoint or failed as `lost_sandbox`, not a `sandbox_error`.
async fn lost_or(svc: &Arc<SessionCore>, id: &str, sbx: &str, e: RunError) -> R<()> {
    if matches!(e, RunError::Sandbox(_)) && !svc.sandboxes.exists(sbx).await? {
        let s = svc.store.get(id).await?;
        return resume_from_checkpoint(svc, &s, sbx).await;
    }
    Err(e)
}

/// The agent's sandbox is gone while it ran (its host was lost, or it
/// was deleted under the session): fork the last checkpoint into a new
/// sandbox, here, and read the agent again from where the checkpoint
/// left it. Without a checkpoint the session fails, saying why.
async fn resume_from_checkpoint(svc: &Arc<SessionCore>, s: &Session, lost: &str) -> R<()> {
    let Some(ckpt) = s.snapshot_id.clone() else {
        return Err(fail(
            "lost_sandbox",
            format!("sandbox {lost} is gone and the session has no checkpoint to resume from"),
        ));
    };
    let meta = svc.sandboxes.snapshot_metadata(&ckpt).await.map_err(|e| {
        fail(
            "lost_sandbox",
            format!("sandbox {lost} is gone and its checkpoint {ckpt} cannot be read: {e}"),
        )
    })?;
    let num = |k: &str| meta.get(k).and_then(|v| v.parse::<u64>().ok());
    let (Some(output_offset), Some(delivered_seq)) = (num(CKPT_OFFSET), num(CKPT_DELIVERED)) else {
        return Err(fail(
            "lost_sandbox",
            format!("sandbox {lost} is gone and {ckpt} is not a checkpoint of this session"),
        ));
    };
    let t0 = Instant::now();
    svc.hooks().unbind(&s.id, lost).await;
    let info = fork_bound(svc, s, &ckpt).await?;
    let resume_ms = t0.elapsed().as_millis() as u64;
    let done = svc
        .append_if_state(
            &s.id,
            &[S::Running, S::WaitingApproval],
            vec![(
                Actor::System,
                EventKind::ResumedFromCheckpoint {
                    sandbox_id: info.id.clone(),
                    lost_sandbox: lost.to_string(),
                    snapshot_id: ckpt.clone(),
                    replay_through: s.agent_seq,
                    resume_ms,
                },
            )],
            Patch {
                sandbox_id: Some(Some(info.id.clone())),
                rewind: Some(crate::store::Rewind {
                    output_offset,
                    delivered_seq,
                }),
                ..Default::default()
            },
        )
        .await;
    if let Err(e) = done {
        discard(svc, &s.id, &info.id).await;
        return Err(fail("store_error", e.to_string()));
    }
    svc.metrics
        .resume_seconds
        .observe(t0.elapsed().as_secs_f64());
    tracing::info!(session = %s.id, lost = %lost, sandbox = %info.id, checkpoint = %ckpt, resume_ms, "session resumed from its checkpoint");
    Ok(())
}

/// A session's sandbox carries its metadata (a tenant, for placement across
/// hosts) and the session's id. A tenant's session's sandbox records the
/// session's recorded tenant (from the caller's key) over whatever its
/// metadata says, so a session stored with another tenant's name (before
/// create stamped it) still cannot put a sandbox in that tenant's account.
pub(crate) fn sandbox_metadata(s: &Session) -> BTreeMap<String, String> {
    let mut meta = s.spec.metadata.clone();
    hatchery_tenants::metadata::stamp(&mut meta, s.spec.tenant.as_deref());
    meta.insert("hatchery_session".to_string(), s.id.clone());
    meta
}

/// A new sandbox for the session from `snapshot` (said first with
/// `sandbox_requested`), its services bound. Not on the session's record
/// yet: the caller records it, or [`discard`]s it.
async fn fork_bound(svc: &Arc<SessionCore>, s: &Session, snapshot: &str) -> R<SandboxInfo> {
    ev(
        svc,
        &s.id,
        EventKind::SandboxRequested {
            template: s.spec.template.clone(),
        },
    )
    .await?;
    let meta = sandbox_metadata(s);
    let info = svc.sandboxes.fork(snapshot, ttl_for(s), meta).await?;
    if let Err(e) = bind(svc, s, &info.id).await {
        discard(svc, &s.id, &info.id).await;
        return Err(e);
    }
    Ok(info)
}

/// A sandbox that never made it onto the session's record: nothing else
/// would delete it.
async fn discard(svc: &Arc<SessionCore>, session: &str, sbx: &str) {
    svc.hooks().unbind(session, sbx).await;
    let _ = svc.sandboxes.delete(sbx).await;
}

/// Waited too long: snapshot, free the sandbox and the place.
async fn go_idle(svc: &Arc<SessionCore>, id: &str, lease: &mut Option<Lease>) -> R<()> {
    let s = svc.store.get(id).await?;
    let Some(sbx) = s.sandbox_id.clone() else {
        return Err(fail("lost_sandbox", "no sandbox to snapshot"));
    };
    ev(
        svc,
        id,
        EventKind::SnapshotStarted {
            purpose: "idle".into(),
        },
    )
    .await?;
    let mut meta = BTreeMap::new();
    meta.insert("hatchery_session".to_string(), id.to_string());
    meta.insert("purpose".to_string(), "idle".to_string());
    let snap = svc
        .sandboxes
        .snapshot(&sbx, SNAPSHOT_RETENTION_S, meta)
        .await?;
    ev(
        svc,
        id,
        EventKind::SnapshotTaken {
            purpose: "idle".into(),
            snapshot_id: snap.clone(),
        },
    )
    .await?;
    release(svc, &s).await;
    to_state(
        svc,
        id,
        S::Idle,
        None,
        vec![],
        Patch {
            sandbox_id: Some(None),
            snapshot_id: Some(Some(snap)),
            ..Default::default()
        },
    )
    .await?;
    *lease = None;
    Ok(())
}

/// Idle: wait for a message or decision (or cancel), then fork the
/// snapshot into a new sandbox and re-attach.
async fn idle(
    svc: &Arc<SessionCore>,
    s: Session,
    notify: &Notify,
    lease: &mut Option<Lease>,
) -> R<()> {
    let id = s.id.clone();
    if s.cancel_requested {
        to_state(
            svc,
            &id,
            S::Cancelled,
            Some("cancelled by the user while idle".into()),
            vec![],
            Patch {
                review_snapshot_id: Some(s.snapshot_id.clone()),
                snapshot_id: Some(None),
                ..Default::default()
            },
        )
        .await?;
        return Ok(());
    }
    let pending = svc.store.deliverables_after(&id, s.delivered_seq).await?;
    if pending.is_empty() {
        notify.notified().await;
        return Ok(());
    }
    let Some(snap) = s.snapshot_id.clone() else {
        return Err(fail("lost_snapshot", "idle without a snapshot on record"));
    };
    if lease.is_none() {
        tokio::select! {
            l = svc.scheduler.acquire(&id) => *lease = Some(l),
            _ = notify.notified() => return Ok(()),
        }
    }
    let t0 = Instant::now();
    let info = fork_bound(svc, &s, &snap).await?;
    let ms = t0.elapsed().as_millis() as u64;
    to_state(
        svc,
        &id,
        S::Running,
        None,
        vec![EventKind::Resumed {
            sandbox_id: info.id.clone(),
            resume_ms: ms,
        }],
        Patch {
            sandbox_id: Some(Some(info.id.clone())),
            snapshot_id: Some(None),
            ..Default::default()
        },
    )
    .await?;
    svc.metrics
        .resume_seconds
        .observe(t0.elapsed().as_secs_f64());
    if let Err(e) = svc.sandboxes.delete_snapshot(&snap).await {
        tracing::warn!(session = %id, snapshot = %snap, error = %e, "idle snapshot not deleted");
    }
    Ok(())
}
