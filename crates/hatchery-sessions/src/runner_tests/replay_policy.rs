//! A diverged re-run decided by the session's pinned policy (crate::replay,
//! issue 37): a person approves or denies it, or the policy lets it go on.
//! The policy is a fake hook here; the policy evaluation itself is tested
//! in crate::replay, and end to end in tests/sessions.

use super::{approval_body, resumed_after_line_2, Env};
use crate::events::EventKind;
use crate::hooks::{HookError, SessionHooks};
use crate::replay::Verdict;
use crate::state::SessionState as S;
use crate::store::Session;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

struct Policy(Verdict);

#[async_trait::async_trait]
impl SessionHooks for Policy {
    async fn bind(&self, _: &Session, _: &str) -> Result<(), HookError> {
        Ok(())
    }
    async fn unbind(&self, _: &str, _: &str) {}
    fn agent_env(&self, _: &Session) -> BTreeMap<String, String> {
        BTreeMap::new()
    }
    fn meters_spend(&self) -> bool {
        false
    }
    async fn replay_diverged(
        &self,
        _: &Session,
        _: u64,
        _: &str,
        _: &str,
    ) -> Result<Verdict, HookError> {
        Ok(self.0.clone())
    }
}

fn call(args: &str) -> serde_json::Value {
    serde_json::json!({"n": 2, "ack": true, "type": "tool_call", "call_id": "c1",
                       "tool": "shell", "arguments": args})
}

/// A session whose re-run asked for `curl x` where it had asked for `ls`,
/// under a policy that says `v`.
async fn diverged(v: Verdict) -> (Env, String, String, String) {
    let e = Env::new(|c| c.checkpoint_every = Some(Duration::from_millis(20)));
    e.svc.set_hooks(Arc::new(Policy(v)));
    let (id, sbx, pid) = resumed_after_line_2(
        &e,
        call(r#"{"command":"ls"}"#),
        call(r#"{"command":"curl x"}"#),
    )
    .await;
    (e, id, sbx, pid)
}

fn acked(e: &Env, sbx: &str, pid: &str) -> bool {
    let sent = String::from_utf8_lossy(&e.fake.stdin(sbx, pid)).to_string();
    let ack = String::from_utf8(crate::agent_proto::ack(2)).unwrap();
    sent.contains(ack.trim())
}

/// Held: the session waits with an approval that shows what the re-run
/// asks, the agent gets no ack; approved, it gets it, message 2 is the new
/// call from then on, and the session goes on to its end.
#[tokio::test]
async fn a_held_rerun_goes_on_once_a_person_approves_it() {
    let (e, id, sbx, pid) = diverged(Verdict::Ask {
        rule: Some("ask".into()),
    })
    .await;
    let s = e.state(&id, S::WaitingApproval).await;
    let a = e
        .svc
        .core
        .store
        .pending_approval(&s.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(a.action, crate::replay::APPROVAL_ACTION);
    assert!(a.approval_id.starts_with(crate::replay::APPROVAL_PREFIX));
    let details: serde_json::Value = serde_json::from_str(&a.details).unwrap();
    assert_eq!(details["n"], 2);
    assert_eq!(details["rule"], "ask");
    assert!(
        details["asked"].as_str().unwrap().contains("curl x"),
        "{details}"
    );
    assert!(!acked(&e, &sbx, &pid), "no ack before the decision");
    let before = e.svc.core.store.agent_line(&id, 2).await.unwrap().unwrap();

    e.svc
        .decide(&id, &a.approval_id, &approval_body("approve", None))
        .await
        .unwrap();
    e.until(&id, "acked and running", |s| s.state == S::Running)
        .await;
    for _ in 0..2000 {
        if acked(&e, &sbx, &pid) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(acked(&e, &sbx, &pid));
    let after = e.svc.core.store.agent_line(&id, 2).await.unwrap().unwrap();
    assert_ne!(
        before.asked, after.asked,
        "message 2 is the approved call now"
    );
    assert_eq!(
        after,
        crate::replay::line(
            2,
            &crate::agent_proto::parse(call(r#"{"command":"curl x"}"#).to_string().as_bytes())
                .event
        )
    );
    // The agent never sees the runner's approval as its own.
    let sent = String::from_utf8_lossy(&e.fake.stdin(&sbx, &pid)).to_string();
    assert!(!sent.contains(&a.approval_id), "{sent}");
    e.fake
        .emit_line(&sbx, &pid, serde_json::json!({"n": 3, "type": "done"}));
    e.fake.exit(&sbx, &pid, 0);
    e.state(&id, S::Completed).await;
}

/// Denied: the session ends `replay_diverged`, and the agent got no ack.
#[tokio::test]
async fn a_held_rerun_that_is_denied_ends_the_session() {
    let (e, id, sbx, pid) = diverged(Verdict::Ask { rule: None }).await;
    e.state(&id, S::WaitingApproval).await;
    let a = e
        .svc
        .core
        .store
        .pending_approval(&id)
        .await
        .unwrap()
        .unwrap();
    e.svc
        .decide(&id, &a.approval_id, &approval_body("deny", None))
        .await
        .unwrap();
    let s = e.state(&id, S::Failed).await;
    let reason = s.reason.unwrap_or_default();
    assert!(reason.starts_with("replay_diverged"), "{reason}");
    assert!(!acked(&e, &sbx, &pid));
}

/// Allowed by the policy: acknowledged at once, logged as `replayed` with
/// `matches: false` before, and kept as message 2.
#[tokio::test]
async fn a_rerun_the_policy_allows_goes_on() {
    let (e, id, sbx, pid) = diverged(Verdict::Continue {
        rule: Some("ok".into()),
    })
    .await;
    for _ in 0..5000 {
        if acked(&e, &sbx, &pid) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(acked(&e, &sbx, &pid));
    let all = e.svc.core.store.events(&id, 0, 10_000).await.unwrap();
    assert!(
        all.iter().any(|ev| matches!(&ev.kind,
        EventKind::Replayed { n: 2, matches: Some(false), asked, .. } if asked.contains("curl x")))
    );
    assert_eq!(e.svc.core.store.get(&id).await.unwrap().state, S::Running);
    e.fake
        .emit_line(&sbx, &pid, serde_json::json!({"n": 3, "type": "done"}));
    e.fake.exit(&sbx, &pid, 0);
    e.state(&id, S::Completed).await;
}

/// Denied by the policy's rule: the failure names it.
#[tokio::test]
async fn a_rerun_the_policy_denies_names_the_rule() {
    let (e, id, _, _) = diverged(Verdict::Fail {
        rule: Some("no-curl".into()),
    })
    .await;
    let s = e.state(&id, S::Failed).await;
    let reason = s.reason.unwrap_or_default();
    assert!(reason.contains("no-curl"), "{reason}");
}
