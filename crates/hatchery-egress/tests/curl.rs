//! The proxy with real curl against HTTP servers on loopback. The policy
//! allows 127.0.0.1/32 on the test server's port only through an explicit
//! CIDR rule (the test-only rule the special-range check requires).

use hatchery_egress::{EgressEvent, Identify, Limits, PolicySource, Proxy, Verdict};
use hatchery_policy::{Policy, PolicyDocument};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Every connection on this listener is one session (as a per-session
/// sandbox-local endpoint would be).
struct OneSession(&'static str);

#[async_trait::async_trait]
impl Identify for OneSession {
    async fn identify(&self, _peer: SocketAddr, _local: SocketAddr) -> Option<String> {
        Some(self.0.to_string())
    }
}

struct Pinned(HashMap<String, Arc<Policy>>);

#[async_trait::async_trait]
impl PolicySource for Pinned {
    async fn policy_for(
        &self,
        session: &str,
    ) -> Result<hatchery_egress::SessionPolicy, hatchery_egress::SourceError> {
        self.0
            .get(session)
            .cloned()
            .map(Into::into)
            .ok_or_else(|| format!("no pinned policy for {session}").into())
    }
}

/// A tiny HTTP/1.1 origin: answers every request with its request line.
async fn origin() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = l.accept().await.unwrap();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&buf).to_string();
                let body = format!(
                    "origin saw: {}\nhost: {}\n",
                    head.lines().next().unwrap_or(""),
                    head.lines()
                        .find(|l| l.to_ascii_lowercase().starts_with("host:"))
                        .unwrap_or("")
                );
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
            });
        }
    });
    addr
}

fn policy(json: serde_json::Value) -> Arc<Policy> {
    let d: PolicyDocument = serde_json::from_value(json).unwrap();
    Arc::new(Policy::compile(&d).unwrap())
}

struct Setup {
    handle: Arc<Proxy>,
    proxy: SocketAddr,
    origin: SocketAddr,
    events: Arc<Mutex<Vec<EgressEvent>>>,
}

async fn setup(session: &'static str, limits: Limits) -> Setup {
    let origin = origin().await;
    let mut pinned = HashMap::new();
    pinned.insert(
        "ses_ok".to_string(),
        policy(serde_json::json!({"name": "t", "rules": [
            {"id": "test-loopback", "effect": "allow", "match": {"tools": ["egress"], "hosts": ["127.0.0.1/32"], "ports": [origin.port()]}},
            {"id": "localhost-by-name", "effect": "allow", "match": {"tools": ["egress"], "hosts": ["localhost"]}}
        ]})),
    );
    let events = Arc::new(Mutex::new(Vec::new()));
    let ev = events.clone();
    let proxy = Proxy::new(
        Arc::new(OneSession(session)),
        Arc::new(Pinned(pinned)),
        Arc::new(move |e| ev.lock().unwrap().push(e)),
        limits,
    );
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(proxy.clone().serve(l));
    Setup {
        handle: proxy,
        proxy: addr,
        origin,
        events,
    }
}

async fn curl(args: Vec<String>) -> (i32, String, String) {
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new("curl")
            .args(["-sS", "--max-time", "30", "--noproxy", ""])
            .args(&args)
            .env_remove("http_proxy")
            .env_remove("https_proxy")
            .env_remove("HTTP_PROXY")
            .env_remove("HTTPS_PROXY")
            .env_remove("ALL_PROXY")
            .output()
            .expect("curl runs");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn curl_through_connect_and_forward() {
    let s = setup("ses_ok", Limits::default()).await;
    let proxy = format!("http://{}", s.proxy);
    let url = format!("http://127.0.0.1:{}/hello?x=1", s.origin.port());
    // Plain-HTTP forward: the origin sees origin-form and its own Host.
    let (rc, out, err) = curl(vec!["-x".into(), proxy.clone(), url.clone()]).await;
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("origin saw: GET /hello?x=1 HTTP/1.1"), "{out}");
    assert!(
        out.contains(&format!("host: Host: 127.0.0.1:{}", s.origin.port())),
        "{out}"
    );
    // CONNECT tunnel.
    let (rc, out, err) = curl(vec!["-p".into(), "-x".into(), proxy.clone(), url.clone()]).await;
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("origin saw: GET /hello?x=1 HTTP/1.1"), "{out}");
    let ev = s.events.lock().unwrap().clone();
    assert_eq!(ev.len(), 2, "{ev:?}");
    for e in &ev {
        assert_eq!(e.verdict, Verdict::Allowed);
        assert_eq!(e.rule_id.as_deref(), Some("test-loopback"));
        assert_eq!(e.ip, Some("127.0.0.1".parse().unwrap()));
        assert_eq!(e.session.as_deref(), Some("ses_ok"));
    }
    let m = s.handle.metrics().render();
    assert!(
        m.contains(r#"hatchery_egress_connections_total{status="200",verdict="allowed"} 2"#),
        "{m}"
    );
    // The relays wind down just after curl exits.
    for _ in 0..200 {
        if s.handle.metrics().tunnels_open.get() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(s.handle.metrics().tunnels_open.get(), 0);
    assert!(s.handle.metrics().bytes.with_label_values(&["down"]).get() > 0);
}

#[tokio::test]
async fn denials_fail_closed_with_an_event() {
    let s = setup("ses_ok", Limits::default()).await;
    let proxy = format!("http://{}", s.proxy);
    // A port the policy does not name.
    let other = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let other_url = format!("http://127.0.0.1:{}/", other.local_addr().unwrap().port());
    let (rc, _, err) = curl(vec!["-p".into(), "-x".into(), proxy.clone(), other_url]).await;
    assert_ne!(rc, 0);
    assert!(err.contains("403"), "{err}");
    // A name rule never reaches a special address, even when it resolves to one.
    // (A port the CIDR rule does not name, so only the name rule matches.)
    let by_name = format!("http://localhost:{}/", other.local_addr().unwrap().port());
    let (rc, _, err) = curl(vec!["-p".into(), "-x".into(), proxy.clone(), by_name]).await;
    assert_ne!(rc, 0, "localhost allowed by name");
    assert!(err.contains("403"), "{err}");
    // The metadata address.
    let (rc, _, err) = curl(vec![
        "-p".into(),
        "-x".into(),
        proxy.clone(),
        "http://169.254.169.254/".into(),
    ])
    .await;
    assert_ne!(rc, 0);
    assert!(err.contains("403"), "{err}");
    let ev = s.events.lock().unwrap().clone();
    assert_eq!(ev.len(), 3, "{ev:?}");
    assert!(
        ev.iter()
            .all(|e| e.verdict == Verdict::Denied && e.status == 403),
        "{ev:?}"
    );
    assert!(ev[0].reason.contains("default deny"), "{:?}", ev[0]);
    assert!(ev[1].reason.contains("loopback"), "{:?}", ev[1]);
    assert_eq!(ev[1].rule_id.as_deref(), Some("localhost-by-name"));
    assert!(ev[2].reason.contains("default deny"), "{:?}", ev[2]);

    // No pinned policy for the session: fail closed.
    let s2 = setup("ses_unknown", Limits::default()).await;
    let url = format!("http://127.0.0.1:{}/", s2.origin.port());
    let (rc, _, err) = curl(vec![
        "-p".into(),
        "-x".into(),
        format!("http://{}", s2.proxy),
        url,
    ])
    .await;
    assert_ne!(rc, 0);
    assert!(err.contains("503"), "{err}");
    let ev = s2.events.lock().unwrap().clone();
    assert_eq!(
        (ev.len(), ev[0].verdict, ev[0].status),
        (1, Verdict::Denied, 503),
        "{ev:?}"
    );
}

/// Raw requests curl would not send.
async fn raw(proxy: SocketAddr, req: &[u8]) -> String {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    let _ = s.write_all(req).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).to_string()
}

