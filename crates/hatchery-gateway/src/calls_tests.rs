//! A call's intent comes before the upstream: unit tests of `calls.rs`
//! with a real listener as the upstream and a fake event sink.

use crate::budget::{BudgetStore, Caller, KeyStore};
use crate::events::{GatewayEvent, GatewayEvents, IntentError};
use crate::policy::{CallPolicy, PolicyCheckError, Verdict};
use crate::pricing::{Price, Prices};
use crate::store::GatewayStore;
use crate::upstream::Upstream;
use crate::usage::Flavor;
use crate::Gateway;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Records events; its intents succeed or fail as told, and each one
/// notes how many connections the upstream had seen by then.
struct Sink {
    refuse: Option<fn() -> IntentError>,
    seen: Arc<AtomicUsize>,
    log: Mutex<Vec<(String, usize)>>,
}

#[async_trait::async_trait]
impl GatewayEvents for Sink {
    fn record(&self, e: GatewayEvent) {
        let name = match e {
            GatewayEvent::Called { .. } => "called",
            GatewayEvent::Refused { code, .. } => code,
            _ => "other",
        };
        self.log.lock().unwrap().push((name.into(), 0));
    }

    async fn intent(&self, e: GatewayEvent) -> Result<(), IntentError> {
        let GatewayEvent::Requested { reserved, .. } = e else {
            panic!("not an intent: {e:?}")
        };
        assert!(reserved.tokens > 0);
        let upstream_saw = self.seen.load(Ordering::SeqCst);
        self.log
            .lock()
            .unwrap()
            .push(("intent".into(), upstream_saw));
        match self.refuse {
            Some(why) => Err(why()),
            None => Ok(()),
        }
    }
}

/// An upstream on loopback that counts connections and answers one
/// chat completion to each.
async fn upstream() -> (String, Arc<AtomicUsize>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let seen = Arc::new(AtomicUsize::new(0));
    let n = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            n.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let _ = c.read(&mut buf).await;
                let body = r#"{"id":"x","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}"#;
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = c.write_all(head.as_bytes()).await;
                let _ = c.write_all(body.as_bytes()).await;
            });
        }
    });
    (url, seen)
}

async fn gateway(refuse: Option<fn() -> IntentError>) -> (Arc<Gateway>, Arc<Sink>) {
    gateway_with(refuse, None).await
}

async fn gateway_with(
    refuse: Option<fn() -> IntentError>,
    policy: Option<Arc<dyn CallPolicy>>,
) -> (Arc<Gateway>, Arc<Sink>) {
    let (url, seen) = upstream().await;
    let store = Arc::new(GatewayStore::open_in_memory().await.unwrap());
    let caller = Caller {
        session: "ses_a".into(),
        tenant: None,
    };
    store
        .add_key(&crate::calls::key_hash("sk-test-key"), &caller, u64::MAX)
        .await
        .unwrap();
    store
        .set_limits("session:ses_a", Some(100_000), None)
        .await
        .unwrap();
    let sink = Arc::new(Sink {
        refuse,
        seen,
        log: Mutex::new(vec![]),
    });
    let price = Price {
        input_cents_per_mtok: 100,
        output_cents_per_mtok: 100,
    };
    let g = Arc::new(Gateway {
        store: store.clone(),
        keys: store,
        prices: Prices {
            models: Default::default(),
            default: Some(price),
        },
        openai: Some(
            Upstream::new(Flavor::OpenAi, &url, "upstream-key", Duration::from_secs(5)).unwrap(),
        ),
        anthropic: None,
        max_output_tokens: 64,
        max_body: 1 << 16,
        reservation_ttl_ms: 300_000,
        trust_sandbox_header: false,
        admin_key: "k".repeat(16),
        metrics: Default::default(),
        events: sink.clone(),
        policy,
    });
    (g, sink)
}

async fn one_call(g: &Arc<Gateway>) -> axum::http::StatusCode {
    let mut h = HeaderMap::new();
    h.insert(
        "authorization",
        HeaderValue::from_static("Bearer sk-test-key"),
    );
    let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
    let r = crate::calls::call(
        g.clone(),
        Flavor::OpenAi,
        "/v1/chat/completions",
        h,
        Body::from(body),
    )
    .await;
    let status = r.status();
    let _ = axum::body::to_bytes(r.into_body(), 1 << 20).await;
    status
}

