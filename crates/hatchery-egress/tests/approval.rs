//! Held connections against a real origin on loopback, with an approver
//! that answers what the test tells it: nothing is dialled before the
//! answer, an approval lets the tunnel through, a denial or a timeout is
//! a 403 with a refusal event, and a proxy with no approver refuses.

use hatchery_egress::{
    Answer, ApprovalAsk, Approver, EgressEvent, Identify, Limits, PolicySource, Proxy, SourceError,
    Verdict,
};
use hatchery_policy::{Policy, PolicyDocument};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

struct OneSession;

#[async_trait::async_trait]
impl Identify for OneSession {
    async fn identify(&self, _: SocketAddr, _: SocketAddr) -> Option<String> {
        Some("ses_a".into())
    }
}

struct Fixed(Arc<Policy>);

#[async_trait::async_trait]
impl PolicySource for Fixed {
    async fn policy_for(&self, _: &str) -> Result<hatchery_egress::SessionPolicy, SourceError> {
        Ok(self.0.clone().into())
    }
}

/// Answers with `answer` and keeps every question.
struct Scripted {
    answer: Answer,
    asked: Mutex<Vec<ApprovalAsk>>,
}

#[async_trait::async_trait]
impl Approver for Scripted {
    async fn ask(&self, ask: ApprovalAsk) -> Result<Answer, SourceError> {
        self.asked.lock().unwrap().push(ask);
        Ok(self.answer.clone())
    }
}

/// An origin that counts the connections it accepted and answers "hi".
async fn origin() -> (SocketAddr, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let n = Arc::new(AtomicUsize::new(0));
    let seen = n.clone();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = l.accept().await.unwrap();
            seen.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut b = [0u8; 1024];
                let _ = s.read(&mut b).await;
                let _ = s
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nhi\n",
                    )
                    .await;
            });
        }
    });
    (addr, n)
}

async fn proxy(
    origin: SocketAddr,
    approver: Option<Arc<Scripted>>,
) -> (SocketAddr, Arc<Mutex<Vec<EgressEvent>>>) {
    let doc: PolicyDocument = serde_json::from_value(serde_json::json!({"name": "t", "rules": [
        {"id": "ask-loopback", "effect": "require_approval", "approval_timeout_s": 7,
         "match": {"tools": ["egress"], "hosts": ["127.0.0.1/32"], "ports": [origin.port()]}}
    ]}))
    .unwrap();
    let events = Arc::new(Mutex::new(Vec::new()));
    let ev = events.clone();
    let p = Proxy::new(
        Arc::new(OneSession),
        Arc::new(Fixed(Arc::new(Policy::compile(&doc).unwrap()))),
        Arc::new(move |e| ev.lock().unwrap().push(e)),
        Limits::default(),
    );
    if let Some(a) = approver {
        p.set_approver(a);
    }
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(p.serve(l));
    (addr, events)
}

/// Sends `head` to the proxy and reads everything it answers.
async fn exchange(proxy: SocketAddr, head: String) -> String {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).into_owned()
}

fn get(origin: SocketAddr) -> String {
    format!("GET http://{origin}/simple/pkg/?token=x HTTP/1.1\r\nHost: {origin}\r\n\r\n")
}

#[tokio::test]
async fn an_approved_request_goes_through_and_the_question_has_method_and_path() {
    let (o, dialled) = origin().await;
    let a = Arc::new(Scripted {
        answer: Answer::Approved {
            approval_id: "apr_1".into(),
            remembered: false,
        },
        asked: Mutex::default(),
    });
    let (p, events) = proxy(o, Some(a.clone())).await;
    let out = exchange(p, get(o)).await;
    assert!(
        out.starts_with("HTTP/1.1 200") && out.ends_with("hi\n"),
        "{out}"
    );
    assert_eq!(dialled.load(Ordering::SeqCst), 1);
    let asked = a.asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 1);
    let q = &asked[0];
    assert_eq!((q.host.as_str(), q.port), ("127.0.0.1", o.port()));
    assert_eq!(q.method.as_deref(), Some("GET"));
    // The query is not shown to the person deciding.
    assert_eq!(q.path.as_deref(), Some("/simple/pkg/"));
    assert_eq!(
        (q.rule_id.as_str(), q.timeout.as_secs()),
        ("ask-loopback", 7)
    );
    let e = events.lock().unwrap().clone();
    assert_eq!(e.len(), 1);
    assert_eq!(e[0].verdict, Verdict::Allowed);
    assert_eq!(e[0].reason, "allowed by approval apr_1");
}

#[tokio::test]
async fn a_connect_is_asked_by_host_and_port_only() {
    let (o, _) = origin().await;
    let a = Arc::new(Scripted {
        answer: Answer::Approved {
            approval_id: "apr_2".into(),
            remembered: true,
        },
        asked: Mutex::default(),
    });
    let (p, events) = proxy(o, Some(a.clone())).await;
    let mut s = TcpStream::connect(p).await.unwrap();
    s.write_all(format!("CONNECT {o} HTTP/1.1\r\nHost: {o}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut b = [0u8; 64];
    let n = s.read(&mut b).await.unwrap();
    assert!(
        b[..n].starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&b[..n])
    );
    let q = a.asked.lock().unwrap()[0].clone();
    assert_eq!((q.method, q.path), (None, None));
    assert!(events.lock().unwrap()[0].reason.contains("remembered"));
}

#[tokio::test]
async fn denied_and_timed_out_are_refused_before_any_dial() {
    for (answer, why) in [
        (
            Answer::Denied {
                approval_id: "apr_3".into(),
                note: "not today".into(),
            },
            "denied by approval apr_3: not today",
        ),
        (
            Answer::TimedOut {
                approval_id: "apr_4".into(),
            },
            "approval apr_4 not decided within 7 s",
        ),
    ] {
        let (o, dialled) = origin().await;
        let a = Arc::new(Scripted {
            answer,
            asked: Mutex::default(),
        });
        let (p, events) = proxy(o, Some(a)).await;
        let out = exchange(p, get(o)).await;
        assert!(out.starts_with("HTTP/1.1 403"), "{out}");
        assert!(out.contains(why), "{out}");
        assert_eq!(dialled.load(Ordering::SeqCst), 0, "dialled before approval");
        let e = events.lock().unwrap().clone();
        assert_eq!(e.len(), 1);
        assert_eq!((e[0].verdict, e[0].status), (Verdict::Denied, 403));
        assert_eq!(e[0].rule_id.as_deref(), Some("ask-loopback"));
    }
}

#[tokio::test]
async fn without_an_approver_a_held_destination_is_refused() {
    let (o, dialled) = origin().await;
    let (p, _) = proxy(o, None).await;
    let out = exchange(p, get(o)).await;
    assert!(
        out.starts_with("HTTP/1.1 403") && out.contains("asks no one"),
        "{out}"
    );
    assert_eq!(dialled.load(Ordering::SeqCst), 0);
}
