//! A small client for the daemon's HTTP API: one HTTP/1.1 connection per
//! call (the daemon is on loopback or a private network), every call bounded
//! in time and in response size.

use crate::events::{SseError, SseEvent, SseParser};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use serde_json::{json, Value};
use std::time::Duration;
use tokio::net::TcpStream;

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("cannot reach the daemon: {0}")]
    Connect(#[from] std::io::Error),
    #[error("HTTP error talking to the daemon: {0}")]
    Http(#[from] hyper::Error),
    #[error("daemon call timed out after {0:?}")]
    Timeout(Duration),
    #[error("daemon answered {status} {code}: {message}")]
    Status {
        status: u16,
        code: String,
        message: String,
    },
    #[error("unexpected daemon response: {0}")]
    Protocol(String),
    #[error(transparent)]
    Sse(#[from] SseError),
}

impl DaemonError {
    /// Whether the daemon refused for lack of room (its own capacity cap).
    pub fn is_capacity(&self) -> bool {
        matches!(self, DaemonError::Status { status: 503, .. })
    }
}

const CALL_TIMEOUT: Duration = Duration::from_secs(30);
const MAX_JSON: usize = 1 << 20;
/// Longest SSE line accepted from the daemon: a 32 KiB chunk JSON-escaped.
const MAX_SSE_LINE: usize = 1 << 20;

#[derive(Clone)]
pub struct Daemon {
    addr: String,
    auth: String,
}

#[derive(Deserialize)]
struct Created {
    id: String,
}

#[derive(Deserialize)]
struct Template {
    version: String,
}

impl Daemon {
    /// `addr` is `host:port` (see config::parse_daemon_url).
    pub fn new(addr: String, api_key: &str) -> Self {
        Daemon {
            addr,
            auth: format!("Bearer {api_key}"),
        }
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<(&'static str, Bytes)>,
    ) -> Result<Response<Incoming>, DaemonError> {
        let stream = TcpStream::connect(&self.addr).await?;
        stream.set_nodelay(true)?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        // The connection lives until the response body is read or dropped;
        // dropping an exec stream's body closes it, and the daemon then kills
        // the command.
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, &self.addr)
            .header(AUTHORIZATION, &self.auth);
        let body = match body {
            Some((ct, b)) => {
                req = req.header(CONTENT_TYPE, ct);
                b
            }
            None => Bytes::new(),
        };
        let req = req
            .body(Full::new(body))
            .map_err(|e| DaemonError::Protocol(e.to_string()))?;
        Ok(sender.send_request(req).await?)
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<(&'static str, Bytes)>,
    ) -> Result<(StatusCode, Bytes), DaemonError> {
        let fut = async {
            let resp = self.send(method, path, body).await?;
            let status = resp.status();
            let bytes = Limited::new(resp.into_body(), MAX_JSON)
                .collect()
                .await
                .map_err(|e| DaemonError::Protocol(e.to_string()))?
                .to_bytes();
            Ok::<_, DaemonError>((status, bytes))
        };
        tokio::time::timeout(CALL_TIMEOUT, fut)
            .await
            .map_err(|_| DaemonError::Timeout(CALL_TIMEOUT))?
    }

    fn status_error(status: StatusCode, body: &[u8]) -> DaemonError {
        let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let err = &v["error"];
        DaemonError::Status {
            status: status.as_u16(),
            code: err["code"].as_str().unwrap_or("unknown").to_string(),
            message: err["message"].as_str().unwrap_or("").to_string(),
        }
    }

    fn json_of(status: StatusCode, ok: StatusCode, body: &[u8]) -> Result<Value, DaemonError> {
        if status != ok {
            return Err(Self::status_error(status, body));
        }
        serde_json::from_slice(body).map_err(|e| DaemonError::Protocol(e.to_string()))
    }

    /// The template's active version, or None if the daemon has no such template.
    pub async fn template_version(&self, name: &str) -> Result<Option<String>, DaemonError> {
        let (status, body) = self
            .call(Method::GET, &format!("/v1/templates/{name}"), None)
            .await?;
        if status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let v = Self::json_of(status, StatusCode::OK, &body)?;
        let t: Template =
            serde_json::from_value(v).map_err(|e| DaemonError::Protocol(e.to_string()))?;
        Ok(Some(t.version))
    }

    /// A fresh sandbox whose TTL destroys it even if nobody else does.
    pub async fn create(&self, template: &str, ttl_seconds: u64) -> Result<String, DaemonError> {
        let body = json!({
            "template": template,
            "ttl_seconds": ttl_seconds,
            "metadata": {"created_by": "hatchery-playground"},
            // Explicit, not the daemon's default: a visitor's snippet must
            // never reach the network even on a daemon configured otherwise.
            "network": {"egress": "deny"},
        });
        let (status, body) = self
            .call(
                Method::POST,
                "/v1/sandboxes",
                Some(("application/json", Bytes::from(body.to_string()))),
            )
            .await?;
        let v = Self::json_of(status, StatusCode::CREATED, &body)?;
        let c: Created =
            serde_json::from_value(v).map_err(|e| DaemonError::Protocol(e.to_string()))?;
        Ok(c.id)
    }

    pub async fn put_file(&self, id: &str, path: &str, data: Bytes) -> Result<(), DaemonError> {
        let uri = format!("/v1/sandboxes/{id}/files?path={}", encode_query(path));
        let (status, body) = self
            .call(Method::PUT, &uri, Some(("application/octet-stream", data)))
            .await?;
        if status != StatusCode::NO_CONTENT {
            return Err(Self::status_error(status, &body));
        }
        Ok(())
    }

    /// Deletes a sandbox; idempotent on the daemon's side.
    pub async fn delete(&self, id: &str) -> Result<(), DaemonError> {
        let (status, body) = self
            .call(Method::DELETE, &format!("/v1/sandboxes/{id}"), None)
            .await?;
        if status != StatusCode::NO_CONTENT {
            return Err(Self::status_error(status, &body));
        }
        Ok(())
    }

    /// Starts `argv` and returns its event stream. Dropping the stream closes
    /// the connection, which kills the command.
    pub async fn exec_stream(
        &self,
        id: &str,
        argv: &[&str],
        timeout_seconds: u64,
        max_output_bytes: usize,
    ) -> Result<ExecStream, DaemonError> {
        let body = json!({
            "argv": argv,
            "cwd": "/workspace",
            "env": {"PYTHONUNBUFFERED": "1"},
            "timeout_seconds": timeout_seconds,
            "max_output_bytes": max_output_bytes,
        });
        self.events(
            &format!("/v1/sandboxes/{id}/exec/stream"),
            &body,
            MAX_SSE_LINE,
        )
        .await
    }

    /// Runs `code` in the sandbox's default interpreter context (run_code)
    /// and returns its event stream: stdout, stderr, result, error, then
    /// done or failed. Dropping the stream closes the connection, which
    /// cancels the run.
    pub async fn code_stream(
        &self,
        id: &str,
        language: &str,
        code: &str,
        timeout_seconds: u64,
        max_output_bytes: usize,
    ) -> Result<ExecStream, DaemonError> {
        let body = json!({
            "code": code,
            "language": language,
            "timeout_seconds": timeout_seconds,
            "max_output_bytes": max_output_bytes,
        });
        // A result event carries its whole MIME bundle on one line; the
        // daemon caps the bundles of a run at max_output_bytes together.
        let max_line =
            MAX_SSE_LINE.max(max_output_bytes.saturating_mul(2).saturating_add(64 << 10));
        self.events(&format!("/v1/sandboxes/{id}/code/stream"), &body, max_line)
            .await
    }

    /// POSTs `body` to an event-stream route; a non-200 answer is an error.
    async fn events(
        &self,
        uri: &str,
        body: &Value,
        max_line: usize,
    ) -> Result<ExecStream, DaemonError> {
        let resp = tokio::time::timeout(
            CALL_TIMEOUT,
            self.send(
                Method::POST,
                uri,
                Some(("application/json", Bytes::from(body.to_string()))),
            ),
        )
        .await
        .map_err(|_| DaemonError::Timeout(CALL_TIMEOUT))??;
        let status = resp.status();
        if status != StatusCode::OK {
            let bytes = Limited::new(resp.into_body(), MAX_JSON)
                .collect()
                .await
                .map(|c| c.to_bytes())
                .unwrap_or_default();
            return Err(Self::status_error(status, &bytes));
        }
        Ok(ExecStream {
            body: resp.into_body(),
            parser: SseParser::new(max_line),
            pending: Vec::new(),
        })
    }
}

/// The events of an exec or code stream, as the daemon sends them.
pub struct ExecStream {
    body: Incoming,
    parser: SseParser,
    pending: Vec<SseEvent>,
}

impl ExecStream {
    /// The next event, or None when the daemon closed the stream.
    pub async fn next(&mut self) -> Result<Option<SseEvent>, DaemonError> {
        loop {
            if !self.pending.is_empty() {
                return Ok(Some(self.pending.remove(0)));
            }
            match self.body.frame().await {
                None => return Ok(None),
                Some(frame) => {
                    if let Ok(data) = frame?.into_data() {
                        self.pending = self.parser.feed(&data)?;
                    }
                }
            }
        }
    }
}

/// Percent-encodes a query value (paths here are fixed, but be exact anyway).
fn encode_query(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
