//! The broker: `invoke` turns one tool call from a sandbox into at most
//! one effect. Order for a new key: the session's pinned policy decides;
//! the call row (with the decision) is committed; the `broker_call` event
//! is appended; for an approval, the approval row and event, and the
//! session moves to `waiting_approval`; then, for an allowed call, the
//! effect's exact plan is recorded (`executing`, and a
//! `broker_effect_started` event) before the credential is used; the
//! result is recorded (`done`/`failed`, `broker_result`). A retry of the
//! key returns what is stored; a call found `executing` by a fresh process
//! is resolved against the remote (or marked `needs_review`), never run
//! again.

use crate::config::BrokerConfig;
use crate::cut::cut;
use crate::diffstat::DiffSize;
use crate::error::BrokerError;
use crate::git;
use crate::github::{self, Forge};
use crate::sandbox::SandboxAccess;
use crate::store::{
    Advance, Begin, BrokerStore, BrokerWrite, Call, CallState, EventRef, Insert, Recorded, Refs,
    SetRef,
};
use crate::wire::{InvokeRequest, InvokeResult};
use hatchery_policy::cache::CompiledPolicies;
use hatchery_policy::{Destination, Effect, Request};
use hatchery_sessions::events::EventKind;
use hatchery_sessions::state::SessionState;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Largest work tree `git_push` moves out of a sandbox.
pub const MAX_PUSH_TREE_BYTES: u64 = 64 << 20;
/// Arguments are shown in events up to this size.
const EVENT_ARGS_BYTES: usize = 4096;
const EXPORT_SCRIPT: &str = include_str!("../sandbox/export_tree.py");
const EXPORT_DIR: &str = "/opt/hatchery/broker";
/// Where the session runner unpacks the checkout.
const WORKDIR: &str = "/workspace";

type KeyLock = Arc<tokio::sync::Mutex<()>>;

/// How often a session's ignored `diff` argument is logged, at most.
const DIFF_WARN_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

pub struct Broker {
    pub(crate) store: BrokerStore,
    sessions: Arc<dyn crate::session_log::SessionLog>,
    policies: CompiledPolicies,
    sandboxes: Arc<dyn SandboxAccess>,
    cfg: BrokerConfig,
    /// One lock per key in this process: concurrent retries of one seq
    /// wait for each other instead of racing to the effect.
    keys: Mutex<HashMap<(String, u64), KeyLock>>,
    /// sandbox id → (session, epoch), as recorded in the store.
    epochs: Mutex<HashMap<String, (String, u64)>>,
    pub(crate) metrics: crate::metrics::BrokerMetrics,
    /// This process, as recorded on the calls it takes into `executing`.
    runner: crate::runner::Runner,
    /// Per-session caps (caps.rs): one lock per session around the check
    /// and the new call's row, so N concurrent calls cannot all pass a
    /// cap that has room for one; the rate's buckets; and which caps have
    /// had their event written (once per cap, session and process).
    session_locks: Mutex<HashMap<String, KeyLock>>,
    rates: crate::caps::RateBuckets,
    capped: Mutex<std::collections::HashSet<(String, &'static str)>>,
    /// Measures a push's diff on the host (diffstat.rs); a trait so tests
    /// can make it fail.
    diffs: Mutex<Arc<dyn crate::diffstat::DiffSizer>>,
    /// When each session was last told (in the log) that its own `diff`
    /// argument was ignored: at most once a minute per session.
    diff_warned: Mutex<HashMap<String, std::time::Instant>>,
}

#[async_trait::async_trait]
impl hatchery_sessions::broker_hooks::BrokerUsage for Broker {
    async fn usage(&self, session: &str) -> Option<(u64, u64)> {
        self.store
            .usage(session)
            .await
            .ok()
            .map(|u| (u.calls, u.arg_bytes))
    }
}

/// The branch a session owns; `pol_standard` lets it push there.
pub fn session_branch(session_id: &str) -> String {
    format!("hatchery/{session_id}")
}

fn canonical(v: &Value) -> String {
    hatchery_audit::canonical_json(v).unwrap_or_else(|_| v.to_string())
}

impl Broker {
    pub fn new(
        store: BrokerStore,
        sessions: Arc<dyn crate::session_log::SessionLog>,
        policies: CompiledPolicies,
        sandboxes: Arc<dyn SandboxAccess>,
        cfg: BrokerConfig,
    ) -> Arc<Broker> {
        Arc::new(Broker {
            store,
            sessions,
            policies,
            sandboxes,
            keys: Mutex::new(HashMap::new()),
            epochs: Mutex::new(HashMap::new()),
            metrics: crate::metrics::BrokerMetrics::new(),
            runner: crate::runner::Runner::new(),
            session_locks: Mutex::new(HashMap::new()),
            rates: crate::caps::RateBuckets::new(cfg.caps.calls_per_minute),
            capped: Mutex::new(std::collections::HashSet::new()),
            diffs: Mutex::new(Arc::new(crate::diffstat::GitNumstat)),
            diff_warned: Mutex::new(HashMap::new()),
            cfg,
        })
    }

    pub fn metrics(&self) -> &crate::metrics::BrokerMetrics {
        &self.metrics
    }

    pub fn store(&self) -> &BrokerStore {
        &self.store
    }

    /// Replaces how pushes are measured (tests: a measurement that fails).
    #[cfg(test)]
    pub(crate) fn set_diff_sizer(&self, d: Arc<dyn crate::diffstat::DiffSizer>) {
        *self.diffs.lock().unwrap_or_else(|p| p.into_inner()) = d;
    }

