//! A `require_approval` rule's hold limit (`approval_timeout_s`): how long
//! the egress proxy keeps a connection waiting for a person. Capped, so a
//! policy cannot pin a session's tunnels (and the guest's sockets) open
//! for hours.

use crate::document::{Effect, Rule};
use std::time::Duration;

/// The longest a connection may be held for a decision.
pub const MAX_APPROVAL_TIMEOUT_S: u64 = 900;
/// The hold when a `require_approval` rule names none.
pub const DEFAULT_APPROVAL_TIMEOUT_S: u64 = 120;

/// The rule's hold (`Some` for every `require_approval` rule), or the
/// error text for its validation error.
pub(crate) fn compile(rule: &Rule) -> Result<Option<Duration>, String> {
    match (rule.effect, rule.approval_timeout_s) {
        (Effect::RequireApproval, None) => {
            Ok(Some(Duration::from_secs(DEFAULT_APPROVAL_TIMEOUT_S)))
        }
        (Effect::RequireApproval, Some(s)) if (1..=MAX_APPROVAL_TIMEOUT_S).contains(&s) => {
            Ok(Some(Duration::from_secs(s)))
        }
        (Effect::RequireApproval, Some(s)) => Err(format!(
            "approval_timeout_s {s}: must be 1–{MAX_APPROVAL_TIMEOUT_S}"
        )),
        (_, Some(_)) => Err("approval_timeout_s: only a require_approval rule holds".into()),
        (_, None) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use crate::{Policy, PolicyDocument};
    use serde_json::json;
    use std::time::Duration;

    fn compile(rule: serde_json::Value) -> Result<Policy, String> {
        let doc: PolicyDocument =
            serde_json::from_value(json!({"name": "p", "rules": [rule]})).unwrap();
        Policy::compile(&doc).map_err(|e| e.to_string())
    }

    fn hold(t: Option<u64>) -> serde_json::Value {
        let mut r = json!({"id": "ask", "effect": "require_approval",
            "match": {"tools": ["egress"], "hosts": ["pkg.example.com"], "ports": [443]}});
        if let Some(t) = t {
            r["approval_timeout_s"] = json!(t);
        }
        r
    }

    #[test]
    fn the_hold_is_capped_at_the_boundary() {
        let at = |t| compile(hold(t)).map(|p| p.approval_timeout(0));
        assert_eq!(at(None), Ok(Some(Duration::from_secs(120))));
        assert_eq!(at(Some(1)), Ok(Some(Duration::from_secs(1))));
        assert_eq!(at(Some(900)), Ok(Some(Duration::from_secs(900))));
        for bad in [0, 901] {
            let e = at(Some(bad)).unwrap_err();
            assert!(
                e.contains("approval_timeout_s") && e.contains("rule 0"),
                "{e}"
            );
        }
    }

    #[test]
    fn only_a_require_approval_rule_has_a_hold() {
        let mut r = hold(Some(30));
        r["effect"] = json!("allow");
        let e = compile(r).unwrap_err();
        assert!(e.contains("only a require_approval rule"), "{e}");
        let mut r = hold(None);
        r["effect"] = json!("allow");
        assert_eq!(compile(r).unwrap().approval_timeout(0), None);
    }

    #[test]
    fn a_held_rule_carries_no_credential() {
        // The proxy holds a connection before it dials; a binding belongs
        // on the allow rule that lets the connection through afterwards.
        let mut r = hold(Some(30));
        r["credential"] = json!({"secret": "tok",
            "inject": {"header": {"name": "Authorization", "template": "Bearer {secret}"}}});
        let e = compile(r).unwrap_err();
        assert!(
            e.contains("only an allow rule may carry a credential"),
            "{e}"
        );
    }
}
