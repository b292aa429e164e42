//! The GET stream's listener against hostile and well-behaved servers
//! written here on a loopback port (raw HTTP/1.1, so a test can send what
//! no server library would: an endless event, a flood). The real `mcp`
//! SDK server is tests/broker/test_broker_mcp_http.py's.

use super::*;
use crate::http_client::Trust;
use crate::mcp_http::HttpSpec;
use std::collections::BTreeMap;
use std::sync::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What the test server answers one request with: `head` (status line,
/// headers, maybe a body), then `repeat` written again and again until the
/// client goes away (an endless stream), then the connection is closed.
struct Reply {
    head: Vec<u8>,
    repeat: Option<Vec<u8>>,
}

fn sse(events: &str) -> Reply {
    Reply {
        head: format!("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n{events}")
            .into_bytes(),
        repeat: None,
    }
}

type Seen = Arc<Mutex<Vec<(String, String)>>>;

/// A server on a loopback port; every request's head and body are kept.
async fn server(respond: impl Fn(&str, usize) -> Reply + Send + Sync + 'static) -> (u16, Seen) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let seen: Seen = Arc::default();
    let (respond, kept) = (Arc::new(respond), seen.clone());
    tokio::spawn(async move {
        loop {
            let Ok((mut c, _)) = l.accept().await else {
                return;
            };
            let (respond, kept) = (respond.clone(), kept.clone());
            tokio::spawn(async move {
                let mut buf = vec![];
                let mut b = [0u8; 4096];
                let end = loop {
                    let n = c.read(&mut b).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&b[..n]);
                    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i + 4;
                    }
                };
                let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                let len = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                while buf.len() < end + len {
                    let n = c.read(&mut b).await.unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    buf.extend_from_slice(&b[..n]);
                }
                let body = String::from_utf8_lossy(&buf[end..]).to_string();
                let n = {
                    let mut k = kept.lock().unwrap();
                    k.push((head.clone(), body));
                    k.len() - 1
                };
                let r = respond(&head, n);
                if c.write_all(&r.head).await.is_err() {
                    return;
                }
                if let Some(chunk) = r.repeat {
                    while c.write_all(&chunk).await.is_ok() {}
                }
            });
        }
    });
    (port, seen)
}

fn session(port: u16) -> Session {
    let spec = HttpSpec::new(
        &format!("http://127.0.0.1:{port}/mcp"),
        &BTreeMap::from([("Authorization".to_string(), "Bearer t".to_string())]),
        Arc::new(Trust::default()),
    )
    .unwrap();
    Session {
        spec,
        id: Some(HeaderValue::from_static("sess-1")),
        protocol: Some(HeaderValue::from_static("2025-06-18")),
    }
}

fn quick() -> Limits {
    Limits {
        max_event_bytes: 4096,
        max_messages_per_minute: 50,
        tries: 3,
        stable: Duration::from_secs(60),
        retry_min: Duration::from_millis(10),
        retry_max: Duration::from_millis(50),
        open_timeout: Duration::from_secs(5),
    }
}

fn resume() -> Resume {
    Resume {
        last_id: None,
        retry: Duration::from_millis(10),
    }
}

/// Within 20 s, or the test fails (nothing here may hang).
async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .expect("bounded in time")
}

/// One stream from the test server on `port`, with the quick limits and
/// no resume state, bounded in time.
async fn listen_at(port: u16, pushed: &AtomicBool) -> End {
    bounded(listen_once(
        "s",
        &session(port),
        pushed,
        &quick(),
        &mut resume(),
    ))
    .await
}

#[tokio::test]
async fn a_405_means_not_offered_and_no_second_try() {
    let (port, seen) = server(|_, _| Reply {
        head: b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n".to_vec(),
        repeat: None,
    })
    .await;
    let flag = AtomicBool::new(false);
    let opened = bounded(run("s", &session(port), &flag, &quick())).await;
    assert_eq!(opened, 1);
    let seen = seen.lock().unwrap();
    let (head, _) = &seen[0];
    assert!(head.starts_with("get /mcp http/1.1"), "{head}");
    for h in [
        "accept: text/event-stream",
        "mcp-session-id: sess-1",
        "mcp-protocol-version: 2025-06-18",
        "authorization: bearer t",
    ] {
        assert!(head.contains(h), "{h} in {head}");
    }
}

#[tokio::test]
async fn an_endless_event_ends_the_stream_at_the_cap() {
    // `data: xxxx...` without end: the parser's buffer stops at the cap.
    let (port, _) = server(|_, _| Reply {
        head: b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\ndata: ".to_vec(),
        repeat: Some(vec![b'x'; 8192]),
    })
    .await;
    let flag = AtomicBool::new(false);
    let end = listen_at(port, &flag).await;
    assert!(
        matches!(end, End::Failed(McpError::TooLarge(4096))),
        "{end:?}"
    );
    // As many `data:` lines as it takes: the event's total counts.
    let (port, _) = server(|_, _| Reply {
        head: b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n".to_vec(),
        repeat: Some(format!("data: {}\n", "y".repeat(1000)).into_bytes()),
    })
    .await;
    let end = listen_at(port, &flag).await;
    assert!(
        matches!(end, End::Failed(McpError::TooLarge(4096))),
        "{end:?}"
    );
}

