//! The sessions' egress approver ([`SessionApprovals`]) against the runner
//! and the real SQLite store: a held connection's question moves the
//! session to `waiting_approval` and back; a decision through the API is
//! the answer; no decision is a `timeout` decided by the system; a
//! remembered decision answers later questions, also after a restart;
//! questions at once about one destination share one approval; the agent
//! never gets an egress decision; an agent that exits while one is held
//! still lets the session complete.

use super::{approval_body as body, ids, pending_id, Env};
use crate::events::EventKind;
use crate::held_approvals::SessionApprovals;
use crate::state::SessionState as S;
use hatchery_egress::{Answer, ApprovalAsk, Approver};
use std::time::Duration;

fn ask(session: &str, port: u16, timeout: Duration) -> ApprovalAsk {
    ApprovalAsk {
        session: session.to_string(),
        host: "pkg.example.com".into(),
        port,
        method: None,
        path: None,
        per_request: false,
        rule_id: "ask".into(),
        policy_version: Some(1),
        timeout,
    }
}

#[tokio::test]
async fn approved_with_remember_then_asked_nothing_even_after_a_restart() {
    let e = Env::new(|_| {});
    let id = e.create().await;
    let s = e.state(&id, S::Running).await;
    let (sbx, pid) = ids(&s);
    let approver = SessionApprovals::new(e.svc.clone());
    let a = approver.clone();
    let q = ask(&id, 443, Duration::from_secs(60));
    // Two connections to one destination at once: one question.
    let (first, second) = (
        tokio::spawn({
            let (a, q) = (a.clone(), q.clone());
            async move { a.ask(q).await.map_err(|e| e.to_string()) }
        }),
        tokio::spawn({
            let (a, q) = (a.clone(), q.clone());
            async move { a.ask(q).await.map_err(|e| e.to_string()) }
        }),
    );
    let aid = pending_id(&e, &id).await;
    assert!(aid.starts_with("apr_egress_"), "{aid}");
    e.state(&id, S::WaitingApproval).await;
    let p = e
        .svc
        .core
        .store
        .pending_approval(&id)
        .await
        .unwrap()
        .unwrap();
    let details: serde_json::Value = serde_json::from_str(&p.details).unwrap();
    assert_eq!(
        (p.action.as_str(), &details["port"]),
        ("egress", &serde_json::json!(443))
    );
    // `remember` other than `session` is refused and decides nothing.
    let bad = e
        .svc
        .decide(&id, &aid, &body("approve", Some("forever")))
        .await;
    assert!(bad.is_err());
    e.svc
        .decide(&id, &aid, &body("approve", Some("session")))
        .await
        .unwrap();
    let want = Answer::Approved {
        approval_id: aid.clone(),
        remembered: false,
    };
    assert_eq!(first.await.unwrap().unwrap(), want);
    assert_eq!(second.await.unwrap().unwrap(), want);
    e.state(&id, S::Running).await;
    let asked = e
        .events(&id)
        .await
        .iter()
        .filter(|t| **t == "approval_requested")
        .count();
    assert_eq!(asked, 1);

    // Later connections, from this approver and from a new one (a
    // restarted daemon reads the log back): no question.
    let remembered = Answer::Approved {
        approval_id: aid.clone(),
        remembered: true,
    };
    assert_eq!(a.ask(q.clone()).await.unwrap(), remembered);
    let fresh = SessionApprovals::new(e.svc.clone());
    assert_eq!(fresh.ask(q.clone()).await.unwrap(), remembered);
    // Another port is another destination.
    let other = tokio::spawn({
        let a = a.clone();
        let q = ask(&id, 8443, Duration::from_secs(60));
        async move { a.ask(q).await.map_err(|e| e.to_string()) }
    });
    let aid2 = pending_id(&e, &id).await;
    assert_ne!(aid2, aid);
    e.svc.decide(&id, &aid2, &body("deny", None)).await.unwrap();
    assert!(matches!(
        other.await.unwrap().unwrap(),
        Answer::Denied { .. }
    ));
    // The agent got neither decision.
    let stdin = String::from_utf8_lossy(&e.fake.stdin(&sbx, &pid)).to_string();
    assert!(!stdin.contains("apr_egress_"), "{stdin}");
}

/// A request held on an intercepted connection: its question names method
/// and path with `scope: "request"`.
fn ask_request(session: &str, method: &str, path: &str) -> ApprovalAsk {
    ApprovalAsk {
        method: Some(method.into()),
        path: Some(path.into()),
        per_request: true,
        ..ask(session, 443, Duration::from_secs(60))
    }
}

