//! The session service: what the routes, the daemon and the broker call.
//! It starts one runner per unfinished session and hands it the
//! [`SessionCore`] (not itself), so the runner does not import the
//! service back. Every change goes to the store first and is published
//! to live streams after it is committed.

use crate::broker_hooks::{BrokerUsage, JoinedFrom, RemoteJoined};
use crate::bus::StreamSlots;
use crate::config::SessionsConfig;
use crate::error::SessionError;
use crate::events::{Actor, EventKind};
use crate::models::*;
use crate::policy::{PolicyCatalog, DEFAULT_POLICY};
use crate::sandbox::Sandboxes;
use crate::scheduler::Scheduler;
use crate::session_core::SessionCore;
use crate::state::SessionState;
use crate::store::{AgentSpec, CreateOutcome, Patch, SessionSpec, SessionStore, TenantLimits};
use crate::validate::{
    self, MAX_IDEMPOTENCY_KEY_BYTES, MAX_MESSAGE_BYTES, MAX_NOTE_BYTES, MAX_TASK_BYTES,
};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

pub use crate::layout::DEFAULT_TEMPLATE;

pub struct Sessions {
    /// The store, bus, sandboxes, scheduler, hooks, config and metrics,
    /// shared with the runners (session_core.rs).
    pub(crate) core: Arc<SessionCore>,
    pub(crate) policies: Arc<dyn PolicyCatalog>,
    pub(crate) streams: StreamSlots,
    /// One runner task per unfinished session, woken through its Notify.
    actors: Mutex<HashMap<String, Arc<Notify>>>,
    /// The broker's record of a session's calls, for its view (set by
    /// the daemon when it runs the broker).
    broker_usage: std::sync::RwLock<Option<Arc<dyn BrokerUsage>>>,
    /// How the writes a remote broker or gateway posts with its events
    /// are read.
    remote_joined: std::sync::RwLock<HashMap<JoinedFrom, Arc<dyn RemoteJoined>>>,
    /// Environments sessions may start from (set by the daemon).
    environments: std::sync::RwLock<Option<Arc<crate::environments::Environments>>>,
}

impl Sessions {
    pub fn new(
        store: Arc<dyn SessionStore>,
        cfg: SessionsConfig,
        policies: Arc<dyn PolicyCatalog>,
        sandboxes: Arc<dyn Sandboxes>,
        scheduler: Arc<dyn Scheduler>,
    ) -> Arc<Self> {
        Arc::new(Sessions {
            streams: StreamSlots::new(cfg.max_streams),
            core: Arc::new(SessionCore::new(store, cfg, sandboxes, scheduler)),
            policies,
            actors: Mutex::new(HashMap::new()),
            broker_usage: std::sync::RwLock::new(None),
            remote_joined: Default::default(),
            environments: Default::default(),
        })
    }

    /// Turns on `/v1/environments` and sessions' `environment_id`.
    pub fn set_environments(&self, e: Arc<crate::environments::Environments>) {
        *self.environments.write().unwrap_or_else(|p| p.into_inner()) = Some(e);
    }

    pub fn environments(&self) -> Option<Arc<crate::environments::Environments>> {
        self.environments
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Where the view finds a session's broker calls.
    pub fn set_broker_usage(&self, b: Arc<dyn BrokerUsage>) {
        *self.broker_usage.write().unwrap_or_else(|p| p.into_inner()) = Some(b);
    }

    /// How this host commits the writes a remote broker or gateway posts
    /// with its events (`POST /v1/sessions/{id}/broker-events`,
    /// `.../model-events`).
    pub fn set_remote_joined(&self, from: JoinedFrom, r: Arc<dyn RemoteJoined>) {
        self.remote_joined
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(from, r);
    }

    /// `write` (posted to session `id` by `from`), read back into what
    /// commits with the events; a 400 when it is refused or no reader is
    /// set.
    pub(crate) fn decode_joined(
        &self,
        from: JoinedFrom,
        id: &str,
        write: serde_json::Value,
    ) -> Result<Box<dyn hatchery_db::Joined>, SessionError> {
        let codec = self
            .remote_joined
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&from)
            .cloned()
            .ok_or_else(|| {
                SessionError::bad(
                    "invalid_request",
                    format!("this host takes no {from:?} writes"),
                )
            })?;
        codec.decode(id, write).map_err(|e| {
            SessionError::bad(
                "invalid_request",
                format!("joined: {}", hatchery_serve::error_text::with_causes(&*e)),
            )
        })
    }

