//! The control role's session log through fakes: the owners and hosts it
//! looks up are in memory, the owning host is a tiny axum server on
//! 127.0.0.1 that answers from a script and records what reached it.

use super::*;
use hatchery_route::fake::{slot, FixedHosts};
use hatchery_sessions::owner_post::SessionOwners;
use std::sync::Mutex;

fn call(seq: u64) -> EventKind {
    EventKind::BrokerCall {
        call_seq: seq,
        epoch: 1,
        tool: "noop".into(),
        arguments: "{}".into(),
        decision: "allow".into(),
        rule_id: None,
        approval_id: None,
    }
}

fn result(seq: u64) -> EventKind {
    EventKind::BrokerResult {
        call_seq: seq,
        tool: "noop".into(),
        status: "done".into(),
        output: "{}".into(),
    }
}

#[test]
fn the_same_write_has_the_same_key_and_another_another() {
    let k = delivery_key("ses_a", b"{\"events\":[1]}");
    assert_eq!(k, delivery_key("ses_a", b"{\"events\":[1]}"));
    assert_ne!(k, delivery_key("ses_b", b"{\"events\":[1]}"));
    assert_ne!(k, delivery_key("ses_a", b"{\"events\":[2]}"));
    // What the owner's route takes: 1 to 64 of A-Z a-z 0-9 - _.
    assert_eq!(k.len(), 44);
    assert!(k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
}

#[test]
fn a_repeated_write_finds_its_seqs_in_the_log() {
    let logged = LoggedCall {
        call: Some((7, "noop".into(), "{}".into(), "allow".into())),
        effect: None,
        result: Some((9, "done".into(), "{}".into())),
    };
    assert_eq!(
        logged_seqs(&[call(3), result(3)], Some(&logged)),
        vec![7, 9]
    );
    assert_eq!(logged_seqs(&[result(3)], Some(&logged)), vec![9]);
    let started = EventKind::BrokerEffectStarted {
        call_seq: 3,
        tool: "noop".into(),
        detail: "x".into(),
    };
    // Up to the first it cannot name.
    assert_eq!(
        logged_seqs(&[call(3), started.clone()], Some(&logged)),
        vec![7]
    );
    assert_eq!(
        logged_seqs(&[started, call(3)], Some(&logged)),
        Vec::<u64>::new()
    );
    assert_eq!(logged_seqs(&[call(3)], None), Vec::<u64>::new());
    assert_eq!(call_seq(&[result(4)]), Some(4));
}

/// Session `ses_gone` has no owner; every other is owned by host `a`.
pub(crate) struct Owners;
#[async_trait::async_trait]
impl SessionOwners for Owners {
    async fn owner(
        &self,
        session: &str,
    ) -> Result<Option<(String, bool)>, hatchery_sessions::store::StoreError> {
        Ok((session != "ses_gone").then(|| ("a".to_string(), false)))
    }
}

/// What reached the owner: (delivery key, body).
type Seen = Arc<Mutex<Vec<(String, String)>>>;

/// An owner that answers each post with the next of `script` (the last
/// one again once the script runs out).
async fn owner(script: Vec<(u16, &'static str)>) -> (String, Seen) {
    use axum::routing::post;
    let seen: Seen = Arc::default();
    let script = Arc::new(Mutex::new(script));
    let (s, sc) = (seen.clone(), script.clone());
    let app = axum::Router::new().route(
        "/v1/sessions/{id}/broker-events",
        post(move |h: axum::http::HeaderMap, body: String| async move {
            let key = h
                .get(hatchery_sessions::model_events::DELIVERY_HEADER)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string();
            s.lock().unwrap().push((key, body));
            let mut sc = sc.lock().unwrap();
            let (status, answer) = if sc.len() > 1 { sc.remove(0) } else { sc[0] };
            (axum::http::StatusCode::from_u16(status).unwrap(), answer)
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    (url, seen)
}

async fn log_to(url: String, alive: bool) -> RemoteSessionLog {
    let db = hatchery_db::Db::sqlite_memory().unwrap();
    let store = hatchery_sessions::store::DbSessionStore::open(db, "ctl")
        .await
        .unwrap();
    let mut log = RemoteSessionLog::new(
        Arc::new(store),
        OwnerPost {
            owners: Arc::new(Owners),
            directory: Arc::new(FixedHosts(vec![slot("a", url, alive)])),
            me: "ctl".into(),
            api_key: "k".into(),
            daemon_key: "dk".into(),
        },
    );
    log.deadline = Duration::from_millis(300);
    log.retry_every = Duration::from_millis(10);
    log
}

const WRITTEN: &str = r#"{"seqs":[4,5],"repeat":false}"#;

/// A 503 or 409 (the owner's store is down, or the session moved) is
/// posted again under the same key, derived from session and events; the
/// owner's seqs are the answer.
#[tokio::test]
async fn a_write_is_retried_under_its_own_key_until_the_owner_takes_it() {
    let (url, seen) = owner(vec![(503, ""), (409, ""), (200, WRITTEN)]).await;
    let log = log_to(url, true).await;
    let seqs = log.record("ses_a", vec![call(1), result(1)]).await.unwrap();
    assert_eq!(seqs, vec![4, 5]);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3, "{seen:?}");
    let key = &seen[0].0;
    assert!(seen.iter().all(|(k, b)| k == key && *b == seen[0].1));
    assert_eq!(key, &delivery_key("ses_a", seen[0].1.as_bytes()));
    let posted: BrokerEvents = serde_json::from_str(&seen[0].1).unwrap();
    assert_eq!(posted.events, vec![call(1), result(1)]);
    assert!(posted.joined.is_none() && posted.approval.is_none());
}

/// The same events asked again are the same post (the owner writes a key
/// once); other events, or another session's, another. An approval's key
/// is its id.
#[tokio::test]
async fn keys_follow_what_is_written() {
    let (url, seen) = owner(vec![(200, WRITTEN)]).await;
    let log = log_to(url, true).await;
    log.record("ses_a", vec![call(1)]).await.unwrap();
    log.record("ses_a", vec![call(1)]).await.unwrap();
    log.record("ses_a", vec![call(2)]).await.unwrap();
    log.record("ses_b", vec![call(1)]).await.unwrap();
    log.open_approval("ses_a", "apr_1", "git_push", "to main")
        .await
        .unwrap();
    let keys: Vec<String> = seen.lock().unwrap().iter().map(|s| s.0.clone()).collect();
    assert_eq!(keys[0], keys[1]);
    assert_ne!(keys[0], keys[2]);
    assert_ne!(keys[0], keys[3]);
    assert_eq!(keys[4], "apr_1");
}

/// Declined rows are `None` (nothing written); a repeat (an answer lost
/// before) takes its seqs from the log, here none.
#[tokio::test]
async fn declined_and_repeated_writes() {
    let (url, _) = owner(vec![(200, r#"{"seqs":[],"repeat":false,"declined":true}"#)]).await;
    let log = log_to(url, true).await;
    let out = log
        .post_events("ses_a", vec![call(1)], Some(serde_json::json!({})))
        .await
        .unwrap();
    assert_eq!(out, None);
    assert_eq!(
        log.record("ses_a", vec![call(1)]).await.unwrap(),
        Vec::<u64>::new()
    );

    let (url, _) = owner(vec![(200, r#"{"seqs":[],"repeat":true}"#)]).await;
    let log = log_to(url, true).await;
    let out = log.post_events("ses_a", vec![call(1)], None).await.unwrap();
    assert_eq!(out, Some(vec![]));
}

/// What is given up, and as what the broker answers: an owner out of
/// reach past the deadline (503, ask again), a session without an owner
/// (404), a refusal (409), an answer that is not one (500).
#[tokio::test]
async fn what_is_given_up() {
    let (url, seen) = owner(vec![(200, WRITTEN)]).await;
    let log = log_to(url.clone(), false).await;
    let started = std::time::Instant::now();
    let e = log.record("ses_a", vec![call(1)]).await.unwrap_err();
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(
        matches!(&e, SessionError::StoreUnavailable(m) if m.contains("ask again")),
        "{e:?}"
    );
    assert!(
        seen.lock().unwrap().is_empty(),
        "a lost owner is not posted to"
    );

    let log = log_to(url, true).await;
    let e = log.record("ses_gone", vec![call(1)]).await.unwrap_err();
    assert!(
        matches!(&e, SessionError::NotFound(id) if id == "ses_gone"),
        "{e:?}"
    );

    let (url, _) = owner(vec![(400, "")]).await;
    let e = log_to(url, true)
        .await
        .open_approval("ses_a", "apr_1", "a", "d")
        .await
        .unwrap_err();
    assert!(
        matches!(&e, SessionError::Conflict(m) if m.contains("refused")),
        "{e:?}"
    );

    let (url, _) = owner(vec![(200, "not json")]).await;
    let e = log_to(url, true)
        .await
        .record("ses_a", vec![call(1)])
        .await
        .unwrap_err();
    assert!(matches!(e, SessionError::Internal(_)), "{e:?}");
}
