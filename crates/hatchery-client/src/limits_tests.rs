//! The client's time and size bounds, against a loopback peer that
//! misbehaves on purpose (answers too much, too slowly, or not at all).

use crate::{Client, ClientConfig, ClientError, ExecRequest};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A one-connection-at-a-time HTTP peer: reads a request head, then writes
/// `answer` (and keeps the socket open for `hold`).
async fn peer(answer: Vec<u8>, hold: Duration) -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = s.write_all(&answer).await;
                tokio::time::sleep(hold).await;
            });
        }
    });
    format!("http://{addr}")
}

fn config() -> ClientConfig {
    ClientConfig::default()
        .call_timeout(Duration::from_millis(500))
        .stream_idle_timeout(Duration::from_millis(500))
        .max_json_bytes(1024)
        .max_sse_line(256)
}

#[tokio::test]
async fn an_oversized_answer_is_cut_off() {
    let body = format!("{{\"status\":\"ok\",\"pad\":\"{}\"}}", "x".repeat(4096));
    let answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let url = peer(answer.into_bytes(), Duration::from_secs(5)).await;
    let c = Client::with_config(&url, "k", config()).unwrap();
    let e = c.health().await.unwrap_err();
    assert!(
        matches!(e, ClientError::TooLarge { limit: 1024, .. }),
        "{e}"
    );
    assert_eq!(e.call(), Some(("GET", "/healthz")));
}

#[tokio::test]
async fn a_silent_daemon_times_out() {
    let url = peer(Vec::new(), Duration::from_secs(30)).await;
    let c = Client::with_config(&url, "k", config()).unwrap();
    let e = c.list_templates().await.unwrap_err();
    assert!(e.is_timeout() && e.is_transport(), "{e}");
}

#[tokio::test]
async fn a_silent_stream_times_out_and_long_lines_are_refused() {
    let head =
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
    let chunk = |s: &str| format!("{:x}\r\n{s}\r\n", s.len());
    // One event, then nothing: the idle timeout ends it.
    let answer = format!(
        "{head}{}",
        chunk("event: stdout\ndata: {\"data\":\"hi\"}\n\n")
    );
    let url = peer(answer.into_bytes(), Duration::from_secs(30)).await;
    let c = Client::with_config(&url, "k", config()).unwrap();
    let mut s = c
        .exec_stream("sbx_x", &ExecRequest::cmd("true"))
        .await
        .unwrap();
    assert_eq!(
        s.next().await.unwrap(),
        Some(crate::ExecEvent::Stdout("hi".into()))
    );
    let e = s.next().await.unwrap_err();
    assert!(e.is_timeout(), "{e}");

    // A line longer than max_sse_line without a newline.
    let answer = format!("{head}{}", chunk(&format!("data: {}", "y".repeat(600))));
    let url = peer(answer.into_bytes(), Duration::from_secs(30)).await;
    let c = Client::with_config(&url, "k", config()).unwrap();
    let mut s = c
        .exec_stream("sbx_x", &ExecRequest::cmd("true"))
        .await
        .unwrap();
    let e = s.next().await.unwrap_err();
    assert!(matches!(e, ClientError::Sse { .. }), "{e}");
}

#[tokio::test]
async fn an_error_answer_and_a_stream_error_event_are_typed() {
    let body = r#"{"error":{"code":"capacity","message":"no room"}}"#;
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let url = peer(answer.into_bytes(), Duration::from_millis(10)).await;
    let c = Client::with_config(&url, "k", config()).unwrap();
    let e = c.create_sandbox(&Default::default()).await.unwrap_err();
    assert!(e.is_capacity(), "{e}");
    assert_eq!(e.call(), Some(("POST", "/v1/sandboxes")));

    let ev =
        "event: error\ndata: {\"error\":{\"code\":\"sandbox_not_found\",\"message\":\"gone\"}}\n\n";
    let answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n{ev}",
        ev.len()
    );
    let url = peer(answer.into_bytes(), Duration::from_millis(10)).await;
    let c = Client::with_config(&url, "k", config()).unwrap();
    let mut s = c
        .exec_stream("sbx_x", &ExecRequest::cmd("true"))
        .await
        .unwrap();
    let e = s.next().await.unwrap_err();
    assert!(matches!(e, ClientError::Stream { .. }), "{e}");
    assert_eq!(e.code(), Some("sandbox_not_found"));
}

#[tokio::test]
async fn nothing_listening_is_a_connect_error() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    let c = Client::with_config(&format!("http://{addr}"), "k", config()).unwrap();
    let e = c.health().await.unwrap_err();
    assert!(matches!(e, ClientError::Connect { .. }), "{e}");
    let t0 = std::time::Instant::now();
    let e = c
        .wait_healthy(Duration::from_millis(400))
        .await
        .unwrap_err();
    assert!(e.is_transport(), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(10));
}
