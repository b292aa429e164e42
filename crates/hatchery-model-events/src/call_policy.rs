//! The gateway's policy check ([`CallPolicy`]) over the sessions store and
//! the policy store: a model call is evaluated under its session's pinned
//! policy version as the tool `model_call`, with `cost` the call's
//! estimated cents (the reservation's: what the call may cost at most) and
//! as arguments the model and the reserved tokens (issue 36).
//!
//! A policy none of whose rules names `model_call` allows it: policies
//! written before model calls were evaluated would otherwise deny every
//! call by their default deny (docs/policy.md).

use async_trait::async_trait;
use hatchery_gateway::budget::{Amount, Caller};
use hatchery_gateway::policy::{CallPolicy, PolicyCheckError, Verdict};
use hatchery_policy::cache::CompiledPolicies;
use hatchery_policy::{Effect, Policy, Request, MODEL_CALL_TOOL};
use hatchery_sessions::store::{SessionStore, StoreError};
use serde_json::{json, Map, Value};
use std::sync::Arc;

pub struct PinnedPolicy {
    pub sessions: Arc<dyn SessionStore>,
    pub policies: Arc<CompiledPolicies>,
}

/// `policy`'s verdict on a model call of `model` reserving `estimate`.
pub fn decide(policy: &Policy, session: &str, model: &str, estimate: Amount) -> Verdict {
    if !policy.names_tool(MODEL_CALL_TOOL) {
        return Verdict::Allow;
    }
    let args = json!({"model": model, "tokens": estimate.tokens});
    let mut ctx = Map::new();
    ctx.insert("session_id".into(), Value::String(session.to_string()));
    let d = policy.evaluate(&Request {
        tool: MODEL_CALL_TOOL,
        args: &args,
        cost_cents: Some(i64::try_from(estimate.usd_cents).unwrap_or(i64::MAX)),
        dest: None,
        ctx: Some(&ctx),
    });
    let rule = d.rule_id.map(str::to_string);
    match d.effect {
        Effect::Allow => Verdict::Allow,
        Effect::Deny => Verdict::Deny { rule },
        Effect::RequireApproval => Verdict::RequireApproval { rule },
    }
}

#[async_trait]
impl CallPolicy for PinnedPolicy {
    async fn model_call(
        &self,
        caller: &Caller,
        model: &str,
        estimate: Amount,
    ) -> Result<Verdict, PolicyCheckError> {
        let boxed = |e: Box<dyn std::error::Error + Send + Sync>| PolicyCheckError(e);
        let s = match self.sessions.get(&caller.session).await {
            Ok(s) => s,
            // A binding that outlived its session: the caller's problem,
            // not the daemon's (it would otherwise answer 500).
            Err(StoreError::NotFound(_)) => return Ok(Verdict::SessionGone),
            Err(e) => return Err(boxed(Box::new(e))),
        };
        let p = self
            .policies
            .get(&s.spec.policy_id, s.spec.policy_version)
            .await
            .map_err(|e| boxed(Box::new(e)))?;
        Ok(decide(&p, &s.id, model, estimate))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(rules: Value) -> Policy {
        let doc = serde_json::from_value(json!({"name": "p", "rules": rules})).unwrap();
        Policy::compile(&doc).unwrap()
    }

    fn cents(usd_cents: u64) -> Amount {
        Amount {
            tokens: 1000,
            usd_cents,
        }
    }

    #[test]
    fn a_model_call_is_decided_on_its_estimated_cost() {
        let p = policy(json!([
            {"id": "pricey", "effect": "deny", "match": {"tools": ["model_call"], "cost": {"op": "gt", "value": 50}}},
            {"id": "review", "effect": "require_approval", "match": {"tools": ["model_call"], "args": [{"field": "model", "op": "eq", "value": "big"}]}},
            {"id": "ok", "effect": "allow", "match": {"tools": ["model_call"]}}
        ]));
        assert_eq!(decide(&p, "ses_a", "small", cents(10)), Verdict::Allow);
        assert_eq!(
            decide(&p, "ses_a", "small", cents(51)),
            Verdict::Deny {
                rule: Some("pricey".into())
            }
        );
        assert_eq!(
            decide(&p, "ses_a", "big", cents(5)),
            Verdict::RequireApproval {
                rule: Some("review".into())
            }
        );
    }

    /// A sandbox whose session is gone (a binding outlived it) is refused
    /// like an ended session's call, not failed as the daemon's fault.
    #[tokio::test]
    async fn a_call_for_a_session_that_does_not_exist_is_refused_not_an_error() {
        use hatchery_sessions::store::{DbSessionStore, LOCAL_HOST};
        let db = hatchery_db::Db::sqlite_memory().unwrap();
        let sessions = Arc::new(DbSessionStore::open(db, LOCAL_HOST).await.unwrap());
        let policies = hatchery_policy::DbPolicyStore::scratch().await.unwrap();
        let p = PinnedPolicy {
            sessions,
            policies: Arc::new(CompiledPolicies::new(Arc::new(policies))),
        };
        let caller = Caller {
            session: "ses_gone".into(),
            tenant: None,
        };
        let v = p.model_call(&caller, "m", cents(1)).await.unwrap();
        assert_eq!(v, Verdict::SessionGone);
    }

    #[test]
    fn a_policy_silent_on_model_calls_leaves_them_to_the_budget() {
        let p =
            policy(json!([{"id": "push", "effect": "allow", "match": {"tools": ["git_push"]}}]));
        assert_eq!(decide(&p, "ses_a", "m", cents(1_000_000)), Verdict::Allow);
        let only_deny = policy(
            json!([{"id": "no-models", "effect": "deny", "match": {"tools": ["model_call"]}}]),
        );
        assert_eq!(
            decide(&only_deny, "ses_a", "m", cents(1)),
            Verdict::Deny {
                rule: Some("no-models".into())
            }
        );
    }
}
