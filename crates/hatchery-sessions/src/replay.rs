//! A resumed session's re-run, checked against what ran before.
//!
//! After a resume from a checkpoint the agent runs again from the
//! checkpoint's state, and its messages up to `replay_through` were handled
//! before the host was lost. A deterministic agent re-sends them as they
//! were; one driven by a model that answers differently the second time
//! may ask for something else under the same number: a tool call that was
//! never logged or approved. So each numbered message records what it
//! asked ([`AgentLine`]: its kind and the part of it that decides its
//! effect), and a re-run message is logged as `replayed` and compared
//! with it. A difference is decided by the session's pinned policy, as the
//! tool `replay_diverged` ([`verdict`]): by default (a policy that does not
//! name it, or denies it) the session ends (`replay_diverged`) before the
//! re-run message is acknowledged, so the different effect never runs;
//! `require_approval` holds the message unacknowledged until a person
//! decides; `allow` lets it go on. Whatever goes on, the `replayed` event
//! with what it asks is in the log before the acknowledgement.
//!
//! What is compared ([`asked`]): a tool call's tool and arguments, a
//! command's text, a changed file's path, an approval's action and
//! details, a model request's step; for other kinds the kind alone (a
//! model's prose may differ without any effect differing).

use crate::events::{cut, EventKind};
use crate::store::AgentLine;
use hatchery_policy::{Effect, Policy, Request, REPLAY_DIVERGED_TOOL};
use sha2::{Digest, Sha256};

/// The action of the approval a diverged re-run asks for.
pub const APPROVAL_ACTION: &str = "replay_diverged";
/// Its approval ids' prefix: the decision is the runner's to act on, not
/// the agent's (it asked for no approval).
pub const APPROVAL_PREFIX: &str = "apr_replay_";

/// What happens to a re-run message that asks for something else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The session ends `replay_diverged`.
    Fail { rule: Option<String> },
    /// The message waits, unacknowledged, for a person's decision.
    Ask { rule: Option<String> },
    /// The message is acknowledged and kept as message `n` from now on.
    Continue { rule: Option<String> },
}

/// The pinned `policy`'s verdict on re-run message `n` of `kind` asking
/// for `asked`. A policy that does not name `replay_diverged` keeps the
/// safe default: the session ends.
pub fn verdict(policy: &Policy, n: u64, kind: &str, asked: &str) -> Verdict {
    if !policy.names_tool(REPLAY_DIVERGED_TOOL) {
        return Verdict::Fail { rule: None };
    }
    let args = serde_json::json!({"n": n, "kind": kind, "asked": asked});
    let d = policy.evaluate(&Request {
        tool: REPLAY_DIVERGED_TOOL,
        args: &args,
        cost_cents: None,
        dest: None,
        ctx: None,
    });
    let rule = d.rule_id.map(str::to_string);
    match d.effect {
        Effect::Allow => Verdict::Continue { rule },
        Effect::RequireApproval => Verdict::Ask { rule },
        Effect::Deny => Verdict::Fail { rule },
    }
}

/// What a replay approval's details carry: enough to keep the re-run's
/// line as message `n` once approved.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Held {
    pub n: u64,
    pub kind: String,
    /// The digest kept as the line's `asked` ([`line`]).
    pub digest: String,
    /// What it asks, cut to [`SHOWN`] bytes, for the person deciding.
    pub asked: String,
    /// The policy rule that asked for the approval.
    pub rule: Option<String>,
}

impl Held {
    pub fn new(n: u64, e: &EventKind, rule: Option<String>) -> Held {
        let l = line(n, e);
        Held {
            n,
            kind: l.kind,
            digest: l.asked,
            asked: cut(&asked(e), SHOWN).to_string(),
            rule,
        }
    }

    pub fn line(&self) -> AgentLine {
        AgentLine {
            n: self.n,
            kind: self.kind.clone(),
            asked: self.digest.clone(),
        }
    }
}

/// How much of a re-run message's `asked` its `replayed` event shows.
pub const SHOWN: usize = 1024;

/// The part of an agent event that decides its effect.
pub fn asked(e: &EventKind) -> String {
    match e {
        EventKind::ToolCall {
            tool, arguments, ..
        } => format!("{tool} {arguments}"),
        EventKind::CommandRun { command, .. } => command.clone(),
        EventKind::FileChanged { path, .. } => path.clone(),
        EventKind::ApprovalRequested {
            action, details, ..
        } => format!("{action} {details}"),
        EventKind::ModelRequest { step, .. } => step.to_string(),
        _ => String::new(),
    }
}

/// What message `n` asked, as kept: its kind and a digest of [`asked`]
/// (fixed size, whatever the arguments' length).
pub fn line(n: u64, e: &EventKind) -> AgentLine {
    AgentLine {
        n,
        kind: e.type_name().to_string(),
        asked: digest(&asked(e)),
    }
}