    pub fn metrics(&self) -> &crate::metrics::SessionMetrics {
        &self.core.metrics
    }

    /// Starts a runner for every unfinished session (after a restart).
    pub async fn recover(self: &Arc<Self>) -> Result<usize, SessionError> {
        let all = self.core.store.unfinished().await?;
        let n = all.len();
        for s in all {
            tracing::info!(session = %s.id, state = %s.state, "recovering session");
            self.spawn_actor(&s.id);
        }
        Ok(n)
    }

    /// Takes over every unfinished session of `lost_host` (a host whose
    /// lease ran out) and starts their runners here: a running one whose
    /// sandbox went with the host resumes from its last checkpoint, an
    /// idle one waits here for its message. Of several hosts sweeping at
    /// once one gets each session. Returns how many moved.
    pub async fn take_over_from(self: &Arc<Self>, lost_host: &str) -> Result<usize, SessionError> {
        if lost_host == self.core.store.host_id() {
            return Ok(0);
        }
        let moved = self
            .core
            .store
            .take_over(lost_host, self.core.store.host_id(), "host_lost")
            .await?;
        for (id, epoch) in &moved {
            tracing::warn!(session = %id, from = %lost_host, epoch, "session taken over from a lost host");
            self.spawn_actor(id);
        }
        Ok(moved.len())
    }

    /// Starts a runner for each unfinished session this host owns that
    /// has none: the sessions another host handed here (graceful stop,
    /// drain). Not while this host sheds its own or is stopping.
    /// Returns how many runners it started.
    pub async fn adopt(self: &Arc<Self>) -> Result<usize, SessionError> {
        if self.core.handoff.is_shedding() || self.core.handoff.halted() {
            return Ok(0);
        }
        let mut n = 0;
        for s in self.core.store.unfinished().await? {
            if self.spawn_actor(&s.id) {
                tracing::info!(session = %s.id, state = %s.state, epoch = s.epoch, "session adopted: handed to this host");
                n += 1;
            }
        }
        Ok(n)
    }