#[tokio::test]
async fn a_request_remembered_covers_its_method_and_path_only() {
    let e = Env::new(|_| {});
    let id = e.create().await;
    e.state(&id, S::Running).await;
    let a = SessionApprovals::new(e.svc.clone());
    let first = tokio::spawn({
        let (a, q) = (a.clone(), ask_request(&id, "GET", "/v1/a"));
        async move { a.ask(q).await.map_err(|e| e.to_string()) }
    });
    let aid = pending_id(&e, &id).await;
    let p = e
        .svc
        .core
        .store
        .pending_approval(&id)
        .await
        .unwrap()
        .unwrap();
    let details: serde_json::Value = serde_json::from_str(&p.details).unwrap();
    assert_eq!(
        (&details["method"], &details["path"], &details["scope"]),
        (
            &serde_json::json!("GET"),
            &serde_json::json!("/v1/a"),
            &serde_json::json!("request")
        )
    );
    e.svc
        .decide(&id, &aid, &body("approve", Some("session")))
        .await
        .unwrap();
    assert!(matches!(
        first.await.unwrap().unwrap(),
        Answer::Approved {
            remembered: false,
            ..
        }
    ));
    let remembered = Answer::Approved {
        approval_id: aid.clone(),
        remembered: true,
    };
    // The same method and path (its query aside), here and after a restart.
    assert_eq!(
        a.ask(ask_request(&id, "GET", "/v1/a?page=2"))
            .await
            .unwrap(),
        remembered
    );
    let fresh = SessionApprovals::new(e.svc.clone());
    assert_eq!(
        fresh.ask(ask_request(&id, "GET", "/v1/a")).await.unwrap(),
        remembered
    );
    // Neither the connection as a whole, another path nor another method.
    for q in [
        ask(&id, 443, Duration::from_secs(60)),
        ask_request(&id, "GET", "/v1/b"),
        ask_request(&id, "POST", "/v1/a"),
    ] {
        let held = tokio::spawn({
            let (a, q) = (fresh.clone(), q.clone());
            async move { a.ask(q).await.map_err(|e| e.to_string()) }
        });
        let again = pending_id(&e, &id).await;
        assert_ne!(again, aid, "{q:?}");
        e.svc
            .decide(&id, &again, &body("deny", None))
            .await
            .unwrap();
        assert!(
            matches!(held.await.unwrap().unwrap(), Answer::Denied { .. }),
            "{q:?}"
        );
    }
}

#[tokio::test]
async fn no_decision_in_time_is_a_timeout_decided_by_the_system() {
    let e = Env::new(|_| {});
    let id = e.create().await;
    e.state(&id, S::Running).await;
    let approver = SessionApprovals::new(e.svc.clone());
    let got = approver
        .ask(ask(&id, 443, Duration::from_millis(300)))
        .await
        .unwrap();
    let Answer::TimedOut { approval_id } = got else {
        panic!("{got:?}")
    };
    let evs = e.svc.core.store.events(&id, 0, 10_000).await.unwrap();
    let decided = evs
        .iter()
        .find_map(|ev| match &ev.kind {
            EventKind::ApprovalDecided {
                approval_id: a,
                decision,
                ..
            } if *a == approval_id => Some((decision.clone(), ev.actor)),
            _ => None,
        })
        .unwrap();
    assert_eq!(decided, ("timeout".into(), crate::events::Actor::System));
    e.state(&id, S::Running).await;
    // Decided: the person is too late.
    let late = e
        .svc
        .decide(&id, &approval_id, &body("approve", None))
        .await;
    assert!(late.is_err());
}

#[tokio::test]
async fn an_agent_that_exits_while_a_connection_is_held_still_completes() {
    let e = Env::new(|_| {});
    let id = e.create().await;
    let s = e.state(&id, S::Running).await;
    let (sbx, pid) = ids(&s);
    let approver = SessionApprovals::new(e.svc.clone());
    let held = tokio::spawn({
        let q = ask(&id, 443, Duration::from_secs(60));
        async move { approver.ask(q).await.map_err(|e| e.to_string()) }
    });
    pending_id(&e, &id).await;
    e.state(&id, S::WaitingApproval).await;
    e.fake.emit_line(
        &sbx,
        &pid,
        serde_json::json!({"n": 1, "type": "done", "summary": "gave up"}),
    );
    e.fake.exit(&sbx, &pid, 0);
    e.state(&id, S::Completed).await;
    assert!(matches!(
        held.await.unwrap().unwrap(),
        Answer::Denied { .. }
    ));
}
