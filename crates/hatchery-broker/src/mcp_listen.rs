//! The optional GET stream of MCP's streamable HTTP transport (protocol
//! 2025-03-26 and 2025-06-18, "Listening for Messages from the Server"):
//! once a session is initialized, the broker opens `GET` on the endpoint
//! with `Accept: text/event-stream` for the messages a server sends of its
//! own accord. A server that offers none answers 405: "not offered", not a
//! failure (its messages then come only with answers to POSTs).
//!
//! What the broker does with those messages, each logged with the server
//! and the method:
//! - `notifications/tools/list_changed`: the tool list is fetched again
//!   before the next call or catalog (the flag [`HttpConn`] checks);
//! - a request: `ping` is answered; every other (sampling, elicitation,
//!   roots) is refused with JSON-RPC error -32601, POSTed back, and never
//!   executed: the broker offers no client features, and a server must not
//!   reach a model or a person through it;
//! - another notification is ignored; a response (which the spec forbids
//!   on this stream) too.
//!
//! Bounded: one stream per session (its [`HttpConn`] owns the task and
//! stops it with the session), an event of at most the server's
//! `max_response_bytes` (a longer one ends the stream: it never grows a
//! buffer without limit), at most [`Limits::max_messages_per_minute`]
//! messages, and a stream that ends is reopened with `Last-Event-ID` (the
//! last event id seen, for a server that resumes) after the server's
//! `retry` (clamped), doubling per failure, giving up after
//! [`Limits::tries`] streams in a row that each ended within
//! [`Limits::stable`] of opening.
//!
//! [`HttpConn`]: crate::mcp_http::HttpConn

use crate::http_client::{self, HttpError};
use crate::mcp_error::McpError;
use crate::mcp_http::{Session, LAST_EVENT_ID_HEADER};
use crate::mcp_rpc::{self, Incoming};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::HeaderValue;
use serde_json::Value;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// An event id longer than this is not kept (nor sent back).
const MAX_EVENT_ID_BYTES: usize = 256;
/// The server's answer to one of the broker's replies.
const MAX_REPLY_ANSWER_BYTES: usize = 64 << 10;
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// A method name as logged.
const MAX_LOGGED_METHOD: usize = 64;

#[derive(Debug, Clone)]
pub struct Limits {
    /// One event's data (and any line) at most.
    pub max_event_bytes: usize,
    /// More messages than this in a minute end the stream.
    pub max_messages_per_minute: u32,
    /// Streams in a row that end early before the broker gives up.
    pub tries: u32,
    /// A stream open this long resets that count (a server may close its
    /// stream now and then; one that closes at once is not listened to
    /// forever).
    pub stable: Duration,
    /// The wait before reopening (the server's `retry`, clamped here),
    /// doubled per early end, at most `retry_max`.
    pub retry_min: Duration,
    pub retry_max: Duration,
    /// The server must answer the GET within this.
    pub open_timeout: Duration,
}

impl Limits {
    pub fn for_server(max_response_bytes: usize) -> Limits {
        Limits {
            max_event_bytes: max_response_bytes,
            max_messages_per_minute: 120,
            tries: 5,
            stable: Duration::from_secs(60),
            retry_min: Duration::from_secs(1),
            retry_max: Duration::from_secs(60),
            open_timeout: Duration::from_secs(30),
        }
    }
}

/// How one stream ended.
#[derive(Debug)]
enum End {
    /// 405: the server offers no GET stream.
    NotOffered,
    /// 404: the session is gone (the next POST finds out and starts anew).
    SessionGone,
    /// The server closed it, as it may.
    Closed,
    Failed(McpError),
}

/// What is carried from one stream to the next.
struct Resume {
    last_id: Option<HeaderValue>,
    retry: Duration,
}

/// Listens on `session`'s GET stream until the server says it offers
/// none, the session ends, or the broker gives up; the task is aborted
/// with the session's connection.
pub fn spawn(
    server: String,
    session: Session,
    pushed: Arc<AtomicBool>,
    limits: Limits,
) -> tokio::task::AbortHandle {
    tokio::spawn(async move {
        run(&server, &session, &pushed, &limits).await;
    })
    .abort_handle()
}