    /// [`Sessions::adopt`] every `every`, for as long as the task lives.
    pub fn spawn_adopter(
        self: &Arc<Self>,
        every: std::time::Duration,
    ) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if let Err(e) = me.adopt().await {
                    tracing::warn!(error = %e, "adopting handed-over sessions failed; retrying");
                }
            }
        })
    }

    /// Starts moving this host's sessions to the hosts `targets` names
    /// (crate::handoff): every runner is woken, and each hands its
    /// session over at its next step. Asking again re-wakes them (after
    /// a target appeared).
    pub fn shed(
        &self,
        targets: Arc<dyn crate::handoff::HandoffTargets>,
        why: crate::handoff::ShedReason,
    ) {
        self.core.handoff.start(targets, why);
        self.nudge_all();
    }

    /// Stops moving sessions away (an uncordon ended the drain).
    pub fn unshed(&self) {
        self.core.handoff.stop();
    }

    pub fn shedding(&self) -> bool {
        self.core.handoff.is_shedding()
    }

    /// The daemon is going away: runners stop without ending their
    /// sessions as failed when their sandbox calls fail.
    pub fn halt(&self) {
        self.core.handoff.halt();
    }

    /// Unfinished sessions this host owns (what a drain waits for).
    pub async fn owned(&self) -> Result<usize, SessionError> {
        Ok(self.core.store.unfinished().await?.len())
    }

    fn nudge_all(&self) {
        let all: Vec<Arc<Notify>> = self
            .actors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        for n in all {
            n.notify_one();
        }
    }

    /// Starts a runner for `id` unless one runs; whether it started one.
    pub(crate) fn spawn_actor(self: &Arc<Self>, id: &str) -> bool {
        let notify = {
            let mut m = self.actors.lock().unwrap_or_else(|p| p.into_inner());
            if m.contains_key(id) {
                return false;
            }
            let n = Arc::new(Notify::new());
            m.insert(id.to_string(), n.clone());
            n
        };
        let me = self.clone();
        let id = id.to_string();
        tokio::spawn(async move {
            crate::runner::run(me.core.clone(), id.clone(), notify).await;
            me.actors
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
        });
        true
    }

    /// The sessions store (the gateway's policy check reads a call's
    /// session from it).
    pub fn store(&self) -> Arc<dyn SessionStore> {
        self.core.store.clone()
    }

    pub(crate) fn nudge(self: &Arc<Self>, id: &str) {
        let n = self
            .actors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned();
        match n {
            Some(n) => n.notify_one(),
            None => {
                self.spawn_actor(id);
            }
        }
    }

    /// Validates, resolves policy and template, stores the session as
    /// queued, and starts its runner. `Ok((created, true))` when a new
    /// session was made, `false` for an idempotent replay.
    /// `tenant`: the caller's tenant (`None`: the operator), recorded on
    /// the session; its idempotency keys are its own, so another tenant
    /// reusing one makes a new session rather than learning of this one.
    ///
    /// A tenant's session is stored only if the tenant's `limits` have
    /// room for its budget (reserved in the same transaction; 429
    /// `tenant_budget_exhausted` otherwise).
    pub async fn create(
        self: &Arc<Self>,
        body: CreateSessionBody,
        tenant: Option<(&str, &TenantLimits)>,
    ) -> Result<(CreatedSession, bool), SessionError> {
        let (tenant, limits) = match tenant {
            Some((t, l)) => (Some(t), Some(l)),
            None => (None, None),
        };
        let mut spec = self.spec_of(&body, tenant).await?;
        spec.tenant = tenant.map(str::to_string);
        if let Some(k) = &body.idempotency_key {
            validate::text("idempotency_key", k, MAX_IDEMPOTENCY_KEY_BYTES, false)?;
        }
        let key = body
            .idempotency_key
            .as_deref()
            .map(|k| idempotency_scope(tenant, k));
        let canonical =
            serde_json::to_vec(&spec).map_err(|e| SessionError::Internal(e.to_string()))?;
        let hash: String = Sha256::digest(&canonical)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let id = crate::ids::new_id("ses");
        match self
            .core
            .store
            .create_within(&id, &spec, key.as_deref(), &hash, limits)
            .await?
        {
            CreateOutcome::Created(s, ev) => {
                self.core.bus.publish(&s.id, &[ev]);
                self.core.metrics.created.inc();
                self.spawn_actor(&s.id);
                Ok((
                    CreatedSession {
                        session_id: s.id,
                        state: s.state,
                    },
                    true,
                ))
            }
            CreateOutcome::Existing(s) => Ok((
                CreatedSession {
                    session_id: s.id,
                    state: s.state,
                },
                false,
            )),
            CreateOutcome::KeyConflict(existing) => {
                Err(SessionError::IdempotencyConflict(existing))
            }
            CreateOutcome::NoRoom(no) => {
                self.core.metrics.tenant_refused.inc();
                Err(SessionError::TenantBudget(no))
            }
        }
    }

    async fn spec_of(
        &self,
        b: &CreateSessionBody,
        tenant: Option<&str>,
    ) -> Result<SessionSpec, SessionError> {
        // From an environment: its repository and template, its current
        // version pinned; a repo or template that says otherwise is 400.
        let from_env = match &b.environment_id {
            None => None,
            Some(eid) => {
                let envs = self.environments().ok_or_else(|| {
                    SessionError::bad("invalid_request", "environments are not enabled")
                })?;
                let (spec, pin) = envs.pin(eid, tenant).await?;
                if !b.repo.is_empty() && b.repo != spec.repo {
                    return Err(SessionError::bad(
                        "invalid_request",
                        format!("repo must be the environment's ({}) or absent", spec.repo),
                    ));
                }
                if b.template.as_ref().is_some_and(|t| *t != spec.template) {
                    return Err(SessionError::bad(
                        "invalid_request",
                        format!(
                            "template must be the environment's ({}) or absent",
                            spec.template
                        ),
                    ));
                }
                Some((spec, pin))
            }
        };
        let repo = match &from_env {
            Some((spec, _)) => spec.repo.clone(),
            None => b.repo.clone(),
        };
        validate::repo_url(&repo, &self.core.cfg)?;
        let git_ref = b.git_ref.clone().unwrap_or_else(|| "main".into());
        validate::git_ref(&git_ref)?;
        validate::text("task", &b.task, MAX_TASK_BYTES, false)?;
        let budget = b.budget.clone().unwrap_or_default();
        let (tokens, cents, wall) = validate::budget(
            budget.tokens,
            budget.usd_cents,
            budget.wall_s,
            &self.core.cfg,
        )?;
        let env = b.env.clone().unwrap_or_default();
        validate::env(&env)?;
        let mut metadata = b.metadata.clone().unwrap_or_default();
        validate::metadata(&metadata)?;
        hatchery_tenants::metadata::stamp(&mut metadata, tenant);
        let a = b.agent.clone().unwrap_or_default();
        let kind = a.kind.clone().unwrap_or_else(|| "reference".into());
        let command = match (kind.as_str(), &a.command) {
            ("reference", None) => None,
            ("reference", Some(_)) => {
                return Err(SessionError::bad(
                    "invalid_request",
                    "agent.command is only for agent.kind \"command\"",
                ))
            }
            ("command", Some(c)) => {
                validate::text("agent.command", c, 4096, false)?;
                Some(c.clone())
            }
            ("command", None) => {
                return Err(SessionError::bad(
                    "invalid_request",
                    "agent.kind \"command\" needs agent.command",
                ))
            }
            (other, _) => {
                return Err(SessionError::bad(
                    "invalid_request",
                    format!("agent.kind {other:?} is not reference or command"),
                ))
            }
        };
        let model_url = a
            .model_url
            .clone()
            .unwrap_or_else(|| self.core.cfg.model_url.clone());
        validate::model_url(&model_url)?;
        let model = a
            .model
            .clone()
            .unwrap_or_else(|| self.core.cfg.model.clone());
        validate::text("agent.model", &model, 200, false)?;
        let max_steps = a.max_steps.unwrap_or(30);
        if !(1..=200).contains(&max_steps) {
            return Err(SessionError::bad(
                "invalid_request",
                "agent.max_steps must be 1..200",
            ));
        }
        let policy_id = b.policy_id.clone().unwrap_or_else(|| DEFAULT_POLICY.into());
        let policy = self
            .policies
            .resolve(&policy_id)
            .await
            // Another tenant's policy is not there for this one.
            .filter(|p| p.usable_by(tenant))
            .ok_or_else(|| SessionError::UnknownPolicy(policy_id.clone()))?;
        let template = match &from_env {
            Some((spec, _)) => spec.template.clone(),
            None => b
                .template
                .clone()
                .unwrap_or_else(|| DEFAULT_TEMPLATE.into()),
        };
        validate::template_name(&template)?;
        match self.core.sandboxes.template_exists(&template).await {
            Ok(true) => {}
            Ok(false) => return Err(SessionError::UnknownTemplate(template)),
            Err(e) => return Err(SessionError::Sandbox(e)),
        }
        Ok(SessionSpec {
            repo,
            git_ref,
            task: b.task.clone(),
            policy_id: policy.id,
            policy_version: policy.version,
            budget_tokens: tokens,
            budget_usd_cents: cents,
            budget_wall_s: wall,
            template,
            agent: AgentSpec {
                kind,
                model_url,
                model,
                max_steps,
                command,
            },
            env,
            metadata,
            environment: from_env.map(|(_, pin)| pin),
            tenant: tenant.map(str::to_string),
        })
    }

    pub async fn view(&self, id: &str) -> Result<SessionView, SessionError> {
        let s = self.core.store.get(id).await?;
        let pending = self.core.store.pending_approval(id).await?;
        let u = self.core.store.usage(id).await?;
        let broker = self
            .broker_usage
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let calls = match broker {
            Some(b) => b.usage(id).await,
            None => None,
        };
        let mut caps_reached = u.capped.clone();
        caps_reached.sort();
        caps_reached.dedup();
        let mut v = SessionView::new(s, pending);
        v.storage = Some(StorageView {
            events: u.events,
            event_bytes: u.event_bytes,
            blobs: u.blobs,
            blob_bytes: u.blob_bytes,
            output_bytes: u.output_bytes(),
            max_output_bytes: self.core.cfg.output.max_bytes,
            open_approvals: u.open_approvals,
            broker_calls: calls.map(|c| c.0),
            broker_arg_bytes: calls.map(|c| c.1),
            caps_reached,
        });
        Ok(v)
    }

    pub async fn message(
        self: &Arc<Self>,
        id: &str,
        text: &str,
    ) -> Result<MessageAccepted, SessionError> {
        validate::text("text", text, MAX_MESSAGE_BYTES, false)?;
        let live: Vec<SessionState> = SessionState::ALL
            .into_iter()
            .filter(|s| s.can_message())
            .collect();
        let evs = match self
            .core
            .store
            .append_if_state(
                id,
                &live,
                vec![(
                    Actor::User,
                    EventKind::Message {
                        text: text.to_string(),
                    },
                )],
                Patch::default(),
            )
            .await
        {
            Ok(e) => e,
            Err(crate::store::StoreError::StateConflict { current, .. }) => {
                return Err(SessionError::Conflict(format!(
                    "session {id} is {current}; messages go only to sessions that have not ended"
                )))
            }
            Err(e) => return Err(e.into()),
        };
        self.core.bus.publish(id, &evs);
        self.core.metrics.messages.inc();
        self.nudge(id);
        let s = self.core.store.get(id).await?;
        Ok(MessageAccepted {
            seq: evs[0].seq,
            state: s.state,
        })
    }

    pub async fn decide(
        self: &Arc<Self>,
        id: &str,
        approval_id: &str,
        body: &ApprovalBody,
    ) -> Result<ApprovalDecided, SessionError> {
        if !matches!(body.decision.as_str(), "approve" | "deny") {
            return Err(SessionError::bad(
                "invalid_request",
                "decision must be \"approve\" or \"deny\"",
            ));
        }
        validate::text("note", &body.note, MAX_NOTE_BYTES, true)?;
        if let Some(r) = &body.remember {
            if r != "session" {
                return Err(SessionError::bad(
                    "invalid_request",
                    "remember must be \"session\" (or absent)",
                ));
            }
            let a = self.core.store.approval(id, approval_id).await?;
            use crate::held_approvals::{is_held, ACTION, MODEL_CALL_ACTION};
            let held = |a: &crate::store::Approval| {
                is_held(&a.approval_id) && matches!(a.action.as_str(), ACTION | MODEL_CALL_ACTION)
            };
            if a.is_some_and(|a| !held(&a)) {
                return Err(SessionError::bad(
                    "invalid_request",
                    "remember applies to egress and model call approvals only",
                ));
            }
        }
        let s = self.core.store.get(id).await?;
        if !s.state.can_decide_approval() {
            // A decided or unknown approval is 404 below; this is the
            // session-level conflict.
            if s.state.is_terminal() {
                return Err(SessionError::Conflict(format!(
                    "session {id} is {}",
                    s.state
                )));
            }
        }
        let evs = self
            .core
            .store
            .decide_approval(
                id,
                approval_id,
                crate::store::Decided {
                    remember: body.remember.as_deref(),
                    ..crate::store::Decided::by_user(&body.decision, &body.note)
                },
            )
            .await?;
        self.core.bus.publish(id, &evs);
        self.nudge(id);
        let s = self.core.store.get(id).await?;
        Ok(ApprovalDecided {
            seq: evs[0].seq,
            state: s.state,
        })
    }

    /// Cancel: idempotent on a cancelled session, 409 on one that completed
    /// or failed. Waits (up to `wait`) for the runner to stop the agent and
    /// keep a snapshot for review.
    pub async fn cancel(
        self: &Arc<Self>,
        id: &str,
        wait: std::time::Duration,
    ) -> Result<SessionView, SessionError> {
        let s = self.core.store.get(id).await?;
        match s.state {
            SessionState::Cancelled => return self.view(id).await,
            SessionState::Completed | SessionState::Failed => {
                return Err(SessionError::Conflict(format!(
                    "session {id} already {}",
                    s.state
                )))
            }
            _ => {}
        }
        let mut rx = self.core.bus.subscribe(id);
        if !s.cancel_requested {
            let r = self
                .core
                .store
                .append_if_state(
                    id,
                    &SessionState::sources_of(SessionState::Cancelled),
                    vec![(Actor::User, EventKind::CancelRequested)],
                    Patch {
                        cancel_requested: Some(true),
                        ..Default::default()
                    },
                )
                .await;
            match r {
                Ok(evs) => self.core.bus.publish(id, &evs),
                Err(crate::store::StoreError::StateConflict {
                    current: SessionState::Cancelled,
                    ..
                }) => return self.view(id).await,
                Err(e) => return Err(e.into()),
            }
        }
        self.nudge(id);
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let cur = self.core.store.get(id).await?;
            if cur.state.is_terminal() {
                break;
            }
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Err(_) => break,
                Ok(Err(tokio::sync::broadcast::error::RecvError::Closed)) => break,
                Ok(_) => {}
            }
        }
        self.view(id).await
    }

    pub async fn blob(&self, id: &str, r: &str) -> Result<Vec<u8>, SessionError> {
        self.core.store.get(id).await?;
        self.core
            .store
            .blob(id, r)
            .await?
            .ok_or_else(|| SessionError::BlobNotFound(r.to_string()))
    }
}

/// The stored idempotency key: the operator's as given, a tenant's
/// prefixed with its id (a tenant id has no `/`), so keys never collide
/// across tenants.
fn idempotency_scope(tenant: Option<&str>, key: &str) -> String {
    match tenant {
        None => key.to_string(),
        Some(t) => format!("{t}/{key}"),
    }
}
