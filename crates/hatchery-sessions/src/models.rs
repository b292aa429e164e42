//! Wire types of `/v1/sessions`.

use crate::events::Event;
use crate::state::SessionState;
use crate::store::{Approval, Session};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BudgetBody {
    /// Model tokens (prompt + completion).
    #[serde(default = "default_tokens")]
    pub tokens: i64,
    #[serde(default)]
    pub usd_cents: i64,
    /// Wall-clock seconds from the first start.
    #[serde(default = "default_wall")]
    pub wall_s: i64,
}

fn default_tokens() -> i64 {
    1_000_000
}
fn default_wall() -> i64 {
    3600
}

impl Default for BudgetBody {
    fn default() -> Self {
        BudgetBody {
            tokens: default_tokens(),
            usd_cents: 0,
            wall_s: default_wall(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct AgentBody {
    /// `reference` (default): Hatchery's agent; `command`: run `command`
    /// in the checkout (a third-party agent) with the model URL in
    /// `OPENAI_BASE_URL`.
    pub kind: Option<String>,
    /// OpenAI-compatible base URL as seen from inside the sandbox
    /// (default: the daemon's `--sessions-model-url`).
    pub model_url: Option<String>,
    pub model: Option<String>,
    /// 1..200 model calls (default 30).
    pub max_steps: Option<u32>,
    pub command: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSessionBody {
    /// `https://…`, `git://…` or `file:///…` under an allowed root.
    /// May be absent with `environment_id` (the environment's is used).
    #[serde(default)]
    pub repo: String,
    /// Start from this environment's current version: its snapshot (the
    /// set-up done) plus the files that changed from its base commit to
    /// `ref`. Its repository and template are the session's.
    pub environment_id: Option<String>,
    /// Branch, tag or commit (default `main`).
    #[serde(rename = "ref")]
    pub git_ref: Option<String>,
    pub task: String,
    /// Default `pol_standard`.
    pub policy_id: Option<String>,
    #[serde(default)]
    pub budget: Option<BudgetBody>,
    /// The same key with the same body returns the same session; with
    /// another body, 409.
    pub idempotency_key: Option<String>,
    /// Default `code-interpreter`.
    pub template: Option<String>,
    pub agent: Option<AgentBody>,
    /// Environment for the agent process.
    pub env: Option<BTreeMap<String, String>>,
    /// Labels kept with the session and copied to each of its sandboxes
    /// (at most 16; keys 1-64 bytes, not `hatchery_*`; values up to 512
    /// bytes). On many hosts, `tenant` spreads one tenant's sessions.
    pub metadata: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CreatedSession {
    pub session_id: String,
    pub state: SessionState,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Spend {
    pub tokens: u64,
    pub usd_cents: u64,
    pub wall_s: u64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SessionView {
    pub session_id: String,
    pub state: SessionState,
    pub repo: String,
    #[serde(rename = "ref")]
    pub git_ref: String,
    pub task: String,
    pub policy_id: String,
    pub policy_version: u32,
    pub template: String,
    /// The environment and the version the session started from.
    pub environment_id: Option<String>,
    pub environment_version: Option<u64>,
    pub metadata: BTreeMap<String, String>,
    /// The tenant whose key created the session; absent for the
    /// operator's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    pub budget: Spend,
    pub spend: Spend,
    pub pending_approval: Option<Approval>,
    /// What the agent waits for (`message`), if anything.
    pub waiting: Option<String>,
    pub created_at: String,
    pub started_at: Option<String>,
    pub ended_at: Option<String>,
    /// Why it ended (completed, failed or cancelled).
    pub reason: Option<String>,
    pub sandbox_id: Option<String>,
    /// While idle: the snapshot it resumes from.
    pub snapshot_id: Option<String>,
    /// After a cancel: the snapshot kept for review.
    pub review_snapshot_id: Option<String>,
    /// Seq of the newest event.
    pub last_seq: u64,
    /// What the session holds in the store (`GET /v1/sessions/{id}`
    /// only; absent in lists, where it would cost a scan per session).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub storage: Option<StorageView>,
}

/// A session's storage use, against its caps (docs/sessions.md, "Caps").
#[derive(Debug, Serialize, ToSchema)]
pub struct StorageView {
    /// Events in its log, and the bytes of their stored JSON.
    pub events: u64,
    pub event_bytes: u64,
    /// Blobs (the whole text of cut fields), and their bytes.
    pub blobs: u64,
    pub blob_bytes: u64,
    /// What counts against `--sessions-max-output-bytes`: the agent's
    /// events and the blobs.
    pub output_bytes: u64,
    pub max_output_bytes: u64,
    /// Approvals open now.
    pub open_approvals: u64,
    /// Broker calls recorded, and the bytes of their stored arguments
    /// (null when this daemon does not run the session's broker).
    pub broker_calls: Option<u64>,
    pub broker_arg_bytes: Option<u64>,
    /// The caps the session has reached (`output_bytes`, `output_rate`,
    /// `open_approvals`, `session_call_cap`, ...), from its
    /// `output_capped` events.
    pub caps_reached: Vec<String>,
}

pub(crate) fn wall_s(s: &Session) -> u64 {
    let parse = |t: &str| {
        time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()
    };
    let Some(start) = s.started_at.as_deref().and_then(parse) else {
        return 0;
    };
    let end = s
        .ended_at
        .as_deref()
        .and_then(parse)
        .unwrap_or_else(time::OffsetDateTime::now_utc);
    (end - start).whole_seconds().max(0) as u64
}

impl SessionView {
    pub fn new(s: Session, pending_approval: Option<Approval>) -> Self {
        let wall = wall_s(&s);
        SessionView {
            session_id: s.id,
            state: s.state,
            repo: s.spec.repo,
            git_ref: s.spec.git_ref,
            task: s.spec.task,
            policy_id: s.spec.policy_id,
            policy_version: s.spec.policy_version,
            template: s.spec.template,
            environment_id: s
                .spec
                .environment
                .as_ref()
                .map(|e| e.environment_id.clone()),
            environment_version: s.spec.environment.as_ref().map(|e| e.version),
            metadata: s.spec.metadata,
            tenant: s.spec.tenant,
            budget: Spend {
                tokens: s.spec.budget_tokens,
                usd_cents: s.spec.budget_usd_cents,
                wall_s: s.spec.budget_wall_s,
            },
            spend: Spend {
                tokens: s.spend_tokens,
                usd_cents: s.spend_usd_cents,
                wall_s: wall,
            },
            pending_approval,
            waiting: s.waiting,
            created_at: s.created_at,
            started_at: s.started_at,
            ended_at: s.ended_at,
            reason: s.reason,
            sandbox_id: s.sandbox_id,
            snapshot_id: s.snapshot_id,
            review_snapshot_id: s.review_snapshot_id,
            last_seq: s.last_seq,
            storage: None,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SessionList {
    pub sessions: Vec<SessionView>,
    /// Pass as `after` for the next page; absent on the last page.
    pub next_after: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EventPage {
    pub events: Vec<Event>,
    /// Seq of the newest event of the session when the page was read.
    pub last_seq: u64,
    pub has_more: bool,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MessageBody {
    /// Up to 64 KiB.
    pub text: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct MessageAccepted {
    /// The message's event seq.
    pub seq: u64,
    pub state: SessionState,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalBody {
    /// `approve` or `deny`.
    pub decision: String,
    #[serde(default)]
    pub note: String,
    /// `session`: the decision also holds for the session's later
    /// connections to the same destination (host and port), or, for a
    /// request held on an intercepted destination (details `scope`
    /// `request`), for its later requests with the same method and exact
    /// path (query aside); those are then not held. On a held model
    /// call's (`action` `model_call`): for the session's later model calls
    /// the same rule decides. Egress and held model call approvals only.
    #[serde(default)]
    pub remember: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ApprovalDecided {
    pub seq: u64,
    pub state: SessionState,
}