/// The listening loop; returns how many streams it opened.
async fn run(server: &str, session: &Session, pushed: &AtomicBool, l: &Limits) -> u32 {
    let mut resume = Resume {
        last_id: None,
        retry: l.retry_min,
    };
    let (mut opened, mut early) = (0u32, 0u32);
    loop {
        let began = Instant::now();
        opened += 1;
        match listen_once(server, session, pushed, l, &mut resume).await {
            End::NotOffered => {
                tracing::info!(server = %server, "mcp server offers no GET stream (405): its messages come only with answers");
                return opened;
            }
            End::SessionGone => {
                tracing::info!(server = %server, "mcp GET stream: the session is gone (404)");
                return opened;
            }
            End::Closed => {
                tracing::info!(server = %server, "mcp GET stream closed by the server");
            }
            End::Failed(e) => {
                tracing::warn!(server = %server, error = %hatchery_serve::error_text::with_causes(&e), "mcp GET stream failed");
            }
        }
        if began.elapsed() >= l.stable {
            early = 0;
        } else {
            early += 1;
        }
        if early >= l.tries {
            tracing::warn!(server = %server, streams = early, "mcp GET stream: giving up after streams that each ended early; the server's messages come only with answers");
            return opened;
        }
        let delay = resume
            .retry
            .saturating_mul(1 << early.saturating_sub(1).min(6))
            .min(l.retry_max);
        tokio::time::sleep(delay).await;
    }
}

async fn listen_once(
    server: &str,
    session: &Session,
    pushed: &AtomicBool,
    l: &Limits,
    resume: &mut Resume,
) -> End {
    let mut req = session.builder(hyper::Method::GET, "text/event-stream");
    if let Some(id) = &resume.last_id {
        req = req.header(LAST_EVENT_ID_HEADER, id);
    }
    let req = match req.body(Full::new(Bytes::new())) {
        Ok(r) => r,
        Err(e) => return End::Failed(McpError::Http(e.into())),
    };
    let spec = &session.spec;
    let open = http_client::open(&spec.trust, spec.base.target(), req);
    let resp = match tokio::time::timeout(l.open_timeout, open).await {
        Err(_) => return End::Failed(McpError::Timeout(l.open_timeout.as_secs())),
        Ok(Err(e)) => return End::Failed(McpError::Http(e)),
        Ok(Ok(r)) => r,
    };
    match resp.status().as_u16() {
        405 => return End::NotOffered,
        404 if session.id.is_some() => return End::SessionGone,
        s if !(200..300).contains(&s) => {
            return End::Failed(McpError::Protocol(format!(
                "the GET stream was answered {s}"
            )))
        }
        _ => {}
    }
    let sse = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("text/event-stream"));
    if !sse {
        return End::Failed(McpError::Protocol(
            "the GET stream's answer is not text/event-stream".into(),
        ));
    }
    let mut body = resp.into_body();
    let mut parser = SseParser::new(l.max_event_bytes);
    let (mut window, mut in_window) = (Instant::now(), 0u32);
    loop {
        let frame = match body.frame().await {
            None => return End::Closed,
            Some(Err(source)) => {
                return End::Failed(McpError::Http(HttpError::Http {
                    addr: spec.base.hostport.clone(),
                    source,
                }))
            }
            Some(Ok(f)) => f,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let events = match parser.push(&data) {
            Ok(ev) => ev,
            Err(e) => return End::Failed(e),
        };
        for ev in events {
            if let Some(id) = ev.id.and_then(|i| HeaderValue::from_str(&i).ok()) {
                resume.last_id = Some(id);
            }
            if let Some(r) = ev.retry {
                resume.retry = r.clamp(l.retry_min, l.retry_max);
            }
            if ev.data.is_empty() {
                // A priming event (an id, a retry), no message.
                continue;
            }
            if window.elapsed() >= Duration::from_secs(60) {
                (window, in_window) = (Instant::now(), 0);
            }
            in_window += 1;
            if in_window > l.max_messages_per_minute {
                return End::Failed(McpError::Protocol(format!(
                    "more than {} messages a minute on the GET stream",
                    l.max_messages_per_minute
                )));
            }
            handle(server, session, pushed, &ev.data).await;
        }
    }
}

