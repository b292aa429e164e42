//! The gateway's policy check ([`CallPolicy`]) over the sessions store and
//! the policy store: a model call is evaluated under its session's pinned
//! policy version as the tool `model_call`, with `cost` the call's
//! estimated cents (the reservation's: what the call may cost at most) and
//! as arguments the model and the reserved tokens (issue 36).
//!
//! A call a rule says `require_approval` for is held for a person's
//! decision (hatchery_sessions::held_approvals) when the policy has
//! [`PinnedPolicy::approvals`], the sessions of this daemon; without them
//! (the control role's gateway) it is refused as it cannot be held.
//!
//! A policy none of whose rules names `model_call` allows it: policies
//! written before model calls were evaluated would otherwise deny every
//! call by their default deny (docs/policy.md).

use async_trait::async_trait;
use hatchery_gateway::budget::{Amount, Caller};

use hatchery_gateway::policy::{CallPolicy, PolicyCheckError, Verdict};
use hatchery_policy::cache::CompiledPolicies;
use hatchery_policy::{Effect, Policy, Request, MODEL_CALL_TOOL};
use hatchery_sessions::held_approvals::{Answer, ApprovalError, ModelCallAsk, SessionApprovals};
use hatchery_sessions::store::{SessionStore, StoreError};
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::Duration;

pub struct PinnedPolicy {
    pub sessions: Arc<dyn SessionStore>,
    pub policies: Arc<CompiledPolicies>,
    /// Holds calls for a person's approval; none: such calls are refused.
    pub approvals: Option<Arc<SessionApprovals>>,
}

/// `policy`'s verdict on a model call of `model` reserving `estimate`.
pub fn decide(policy: &Policy, session: &str, model: &str, estimate: Amount) -> Verdict {
    decide_with_hold(policy, session, model, estimate).0
}

/// The verdict and, for `require_approval`, its rule's hold limit.
fn decide_with_hold(
    policy: &Policy,
    session: &str,
    model: &str,
    estimate: Amount,
) -> (Verdict, Option<Duration>) {
    if !policy.names_tool(MODEL_CALL_TOOL) {
        return (Verdict::Allow, None);
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
        Effect::Allow => (Verdict::Allow, None),
        Effect::Deny => (Verdict::Deny { rule }, None),
        Effect::RequireApproval => (
            Verdict::RequireApproval { rule },
            d.rule_index.and_then(|i| policy.approval_timeout(i)),
        ),
    }
}

/// A held call's verdict from the person's answer (or its absence).
fn verdict_of(answer: Answer, rule: Option<String>) -> Verdict {
    match answer {
        Answer::Approved { .. } => Verdict::Allow,
        Answer::Denied { .. } => Verdict::Deny { rule },
        Answer::TimedOut { approval_id } => Verdict::ApprovalTimedOut { rule, approval_id },
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
        let (verdict, hold) = decide_with_hold(&p, &s.id, model, estimate);
        let (Verdict::RequireApproval { rule: Some(rule) }, Some(timeout), Some(approvals)) =
            (&verdict, hold, &self.approvals)
        else {
            return Ok(verdict);
        };
        let ask = ModelCallAsk {
            session: s.id.clone(),
            model: model.to_string(),
            tokens: estimate.tokens,
            usd_cents: estimate.usd_cents,
            rule_id: rule.clone(),
            policy_version: s.spec.policy_version,
            timeout,
        };
        // In a task of its own: a caller that hangs up while held does not
        // leave its question open with nobody to time it out.
        let approvals = approvals.clone();
        let held = tokio::spawn(async move { approvals.model_call(&ask).await });
        match held.await {
            Ok(Ok(answer)) => Ok(verdict_of(answer, Some(rule.clone()))),
            Ok(Err(ApprovalError::TooMany(open))) => Ok(Verdict::TooManyApprovals { open }),
            Ok(Err(e)) => Err(boxed(Box::new(e))),
            Err(e) => Err(boxed(Box::new(e))),
        }
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

    /// A `require_approval` verdict carries its rule's hold limit (the
    /// rule's `approval_timeout_s`, else the default), which bounds how
    /// long the call is held.
    #[test]
    fn an_approval_verdict_carries_its_rule_s_hold_limit() {
        let p = policy(json!([
            {"id": "quick", "effect": "require_approval", "approval_timeout_s": 5,
             "match": {"tools": ["model_call"], "args": [{"field": "model", "op": "eq", "value": "big"}]}},
            {"id": "slow", "effect": "require_approval", "match": {"tools": ["model_call"]}}
        ]));
        let (v, hold) = decide_with_hold(&p, "ses_a", "big", cents(1));
        assert_eq!(
            (v, hold),
            (
                Verdict::RequireApproval {
                    rule: Some("quick".into())
                },
                Some(Duration::from_secs(5))
            )
        );
        let (_, hold) = decide_with_hold(&p, "ses_a", "small", cents(1));
        assert_eq!(hold, Some(Duration::from_secs(120)));
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
            approvals: None,
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