/// The intent is written while the upstream has seen nothing, then the
/// call goes out and is settled.
#[tokio::test]
async fn the_intent_is_written_before_the_upstream_is_dialled() {
    let (g, sink) = gateway(None).await;
    assert_eq!(one_call(&g).await, 200);
    for _ in 0..200 {
        if sink.log.lock().unwrap().iter().any(|(n, _)| n == "called") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let log = sink.log.lock().unwrap().clone();
    assert_eq!(log[0], ("intent".to_string(), 0), "{log:?}");
    assert!(log.iter().any(|(n, _)| n == "called"), "{log:?}");
    assert_eq!(sink.seen.load(Ordering::SeqCst), 1);
}

/// An intent the log refuses keeps the call from the upstream, answers
/// 409 `session_ended` or 503 `log_unavailable`, and frees the
/// reservation without charging it.
#[tokio::test]
async fn a_refused_intent_keeps_the_call_from_the_upstream() {
    for (why, status) in [
        ((|| IntentError::SessionEnded) as fn() -> IntentError, 409),
        (|| IntentError::NotRecorded("store down".into()), 503),
    ] {
        let (g, sink) = gateway(Some(why)).await;
        assert_eq!(one_call(&g).await, status);
        assert_eq!(
            sink.seen.load(Ordering::SeqCst),
            0,
            "the upstream was dialled"
        );
        let b = g.store.get("session:ses_a").await.unwrap();
        assert_eq!((b.used_tokens, b.reserved_tokens), (0, 0), "{b:?}");
    }
}

/// Only the allowed beta flags reach the upstream: a long-context flag
/// (priced beyond the estimate) is dropped from a list, and a header of
/// unknown flags only is not sent at all; the version always is.
#[test]
fn only_allowed_anthropic_betas_are_passed_on() {
    let mut h = HeaderMap::new();
    h.insert("anthropic-version", HeaderValue::from_static("2023-06-01"));
    h.append(
        "anthropic-beta",
        HeaderValue::from_static("context-1m-2025-08-07, prompt-caching-2024-07-31"),
    );
    h.append(
        "anthropic-beta",
        HeaderValue::from_static("token-efficient-tools-2025-02-19"),
    );
    h.insert("x-api-key", HeaderValue::from_static("caller-key"));
    let passed = super::pass_headers(Flavor::Anthropic, &h);
    assert_eq!(
        passed,
        vec![
            ("anthropic-version", "2023-06-01".to_string()),
            (
                "anthropic-beta",
                "prompt-caching-2024-07-31,token-efficient-tools-2025-02-19".to_string()
            ),
        ]
    );
    let mut h = HeaderMap::new();
    h.insert(
        "anthropic-beta",
        HeaderValue::from_static("context-1m-2025-08-07,files-api-2025-04-14"),
    );
    assert!(super::pass_headers(Flavor::Anthropic, &h).is_empty());
    // Not an Anthropic header on the OpenAI API.
    h.insert(
        "anthropic-beta",
        HeaderValue::from_static("prompt-caching-2024-07-31"),
    );
    assert!(super::pass_headers(Flavor::OpenAi, &h).is_empty());
}

/// A policy that holds each call until the test answers it, as the
/// daemon's does while a person decides (crate::policy).
struct Held {
    asked: tokio::sync::mpsc::UnboundedSender<tokio::sync::oneshot::Sender<Verdict>>,
}

#[async_trait::async_trait]
impl CallPolicy for Held {
    async fn model_call(
        &self,
        _: &Caller,
        _: &str,
        _: crate::budget::Amount,
    ) -> Result<Verdict, PolicyCheckError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.asked.send(tx).unwrap();
        Ok(rx.await.unwrap())
    }
}

/// A held call reserves nothing and reaches nobody while it waits; its
/// verdict then decides: approved, it goes out (intent first); timed out
/// or past the cap of open approvals, it is refused with its own code.
#[tokio::test]
async fn a_held_call_waits_unreserved_then_goes_or_is_refused() {
    let (tx, mut asked) = tokio::sync::mpsc::unbounded_channel();
    let (g, sink) = gateway_with(None, Some(Arc::new(Held { asked: tx }))).await;
    for (verdict, status, code) in [
        (Verdict::Allow, 200, "called"),
        (
            Verdict::ApprovalTimedOut {
                rule: Some("ask".into()),
                approval_id: "apr_model_x".into(),
            },
            403,
            "approval_timeout",
        ),
        (
            Verdict::TooManyApprovals { open: 8 },
            503,
            "too_many_approvals",
        ),
    ] {
        sink.log.lock().unwrap().clear();
        let call = tokio::spawn({
            let g = g.clone();
            async move { one_call(&g).await }
        });
        let answer = asked.recv().await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let b = g.store.get("session:ses_a").await.unwrap();
        assert_eq!(b.reserved_tokens, 0, "a held call reserved {b:?}");
        assert!(sink.log.lock().unwrap().is_empty(), "no intent while held");
        let seen = sink.seen.load(Ordering::SeqCst);
        answer.send(verdict).unwrap();
        assert_eq!(call.await.unwrap(), status);
        for _ in 0..200 {
            if sink.log.lock().unwrap().iter().any(|(n, _)| n == code) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let log = sink.log.lock().unwrap().clone();
        assert!(log.iter().any(|(n, _)| n == code), "{code}: {log:?}");
        let went = sink.seen.load(Ordering::SeqCst) - seen;
        assert_eq!(went, usize::from(status == 200), "{code}: upstream calls");
    }
}