/// One message the server sent of its own accord.
async fn handle(server: &str, session: &Session, pushed: &AtomicBool, data: &str) {
    let msg: Value = match serde_json::from_str(data) {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!(server = %server, error = %e, "mcp GET stream: an event that is not JSON, ignored");
            return;
        }
    };
    let Some(method) = msg
        .get("method")
        .and_then(Value::as_str)
        .map(|m| crate::cut::cut(m, MAX_LOGGED_METHOD))
    else {
        tracing::info!(server = %server, "mcp GET stream: a response (not expected there), ignored");
        return;
    };
    // Id 0 is never the broker's (its ids start at 1), and a message with
    // a method is never an answer anyway.
    match mcp_rpc::classify(&msg, 0) {
        Incoming::ToolsChanged => {
            pushed.store(true, Ordering::Relaxed);
            tracing::info!(server = %server, "mcp server: its tool list changed; listed again before the next call");
        }
        Incoming::ServerRequest(reply) => {
            if reply.get("error").is_some() {
                tracing::warn!(server = %server, method = %method, "mcp server request refused: the broker offers no client features (nothing run)");
            } else {
                tracing::info!(server = %server, method = %method, "mcp server request answered");
            }
            match tokio::time::timeout(REPLY_TIMEOUT, session.send(&reply, MAX_REPLY_ANSWER_BYTES))
                .await
            {
                Ok(Ok(a)) if (200..300).contains(&a.status) => {}
                Ok(Ok(a)) => {
                    tracing::warn!(server = %server, status = a.status, "mcp server did not take the broker's reply")
                }
                Ok(Err(e)) => {
                    tracing::warn!(server = %server, error = %hatchery_serve::error_text::with_causes(&e), "mcp server: sending the broker's reply")
                }
                Err(_) => {
                    tracing::warn!(server = %server, "mcp server: the broker's reply timed out")
                }
            }
        }
        Incoming::Ignored | Incoming::Answer(_) => {
            tracing::info!(server = %server, method = %method, "mcp server notification (ignored)");
        }
    }
}

/// One dispatched event.
#[derive(Debug, PartialEq)]
struct SseEvent {
    /// Its `data` lines, joined by newlines; empty for none.
    data: String,
    id: Option<String>,
    retry: Option<Duration>,
}

/// An incremental `text/event-stream` reader whose buffer never holds
/// more than `max` bytes: an event (or a line) longer than that is an
/// error, however the server splits it.
struct SseParser {
    max: usize,
    line: Vec<u8>,
    data: String,
    has_data: bool,
    id: Option<String>,
    retry: Option<Duration>,
}

impl SseParser {
    fn new(max: usize) -> SseParser {
        SseParser {
            max,
            line: vec![],
            data: String::new(),
            has_data: false,
            id: None,
            retry: None,
        }
    }

    fn push(&mut self, chunk: &[u8]) -> Result<Vec<SseEvent>, McpError> {
        let mut out = vec![];
        for &b in chunk {
            if b == b'\n' {
                let mut line = std::mem::take(&mut self.line);
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                self.field(line, &mut out)?;
            } else {
                self.line.push(b);
                if self.line.len() + self.data.len() > self.max {
                    return Err(McpError::TooLarge(self.max));
                }
            }
        }
        Ok(out)
    }

    fn field(&mut self, line: Vec<u8>, out: &mut Vec<SseEvent>) -> Result<(), McpError> {
        if line.is_empty() {
            if self.has_data || self.id.is_some() || self.retry.is_some() {
                out.push(SseEvent {
                    data: std::mem::take(&mut self.data),
                    id: self.id.take(),
                    retry: self.retry.take(),
                });
            }
            self.has_data = false;
            return Ok(());
        }
        let line = String::from_utf8(line)
            .map_err(|_| McpError::Protocol("an event stream that is not UTF-8".into()))?;
        if line.starts_with(':') {
            return Ok(()); // a comment (a keep-alive)
        }
        let (name, value) = match line.split_once(':') {
            Some((n, v)) => (n, v.strip_prefix(' ').unwrap_or(v)),
            None => (line.as_str(), ""),
        };
        match name {
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
                if self.data.len() > self.max {
                    return Err(McpError::TooLarge(self.max));
                }
            }
            "id" if !value.contains('\0') && value.len() <= MAX_EVENT_ID_BYTES => {
                self.id = Some(value.to_string());
            }
            "retry" if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => {
                self.retry = value.parse().ok().map(Duration::from_millis);
            }
            // `event` (MCP's are all "message") and unknown fields.
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "mcp_listen_tests.rs"]
mod tests;
