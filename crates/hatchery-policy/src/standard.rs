//! `pol_standard`: the built-in policy every install has at version 1.
//! docs/policy.md explains each rule. It is read-only: operators who want
//! something else create their own policy (starting from this document).

use crate::document::PolicyDocument;

pub const STANDARD_ID: &str = "pol_standard";

/// Hosts `http_fetch` and the egress proxy may reach by default: the public
/// package indexes and source forge the templates' tools use, on HTTPS only.
pub const STANDARD_HOSTS: &[&str] = &[
    "pypi.org",
    "files.pythonhosted.org",
    "registry.npmjs.org",
    "crates.io",
    "index.crates.io",
    "static.crates.io",
    "github.com",
    "codeload.github.com",
    "objects.githubusercontent.com",
    "deb.debian.org",
];

/// Every version of `pol_standard`, oldest first: version N is the Nth.
/// Append only (sessions pin a version by number, on every deployment
/// alike); the store adds the versions a database lacks when it opens.
pub fn standard_versions() -> Vec<PolicyDocument> {
    vec![standard_document_v1(), standard_document()]
}

/// Version 1, as the first releases wrote it.
pub fn standard_document_v1() -> PolicyDocument {
    let hosts = serde_json::json!(STANDARD_HOSTS);
    serde_json::from_value(serde_json::json!({
        "name": "standard",
        "description": "Built-in defaults: push only the session's own branch, never main/master; fetch and connect only to the package indexes and GitHub over HTTPS; everything else is denied.",
        "rules": [
            {"id": "push-session-branch", "effect": "allow",
             "description": "The session's work branch is the agent's to push.",
             "match": {"tools": ["git_push"], "args": [{"field": "branch", "op": "eq", "value": {"ctx": "session_branch"}}]}},
            {"id": "push-protected", "effect": "deny",
             "description": "Protected branches are never pushed by an agent.",
             "match": {"tools": ["git_push"], "args": [{"field": "branch", "op": "in", "value": ["main", "master"]}]}},
            {"id": "push-other-branch", "effect": "require_approval",
             "description": "Any other branch needs a person to approve.",
             "match": {"tools": ["git_push"], "args": [{"field": "branch", "op": "exists"}]}},
            {"id": "pr-from-session-branch", "effect": "allow",
             "description": "A pull request from the session's branch.",
             "match": {"tools": ["open_pr"], "args": [{"field": "head", "op": "eq", "value": {"ctx": "session_branch"}}]}},
            {"id": "fetch-allowed-hosts", "effect": "allow",
             "match": {"tools": ["http_fetch"], "hosts": hosts.clone(), "ports": [443]}},
            {"id": "egress-allowed-hosts", "effect": "allow",
             "match": {"tools": ["egress"], "hosts": hosts, "ports": [443]}}
        ]
    }))
    .expect("the standard policy is a valid document")
}

/// The current version (2): version 1 and, first, the large-diff rule
/// and the model-call rule of issue 36.
pub fn standard_document() -> PolicyDocument {
    let hosts = serde_json::json!(STANDARD_HOSTS);
    serde_json::from_value(serde_json::json!({
        "name": "standard",
        "description": "Built-in defaults: push only the session's own branch, never main/master, and a push of more than 500 changed lines (as the host counts them) only with approval; model calls within the budget; fetch and connect only to the package indexes and GitHub over HTTPS; everything else is denied.",
        "rules": [
            {"id": "push-large-diff", "effect": "require_approval",
             "description": "More than 500 lines added and removed (counted by the host in the commit it pushes) needs a person to approve.",
             "match": {"tools": ["git_push"], "args": [{"field": "diff.lines", "op": "gt", "value": 500}]}},
            {"id": "model-calls", "effect": "allow",
             "description": "Model calls, within the session's budget.",
             "match": {"tools": ["model_call"]}},
            {"id": "push-session-branch", "effect": "allow",
             "description": "The session's work branch is the agent's to push.",
             "match": {"tools": ["git_push"], "args": [{"field": "branch", "op": "eq", "value": {"ctx": "session_branch"}}]}},
            {"id": "push-protected", "effect": "deny",
             "description": "Protected branches are never pushed by an agent.",
             "match": {"tools": ["git_push"], "args": [{"field": "branch", "op": "in", "value": ["main", "master"]}]}},
            {"id": "push-other-branch", "effect": "require_approval",
             "description": "Any other branch needs a person to approve.",
             "match": {"tools": ["git_push"], "args": [{"field": "branch", "op": "exists"}]}},
            {"id": "pr-from-session-branch", "effect": "allow",
             "description": "A pull request from the session's branch.",
             "match": {"tools": ["open_pr"], "args": [{"field": "head", "op": "eq", "value": {"ctx": "session_branch"}}]}},
            {"id": "fetch-allowed-hosts", "effect": "allow",
             "match": {"tools": ["http_fetch"], "hosts": hosts.clone(), "ports": [443]}},
            {"id": "egress-allowed-hosts", "effect": "allow",
             "match": {"tools": ["egress"], "hosts": hosts, "ports": [443]}}
        ]
    }))
    .expect("the standard policy is a valid document")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Destination, Effect, Policy, Request};
    use serde_json::{json, Map, Value};

    #[test]
    fn standard_policy_decisions() {
        let p = Policy::compile(&standard_document()).unwrap();
        let mut ctx = Map::new();
        ctx.insert("session_branch".into(), json!("hatchery/ses_1"));
        let push = |branch: &str| {
            let args = json!({"branch": branch});
            p.evaluate(&Request {
                tool: "git_push",
                args: &args,
                cost_cents: None,
                dest: None,
                ctx: Some(&ctx),
            })
            .effect
        };
        assert_eq!(push("hatchery/ses_1"), Effect::Allow);
        let big = |lines: u64| {
            let args = json!({"branch": "hatchery/ses_1", "diff": {"lines": lines, "files": 1}});
            p.evaluate(&Request {
                tool: "git_push",
                args: &args,
                cost_cents: None,
                dest: None,
                ctx: Some(&ctx),
            })
            .rule_id
            .map(str::to_string)
        };
        assert_eq!(big(800).as_deref(), Some("push-large-diff"));
        assert_eq!(big(500).as_deref(), Some("push-session-branch"));
        assert!(p.names_tool("model_call") && p.names_tool("git_push") && !p.names_tool("shell"));
        let model = p.evaluate(&Request {
            tool: "model_call",
            args: &Value::Null,
            cost_cents: Some(40),
            dest: None,
            ctx: Some(&ctx),
        });
        assert_eq!(model.effect, Effect::Allow);
        assert_eq!(push("main"), Effect::Deny);
        assert_eq!(push("master"), Effect::Deny);
        assert_eq!(push("feature"), Effect::RequireApproval);
        let conn = |tool: &str, host: &str, port: u16| {
            p.evaluate(&Request {
                tool,
                args: &Value::Null,
                cost_cents: None,
                dest: Some(Destination {
                    host,
                    ip: None,
                    port,
                }),
                ctx: Some(&ctx),
            })
            .effect
        };
        assert_eq!(conn("http_fetch", "pypi.org", 443), Effect::Allow);
        assert_eq!(conn("egress", "files.pythonhosted.org", 443), Effect::Allow);
        assert_eq!(conn("egress", "pypi.org", 80), Effect::Deny);
        assert_eq!(conn("egress", "evil.example", 443), Effect::Deny);
        assert_eq!(conn("egress", "169.254.169.254", 80), Effect::Deny);
        assert_eq!(conn("shell", "pypi.org", 443), Effect::Deny);
    }
}