    fn diff_sizer(&self) -> Arc<dyn crate::diffstat::DiffSizer> {
        self.diffs.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// A sandbox's epoch never changes once given, so it is looked up in
    /// the store once per sandbox and process.
    async fn epoch(&self, session: &str, sandbox_id: &str) -> Result<u64, BrokerError> {
        let cached = self
            .epochs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(sandbox_id)
            .filter(|(s, _)| s == session)
            .map(|(_, e)| *e);
        if let Some(e) = cached {
            return Ok(e);
        }
        let e = self.store.epoch_for(session, sandbox_id).await?;
        let mut m = self.epochs.lock().unwrap_or_else(|p| p.into_inner());
        if m.len() > 10_000 {
            m.clear();
        }
        m.insert(sandbox_id.to_string(), (session.to_string(), e));
        Ok(e)
    }

    fn key_lock(&self, session: &str, seq: u64) -> KeyLock {
        let mut m = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        if m.len() > 10_000 {
            // Drop locks nobody holds; a lock is only an in-process guard.
            m.retain(|_, l| Arc::strong_count(l) > 1);
        }
        m.entry((session.to_string(), seq)).or_default().clone()
    }

    fn session_lock(&self, session: &str) -> KeyLock {
        let mut m = self.session_locks.lock().unwrap_or_else(|p| p.into_inner());
        if m.len() > 10_000 {
            m.retain(|_, l| Arc::strong_count(l) > 1);
        }
        m.entry(session.to_string()).or_default().clone()
    }

    /// A refusal at a per-session cap: counted, its event written once
    /// (per cap, session and process: a refused call is what a looping
    /// agent repeats, and each refusal writing an event would be the
    /// unbounded storage the cap is there to stop), logged rate-limited
    /// the same way, and answered 429.
    async fn refuse(&self, session: &str, r: crate::caps::Refusal) -> BrokerError {
        self.metrics.caps_hit.with_label_values(&[r.code]).inc();
        let first = {
            let mut m = self.capped.lock().unwrap_or_else(|p| p.into_inner());
            if m.len() > 100_000 {
                m.clear();
            }
            m.insert((session.to_string(), r.code))
        };
        if first {
            tracing::warn!(
                session,
                cap = r.code,
                "broker call refused at a per-session cap"
            );
            let ev = EventKind::OutputCapped {
                cap: r.code.to_string(),
                limit: r.limit,
                message: r.message.clone(),
            };
            if let Err(e) = self.sessions.record(session, vec![ev]).await {
                tracing::warn!(session, error = %e, "cap event not written");
            }
        }
        BrokerError::SessionCap {
            code: r.code,
            message: r.message,
            retry_after: r.retry_after,
        }
    }

    /// The count, argument-bytes and rate caps for a new call of
    /// `arg_bytes`; then, once the policy asked for an approval, the
    /// approval cap (`decided`). Called under the session's lock.
    async fn check_caps(
        &self,
        session: &str,
        arg_bytes: u64,
        decided: Option<&Call>,
    ) -> Result<(), BrokerError> {
        let u = self.store.usage(session).await?;
        let r = match decided {
            None => crate::caps::check_stored(&self.cfg.caps, &u, arg_bytes)
                .and_then(|()| self.rates.take(session, std::time::Instant::now())),
            Some(c) if c.state == CallState::AwaitingApproval => {
                crate::caps::check_approvals(&self.cfg.caps, &u)
            }
            Some(_) => Ok(()),
        };
        match r {
            Ok(()) => Ok(()),
            Err(r) => Err(self.refuse(session, r).await),
        }
    }

    /// What a session's calls hold in the record, for its view.
    pub async fn usage(&self, session: &str) -> Result<crate::store::CallUsage, BrokerError> {
        Ok(self.store.usage(session).await?)
    }

    /// The session whose current sandbox `sandbox_id` is, if it may use
    /// the broker now: a sandbox of no session (a plain or playground
    /// one) is 403 `unknown_sandbox`, a replaced one 409 `fenced`, a
    /// session still starting 503 (ask again), one that is not running
    /// 409. Every guest route asks this
    /// first (`routes.rs`), so nothing of the broker (not even its tool
    /// list) answers a sandbox without a session.
    pub async fn caller(
        &self,
        sandbox_id: &str,
    ) -> Result<hatchery_sessions::store::Session, BrokerError> {
        let Some(session) = self.sessions.session_for_sandbox(sandbox_id).await? else {
            return Err(match self.store.known_epoch(sandbox_id).await? {
                Some((s, e)) => BrokerError::Fenced(format!(
                    "sandbox {sandbox_id} (epoch {e} of session {s}) was replaced; its calls are refused"
                )),
                None => BrokerError::UnknownSandbox(format!("sandbox {sandbox_id} belongs to no running session")),
            });
        };
        if session.state == SessionState::Starting {
            // The runner starts the agent, then records `running`: a quick
            // agent's first call can land in between. Nothing is done; a
            // 503 says ask again with the same seq (a 409 here was final
            // for the agent, seen under load in broker-test).
            return Err(BrokerError::Unavailable(format!(
                "session {} is starting",
                session.id
            )));
        }
        if !matches!(
            session.state,
            SessionState::Running | SessionState::WaitingApproval
        ) {
            return Err(BrokerError::SessionState(format!(
                "session {} is {}",
                session.id, session.state
            )));
        }
        Ok(session)
    }

    /// One call from the sandbox `sandbox_id` (attached by the host side).
    pub async fn invoke(
        &self,
        sandbox_id: &str,
        req: InvokeRequest,
    ) -> Result<InvokeResult, BrokerError> {
        req.validate()?;
        if let Some((server, _)) = crate::mcp::split_name(&req.tool) {
            if self.cfg.mcp.server(server).is_none() {
                let mut known: Vec<String> =
                    crate::wire::TOOLS.iter().map(|t| t.to_string()).collect();
                known.extend(self.cfg.mcp.names().iter().map(|n| format!("mcp.{n}.*")));
                return Err(BrokerError::UnknownTool(req.tool.clone(), known.join(", ")));
            }
        }
        let session = self.caller(sandbox_id).await?;
        let epoch = self.epoch(&session.id, sandbox_id).await?;
        let args = canonical(&req.args);
        let sha = hex(&Sha256::digest(
            format!("{}\n{}", req.tool, args).as_bytes(),
        ));

        let lock = self.key_lock(&session.id, req.seq);
        let _held = lock.lock().await;
        // One database holds the call record and the session log, and a
        // call's row commits with its first events: a key with no row was
        // never asked of any broker (a session rewound to a checkpoint, or
        // moved to another host, finds its calls here) and is new.
        let (call, measured) = match self.store.get(&session.id, req.seq).await? {
            Some(c) if c.args_sha256 == sha && c.tool == req.tool => (c, None),
            Some(c) => {
                self.metrics
                    .calls
                    .with_label_values(&[&req.tool, "seq_conflict"])
                    .inc();
                return Err(BrokerError::SeqConflict {
                    seq: req.seq,
                    tool: c.tool,
                });
            }
            None => {
                // A new call: within the session's caps, or nothing of it
                // is recorded (429).
                let session_lock = self.session_lock(&session.id);
                let _session_held = session_lock.lock().await;
                self.check_caps(&session.id, args.len() as u64, None)
                    .await?;
                let mut c = Call::new(&session.id, req.seq, epoch, &req.tool, args.clone(), sha);
                let measured = self.decide(&session, &req, &mut c, sandbox_id).await?;
                self.check_caps(&session.id, 0, Some(&c)).await?;
                let created = c.created_at.clone();
                let row = self.begin(c).await?;
                // The push measured for the decision is the one pushed,
                // unless another request recorded the key first (its
                // commit would carry another date).
                let measured = measured.filter(|_| row.created_at == created);
                (row, measured)
            }
        };
        // An allowed call's `broker_call` event is written with its
        // effect's start (execute), in one transaction; every other call's
        // now.
        let call = if call.state == CallState::Pending {
            call
        } else {
            self.ensure_recorded(call).await?
        };
        let call = self.drive(&session, call, sandbox_id, measured).await?;
        // A call that failed in planning has had no event yet.
        let call = self.ensure_recorded(call).await?;
        let call = self.ensure_result_event(call).await?;
        self.metrics
            .calls
            .with_label_values(&[&call.tool, call.state.as_str()])
            .inc();
        // The caller's epoch (the row keeps the one that recorded it).
        let mut r = InvokeResult::from_call(&call);
        r.epoch = epoch;
        Ok(r)
    }

    /// Records a new call under its key, or finds the same call there
    /// already; another call under the key is 409. A call decided at once
    /// (denied, effect-free, waiting for an approval) is recorded with its
    /// events in one commit; an allowed one alone (its events go with its
    /// effect's start, `execute`).
    async fn begin(&self, mut c: Call) -> Result<Call, BrokerError> {
        let seq = c.seq;
        if c.state == CallState::Pending && c.tool == "noop" {
            // No effect at all: done before anything happens.
            c.state = CallState::Done;
            c.output = Some(json!({"ok": true}).to_string());
        }
        if c.state != CallState::Pending {
            let mut kinds = vec![call_event(&c)];
            let mut refs = Refs {
                call: Some(0),
                ..Refs::default()
            };
            if c.state.is_final() {
                refs.result = Some(1);
                kinds.push(result_event(&c));
            }
            let sid = c.session_id.clone();
            let mut w = BrokerWrite::Insert(Insert::new(c.clone(), refs));
            self.sessions.record_joined(&sid, kinds, &mut w).await?;
            if let Some(c) = w.into_insert().and_then(Insert::inserted) {
                return Ok(c);
            }
            // The key was taken meanwhile (or the row was inserted by the
            // session's owner, on the control role): as below, without
            // events.
        }
        match self.store.begin(c).await? {
            Begin::New(c) | Begin::Existing(c) => Ok(c),
            Begin::Conflict(c) => Err(BrokerError::SeqConflict { seq, tool: c.tool }),
        }
    }

    /// The session's pinned policy, compiled.
    async fn policy(
        &self,
        s: &hatchery_sessions::store::Session,
    ) -> Result<Arc<hatchery_policy::Policy>, BrokerError> {
        self.policies
            .get(&s.spec.policy_id, s.spec.policy_version)
            .await
            .map_err(|e| {
                BrokerError::PolicyUnavailable(
                    format!("{} v{}", s.spec.policy_id, s.spec.policy_version),
                    e.to_string(),
                )
            })
    }

    /// Evaluates `args` (as the host prepared them) for `tool` under the
    /// session's policy: context `session_branch` and `session_id`, and
    /// as `cost` the session's spend so far in cents (a broker tool call
    /// costs no model tokens of its own; docs/policy.md).
    async fn evaluate(
        &self,
        s: &hatchery_sessions::store::Session,
        tool: &str,
        args: &Value,
    ) -> Result<(Effect, Option<String>), BrokerError> {
        let policy = self.policy(s).await?;
        let mut ctx = Map::new();
        ctx.insert(
            "session_branch".into(),
            Value::String(session_branch(&s.id)),
        );
        ctx.insert("session_id".into(), Value::String(s.id.clone()));
        let url_dest = crate::fetch::destination(tool, args);
        let dest = url_dest.as_ref().map(|(h, p)| Destination {
            host: h,
            ip: None,
            port: *p,
        });
        let t = std::time::Instant::now();
        let d = policy.evaluate(&Request {
            tool,
            args,
            cost_cents: Some(i64::try_from(s.spend_usd_cents).unwrap_or(i64::MAX)),
            dest,
            ctx: Some(&ctx),
        });
        self.metrics
            .policy_seconds
            .observe(t.elapsed().as_secs_f64());
        Ok((d.effect, d.rule_id.map(str::to_string)))
    }

    /// The pinned policy's decision, written into the new call. A
    /// `git_push` is planned first (its commit built on the host, not
    /// pushed) and measured, so `diff.*` in the policy is the host's
    /// count, never the agent's: the plan is returned to be pushed as it
    /// was measured when the call is allowed at once. A push that cannot
    /// be planned or measured is decided without any `diff` and, unless
    /// that denies it, fails: it is never allowed at an unknown size.
    async fn decide(
        &self,
        s: &hatchery_sessions::store::Session,
        req: &InvokeRequest,
        c: &mut Call,
        sandbox_id: &str,
    ) -> Result<Option<Plan>, BrokerError> {
        // Fail closed before any work: no policy, no plan.
        self.policy(s).await?;
        let mut measured = None;
        let mut unplanned = None;
        let mut eval_args = None;
        if req.tool == "git_push" {
            match self.plan_push(s, c, &req.args, sandbox_id).await {
                Ok(plan) => {
                    let size = plan.diff().unwrap_or_default();
                    self.note_agent_diff(&s.id, req.seq, &req.args, &size);
                    eval_args = Some(with_diff(&req.args, Some(&size)));
                    measured = Some(plan);
                }
                Err(PlanError::Transient(e)) => return Err(BrokerError::Unavailable(e)),
                Err(e) => {
                    eval_args = Some(with_diff(&req.args, None));
                    unplanned = Some(e);
                }
            }
        }
        let (effect, rule_id) = self
            .evaluate(s, &req.tool, eval_args.as_ref().unwrap_or(&req.args))
            .await?;
        c.rule_id = rule_id;
        let diff = measured.as_ref().and_then(Plan::diff);
        match effect {
            Effect::Allow => {
                c.decision = "allow".into();
                c.state = CallState::Pending;
            }
            Effect::Deny => {
                c.decision = "deny".into();
                c.state = CallState::Denied;
                let mut out = json!({"error": match &c.rule_id {
                    Some(r) => format!("denied by policy rule {r:?}"),
                    None => "denied: no policy rule allows this call (default deny)".to_string(),
                }});
                if let Some(d) = diff {
                    out["diff"] = d.to_json();
                }
                c.output = Some(out.to_string());
            }
            Effect::RequireApproval => {
                c.decision = "require_approval".into();
                c.state = CallState::AwaitingApproval;
                c.approval_id = Some(approval_id(&s.id, req.seq));
                // The operator's record shows the size the approval is
                // asked for (the effect proper replaces it when it runs).
                if let Some(d) = diff {
                    c.effect = Some(json!({"diff": d.to_json()}).to_string());
                }
            }
        }
        if let Some(e) = unplanned {
            if c.state != CallState::Denied {
                c.state = CallState::Failed;
                c.approval_id = None;
                c.output = Some(plan_error_output(e).to_string());
            }
        }
        Ok(measured.filter(|_| c.state == CallState::Pending))
    }

    /// An agent's own `diff` argument is not what the policy sees; when it
    /// differs from the host's count, that is logged (at most once a
    /// minute per session) and counted.
    fn note_agent_diff(&self, session: &str, seq: u64, args: &Value, host: &DiffSize) {
        let Some(claimed) = args.get("diff") else {
            return;
        };
        if *claimed == host.to_json() {
            return;
        }
        self.metrics.agent_diff_ignored.inc();
        let now = std::time::Instant::now();
        let mut w = self.diff_warned.lock().unwrap_or_else(|p| p.into_inner());
        w.retain(|_, t| now.duration_since(*t) < DIFF_WARN_EVERY);
        if w.contains_key(session) {
            return;
        }
        w.insert(session.to_string(), now);
        tracing::warn!(
            session = %session,
            seq,
            claimed = %cut(&claimed.to_string(), 200),
            files = host.files,
            lines_added = host.lines_added,
            lines_removed = host.lines_removed,
            "git_push: the agent's diff argument is ignored; the policy sees the host's count"
        );
    }

    /// A `git_push` planned again when it runs (after an approval, or by
    /// another process): the policy is asked again with the size of the
    /// commit about to be pushed, which may not be the one decided on if
    /// the work tree changed meanwhile. It must allow it, or ask for the
    /// approval this call has had; otherwise the call fails with
    /// `push_not_allowed_as_measured` and nothing is pushed.
    async fn recheck_push(
        &self,
        s: &hatchery_sessions::store::Session,
        call: &Call,
        args: &Value,
        size: &DiffSize,
    ) -> Result<Option<PlanError>, BrokerError> {
        let (effect, rule) = self
            .evaluate(s, &call.tool, &with_diff(args, Some(size)))
            .await?;
        // Only an approved call moves from awaiting_approval to pending.
        let approved = call.approval_id.is_some();
        Ok(match effect {
            Effect::Allow => None,
            Effect::RequireApproval if approved => None,
            e => Some(PlanError::Refused {
                code: "push_not_allowed_as_measured",
                message: format!(
                    "the commit to push changes {} files (+{} -{} lines), which policy rule {} answers with {} (the work tree changed since the call was decided); nothing was pushed, ask again with a new seq",
                    size.files,
                    size.lines_added,
                    size.lines_removed,
                    rule.as_deref().unwrap_or("(default deny)"),
                    match e {
                        Effect::Allow => "allow",
                        Effect::Deny => "deny",
                        Effect::RequireApproval => "require_approval",
                    }
                ),
            }),
        })
    }

    /// The `broker_call` event (once per call) and, for an approval, the
    /// approval itself. A call recorded with its events (`begin`,
    /// `advance`) has them; this writes what a call recorded without them
    /// lacks (one that failed in planning, a row from an older release),
    /// the event and its seq in one commit.
    async fn ensure_recorded(&self, call: Call) -> Result<Call, BrokerError> {
        let call = self.ensure_event(call, EventRef::Call, call_event).await?;
        if let Some(aid) = &call.approval_id {
            // Opened once: a decided approval is not asked again (the
            // agent re-asks its call after the decision, or after a
            // resume), and a crash before the opening opens it on the retry.
            let after = call.event_seq.unwrap_or(1).saturating_sub(1);
            if call.state == CallState::AwaitingApproval
                && self
                    .sessions
                    .approval_decision(&call.session_id, aid, after)
                    .await?
                    .is_none()
            {
                self.sessions
                    .open_approval(
                        &call.session_id,
                        aid,
                        &call.tool,
                        &cut(&approval_args(&call), EVENT_ARGS_BYTES),
                    )
                    .await?;
            }
        }
        Ok(call)
    }

    /// The `broker_result` event of a finished call, once (see
    /// [`Self::ensure_recorded`]).
    async fn ensure_result_event(&self, call: Call) -> Result<Call, BrokerError> {
        if !call.state.is_final() {
            return Ok(call);
        }
        self.ensure_event(call, EventRef::Result, result_event)
            .await
    }

    /// Writes the call's `which` event (`kind`) with its seq, in one
    /// commit, unless its seq is stored already.
    async fn ensure_event(
        &self,
        call: Call,
        which: EventRef,
        kind: impl FnOnce(&Call) -> EventKind,
    ) -> Result<Call, BrokerError> {
        let written = match which {
            EventRef::Call => call.event_seq,
            EventRef::Result => call.result_event_seq,
            EventRef::Review => call.review_event_seq,
        };
        if written.is_some() {
            return Ok(call);
        }
        let mut set = BrokerWrite::SetRef(SetRef {
            which,
            session_id: call.session_id.clone(),
            seq: call.seq,
        });
        self.sessions
            .record_joined(&call.session_id, vec![kind(&call)], &mut set)
            .await?;
        Ok(self
            .store
            .get(&call.session_id, call.seq)
            .await?
            .unwrap_or(call))
    }

    /// `measured`: the push planned for the decision, pushed as it is
    /// if the call runs now.
    async fn drive(
        &self,
        s: &hatchery_sessions::store::Session,
        mut call: Call,
        sandbox_id: &str,
        mut measured: Option<Plan>,
    ) -> Result<Call, BrokerError> {
        loop {
            match call.state {
                st if st.is_final() => return Ok(call),
                CallState::AwaitingApproval => {
                    let aid = call.approval_id.clone().unwrap_or_default();
                    let after = call.event_seq.unwrap_or(1).saturating_sub(1);
                    match self
                        .sessions
                        .approval_decision(&call.session_id, &aid, after)
                        .await?
                    {
                        None => return Ok(call),
                        Some(d) if d.approved => {
                            call = self
                                .advance(
                                    &call,
                                    (CallState::AwaitingApproval, CallState::Pending),
                                    Recorded::default(),
                                    vec![],
                                )
                                .await?;
                        }
                        Some(d) => {
                            let out = json!({"error": "denied by the approver", "note": d.note})
                                .to_string();
                            call = self
                                .advance(
                                    &call,
                                    (CallState::AwaitingApproval, CallState::Denied),
                                    output(out),
                                    vec![],
                                )
                                .await?;
                        }
                    }
                }
                CallState::Pending => {
                    call = self.execute(s, call, sandbox_id, measured.take()).await?
                }
                // We hold the key's lock, so no request of this process is
                // in the middle of it: the process that started it stopped
                // mid-effect, or (another live broker) is still at it.
                CallState::Executing => {
                    call = match self.wait_for_runner(call).await? {
                        c if c.state == CallState::Executing => self.resolve(c).await?,
                        c => c,
                    }
                }
                _ => return Ok(call),
            }
        }
    }

    /// Moves `call` from `from` to `to`, in one commit with the events
    /// that record the move: its `broker_call` if not yet written, then
    /// `extra`, then its `broker_result` if `to` is final. The call as it
    /// is after (moved by someone else first, if it was).
    async fn advance(
        &self,
        call: &Call,
        (from, to): (CallState, CallState),
        rec: Recorded,
        extra: Vec<EventKind>,
    ) -> Result<Call, BrokerError> {
        let mut kinds = vec![];
        let mut refs = Refs::default();
        if call.event_seq.is_none() {
            refs.call = Some(kinds.len());
            kinds.push(call_event(call));
        }
        for k in extra {
            if matches!(k, EventKind::BrokerCallResolved { .. }) {
                refs.review = Some(kinds.len());
            }
            kinds.push(k);
        }
        if to.is_final() && call.result_event_seq.is_none() {
            let mut done = call.clone();
            done.state = to;
            done.output = rec.output.clone().or(done.output);
            refs.result = Some(kinds.len());
            kinds.push(result_event(&done));
        }
        let moved = if kinds.is_empty() {
            self.store
                .advance_recorded(&call.session_id, call.seq, from, to, rec)
                .await?
        } else {
            let mut step = BrokerWrite::Advance(Advance::new(call, from, to, rec, refs));
            self.sessions
                .record_joined(&call.session_id, kinds, &mut step)
                .await?;
            match step.into_advance() {
                Some(a) => a.moved()?,
                None => None,
            }
        };
        match moved {
            Some(c) => Ok(c),
            None => Ok(self
                .store
                .get(&call.session_id, call.seq)
                .await?
                .ok_or_else(|| BrokerError::Internal("call row vanished".into()))?),
        }
    }

    /// Plan (no effect), record the plan, have the effect, record the result.
    async fn execute(
        &self,
        s: &hatchery_sessions::store::Session,
        call: Call,
        sandbox_id: &str,
        measured: Option<Plan>,
    ) -> Result<Call, BrokerError> {
        let args: Value = serde_json::from_str(&call.args).unwrap_or(Value::Null);
        let plan = match call.tool.as_str() {
            "git_push" => match measured {
                // Decided on this very commit's size a moment ago.
                Some(p) => Ok(p),
                None => match self.plan_push(s, &call, &args, sandbox_id).await {
                    Ok(p) => {
                        let size = p.diff().unwrap_or_default();
                        match self.recheck_push(s, &call, &args, &size).await? {
                            None => Ok(p),
                            Some(refused) => Err(refused),
                        }
                    }
                    Err(e) => Err(e),
                },
            },
            "open_pr" => self.plan_pr(s, &args),
            "http_fetch" => {
                crate::fetch::plan(&args)
                    .map_err(PlanError::from)
                    .map(|(effect, f)| Plan {
                        effect,
                        run: Run::Fetch(f),
                    })
            }
            "noop" => Ok(Plan {
                effect: json!({}),
                run: Run::Noop,
            }),
            t if t.starts_with("mcp.") => self.plan_mcp(t).await,
            other => Err(PlanError::Invalid(format!("no executor for {other}"))),
        };
        let plan = match plan {
            Ok(p) => p,
            // The daemon's own API is not there yet (it is starting) or
            // the sandbox is busy: nothing happened; the agent asks again.
            Err(PlanError::Transient(e)) => return Err(BrokerError::Unavailable(e)),
            Err(e @ (PlanError::Invalid(_) | PlanError::Refused { .. })) => {
                // Nothing happened outside; the call failed before its
                // effect. Its `broker_call` and `broker_result` events
                // (the latter with this output) are written by `invoke`.
                let out = plan_error_output(e);
                return self
                    .advance(
                        &call,
                        (CallState::Pending, CallState::Failed),
                        output(out.to_string()),
                        vec![],
                    )
                    .await;
            }
        };
        let effect = plan.effect.to_string();
        if matches!(plan.run, Run::Noop) {
            // No outside effect: the result is known before anything
            // happens (the call, its result and their events, one commit).
            let done = output(json!({"ok": true}).to_string());
            return self
                .advance(&call, (CallState::Pending, CallState::Done), done, vec![])
                .await;
        }
        // A heartbeat this recent gives the effect most of a TTL before
        // another broker may take this process for gone; no heartbeat (the
        // store is down), no effect.
        self.runner.ensure_fresh(&self.store).await?;
        // The call's event (unless an approval wrote it), the plan's, and
        // the move to `executing`, in one commit before the effect: a
        // process that stops before it plans again on the retry (still no
        // effect, no event twice); one that stops after finds `executing`
        // and resolves it.
        let started = EventKind::BrokerEffectStarted {
            call_seq: call.seq,
            tool: call.tool.clone(),
            detail: cut(&effect, EVENT_ARGS_BYTES),
        };
        let rec = Recorded {
            effect: Some(effect),
            runner: Some(self.runner.id.clone()),
            ..Recorded::default()
        };
        let c = self
            .advance(
                &call,
                (CallState::Pending, CallState::Executing),
                rec,
                vec![started],
            )
            .await?;
        if c.state != CallState::Executing || c.runner.as_deref() != Some(&*self.runner.id) {
            // Another request moved it first.
            return Ok(c);
        }
        let t = std::time::Instant::now();
        let (to, out) = match plan.run {
            Run::Push {
                prepared,
                remote,
                branch,
                ..
            } => self.run_push(&prepared, &remote, &branch).await,
            Run::Pr {
                forge,
                owner,
                repo,
                body,
            } => self.run_pr(&forge, &owner, &repo, &body).await,
            Run::Noop => (CallState::Done, json!({"ok": true})),
            Run::Mcp { server, tool } => {
                let outcome = server.call(&tool, &args).await;
                self.mcp_result(&c.tool, outcome)
            }
            Run::Fetch(f) => match f.run(&self.cfg.trust).await {
                Ok(v) => (CallState::Done, v),
                Err(e) => (
                    CallState::Failed,
                    json!({"error": hatchery_serve::error_text::with_causes(&e)}),
                ),
            },
        };
        self.metrics
            .effect_seconds
            .with_label_values(&[&c.tool])
            .observe(t.elapsed().as_secs_f64());
        self.advance(
            &c,
            (CallState::Executing, to),
            output(out.to_string()),
            vec![],
        )
        .await
    }

    async fn plan_push(
        &self,
        s: &hatchery_sessions::store::Session,
        call: &Call,
        args: &Value,
        sandbox_id: &str,
    ) -> Result<Plan, PlanError> {
        let branch = args
            .get("branch")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if !git::valid_branch(&branch) {
            return Err(format!("invalid branch name {branch:?}").into());
        }
        let message = args
            .get("message")
            .and_then(Value::as_str)
            .map(|m| cut(m, 4096))
            .unwrap_or_else(|| format!("hatchery session {}", s.id));
        let remote = self.remote(s)?;
        // The tree, from the sandbox, as data only.
        let out = format!("/tmp/hatchery-push-{}.fi", call.seq);
        self.sandboxes
            .write_file(
                sandbox_id,
                &format!("{EXPORT_DIR}/export_tree.py"),
                EXPORT_SCRIPT.as_bytes().to_vec(),
            )
            .await
            .map_err(|e| PlanError::Transient(e.to_string()))?;
        let x = self
            .sandboxes
            .exec(
                sandbox_id,
                vec![
                    "python3".into(),
                    format!("{EXPORT_DIR}/export_tree.py"),
                    WORKDIR.into(),
                    out.clone(),
                    MAX_PUSH_TREE_BYTES.to_string(),
                ],
                120,
            )
            .await
            .map_err(|e| PlanError::Transient(e.to_string()))?;
        if x.exit_code != 0 {
            return Err(format!("exporting the work tree: {}", cut(x.stderr.trim(), 500)).into());
        }
        let stream = self
            .sandboxes
            .read_file(sandbox_id, &out)
            .await
            .map_err(|e| PlanError::Transient(e.to_string()))?;
        if stream.len() as u64 > MAX_PUSH_TREE_BYTES * 2 {
            return Err("work tree stream too large".into());
        }
        // Whatever wrote that file (the export script, or the agent in its
        // place), only file and delete records are taken from it; the
        // host writes the commit itself (issue 31, finding 2).
        let tree = crate::tree::parse(&stream, MAX_PUSH_TREE_BYTES).map_err(|e| {
            tracing::warn!(session = %s.id, seq = call.seq, error = %e, "git_push: the sandbox's tree stream was refused");
            PlanError::Refused {
                code: "tree_stream_refused",
                message: format!("the work tree stream from the sandbox was refused: {e}"),
            }
        })?;
        // On top of the branch if it exists (each push of the session is
        // a fast-forward of the last), else on the session's base commit.
        let tip = git::remote_tip(&remote, &branch)
            .await
            .map_err(|e| e.to_string())?;
        let base = self
            .sessions
            .checkout_commit(&s.id)
            .await
            .map_err(|e| e.to_string())?;
        let (parent_ref, expect) = match &tip {
            Some(_) => (format!("refs/heads/{branch}"), tip.clone()),
            None => (format!("refs/heads/{}", s.spec.git_ref), base.clone()),
        };
        let date = time::OffsetDateTime::parse(
            &call.created_at,
            &time::format_description::well_known::Rfc3339,
        )
        .map(|t| t.unix_timestamp())
        .unwrap_or(0);
        let info = git::CommitInfo {
            message: &message,
            name: "Hatchery session",
            email: "session@hatchery.invalid",
            date,
        };
        let prepared = git::prepare(&remote, &parent_ref, expect.as_deref(), &tree, &info)
            .await
            .map_err(|e| PlanError::Refused {
                code: "push_git_failed",
                message: format!("building the commit on the host: {e}"),
            })?;
        let _ = self
            .sandboxes
            .exec(sandbox_id, vec!["rm".into(), "-f".into(), out], 30)
            .await;
        // What the policy's `diff.*` matches and the effect's event
        // records: the commit's own diff against its parent, on the host.
        let diff = self
            .diff_sizer()
            .size(&prepared.scratch, &prepared.parent, &prepared.commit)
            .await
            .map_err(|e| {
                tracing::warn!(session = %s.id, seq = call.seq, error = %hatchery_serve::error_text::with_causes(&e), "git_push: the push could not be measured; refused");
                PlanError::Refused {
                    code: "diff_unavailable",
                    message: format!(
                        "the push's size could not be measured on the host: {}",
                        hatchery_serve::error_text::with_causes(&e)
                    ),
                }
            })?;
        Ok(Plan {
            effect: json!({"remote": remote.url, "branch": branch, "commit": prepared.commit,
                           "parent": prepared.parent, "diff": diff.to_json(),
                           "credential": remote.header.is_some()}),
            run: Run::Push {
                prepared,
                remote,
                branch,
                diff,
            },
        })
    }

    /// The MCP servers the broker fronts.
    pub fn mcp(&self) -> &crate::mcp::McpHub {
        &self.cfg.mcp
    }

    /// An MCP tool call: the server must be up (else the call stays
    /// pending and the agent is told to ask again) and must list the tool.
    async fn plan_mcp(&self, name: &str) -> Result<Plan, PlanError> {
        let (server, tool) = crate::mcp::split_name(name).ok_or("not an MCP tool name")?;
        let s = self
            .cfg
            .mcp
            .server(server)
            .cloned()
            .ok_or_else(|| format!("no MCP server {server:?} is configured"))?;
        let (tools, _) = s
            .tools()
            .await
            .map_err(|e| PlanError::Transient(format!("MCP server {server}: {e}")))?;
        if !tools.iter().any(|t| t.name == tool) {
            return Err(format!("MCP server {server:?} has no tool {tool:?}").into());
        }
        Ok(Plan {
            effect: json!({"mcp_server": server, "tool": tool}),
            run: Run::Mcp {
                server: s,
                tool: tool.to_string(),
            },
        })
    }

    /// How an MCP call's outcome is recorded: `isError` is the tool's own
    /// failure (allowed, output carries it); a JSON-RPC error or a server
    /// that was down is a broker-side failure (nothing ran); a crash,
    /// timeout or oversized answer after the call was sent leaves the
    /// effect unknown: `needs_review`, never sent again.
    fn mcp_result(&self, name: &str, o: crate::mcp::CallOutcome) -> (CallState, Value) {
        use crate::mcp::CallOutcome as O;
        let server = crate::mcp::split_name(name).map(|x| x.0).unwrap_or("");
        let label = match &o {
            O::Ok(_) => "ok",
            O::ToolError(_) => "is_error",
            O::Rpc { .. } => "rpc_error",
            O::NotSent(_) => "not_sent",
            O::Unknown(_) => "unknown",
        };
        self.metrics
            .mcp_calls
            .with_label_values(&[server, label])
            .inc();
        match o {
            O::Ok(v) => (CallState::Done, v),
            O::ToolError(v) => (
                CallState::Failed,
                json!({"error": "the MCP tool reported an error (isError)", "is_error": true,
                       "content": v.get("content").cloned().unwrap_or(Value::Null)}),
            ),
            O::Rpc { code, message } => (
                CallState::Failed,
                json!({"error": format!("MCP server {server} refused the call: JSON-RPC error {code}: {message}"),
                       "code": "mcp_rpc_error", "rpc_code": code}),
            ),
            O::NotSent(e) => (
                CallState::Failed,
                json!({"error": format!("MCP server {server} is down; the call was not sent: {e}"),
                       "code": "mcp_unavailable"}),
            ),
            O::Unknown(e) => (
                CallState::NeedsReview,
                json!({"error": format!("MCP server {server}: {e}"), "code": "mcp_outcome_unknown",
                       "review": "the call was sent and no usable answer came back; whether it took effect is unknown; not sent again"}),
            ),
        }
    }

    /// Where session `s`'s push goes, with the write credential only when
    /// the push URL's host may have it: always for the operator's
    /// session, for a tenant's only on a `--broker-git-credential-host`
    /// (the tenant chose the repository URL; hatchery_sessions::git_cred).
    pub(crate) fn remote(
        &self,
        s: &hatchery_sessions::store::Session,
    ) -> Result<git::Remote, String> {
        let url = self.cfg.push_url(&s.spec.repo);
        let send = hatchery_sessions::git_cred::allowed(
            &url,
            s.spec.tenant.as_deref(),
            &self.cfg.git_credential_hosts,
        );
        self.remote_at(url, send)
    }

    /// The remote at `url`, with the write credential if `send`.
    fn remote_at(&self, url: String, send: bool) -> Result<git::Remote, String> {
        let header = match &self.cfg.git_credential_file {
            Some(p) if send => Some(
                std::fs::read_to_string(p)
                    .map_err(|e| format!("the broker's git credential file: {e}"))?
                    .trim()
                    .to_string(),
            ),
            _ => None,
        };
        Ok(git::Remote {
            url,
            header,
            scratch: self.cfg.scratch.clone(),
        })
    }

    async fn run_push(
        &self,
        p: &git::Prepared,
        remote: &git::Remote,
        branch: &str,
    ) -> (CallState, Value) {
        match git::push(p, remote, branch).await {
            Ok(out) => (
                CallState::Done,
                json!({"pushed": true, "branch": branch, "commit": p.commit, "parent": p.parent, "git": cut(&out, 2000)}),
            ),
            Err(e) => {
                // An error after the ref moved is still a push: ask the remote.
                match git::remote_tip(remote, branch).await {
                    Ok(Some(t)) if t == p.commit => (
                        CallState::Done,
                        json!({"pushed": true, "branch": branch, "commit": p.commit, "parent": p.parent}),
                    ),
                    Ok(_) => (CallState::Failed, json!({"error": e.to_string()})),
                    Err(e2) => (
                        CallState::NeedsReview,
                        json!({"error": e.to_string(), "review": format!("remote state unknown: {e2}")}),
                    ),
                }
            }
        }
    }

    fn forge(&self) -> Result<Forge, String> {
        let base = self
            .cfg
            .github_api
            .clone()
            .ok_or_else(|| "open_pr: no forge API configured".to_string())?;
        let token = match &self.cfg.github_token_file {
            Some(p) => Some(
                std::fs::read_to_string(p)
                    .map_err(|e| format!("the broker's forge token file: {e}"))?
                    .trim()
                    .to_string(),
            ),
            None => None,
        };
        Ok(Forge {
            base,
            token,
            trust: self.cfg.trust.clone(),
        })
    }

    pub(crate) fn plan_pr(
        &self,
        s: &hatchery_sessions::store::Session,
        args: &Value,
    ) -> Result<Plan, PlanError> {
        // A tenant names its session's repository, and the forge token
        // acts on the owner/repo that URL names: a tenant's pull request
        // is opened only for a repository on a listed host (issue 36;
        // the same rule as the push credential).
        if !hatchery_sessions::git_cred::allowed(
            &s.spec.repo,
            s.spec.tenant.as_deref(),
            &self.cfg.git_credential_hosts,
        ) {
            return Err(PlanError::Refused {
                code: "repo_host_not_listed",
                message: format!(
                    "open_pr: a tenant's session opens pull requests only for a repository on --broker-git-credential-host, not {}",
                    s.spec.repo
                ),
            });
        }
        let forge = self.forge()?;
        let (owner, repo) = github::owner_repo(&s.spec.repo).ok_or_else(|| {
            format!(
                "no owner/repo in the session's repository URL {}",
                s.spec.repo
            )
        })?;
        let text = |k: &str, max: usize| args.get(k).and_then(Value::as_str).map(|v| cut(v, max));
        let head = text("head", 200).unwrap_or_else(|| session_branch(&s.id));
        if !git::valid_branch(&head) {
            return Err(format!("invalid head branch {head:?}").into());
        }
        let base = text("base", 200).unwrap_or_else(|| s.spec.git_ref.clone());
        let title = text("title", 256)
            .filter(|t| !t.trim().is_empty())
            .ok_or("open_pr needs a title")?;
        let body = json!({"title": title, "head": head, "base": base, "body": text("body", 65536).unwrap_or_default()});
        Ok(Plan {
            effect: json!({"forge": forge.base, "owner": owner, "repo": repo, "pr": body}),
            run: Run::Pr {
                forge,
                owner,
                repo,
                body,
            },
        })
    }

    async fn run_pr(
        &self,
        forge: &Forge,
        owner: &str,
        repo: &str,
        body: &Value,
    ) -> (CallState, Value) {
        match forge.create_pr(owner, repo, body).await {
            Ok(v) => (CallState::Done, github::summary(&v)),
            Err(github::ForgeError::Status { status, body }) if (400..500).contains(&status) => (
                CallState::Failed,
                json!({"error": format!("forge answered {status}"), "body": body}),
            ),
            Err(e) => match find_pr(forge, owner, repo, body).await {
                Ok(Some(v)) => (CallState::Done, github::summary(&v)),
                Ok(None) => (CallState::Failed, json!({"error": e.to_string()})),
                Err(e2) => (
                    CallState::NeedsReview,
                    json!({"error": e.to_string(), "review": format!("forge state unknown: {e2}")}),
                ),
            },
        }
    }

    /// A call a previous process left `executing`: what the outside world
    /// says happened, or `needs_review`.
    async fn resolve(&self, call: Call) -> Result<Call, BrokerError> {
        let effect: Value = call
            .effect
            .as_deref()
            .and_then(|e| serde_json::from_str(e).ok())
            .unwrap_or(Value::Null);
        let (to, out) = match call.tool.as_str() {
            "git_push" => self.resolve_push(&effect).await,
            "open_pr" => self.resolve_pr(&effect).await,
            _ => (
                CallState::NeedsReview,
                json!({"review": "the broker stopped during this call; whether it took effect is unknown"}),
            ),
        };
        tracing::warn!(session = %call.session_id, seq = call.seq, tool = %call.tool, to = to.as_str(), "broker call resolved after a restart");
        self.advance(
            &call,
            (CallState::Executing, to),
            output(out.to_string()),
            vec![],
        )
        .await
    }

    async fn resolve_push(&self, effect: &Value) -> (CallState, Value) {
        let g = |k: &str| {
            effect
                .get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let (url, branch, commit) = (g("remote"), g("branch"), g("commit"));
        // The recorded URL is already the push URL; the credential goes
        // only where the plan sent it (a record without `credential`
        // predates the rule and was planned with it).
        let send = effect.get("credential").and_then(Value::as_bool) != Some(false);
        let Ok(remote) = self.remote_at(url, send) else {
            return (
                CallState::NeedsReview,
                json!({"review": "the credential file cannot be read"}),
            );
        };
        match git::remote_tip(&remote, &branch).await {
            Ok(Some(t)) if t == commit => (
                CallState::Done,
                json!({"pushed": true, "branch": branch, "commit": commit, "parent": g("parent"), "recovered": true}),
            ),
            Ok(t) => (
                CallState::NeedsReview,
                json!({"review": "the broker stopped mid-push and the remote branch is not at the commit; not pushed again",
                       "branch": branch, "commit": commit, "remote_tip": t}),
            ),
            Err(e) => (
                CallState::NeedsReview,
                json!({"review": format!("remote state unknown: {e}")}),
            ),
        }
    }

    async fn resolve_pr(&self, effect: &Value) -> (CallState, Value) {
        let Ok(mut forge) = self.forge() else {
            return (
                CallState::NeedsReview,
                json!({"review": "no forge configured"}),
            );
        };
        if let Some(b) = effect.get("forge").and_then(Value::as_str) {
            forge.base = b.to_string();
        }
        let g = |k: &str| {
            effect
                .get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let pr = effect.get("pr").cloned().unwrap_or(Value::Null);
        match find_pr(&forge, &g("owner"), &g("repo"), &pr).await {
            Ok(Some(v)) => {
                let mut s = github::summary(&v);
                s["recovered"] = Value::Bool(true);
                (CallState::Done, s)
            }
            Ok(None) => (
                CallState::NeedsReview,
                json!({"review": "the broker stopped while opening the pull request and the forge has none; not opened again"}),
            ),
            Err(e) => (
                CallState::NeedsReview,
                json!({"review": format!("forge state unknown: {e}")}),
            ),
        }
    }

    /// An operator's resolution of a `needs_review` call, after checking
    /// the outside world: the call becomes `done` or `failed` (its output
    /// keeps what was recorded before, under `before`), with a
    /// `broker_call_resolved` event. Asking again with the same outcome
    /// and note answers the same; anything else on a call that is not
    /// `needs_review` is refused. An agent retrying the call's seq gets
    /// the resolved answer.
    pub async fn resolve_review(
        &self,
        session_id: &str,
        seq: u64,
        outcome: CallState,
        note: &str,
    ) -> Result<Call, BrokerError> {
        debug_assert!(matches!(outcome, CallState::Done | CallState::Failed));
        let lock = self.key_lock(session_id, seq);
        let _held = lock.lock().await;
        let not_found =
            || BrokerError::CallNotFound(format!("session {session_id} has no broker call {seq}"));
        let call = self
            .store
            .get(session_id, seq)
            .await?
            .ok_or_else(not_found)?;
        let resolution = json!({"outcome": outcome.as_str(), "note": note});
        let resolved = |call: &Call| EventKind::BrokerCallResolved {
            call_seq: seq,
            tool: call.tool.clone(),
            outcome: outcome.as_str().to_string(),
            note: note.to_string(),
        };
        let call = if call.state == CallState::NeedsReview {
            let before: Value = call
                .output
                .as_deref()
                .and_then(|o| serde_json::from_str(o).ok())
                .unwrap_or(Value::Null);
            let out = json!({"resolution": resolution, "before": before}).to_string();
            self.advance(
                &call,
                (CallState::NeedsReview, outcome),
                output(out),
                vec![resolved(&call)],
            )
            .await?
        } else {
            call
        };
        let stored: Option<Value> = call
            .output
            .as_deref()
            .and_then(|o| serde_json::from_str::<Value>(o).ok())
            .and_then(|v| v.get("resolution").cloned());
        if stored.as_ref() != Some(&resolution) {
            return Err(BrokerError::NotNeedsReview(format!(
                "broker call {seq} is {}{}",
                call.state.as_str(),
                if stored.is_some() {
                    " (resolved already, differently)"
                } else {
                    ", not needs_review"
                }
            )));
        }
        // Moved without its event (the control role's log commits the
        // row apart from the post): written now, once.
        self.ensure_event(call, EventRef::Review, resolved).await?;
        tracing::info!(session = %session_id, seq, outcome = outcome.as_str(), "needs_review broker call resolved");
        self.store.get(session_id, seq).await?.ok_or_else(not_found)
    }

    /// A call found `executing` that another live broker process runs:
    /// waits (up to [`WAIT_FOR_OTHER`](crate::runner::WAIT_FOR_OTHER)) for
    /// it to move on or for that process's heartbeat to lapse. Returns the
    /// call as it is then: still `executing` means its runner is gone and
    /// the caller resolves it; 503 if the other process is still at it.
    async fn wait_for_runner(&self, mut call: Call) -> Result<Call, BrokerError> {
        let until = std::time::Instant::now() + crate::runner::WAIT_FOR_OTHER;
        loop {
            if call.state != CallState::Executing
                || self
                    .runner
                    .others_gone(&self.store, call.runner.as_deref())
                    .await?
            {
                return Ok(call);
            }
            if std::time::Instant::now() >= until {
                return Err(BrokerError::Unavailable(format!(
                    "call {} is being run by another broker process; ask again",
                    call.seq
                )));
            }
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            call = self
                .store
                .get(&call.session_id, call.seq)
                .await?
                .unwrap_or(call);
        }
    }

    /// Renews this process's heartbeat every [`BEAT`](crate::runner::BEAT),
    /// and resolves the calls a previous process left mid-effect, then
    /// every [`TTL`](crate::runner::TTL) those of broker processes that
    /// stopped renewing (a second control process, or the host a session
    /// left, died mid-effect). Two tasks: a sweep may wait on a key's lock
    /// for as long as an effect takes, and the heartbeat must not wait
    /// with it. They run for the life of the process.
    pub fn spawn_upkeep(self: &Arc<Self>) {
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                if let Err(e) = me.runner.beat(&me.store).await {
                    tracing::warn!(error = %e, "broker: heartbeat not renewed");
                }
                tokio::time::sleep(crate::runner::BEAT).await;
            }
        });
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                match me.recover().await {
                    Ok(0) => {}
                    Ok(k) => tracing::info!(calls = k, "broker calls caught mid-effect resolved"),
                    Err(e) => {
                        tracing::warn!(error = %e, "broker: resolving calls caught mid-effect failed")
                    }
                }
                tokio::time::sleep(crate::runner::TTL).await;
            }
        });
    }

    /// Every call left mid-effect, in the sessions this host owns, by a
    /// broker process that is gone (at start: a previous process of this
    /// one; later: another process that stopped renewing its heartbeat).
    pub async fn recover(&self) -> Result<usize, BrokerError> {
        // On a shared database (`--db postgres://`) the record holds every
        // host's calls: one another host owns may be mid-effect there, and
        // its events could not be written from here (fenced). Leave it.
        let mut mine = vec![];
        for c in self.store.executing().await? {
            // This process's own: in flight under its key's lock (a sweep
            // would only wait for it), or cut off by an error reported to
            // its caller, whose retry resolves it.
            if c.runner.as_deref() == Some(&*self.runner.id) {
                continue;
            }
            if !self.sessions.owned_elsewhere(&c.session_id).await? {
                mine.push(c);
            }
        }
        let mut n = 0;
        for c in mine {
            let lock = self.key_lock(&c.session_id, c.seq);
            let _held = lock.lock().await;
            if let Some(c) = self.store.get(&c.session_id, c.seq).await? {
                if c.state == CallState::Executing
                    && self
                        .runner
                        .others_gone(&self.store, c.runner.as_deref())
                        .await?
                {
                    let c = self.resolve(c).await?;
                    self.ensure_result_event(c).await?;
                    n += 1;
                }
            }
        }
        Ok(n)
    }
}