#[tokio::test]
async fn bad_input_is_refused() {
    let s = setup(
        "ses_ok",
        Limits {
            max_head_bytes: 8192,
            ..Limits::default()
        },
    )
    .await;
    let port = s.origin.port();
    for (req, status) in [
        (format!("CONNECT 127.0.0.1:{port}  HTTP/1.1\r\n\r\n"), "400"),
        (format!("CONNECT 127.0.0.1:{port}\r\n\r\n"), "400"),
        ("CONNECT 2130706433:80 HTTP/1.1\r\n\r\n".to_string(), "400"),
        ("CONNECT 0177.0.0.1:80 HTTP/1.1\r\n\r\n".to_string(), "400"),
        ("CONNECT 0x7f.0.0.1:80 HTTP/1.1\r\n\r\n".to_string(), "400"),
        ("CONNECT localhost.:80 HTTP/1.1\r\n\r\n".to_string(), "400"),
        (
            "CONNECT b\u{fc}cher.de:443 HTTP/1.1\r\n\r\n".to_string(),
            "400",
        ),
        (
            format!("GET http://user:pw@127.0.0.1:{port}/ HTTP/1.1\r\n\r\n"),
            "400",
        ),
        (
            format!("CONNECT [::ffff:127.0.0.1]:{port} HTTP/1.1\r\n\r\n"),
            "403",
        ),
        (
            "CONNECT [64:ff9b::a9fe:a9fe]:80 HTTP/1.1\r\n\r\n".to_string(),
            "403",
        ),
        (
            format!(
                "GET http://127.0.0.1:{port}/ HTTP/1.1\r\nX: {}\r\n\r\n",
                "a".repeat(9000)
            ),
            "431",
        ),
    ] {
        let got = raw(s.proxy, req.as_bytes()).await;
        assert!(
            got.starts_with(&format!("HTTP/1.1 {status} ")),
            "{req:.80}: {got:.200}"
        );
    }
    let ev = s.events.lock().unwrap().clone();
    assert_eq!(ev.len(), 11, "an event per refusal");
    assert!(ev.iter().all(|e| e.verdict == Verdict::Denied));
}

#[tokio::test]
async fn tunnel_caps_and_idle_timeout() {
    let s = setup(
        "ses_ok",
        Limits {
            max_tunnels_per_session: 1,
            idle: Duration::from_secs(2),
            ..Limits::default()
        },
    )
    .await;
    let port = s.origin.port();
    // An open tunnel that sends nothing holds the session's only slot...
    let mut first = TcpStream::connect(s.proxy).await.unwrap();
    first
        .write_all(format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = [0u8; 64];
    let n = first.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    let second = raw(
        s.proxy,
        format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(second.starts_with("HTTP/1.1 429 "), "{second}");
    // ...until the idle limit closes it; then the slot is free again.
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(30), first.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "idle tunnel was not closed");
    let mut freed = false;
    for _ in 0..100 {
        let mut c = TcpStream::connect(s.proxy).await.unwrap();
        c.write_all(format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let n = c.read(&mut buf).await.unwrap_or(0);
        if String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200") {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(freed, "the slot was not released");
}
