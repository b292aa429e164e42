//! The wire shape of `POST /v1/invoke` (JSON over HTTP, through the
//! sandbox's `broker` host service; docs/sessions.md, "Tool broker").

use crate::error::BrokerError;
use crate::store::{Call, CallState};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The tools the broker runs.
/// `noop` has no effect (round-trip figures, health checks); a policy must
/// still allow it.
pub const TOOLS: &[&str] = &["git_push", "open_pr", "http_fetch", "noop"];
/// Largest `seq` (exact in every JSON implementation).
pub const MAX_SEQ: u64 = (1 << 53) - 1;
/// Largest arguments object, as JSON.
pub const MAX_ARGS_BYTES: usize = 64 << 10;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InvokeRequest {
    /// The agent's key for this call: one effect per (session, seq).
    pub seq: u64,
    pub tool: String,
    #[serde(default)]
    pub args: Value,
}

impl InvokeRequest {
    pub fn validate(&self) -> Result<(), BrokerError> {
        if self.seq == 0 || self.seq > MAX_SEQ {
            return Err(BrokerError::BadRequest(format!(
                "seq must be 1 to {MAX_SEQ}"
            )));
        }
        // `mcp.<server>.<tool>`: a server the operator configured (the
        // broker checks which; see mcp.rs).
        if !TOOLS.contains(&self.tool.as_str()) && crate::mcp::split_name(&self.tool).is_none() {
            return Err(BrokerError::UnknownTool(
                self.tool.clone(),
                TOOLS.join(", "),
            ));
        }
        if !self.args.is_object() {
            return Err(BrokerError::BadRequest("args must be a JSON object".into()));
        }
        if self.args.to_string().len() > MAX_ARGS_BYTES {
            return Err(BrokerError::BadRequest(format!(
                "args over {MAX_ARGS_BYTES} bytes"
            )));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct InvokeResult {
    pub seq: u64,
    /// The sandbox instance's epoch in its session.
    pub epoch: u64,
    pub tool: String,
    /// `awaiting_approval`, `pending`, `done`, `failed`, `denied`,
    /// `needs_review`.
    pub status: String,
    /// The policy allowed it (or an approver did).
    pub allowed: bool,
    pub needs_approval: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule_id: Option<String>,
    /// The tool's result (or `{"error": ...}`), as stored.
    pub output: Value,
}

impl InvokeResult {
    pub fn from_call(c: &Call) -> InvokeResult {
        let allowed = !matches!(c.state, CallState::Denied | CallState::AwaitingApproval);
        InvokeResult {
            seq: c.seq,
            epoch: c.epoch,
            tool: c.tool.clone(),
            status: c.state.as_str().to_string(),
            allowed,
            needs_approval: c.state == CallState::AwaitingApproval,
            approval_id: c.approval_id.clone(),
            rule_id: c.rule_id.clone(),
            output: c
                .output
                .as_deref()
                .and_then(|o| serde_json::from_str(o).ok())
                .unwrap_or(Value::Null),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn req(v: Value) -> Result<InvokeRequest, serde_json::Error> {
        serde_json::from_value(v)
    }

    #[test]
    fn bounds() {
        assert!(req(json!({"seq": 1, "tool": "git_push", "args": {}}))
            .unwrap()
            .validate()
            .is_ok());
        assert!(req(json!({"seq": 0, "tool": "git_push", "args": {}}))
            .unwrap()
            .validate()
            .is_err());
        assert!(req(json!({"seq": MAX_SEQ, "tool": "open_pr", "args": {}}))
            .unwrap()
            .validate()
            .is_ok());
        assert!(
            req(json!({"seq": MAX_SEQ + 1, "tool": "open_pr", "args": {}}))
                .unwrap()
                .validate()
                .is_err()
        );
        assert!(req(json!({"seq": 1, "tool": "rm_rf", "args": {}}))
            .unwrap()
            .validate()
            .is_err());
        assert!(req(json!({"seq": 1, "tool": "git_push", "args": [1]}))
            .unwrap()
            .validate()
            .is_err());
        assert!(
            req(json!({"seq": 1, "tool": "mcp.git.git_status", "args": {}}))
                .unwrap()
                .validate()
                .is_ok()
        );
        assert!(req(json!({"seq": 1, "tool": "mcp.git", "args": {}}))
            .unwrap()
            .validate()
            .is_err());
        let big = "x".repeat(MAX_ARGS_BYTES);
        assert!(
            req(json!({"seq": 1, "tool": "git_push", "args": {"m": big}}))
                .unwrap()
                .validate()
                .is_err()
        );
        // The session is never the guest's to name.
        assert!(
            req(json!({"seq": 1, "tool": "git_push", "args": {}, "session_id": "ses_x"})).is_err()
        );
    }
}