async fn find_pr(
    forge: &Forge,
    owner: &str,
    repo: &str,
    pr: &Value,
) -> Result<Option<Value>, github::ForgeError> {
    let head = pr.get("head").and_then(Value::as_str).unwrap_or_default();
    let title = pr.get("title").and_then(Value::as_str).unwrap_or_default();
    let found = forge.find_prs(owner, repo, head).await?;
    Ok(found
        .into_iter()
        .find(|p| p.get("title").and_then(Value::as_str) == Some(title)))
}

/// Why a call could not be planned: `Transient` leaves it pending (the
/// answer is 503 and a retry plans again), `Invalid` fails it for good,
/// `Refused` too, with a `code` in its output: the sandbox sent something
/// the broker does not take (a tree stream outside the grammar).
#[derive(Debug)]
pub(crate) enum PlanError {
    Transient(String),
    Invalid(String),
    Refused { code: &'static str, message: String },
}

impl From<String> for PlanError {
    fn from(e: String) -> Self {
        PlanError::Invalid(e)
    }
}

impl From<&str> for PlanError {
    fn from(e: &str) -> Self {
        PlanError::Invalid(e.to_string())
    }
}

/// How a planning failure reads in the call's output.
fn plan_error_output(e: PlanError) -> Value {
    match e {
        PlanError::Refused { code, message } => json!({"error": message, "code": code}),
        PlanError::Invalid(e) | PlanError::Transient(e) => json!({"error": e}),
    }
}

/// The arguments the policy sees for a `git_push`: the agent's, with
/// `diff` replaced by the host's count, or removed when there is none.
fn with_diff(args: &Value, size: Option<&DiffSize>) -> Value {
    let mut a = args.clone();
    if let Some(o) = a.as_object_mut() {
        match size {
            Some(d) => {
                o.insert("diff".into(), d.to_json());
            }
            None => {
                o.remove("diff");
            }
        }
    }
    a
}

pub(crate) struct Plan {
    effect: Value,
    run: Run,
}

impl Plan {
    /// A push's measured size.
    fn diff(&self) -> Option<DiffSize> {
        match &self.run {
            Run::Push { diff, .. } => Some(*diff),
            _ => None,
        }
    }
}

enum Run {
    Push {
        prepared: git::Prepared,
        remote: git::Remote,
        branch: String,
        diff: DiffSize,
    },
    Pr {
        forge: Forge,
        owner: String,
        repo: String,
        body: Value,
    },
    Fetch(crate::fetch::Fetch),
    Noop,
    Mcp {
        server: Arc<crate::mcp::Server>,
        tool: String,
    },
}

fn call_event(call: &Call) -> EventKind {
    EventKind::BrokerCall {
        call_seq: call.seq,
        epoch: call.epoch,
        tool: call.tool.clone(),
        arguments: cut(&call.args, EVENT_ARGS_BYTES),
        decision: call.decision.clone(),
        rule_id: call.rule_id.clone(),
        approval_id: call.approval_id.clone(),
    }
}

/// What a move records besides the state: the call's output.
fn output(out: String) -> Recorded {
    Recorded {
        output: Some(out),
        ..Recorded::default()
    }
}

fn result_event(c: &Call) -> EventKind {
    EventKind::BrokerResult {
        call_seq: c.seq,
        tool: c.tool.clone(),
        status: c.state.as_str().to_string(),
        output: cut(c.output.as_deref().unwrap_or(""), EVENT_ARGS_BYTES),
    }
}

/// What the approver is shown: the call's arguments, and for a push the
/// host's measured `diff` (recorded with the decision) in place of any
/// the agent sent: the size the policy asked about.
fn approval_args(call: &Call) -> String {
    let host = call
        .effect
        .as_deref()
        .and_then(|e| serde_json::from_str::<Value>(e).ok())
        .and_then(|e| e.get("diff").cloned());
    match (host, serde_json::from_str::<Value>(&call.args)) {
        (Some(d), Ok(Value::Object(mut a))) if call.tool == "git_push" => {
            a.insert("diff".into(), d);
            canonical(&Value::Object(a))
        }
        _ => call.args.clone(),
    }
}

fn approval_id(session: &str, seq: u64) -> String {
    let h = Sha256::digest(format!("broker/{session}/{seq}").as_bytes());
    let alpha = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let tail: String = h
        .iter()
        .take(16)
        .map(|b| alpha[*b as usize % alpha.len()] as char)
        .collect();
    format!("apr_{tail}")
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod policy_fail_closed_tests {
    //! The broker fails closed: when the session's pinned policy cannot be
    //! loaded, no call is decided, recorded or run (503
    //! `policy_unavailable`, and the agent's retry plans again).
    use super::*;
    use crate::sandbox::{Exec, SandboxError};
    use hatchery_policy::store::PolicySummary;
    use hatchery_policy::{DbPolicyStore, PolicyDocument, PolicyStore, StoreError, StoredPolicy};
    use hatchery_sessions::broker_hooks::Decision;
    use hatchery_sessions::error::SessionError;
    use hatchery_sessions::store::{AgentSpec, Session, SessionSpec};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// The SQLite policy store, or (with `fail` set) a store that errors
    /// on every read, as an unreachable shared database does.
    struct Flaky {
        inner: DbPolicyStore,
        fail: AtomicBool,
    }

    impl Flaky {
        fn check(&self) -> Result<(), StoreError> {
            if self.fail.load(Ordering::SeqCst) {
                return Err(StoreError::Unavailable(hatchery_db::DbError::Unavailable(
                    "connection refused",
                )));
            }
            Ok(())
        }
    }

    #[async_trait::async_trait]
    impl PolicyStore for Flaky {
        async fn create(
            &self,
            doc: PolicyDocument,
            tenant: Option<&str>,
        ) -> Result<StoredPolicy, StoreError> {
            self.inner.create(doc, tenant).await
        }
        async fn add_version(
            &self,
            id: &str,
            doc: PolicyDocument,
        ) -> Result<StoredPolicy, StoreError> {
            self.inner.add_version(id, doc).await
        }
        async fn list(&self) -> Result<Vec<PolicySummary>, StoreError> {
            self.check()?;
            self.inner.list().await
        }
        async fn latest(&self, id: &str) -> Result<StoredPolicy, StoreError> {
            self.check()?;
            self.inner.latest(id).await
        }
        async fn version(&self, id: &str, version: u32) -> Result<StoredPolicy, StoreError> {
            self.check()?;
            self.inner.version(id, version).await
        }
    }

    /// One running session on sandbox `sbx_1`; counts the events written.
    struct OneSession {
        policy_id: String,
        events: AtomicUsize,
        /// The runner has started the agent but not yet recorded `running`.
        starting: AtomicBool,
        /// The broker store's database.
        db: hatchery_db::Db,
    }

    fn db_err(e: hatchery_db::DbError) -> SessionError {
        hatchery_sessions::store::StoreError::from(e).into()
    }

    #[async_trait::async_trait]
    impl crate::session_log::SessionLog for OneSession {
        async fn session_for_sandbox(
            &self,
            sandbox_id: &str,
        ) -> Result<Option<Session>, SessionError> {
            Ok((sandbox_id == "sbx_1").then(|| Session {
                id: "ses_1".into(),
                spec: SessionSpec {
                    repo: "https://example.invalid/r.git".into(),
                    git_ref: "main".into(),
                    task: "t".into(),
                    policy_id: self.policy_id.clone(),
                    policy_version: 1,
                    budget_tokens: 1000,
                    budget_usd_cents: 100,
                    budget_wall_s: 600,
                    template: "default".into(),
                    agent: AgentSpec {
                        kind: "reference".into(),
                        model_url: "http://127.0.0.1:9/v1".into(),
                        model: "m".into(),
                        max_steps: 1,
                        command: None,
                    },
                    env: Default::default(),
                    metadata: Default::default(),
                    environment: None,
                    tenant: None,
                },
                state: if self.starting.load(Ordering::SeqCst) {
                    SessionState::Starting
                } else {
                    SessionState::Running
                },
                idempotency_key: None,
                created_at: "2026-01-01T00:00:00Z".into(),
                started_at: None,
                ended_at: None,
                reason: None,
                spend_tokens: 0,
                spend_usd_cents: 0,
                spend_wall_s: 0,
                sandbox_id: Some("sbx_1".into()),
                process_id: None,
                snapshot_id: None,
                review_snapshot_id: None,
                waiting: None,
                output_offset: 0,
                agent_seq: 0,
                delivered_seq: 0,
                cancel_requested: false,
                last_seq: 0,
                replay_through: 0,
                host_id: "h1".into(),
                epoch: 1,
            }))
        }
        async fn record_joined(
            &self,
            id: &str,
            kinds: Vec<EventKind>,
            joined: &mut BrokerWrite,
        ) -> Result<Option<Vec<u64>>, SessionError> {
            use hatchery_db::Joined;
            // The broker's own database: its rows commit with a pretend
            // append (the counter), as with the real log.
            let mut tx = self.db.begin().await.map_err(db_err)?;
            let seqs = self.record(id, kinds).await?;
            let ok = joined.write(&mut tx, &seqs).await.map_err(db_err)?;
            tx.commit().await.map_err(db_err)?;
            Ok(ok.then_some(seqs))
        }
        async fn record(&self, _: &str, kinds: Vec<EventKind>) -> Result<Vec<u64>, SessionError> {
            let first = self.events.fetch_add(kinds.len(), Ordering::SeqCst) as u64 + 1;
            Ok((first..first + kinds.len() as u64).collect())
        }
        async fn open_approval(
            &self,
            _: &str,
            _: &str,
            _: &str,
            _: &str,
        ) -> Result<(), SessionError> {
            Ok(())
        }
        async fn approval_decision(
            &self,
            _: &str,
            _: &str,
            _: u64,
        ) -> Result<Option<Decision>, SessionError> {
            Ok(None)
        }
        async fn checkout_commit(&self, _: &str) -> Result<Option<String>, SessionError> {
            Ok(None)
        }
        async fn owned_elsewhere(&self, _: &str) -> Result<bool, SessionError> {
            Ok(false)
        }
    }

    /// Counts every use of the sandbox (git_push's export starts there).
    #[derive(Default)]
    struct Touched(AtomicUsize);

    #[async_trait::async_trait]
    impl SandboxAccess for Touched {
        async fn exec(&self, _: &str, _: Vec<String>, _: u64) -> Result<Exec, SandboxError> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Err(SandboxError("fake".into()))
        }
        async fn write_file(&self, _: &str, _: &str, _: Vec<u8>) -> Result<(), SandboxError> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Err(SandboxError("fake".into()))
        }
        async fn read_file(&self, _: &str, _: &str) -> Result<Vec<u8>, SandboxError> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Err(SandboxError("fake".into()))
        }
    }

    struct Rig {
        broker: Arc<Broker>,
        log: Arc<OneSession>,
        sandbox: Arc<Touched>,
    }

    /// A broker whose session is pinned to an allow-everything policy;
    /// `fail`: its store errors from the start.
    async fn rig(fail: bool) -> Rig {
        let store = Arc::new(Flaky {
            inner: DbPolicyStore::scratch().await.unwrap(),
            fail: AtomicBool::new(false),
        });
        let doc = serde_json::from_value(
            json!({"name": "all", "rules": [{"id": "any", "effect": "allow"}]}),
        )
        .unwrap();
        let p = store.create(doc, None).await.unwrap();
        store.fail.store(fail, Ordering::SeqCst);
        let db = hatchery_db::Db::sqlite_memory().unwrap();
        let log = Arc::new(OneSession {
            policy_id: p.id,
            events: AtomicUsize::new(0),
            starting: AtomicBool::new(false),
            db: db.clone(),
        });
        let sandbox = Arc::new(Touched::default());
        let broker = Broker::new(
            BrokerStore::open(db).await.unwrap(),
            log.clone(),
            CompiledPolicies::new(store),
            sandbox.clone(),
            BrokerConfig::default(),
        );
        Rig {
            broker,
            log,
            sandbox,
        }
    }

    fn call(seq: u64, tool: &str, args: Value) -> InvokeRequest {
        InvokeRequest {
            seq,
            tool: tool.into(),
            args,
        }
    }

    #[tokio::test]
    async fn the_same_call_runs_when_the_policy_loads() {
        // The control for the test below: with the store answering, the
        // allow-all policy lets the call through, recorded with events.
        let r = rig(false).await;
        let res = r
            .broker
            .invoke("sbx_1", call(1, "noop", json!({})))
            .await
            .unwrap();
        assert_eq!(res.status, "done", "{res:?}");
        assert!(r.broker.store.get("ses_1", 1).await.unwrap().is_some());
        assert_eq!(r.log.events.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_call_while_the_session_starts_is_asked_again() {
        // The runner records `running` just after it starts the agent; a
        // call in between must be a retryable 503 with nothing done, not a
        // final 409, and the same seq then runs.
        let r = rig(false).await;
        r.log.starting.store(true, Ordering::SeqCst);
        match r.broker.invoke("sbx_1", call(1, "noop", json!({}))).await {
            Err(e @ BrokerError::Unavailable(_)) => {
                assert_eq!(
                    e.status_code().0,
                    axum::http::StatusCode::SERVICE_UNAVAILABLE
                )
            }
            other => panic!("not a retryable refusal: {other:?}"),
        }
        assert!(r.broker.store.get("ses_1", 1).await.unwrap().is_none());
        assert_eq!(r.log.events.load(Ordering::SeqCst), 0);
        r.log.starting.store(false, Ordering::SeqCst);
        let res = r
            .broker
            .invoke("sbx_1", call(1, "noop", json!({})))
            .await
            .unwrap();
        assert_eq!(res.status, "done", "{res:?}");
    }

    #[tokio::test]
    async fn an_unloadable_policy_refuses_every_effect() {
        // Promise: a policy the store cannot load allows nothing. Fails if
        // any call is decided (a row), logged (an event) or run (the
        // sandbox used, a connection made) while the store errors.
        let r = rig(true).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/x", listener.local_addr().unwrap());
        let calls = [
            call(1, "noop", json!({})),
            call(
                2,
                "git_push",
                json!({"remote": "origin", "branch": "hatchery/ses_1"}),
            ),
            call(3, "http_fetch", json!({"url": url})),
        ];
        for c in calls {
            let (seq, tool) = (c.seq, c.tool.clone());
            match r.broker.invoke("sbx_1", c).await {
                Err(BrokerError::PolicyUnavailable(p, why)) => {
                    assert!(why.contains("unavailable"), "{tool}: {p}: {why}")
                }
                other => panic!("{tool}: not refused: {other:?}"),
            }
            assert!(
                r.broker.store.get("ses_1", seq).await.unwrap().is_none(),
                "{tool}: a call row was written"
            );
        }
        assert_eq!(
            r.log.events.load(Ordering::SeqCst),
            0,
            "events were written"
        );
        assert_eq!(
            r.sandbox.0.load(Ordering::SeqCst),
            0,
            "the sandbox was used"
        );
        let accepted =
            tokio::time::timeout(std::time::Duration::from_millis(200), listener.accept()).await;
        assert!(accepted.is_err(), "http_fetch reached its destination");
    }
}