#[tokio::test]
async fn a_flood_of_messages_ends_the_stream() {
    let (port, _) = server(|_, _| Reply {
        head: b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n".to_vec(),
        repeat: Some(
            b"data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\"}\n\n".to_vec(),
        ),
    })
    .await;
    let flag = AtomicBool::new(false);
    let end = listen_at(port, &flag).await;
    assert!(
        matches!(&end, End::Failed(McpError::Protocol(m)) if m.contains("more than 50 messages")),
        "{end:?}"
    );
    assert!(!flag.load(Ordering::Relaxed));
}

#[tokio::test]
async fn a_closed_stream_is_reopened_with_the_last_event_id_then_given_up() {
    // Each stream: a priming event, the tool list changed, then closed.
    let (port, seen) = server(|_, n| {
        sse(&format!(
            "id: ev-{n}\nretry: 5\ndata:\n\n: keep-alive\nevent: message\nid: ev-{n}b\ndata: {{\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}}\n\n"
        ))
    })
    .await;
    let flag = AtomicBool::new(false);
    let opened = bounded(run("s", &session(port), &flag, &quick())).await;
    assert_eq!(opened, 3, "gave up after `tries` early ends");
    assert!(flag.load(Ordering::Relaxed));
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 3);
    assert!(!seen[0].0.contains("last-event-id"), "{}", seen[0].0);
    assert!(seen[1].0.contains("last-event-id: ev-0b"), "{}", seen[1].0);
    assert!(seen[2].0.contains("last-event-id: ev-1b"), "{}", seen[2].0);
}

#[tokio::test]
async fn server_requests_are_refused_except_ping_and_never_run() {
    let (port, seen) = server(|head, _| {
        if head.starts_with("post ") {
            Reply {
                head: b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n".to_vec(),
                repeat: None,
            }
        } else {
            sse(concat!(
                "data: {\"jsonrpc\":\"2.0\",\"id\":\"s1\",\"method\":\"sampling/createMessage\",",
                "\"params\":{\"messages\":[],\"maxTokens\":5}}\n\n",
                "data: {\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"ping\"}\n\n",
                "data: {\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{}}\n\n",
                "data: not json\n\n",
            ))
        }
    })
    .await;
    let flag = AtomicBool::new(false);
    let end = listen_at(port, &flag).await;
    assert!(matches!(end, End::Closed), "{end:?}");
    let seen = seen.lock().unwrap();
    let posts: Vec<Value> = seen
        .iter()
        .filter(|(h, _)| h.starts_with("post "))
        .map(|(h, b)| {
            assert!(h.contains("mcp-session-id: sess-1"), "{h}");
            serde_json::from_str(b).unwrap()
        })
        .collect();
    assert_eq!(posts.len(), 2, "{posts:?}");
    assert_eq!(posts[0]["id"], "s1");
    assert_eq!(posts[0]["error"]["code"], -32601);
    assert!(posts[0].get("result").is_none());
    assert_eq!(posts[1]["id"], 7);
    assert_eq!(posts[1]["result"], serde_json::json!({}));
}

#[tokio::test]
async fn a_stream_that_is_not_an_event_stream_fails() {
    let (port, _) = server(|_, _| Reply {
        head: b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
            .to_vec(),
        repeat: None,
    })
    .await;
    let flag = AtomicBool::new(false);
    let end = listen_at(port, &flag).await;
    assert!(matches!(end, End::Failed(McpError::Protocol(_))), "{end:?}");
    // A session the server no longer knows: stop, the POSTs start anew.
    let (port, _) = server(|_, _| Reply {
        head: b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".to_vec(),
        repeat: None,
    })
    .await;
    assert_eq!(bounded(run("s", &session(port), &flag, &quick())).await, 1);
}

#[test]
fn events_are_parsed_across_chunks() {
    let mut p = SseParser::new(100);
    assert!(p.push(b"id: 1\r\nda").unwrap().is_empty());
    assert!(p.push(b"ta: {\"a\":\ndata:1}\r").unwrap().is_empty());
    let ev = p.push(b"\n\r\nretry: 250\n\n: c\n\nid: x\0y\n\n").unwrap();
    assert_eq!(
        ev,
        vec![
            SseEvent {
                data: "{\"a\":\n1}".into(),
                id: Some("1".into()),
                retry: None
            },
            SseEvent {
                data: String::new(),
                id: None,
                retry: Some(Duration::from_millis(250))
            },
        ]
    );
    // The event's data and the line being read count together: at the
    // cap is fine, one byte over is not.
    let mut p = SseParser::new(10);
    assert!(p.push(b"data:1234\n").is_ok());
    assert!(p.push(b"data:1").is_ok());
    assert!(matches!(p.push(b"2"), Err(McpError::TooLarge(10))));
    assert!(matches!(
        SseParser::new(10).push(b"data: \xff\n"),
        Err(McpError::Protocol(_))
    ));
}