fn digest(s: &str) -> String {
    Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The `replayed` event of re-run message `n`: `matches` is `None` when
/// the first run's record is missing (a line dropped by a cap, or handled
/// before this was kept).
pub fn replayed(n: u64, e: &EventKind, original: Option<&AgentLine>) -> (EventKind, Option<bool>) {
    let now = line(n, e);
    let matches = original.map(|o| o.kind == now.kind && o.asked == now.asked);
    let ev = EventKind::Replayed {
        n,
        kind: now.kind,
        asked: cut(&asked(e), SHOWN).to_string(),
        matches,
    };
    (ev, matches)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(args: &str) -> EventKind {
        EventKind::ToolCall {
            call_id: "call_1".into(),
            tool: "shell".into(),
            arguments: args.into(),
        }
    }

    fn policy(rules: serde_json::Value) -> Policy {
        let doc = serde_json::from_value(serde_json::json!({"name": "p", "rules": rules})).unwrap();
        Policy::compile(&doc).unwrap()
    }

    /// A policy that does not name `replay_diverged` ends the session (even
    /// one that allows every other tool); one that does decides by its
    /// rules, on the message's kind and what it asks.
    #[test]
    fn the_pinned_policy_decides_a_divergence() {
        let any = policy(
            serde_json::json!([{"id": "all", "match": {"tools": ["*"]}, "effect": "allow"}]),
        );
        assert_eq!(
            verdict(&any, 2, "tool_call", "shell ls"),
            Verdict::Fail { rule: None }
        );
        let p = policy(serde_json::json!([
            {"id": "prose", "match": {"tools": ["replay_diverged"],
             "args": [{"field": "kind", "op": "eq", "value": "agent_message"}]}, "effect": "allow"},
            {"id": "no-curl", "match": {"tools": ["replay_diverged"],
             "args": [{"field": "asked", "op": "glob", "value": "*curl*"}]}, "effect": "deny"},
            {"id": "ask", "match": {"tools": ["replay_diverged"]}, "effect": "require_approval"},
        ]));
        let r = |s: &str| Some(s.to_string());
        assert_eq!(
            verdict(&p, 1, "agent_message", ""),
            Verdict::Continue { rule: r("prose") }
        );
        assert_eq!(
            verdict(&p, 2, "tool_call", "shell curl x"),
            Verdict::Fail { rule: r("no-curl") }
        );
        assert_eq!(
            verdict(&p, 2, "tool_call", "shell ls"),
            Verdict::Ask { rule: r("ask") }
        );
    }

    /// What an approval holds is the line kept once approved.
    #[test]
    fn a_held_rerun_keeps_its_full_digest() {
        let long = format!("{{\"command\":\"{}\"}}", "x".repeat(5000));
        let h = Held::new(7, &tool(&long), None);
        assert_eq!(h.line(), line(7, &tool(&long)));
        assert!(h.asked.len() <= SHOWN);
        let back: Held = serde_json::from_str(&serde_json::to_string(&h).unwrap()).unwrap();
        assert_eq!(back, h);
    }

    /// The same tool call under another call id matches; other arguments,
    /// another kind, or no record at all do not (or are unknown).
    #[test]
    fn a_rerun_matches_only_what_decides_its_effect() {
        let first = line(3, &tool(r#"{"command":"ls"}"#));
        let mut again = tool(r#"{"command":"ls"}"#);
        if let EventKind::ToolCall { call_id, .. } = &mut again {
            *call_id = "call_other".into();
        }
        assert_eq!(replayed(3, &again, Some(&first)).1, Some(true));
        let other = tool(r#"{"command":"curl evil"}"#);
        let (ev, m) = replayed(3, &other, Some(&first));
        assert_eq!(m, Some(false));
        assert!(
            matches!(ev, EventKind::Replayed { n: 3, ref asked, .. } if asked.contains("curl evil"))
        );
        let msg = EventKind::Message { text: "x".into() };
        assert_eq!(replayed(3, &msg, Some(&first)).1, Some(false));
        assert_eq!(replayed(3, &other, None).1, None);
        // Prose may differ: only the kind is compared.
        let said = |t: &str| EventKind::AgentMessage {
            text: t.into(),
            text_ref: None,
        };
        assert_eq!(
            replayed(4, &said("b"), Some(&line(4, &said("a")))).1,
            Some(true)
        );
    }

    /// What is kept is fixed-size; what is shown is capped.
    #[test]
    fn records_are_bounded() {
        let big = tool(&"a".repeat(100_000));
        assert_eq!(line(1, &big).asked.len(), 64);
        let (ev, _) = replayed(1, &big, None);
        let EventKind::Replayed { asked, .. } = ev else {
            unreachable!()
        };
        assert!(asked.len() <= SHOWN);
    }
}
