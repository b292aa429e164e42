//! A model call held for a person ([`SessionApprovals::model_call`])
//! against the runner and the real SQLite store: its question is a
//! pending approval of action `model_call` naming the model, the estimate
//! and the rule, and the session waits; `remember: "session"` answers the
//! session's later calls the same rule decides (also after a restart),
//! not another rule's; an agent's own approval with the same action and
//! details is never remembered for the gateway; the agent gets no held
//! call's decision; no decision is a `timeout` decided by the system.

use super::{approval_body as body, ids, pending_id, Env};
use crate::events::EventKind;
use crate::held_approvals::{Answer, ModelCallAsk, SessionApprovals};
use crate::state::SessionState as S;
use std::time::Duration;

fn ask(session: &str, rule: &str, timeout: Duration) -> ModelCallAsk {
    ModelCallAsk {
        session: session.to_string(),
        model: "big".into(),
        tokens: 465,
        usd_cents: 3,
        rule_id: rule.into(),
        policy_version: 1,
        timeout,
    }
}

fn held(
    a: &std::sync::Arc<SessionApprovals>,
    q: ModelCallAsk,
) -> tokio::task::JoinHandle<Result<Answer, String>> {
    let a = a.clone();
    tokio::spawn(async move { a.model_call(&q).await.map_err(|e| e.to_string()) })
}

#[tokio::test]
async fn approved_with_remember_answers_the_rule_s_later_calls() {
    let e = Env::new(|_| {});
    let id = e.create().await;
    let s = e.state(&id, S::Running).await;
    let (sbx, pid) = ids(&s);
    let a = SessionApprovals::new(e.svc.clone());
    let first = held(&a, ask(&id, "review", Duration::from_secs(60)));
    let aid = pending_id(&e, &id).await;
    assert!(aid.starts_with("apr_model_"), "{aid}");
    e.state(&id, S::WaitingApproval).await;
    let p = e
        .svc
        .core
        .store
        .pending_approval(&id)
        .await
        .unwrap()
        .unwrap();
    let d: serde_json::Value = serde_json::from_str(&p.details).unwrap();
    assert_eq!(p.action, "model_call");
    assert_eq!(
        (&d["model"], &d["tokens"], &d["usd_cents"], &d["rule_id"]),
        (
            &serde_json::json!("big"),
            &serde_json::json!(465),
            &serde_json::json!(3),
            &serde_json::json!("review")
        )
    );
    e.svc
        .decide(&id, &aid, &body("approve", Some("session")))
        .await
        .unwrap();
    assert_eq!(
        first.await.unwrap().unwrap(),
        Answer::Approved {
            approval_id: aid.clone(),
            remembered: false
        }
    );
    e.state(&id, S::Running).await;
    let remembered = Answer::Approved {
        approval_id: aid.clone(),
        remembered: true,
    };
    let later = ask(&id, "review", Duration::from_secs(60));
    assert_eq!(a.model_call(&later).await.unwrap(), remembered);
    let fresh = SessionApprovals::new(e.svc.clone());
    assert_eq!(fresh.model_call(&later).await.unwrap(), remembered);
    // Another rule is asked about.
    let other = held(&fresh, ask(&id, "pricey", Duration::from_secs(60)));
    let aid2 = pending_id(&e, &id).await;
    assert_ne!(aid2, aid);
    e.svc.decide(&id, &aid2, &body("deny", None)).await.unwrap();
    assert!(matches!(
        other.await.unwrap().unwrap(),
        Answer::Denied { .. }
    ));
    // The agent got neither decision.
    let stdin = String::from_utf8_lossy(&e.fake.stdin(&sbx, &pid)).to_string();
    assert!(!stdin.contains("apr_model_"), "{stdin}");
}

/// An agent may ask for an approval with any action and details; one
/// that looks like a held model call's, decided with `remember`, is not
/// the gateway's to remember.
#[tokio::test]
async fn an_agent_s_look_alike_approval_is_not_remembered_for_model_calls() {
    let e = Env::new(|_| {});
    let id = e.create().await;
    e.state(&id, S::Running).await;
    let details = serde_json::json!({"rule_id": "review"}).to_string();
    e.svc
        .open_approval(&id, "apr_0123456789abcdef", "model_call", &details)
        .await
        .unwrap();
    let refused = e
        .svc
        .decide(
            &id,
            "apr_0123456789abcdef",
            &body("approve", Some("session")),
        )
        .await;
    assert!(refused.is_err(), "remember on an agent's approval");
    e.svc
        .decide(&id, "apr_0123456789abcdef", &body("approve", None))
        .await
        .unwrap();
    let a = SessionApprovals::new(e.svc.clone());
    let q = held(&a, ask(&id, "review", Duration::from_secs(60)));
    let aid = pending_id(&e, &id).await;
    assert!(aid.starts_with("apr_model_"), "{aid}");
    e.svc.decide(&id, &aid, &body("deny", None)).await.unwrap();
    assert!(matches!(q.await.unwrap().unwrap(), Answer::Denied { .. }));
}

#[tokio::test]
async fn no_decision_in_time_is_a_timeout_in_the_log() {
    let e = Env::new(|_| {});
    let id = e.create().await;
    e.state(&id, S::Running).await;
    let a = SessionApprovals::new(e.svc.clone());
    let got = a
        .model_call(&ask(&id, "review", Duration::from_millis(300)))
        .await
        .unwrap();
    let Answer::TimedOut { approval_id } = got else {
        panic!("{got:?}")
    };
    let evs = e.svc.core.store.events(&id, 0, 10_000).await.unwrap();
    let decided = evs.iter().find_map(|ev| match &ev.kind {
        EventKind::ApprovalDecided {
            approval_id: x,
            decision,
            ..
        } if *x == approval_id => Some((decision.clone(), ev.actor)),
        _ => None,
    });
    assert_eq!(
        decided,
        Some(("timeout".into(), crate::events::Actor::System))
    );
    e.state(&id, S::Running).await;
}
