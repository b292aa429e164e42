//! Typed session events. Each is stored with a per-session `seq` (1, 2, …
//! without gaps), a time and an actor. Large text fields are capped in the
//! event itself; the full text (up to [`MAX_BLOB_BYTES`]) is stored as a
//! blob that the event names by reference.

use crate::state::SessionState;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Text fields longer than this are cut in the event and stored whole as a
/// blob (`*_ref`).
pub const INLINE_TEXT_BYTES: usize = 4096;
/// Largest blob kept per field; beyond it the text is cut for good.
pub const MAX_BLOB_BYTES: usize = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Actor {
    /// The API caller.
    User,
    /// The agent inside the sandbox (what it says may be anything).
    Agent,
    /// The session runner on the host.
    System,
}

impl Actor {
    pub fn as_str(self) -> &'static str {
        match self {
            Actor::User => "user",
            Actor::Agent => "agent",
            Actor::System => "system",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        [Actor::User, Actor::Agent, Actor::System]
            .into_iter()
            .find(|a| a.as_str() == s)
    }
}

/// A tool call as the model asked for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ToolCallInfo {
    pub call_id: String,
    pub tool: String,
    /// The arguments, as the JSON text the model produced.
    pub arguments: String,
}

/// What happened. `type` names the variant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventKind {
    /// The session was accepted and stored (seq 1 of every session).
    SessionCreated {
        repo: String,
        #[serde(rename = "ref")]
        git_ref: String,
        task: String,
        policy_id: String,
        policy_version: u32,
        template: String,
    },
    /// A state change; written in the same transaction as the change.
    StateChanged {
        from: SessionState,
        to: SessionState,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// The runner is about to get a sandbox (from the warm pool, a
    /// checkpoint restore or a fork of an idle snapshot).
    SandboxRequested {
        template: String,
    },
    SandboxReady {
        sandbox_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        boot_mode: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        boot_ms: Option<u64>,
    },
    /// The host is about to fetch the repository (the credential stays on
    /// the host).
    RepoFetchStarted {
        repo: String,
        #[serde(rename = "ref")]
        git_ref: String,
    },
    RepoCheckedOut {
        commit: String,
        path: String,
        bytes: u64,
    },
    AgentStarted {
        process_id: String,
        agent: String,
    },
    /// The agent asked the model for its next step.
    ModelRequest {
        step: u32,
        messages: u32,
    },
    /// The model's answer: text and/or tool calls, and token usage.
    ModelResponse {
        step: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content_ref: Option<String>,
        #[serde(default)]
        tool_calls: Vec<ToolCallInfo>,
        #[serde(default)]
        prompt_tokens: u64,
        #[serde(default)]
        completion_tokens: u64,
    },
    /// A tool is about to run. Written before it runs: the agent waits for
    /// the runner's acknowledgement.
    ToolCall {
        call_id: String,
        tool: String,
        arguments: String,
    },
    ToolResult {
        call_id: String,
        tool: String,
        ok: bool,
        output: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output_ref: Option<String>,
        #[serde(default)]
        truncated: bool,
    },
    /// A shell command the agent ran, with its exit code.
    CommandRun {
        call_id: String,
        command: String,
        exit_code: i32,
        duration_ms: u64,
        output: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output_ref: Option<String>,
        #[serde(default)]
        truncated: bool,
    },
    FileChanged {
        call_id: String,
        path: String,
        bytes: u64,
    },
    /// A steering message from the user; written before it is delivered.
    Message {
        text: String,
    },
    /// The agent received messages up to `seq`.
    MessageDelivered {
        message_seq: u64,
    },
    /// The agent says something to the user (a final answer or a question).
    AgentMessage {
        text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text_ref: Option<String>,
    },
    /// The agent waits for the user (a message).
    Waiting {
        waiting_for: String,
    },
    ApprovalRequested {
        approval_id: String,
        action: String,
        #[serde(default)]
        details: String,
    },
    ApprovalDecided {
        approval_id: String,
        /// `approve`, `deny`, or `timeout` (an egress hold that ran out).
        decision: String,
        #[serde(default)]
        note: String,
        /// `session`: an approved egress destination is let through for
        /// the rest of the session without asking again.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        remember: Option<String>,
    },
    /// Spend so far.
    Budget {
        tokens: u64,
        usd_cents: u64,
        wall_s: u64,
    },
    /// A snapshot of the sandbox is about to be taken (`idle` to free it,
    /// `review` on cancel), then was taken.
    SnapshotStarted {
        purpose: String,
    },
    SnapshotTaken {
        purpose: String,
        snapshot_id: String,
    },
    SandboxReleased {
        sandbox_id: String,
    },
    /// Back from an idle snapshot into a new sandbox.
    Resumed {
        sandbox_id: String,
        resume_ms: u64,
    },
    /// The session's sandbox was lost while the agent ran (its host went
    /// away): the last checkpoint was forked into a new sandbox, the agent
    /// runs on from that point, and its messages up to `replay_through`,
    /// handled before, are not handled again.
    ResumedFromCheckpoint {
        sandbox_id: String,
        lost_sandbox: String,
        snapshot_id: String,
        replay_through: u64,
        resume_ms: u64,
    },
    /// Agent message `n`, handled before the checkpoint the session
    /// resumed from, sent again by the re-run agent: what it asked
    /// (crate::replay), and whether that is what it asked the first time
    /// (`None`: the first run's record is missing). `false` ends the
    /// session `failed` (`replay_diverged`) before the message is acted on.
    Replayed {
        n: u64,
        kind: String,
        asked: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        matches: Option<bool>,
    },
    CancelRequested,
    /// The agent said it is done.
    AgentDone {
        summary: String,
    },
    AgentExited {
        exit_code: Option<i32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// What the agent changed in the checkout (`git diff` against the
    /// fetched commit), recorded when it ends.
    WorkspaceDiff {
        stat: String,
        patch: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        patch_ref: Option<String>,
        #[serde(default)]
        truncated: bool,
    },
    /// Something went wrong; `code` is stable.
    Error {
        code: String,
        message: String,
    },
    /// A broker tool call (`crates/hatchery-broker`), recorded with the
    /// policy's decision before any effect. `seq` is the agent's call key.
    BrokerCall {
        call_seq: u64,
        epoch: u64,
        tool: String,
        /// The arguments as canonical JSON (capped).
        arguments: String,
        /// `allow`, `deny` or `require_approval`.
        decision: String,
        /// The rule that decided; absent for the default deny.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rule_id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        approval_id: Option<String>,
    },
    /// The broker is about to have the effect (credential in hand).
    BrokerEffectStarted {
        call_seq: u64,
        tool: String,
        /// What will be done, e.g. the commit and ref of a push.
        detail: String,
    },
    /// What the broker call ended with: `done`, `failed`, `denied` or
    /// `needs_review` (an effect whose outcome could not be established
    /// after a crash; never repeated on its own).
    BrokerResult {
        call_seq: u64,
        tool: String,
        status: String,
        output: String,
    },
    /// An operator settled a `needs_review` broker call (checked the
    /// outside world): `outcome` is `done` or `failed`.
    BrokerCallResolved {
        call_seq: u64,
        tool: String,
        outcome: String,
        note: String,
    },
    /// A model call about to go to the upstream: written by the gateway
    /// after the call's worst case was reserved and before the upstream is
    /// dialled, and only while the session is unfinished (else the call is
    /// refused). `reservation` names the call; its `model_call` follows
    /// with what it cost, or, when the gateway died in between, nothing
    /// (the reservation then expires charged whole).
    ModelCallIntent {
        api: String,
        model: String,
        reservation: String,
        reserved_tokens: u64,
        reserved_usd_cents: u64,
    },
    /// A model call the gateway forwarded and settled (what it charged is
    /// what the session's spend grew by; the agent's own reports are not
    /// counted when a gateway meters the session).
    ModelCall {
        api: String,
        model: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        input_tokens: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output_tokens: Option<u64>,
        tokens: u64,
        usd_cents: u64,
    },
    /// A model call whose `model_call_intent` has no `model_call`: the
    /// process serving it died, and once its reservation's TTL passed the
    /// gateway charged it whole (the upstream may have billed it), added
    /// to the session's spend.
    ModelCallExpired {
        reservation: String,
        tokens: u64,
        usd_cents: u64,
    },
    /// The gateway refused a model call before it reached the upstream.
    ModelRefused {
        api: String,
        code: String,
        message: String,
    },
    /// A model call did not fit in the session's budget; the session ends
    /// `failed` with reason `budget_exhausted: ...`.
    BudgetExhausted {
        scope: String,
        message: String,
    },
    /// The egress proxy's intent to dial a destination the session's policy
    /// allows, committed before the dial (with a check, in the same
    /// transaction, that the session is unfinished and still on the
    /// policy version that decided). Its `egress_result` follows.
    EgressConnect {
        host: String,
        port: u16,
        /// The exact address to be dialled (the one the policy saw).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ip: Option<String>,
        /// `allow` (refusals are `egress_denied`).
        decision: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rule_id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        policy_version: Option<u32>,
        /// A `require_approval` rule held the connection: the approval
        /// that let it through (possibly an earlier one, remembered).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        approval_id: Option<String>,
    },
    /// How the connection of an `egress_connect` ended.
    EgressResult {
        /// The seq of its `egress_connect`.
        connect_seq: u64,
        /// `connected` (written when the tunnel closed), `refused` (the
        /// destination refused the dial) or `failed` (timed out, unreachable).
        outcome: String,
        /// What the proxy answered the guest (200 when connected).
        status: u16,
        reason: String,
        bytes_up: u64,
        bytes_down: u64,
        duration_ms: u64,
    },
    /// A stored secret about to be added to one request of an intercepted
    /// connection (docs/policy.md, "Credentials"), committed before the
    /// request goes out (with the same check as `egress_connect`). Never
    /// the value; the path without its query.
    EgressCredential {
        /// The seq of the connection's `egress_connect`.
        connect_seq: u64,
        secret: String,
        rule_id: String,
        host: String,
        port: u16,
        method: String,
        path: String,
    },
    /// The destination's answer to the request of an `egress_credential`.
    EgressCredentialResult {
        /// The seq of its `egress_credential`.
        credential_seq: u64,
        status: u16,
        reason: String,
    },
    /// Egress connections refused by the proxy or by the sandbox's
    /// nftables policy: one event per source, destination (host, port)
    /// and status per interval, `count` being how many attempts it stands
    /// for (docs/sessions.md, "Egress").
    EgressDenied {
        /// `proxy` or `nftables`; absent in events written before the
        /// kernel's refusals were logged (all of those are the proxy's).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        source: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        host: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        port: Option<u16>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ip: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rule_id: Option<String>,
        /// What the proxy answered; 0 for `nftables` (a TCP reset or an
        /// ICMP admin-prohibited).
        status: u16,
        /// The first refusal's reason in the interval.
        reason: String,
        count: u64,
    },
    /// Written by versions before `egress_connect`: a connection through
    /// the egress proxy, allowed (after the dial) or denied.
    Egress {
        /// `allowed` or `denied`.
        verdict: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        host: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        port: Option<u16>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ip: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rule_id: Option<String>,
        /// The HTTP status the proxy answered (200 when allowed).
        status: u16,
        reason: String,
    },
    /// Written by versions before `egress_denied`: denials not written one
    /// by one (over a per-session rate limit).
    EgressSuppressed {
        denied: u64,
    },
    /// The session was moved to another version of its policy
    /// (`POST /v1/sessions/{id}/policy`); new connections use it.
    PolicyMoved {
        policy_id: String,
        from_version: u32,
        to_version: u32,
    },
    /// The session moved to another host (its old host was lost or
    /// drained): `epoch` is the new ownership epoch; writes of `from`
    /// after this are refused by the store (fencing).
    HostChanged {
        from: String,
        to: String,
        epoch: u64,
        reason: String,
    },
    /// A per-session cap was reached (docs/sessions.md, "Caps"): written
    /// once per cap and session. `output_bytes`: the agent's output is
    /// dropped from here on; `output_rate`: lines over the rate are
    /// dropped from here on (counted in metrics); `open_approvals`: an
    /// approval the agent asked for was refused.
    OutputCapped {
        cap: String,
        limit: u64,
        message: String,
    },
    /// A line the agent printed that was not a valid protocol message
    /// (kept, capped, so nothing it says is lost).
    AgentOutput {
        text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text_ref: Option<String>,
    },
}

impl EventKind {
    pub fn type_name(&self) -> &'static str {
        match self {
            EventKind::SessionCreated { .. } => "session_created",
            EventKind::StateChanged { .. } => "state_changed",
            EventKind::SandboxRequested { .. } => "sandbox_requested",
            EventKind::SandboxReady { .. } => "sandbox_ready",
            EventKind::RepoFetchStarted { .. } => "repo_fetch_started",
            EventKind::RepoCheckedOut { .. } => "repo_checked_out",
            EventKind::AgentStarted { .. } => "agent_started",
            EventKind::ModelRequest { .. } => "model_request",
            EventKind::ModelResponse { .. } => "model_response",
            EventKind::ToolCall { .. } => "tool_call",
            EventKind::ToolResult { .. } => "tool_result",
            EventKind::CommandRun { .. } => "command_run",
            EventKind::FileChanged { .. } => "file_changed",
            EventKind::Message { .. } => "message",
            EventKind::MessageDelivered { .. } => "message_delivered",
            EventKind::AgentMessage { .. } => "agent_message",
            EventKind::Waiting { .. } => "waiting",
            EventKind::ApprovalRequested { .. } => "approval_requested",
            EventKind::ApprovalDecided { .. } => "approval_decided",
            EventKind::Budget { .. } => "budget",
            EventKind::SnapshotStarted { .. } => "snapshot_started",
            EventKind::SnapshotTaken { .. } => "snapshot_taken",
            EventKind::SandboxReleased { .. } => "sandbox_released",
            EventKind::Resumed { .. } => "resumed",
            EventKind::ResumedFromCheckpoint { .. } => "resumed_from_checkpoint",
            EventKind::CancelRequested => "cancel_requested",
            EventKind::AgentDone { .. } => "agent_done",
            EventKind::AgentExited { .. } => "agent_exited",
            EventKind::WorkspaceDiff { .. } => "workspace_diff",
            EventKind::Error { .. } => "error",
            EventKind::BrokerCall { .. } => "broker_call",
            EventKind::BrokerEffectStarted { .. } => "broker_effect_started",
            EventKind::BrokerResult { .. } => "broker_result",
            EventKind::BrokerCallResolved { .. } => "broker_call_resolved",
            EventKind::AgentOutput { .. } => "agent_output",
            EventKind::ModelCallIntent { .. } => "model_call_intent",
            EventKind::ModelCallExpired { .. } => "model_call_expired",
            EventKind::Replayed { .. } => "replayed",
            EventKind::ModelCall { .. } => "model_call",
            EventKind::ModelRefused { .. } => "model_refused",
            EventKind::BudgetExhausted { .. } => "budget_exhausted",
            EventKind::EgressConnect { .. } => "egress_connect",
            EventKind::EgressResult { .. } => "egress_result",
            EventKind::EgressCredential { .. } => "egress_credential",
            EventKind::EgressCredentialResult { .. } => "egress_credential_result",
            EventKind::EgressDenied { .. } => "egress_denied",
            EventKind::Egress { .. } => "egress",
            EventKind::EgressSuppressed { .. } => "egress_suppressed",
            EventKind::PolicyMoved { .. } => "policy_moved",
            EventKind::HostChanged { .. } => "host_changed",
            EventKind::OutputCapped { .. } => "output_capped",
        }
    }

    /// The text fields that may be large, with their `*_ref` slots: the
    /// store cuts each to [`INLINE_TEXT_BYTES`] and keeps the whole as a
    /// blob.
    pub(crate) fn large_fields(&mut self) -> Vec<LargeField<'_>> {
        match self {
            EventKind::ModelResponse {
                content: Some(c),
                content_ref,
                ..
            } => {
                vec![(c, Some(content_ref), None)]
            }
            EventKind::ToolResult {
                output,
                output_ref,
                truncated,
                ..
            }
            | EventKind::CommandRun {
                output,
                output_ref,
                truncated,
                ..
            } => {
                vec![(output, Some(output_ref), Some(truncated))]
            }
            EventKind::AgentMessage { text, text_ref }
            | EventKind::AgentOutput { text, text_ref } => {
                vec![(text, Some(text_ref), None)]
            }
            EventKind::WorkspaceDiff {
                patch,
                patch_ref,
                truncated,
                ..
            } => {
                vec![(patch, Some(patch_ref), Some(truncated))]
            }
            EventKind::ToolCall { arguments, .. } => vec![(arguments, None, None)],
            EventKind::Message { text } => vec![(text, None, None)],
            EventKind::Error { message, .. } => vec![(message, None, None)],
            EventKind::ModelRefused { message, .. }
            | EventKind::BudgetExhausted { message, .. } => vec![(message, None, None)],
            EventKind::Egress { reason, .. }
            | EventKind::EgressDenied { reason, .. }
            | EventKind::EgressResult { reason, .. } => vec![(reason, None, None)],
            EventKind::AgentDone { summary } => vec![(summary, None, None)],
            _ => vec![],
        }
    }
}

/// A text field, its blob reference slot, its `truncated` flag.
pub(crate) type LargeField<'a> = (
    &'a mut String,
    Option<&'a mut Option<String>>,
    Option<&'a mut bool>,
);

/// What `kind` takes in the store once appended: its JSON after the
/// large fields are cut (as the store cuts them) plus the blobs kept for
/// them, each at most `max_blob` bytes.
pub fn stored_bytes(kind: &EventKind, max_blob: usize) -> u64 {
    let mut k = kind.clone();
    let mut blobs = 0u64;
    for (text, slot, _) in k.large_fields() {
        if text.len() <= INLINE_TEXT_BYTES {
            continue;
        }
        if slot.is_some() {
            blobs += cut(text, max_blob.min(MAX_BLOB_BYTES)).len() as u64;
            // The ref the store writes ("b<seq>.<i>") is about this long.
            if let Some(s) = slot {
                *s = Some("b0000000000.0".into());
            }
        }
        *text = cut(text, INLINE_TEXT_BYTES).to_string();
    }
    let json = serde_json::to_string(&k).map(|j| j.len()).unwrap_or(0) as u64;
    json + blobs
}

/// Cuts every large field of `kind` that keeps a blob to `max_blob`
/// bytes (the per-session blob cap, below the store's own maximum); true
/// if anything was cut.
pub fn cap_blobs(kind: &mut EventKind, max_blob: usize) -> bool {
    let mut cut_any = false;
    for (text, slot, truncated) in kind.large_fields() {
        if slot.is_some() && text.len() > max_blob {
            let keep = cut(text, max_blob).len();
            text.truncate(keep);
            if let Some(t) = truncated {
                *t = true;
            }
            cut_any = true;
        }
    }
    cut_any
}

/// A stored event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Event {
    pub seq: u64,
    /// RFC 3339 UTC, when it was appended.
    pub at: String,
    pub actor: Actor,
    #[serde(flatten)]
    pub kind: EventKind,
}

/// Cuts `s` to at most `max` bytes on a character boundary.
pub fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_shape() {
        let e = Event {
            seq: 3,
            at: "2026-12-01T00:00:00Z".into(),
            actor: Actor::Agent,
            kind: EventKind::CommandRun {
                call_id: "c1".into(),
                command: "pytest".into(),
                exit_code: 1,
                duration_ms: 5,
                output: "F".into(),
                output_ref: None,
                truncated: false,
            },
        };
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["type"], "command_run");
        assert_eq!(v["seq"], 3);
        assert_eq!(v["actor"], "agent");
        assert_eq!(v["exit_code"], 1);
        let back: Event = serde_json::from_value(v).unwrap();
        assert_eq!(back, e);
        assert_eq!(e.kind.type_name(), "command_run");
    }

    #[test]
    fn cut_respects_chars() {
        assert_eq!(cut("héllo", 2), "h");
        assert_eq!(cut("abc", 5), "abc");
    }
}
