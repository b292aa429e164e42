//! HTTP/1.1 over plain TCP to the daemon (loopback or a private network):
//! one connection per call, so a stream's connection is its own and
//! dropping it tells the daemon to stop. Every call is bounded in time and
//! every answer in size.

use crate::error::{ClientError, Result};
use crate::sse::{SseEvent, SseParser};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::collections::VecDeque;
use std::time::Duration;
use tokio::net::TcpStream;

/// Limits of a client. Build with `ClientConfig::default()` and the
/// setters; new limits get defaults, so this stays source compatible.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub(crate) call_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) max_json_bytes: usize,
    pub(crate) max_file_bytes: usize,
    pub(crate) max_sse_line: usize,
    pub(crate) stream_idle_timeout: Duration,
    pub(crate) run_slack: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            call_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(10),
            max_json_bytes: 4 << 20,
            // The daemon's default --max-file-bytes.
            max_file_bytes: 64 << 20,
            max_sse_line: 1 << 20,
            // The daemon sends a keep-alive comment every 15 s.
            stream_idle_timeout: Duration::from_secs(90),
            run_slack: Duration::from_secs(30),
        }
    }
}

impl ClientConfig {
    /// Deadline of an ordinary call (not exec/code/wait, whose deadline is
    /// their own timeout plus `run_slack`). Default 60 s.
    pub fn call_timeout(mut self, d: Duration) -> Self {
        self.call_timeout = d;
        self
    }
    /// Default 10 s.
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }
    /// Largest JSON answer read (exec and code answers get room for their
    /// output caps on top). Default 4 MiB.
    pub fn max_json_bytes(mut self, n: usize) -> Self {
        self.max_json_bytes = n;
        self
    }
    /// Largest file download. Default 64 MiB (the daemon's default cap).
    pub fn max_file_bytes(mut self, n: usize) -> Self {
        self.max_file_bytes = n;
        self
    }
    /// Longest single SSE line. Default 1 MiB.
    pub fn max_sse_line(mut self, n: usize) -> Self {
        self.max_sse_line = n;
        self
    }
    /// A stream that sends nothing (not even a keep-alive) for this long is
    /// dropped. Default 90 s.
    pub fn stream_idle_timeout(mut self, d: Duration) -> Self {
        self.stream_idle_timeout = d;
        self
    }
    /// Added to a command's own timeout for the call's deadline. Default 30 s.
    pub fn run_slack(mut self, d: Duration) -> Self {
        self.run_slack = d;
        self
    }
}

/// Where the daemon is: `host:port` and an optional path prefix.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub addr: String,
    pub prefix: String,
}

pub(crate) fn parse_base_url(url: &str) -> Result<Target> {
    let bad = |reason: &str| ClientError::InvalidUrl {
        url: url.to_string(),
        reason: reason.to_string(),
    };
    if url.starts_with("https://") {
        return Err(bad(
            "https is not supported: the client speaks plain http to a loopback or private-network daemon",
        ));
    }
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| bad("it must start with http://"))?;
    let (host, prefix) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    if host.is_empty() || host.contains(['@', '?', '#', ' ']) {
        return Err(bad("no host"));
    }
    if prefix.contains(['?', '#']) {
        return Err(bad("a query or fragment is not a base URL"));
    }
    let has_port = match host.rfind(':') {
        Some(i) => !host[i..].contains(']'),
        None => false,
    };
    let addr = if has_port {
        let port = &host[host.rfind(':').unwrap_or(0) + 1..];
        port.parse::<u16>().map_err(|_| bad("bad port"))?;
        host.to_string()
    } else {
        format!("{host}:80")
    };
    Ok(Target {
        addr,
        prefix: prefix.to_string(),
    })
}

pub(crate) enum ReqBody {
    Empty,
    Json(Vec<u8>),
    Bytes(Bytes),
}

#[derive(Clone)]
pub(crate) struct Transport {
    pub target: Target,
    auth: Option<String>,
    pub config: ClientConfig,
}

impl Transport {
    pub fn new(target: Target, api_key: Option<&str>, config: ClientConfig) -> Self {
        Transport {
            target,
            auth: api_key
                .filter(|k| !k.is_empty())
                .map(|k| format!("Bearer {k}")),
            config,
        }
    }

    fn err_connect(&self, method: &Method, path: &str, source: std::io::Error) -> ClientError {
        ClientError::Connect {
            method: method.to_string(),
            path: path.to_string(),
            addr: self.target.addr.clone(),
            source,
        }
    }

    /// Sends one request on a fresh connection; answers the head (the body
    /// is read by the caller). Not itself bounded: callers wrap it.
    async fn send(&self, method: &Method, path: &str, body: ReqBody) -> Result<Response<Incoming>> {
        let http = |source| ClientError::Http {
            method: method.to_string(),
            path: path.to_string(),
            source,
        };
        let stream = tokio::time::timeout(
            self.config.connect_timeout,
            TcpStream::connect(&self.target.addr),
        )
        .await
        .map_err(|_| ClientError::Timeout {
            method: method.to_string(),
            path: path.to_string(),
            after: self.config.connect_timeout,
        })?
        .map_err(|e| self.err_connect(method, path, e))?;
        stream
            .set_nodelay(true)
            .map_err(|e| self.err_connect(method, path, e))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(http)?;
        // The connection lives until the response body is read or dropped;
        // dropping a stream's body closes it, and the daemon then stops the
        // command behind it.
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut req = Request::builder()
            .method(method.clone())
            .uri(format!("{}{path}", self.target.prefix))
            .header(HOST, &self.target.addr);
        if let Some(a) = &self.auth {
            req = req.header(AUTHORIZATION, a);
        }
        let body = match body {
            ReqBody::Empty => Bytes::new(),
            ReqBody::Json(b) => {
                req = req.header(CONTENT_TYPE, "application/json");
                Bytes::from(b)
            }
            ReqBody::Bytes(b) => {
                req = req.header(CONTENT_TYPE, "application/octet-stream");
                b
            }
        };
        let req = req
            .header(CONTENT_LENGTH, body.len())
            .body(Full::new(body))
            .map_err(|e| ClientError::InvalidRequest(e.to_string()))?;
        sender.send_request(req).await.map_err(http)
    }

    /// A whole call: status and body (at most `limit` bytes), within
    /// `deadline`.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: ReqBody,
        limit: usize,
        deadline: Duration,
    ) -> Result<(StatusCode, Bytes)> {
        let fut = async {
            let resp = self.send(&method, path, body).await?;
            let status = resp.status();
            let bytes = read_limited(resp.into_body(), limit, &method, path).await?;
            Ok::<_, ClientError>((status, bytes))
        };
        tokio::time::timeout(deadline, fut)
            .await
            .map_err(|_| ClientError::Timeout {
                method: method.to_string(),
                path: path.to_string(),
                after: deadline,
            })?
    }

    /// A call whose success is `ok` with a JSON body of type `T`.
    pub async fn json<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: ReqBody,
        ok: StatusCode,
        limit: usize,
        deadline: Duration,
    ) -> Result<T> {
        let (status, bytes) = self
            .call(method.clone(), path, body, limit, deadline)
            .await?;
        if status != ok {
            return Err(status_error(&method, path, status, &bytes));
        }
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Protocol {
            method: method.to_string(),
            path: path.to_string(),
            detail: format!("answer is not the expected JSON: {e}"),
        })
    }

    /// A call whose success is 204 (or any 2xx) without a body worth reading.
    pub async fn empty(&self, method: Method, path: &str, body: ReqBody) -> Result<()> {
        let (status, bytes) = self
            .call(
                method.clone(),
                path,
                body,
                self.config.max_json_bytes,
                self.config.call_timeout,
            )
            .await?;
        if !status.is_success() {
            return Err(status_error(&method, path, status, &bytes));
        }
        Ok(())
    }

    /// Opens an event stream: the head within the call timeout, then each
    /// read within the idle timeout. A non-200 answer is an error.
    pub async fn events(
        &self,
        method: Method,
        path: &str,
        body: ReqBody,
        max_line: usize,
    ) -> Result<EventStream> {
        let deadline = self.config.call_timeout;
        let resp = tokio::time::timeout(deadline, self.send(&method, path, body))
            .await
            .map_err(|_| ClientError::Timeout {
                method: method.to_string(),
                path: path.to_string(),
                after: deadline,
            })??;
        let status = resp.status();
        if status != StatusCode::OK {
            let bytes = tokio::time::timeout(
                deadline,
                read_limited(resp.into_body(), self.config.max_json_bytes, &method, path),
            )
            .await
            .ok()
            .and_then(|r| r.ok())
            .unwrap_or_default();
            return Err(status_error(&method, path, status, &bytes));
        }
        Ok(EventStream {
            body: resp.into_body(),
            parser: SseParser::new(max_line),
            pending: VecDeque::new(),
            idle: self.config.stream_idle_timeout,
            method: method.to_string(),
            path: path.to_string(),
            done: false,
        })
    }
}

async fn read_limited(body: Incoming, limit: usize, method: &Method, path: &str) -> Result<Bytes> {
    let mut body = body;
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|source| ClientError::Http {
            method: method.to_string(),
            path: path.to_string(),
            source,
        })?;
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > limit {
                return Err(ClientError::TooLarge {
                    method: method.to_string(),
                    path: path.to_string(),
                    limit,
                });
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(Bytes::from(out))
}

/// The error an error answer carries (`{"error":{"code","message"}}`);
/// a body that is not that shape keeps its text as the message.
pub(crate) fn status_error(
    method: &Method,
    path: &str,
    status: StatusCode,
    body: &[u8],
) -> ClientError {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let err = &v["error"];
    let text = String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned();
    ClientError::Api {
        method: method.to_string(),
        path: path.to_string(),
        status: status.as_u16(),
        code: err["code"].as_str().unwrap_or("unknown").to_string(),
        message: err["message"].as_str().map(str::to_string).unwrap_or(text),
    }
}

/// A raw server-sent event stream. Dropping it closes the connection (for
/// exec and code streams, that cancels the run).
pub struct EventStream {
    body: Incoming,
    parser: SseParser,
    pending: VecDeque<SseEvent>,
    idle: Duration,
    method: String,
    path: String,
    done: bool,
}

impl EventStream {
    /// The next event, or None when the daemon closed the stream.
    pub async fn next(&mut self) -> Result<Option<SseEvent>> {
        loop {
            if let Some(ev) = self.pending.pop_front() {
                return Ok(Some(ev));
            }
            if self.done {
                return Ok(None);
            }
            let frame = tokio::time::timeout(self.idle, self.body.frame())
                .await
                .map_err(|_| ClientError::Timeout {
                    method: self.method.clone(),
                    path: self.path.clone(),
                    after: self.idle,
                })?;
            match frame {
                None => {
                    self.done = true;
                    return Ok(None);
                }
                Some(frame) => {
                    let frame = frame.map_err(|source| ClientError::Http {
                        method: self.method.clone(),
                        path: self.path.clone(),
                        source,
                    })?;
                    if let Ok(data) = frame.into_data() {
                        let evs = self.parser.feed(&data).map_err(|source| ClientError::Sse {
                            method: self.method.clone(),
                            path: self.path.clone(),
                            source,
                        })?;
                        self.pending.extend(evs);
                    }
                }
            }
        }
    }

    /// The call this stream answers: (method, path).
    pub fn call(&self) -> (&str, &str) {
        (&self.method, &self.path)
    }

    pub(crate) fn protocol(&self, detail: String) -> ClientError {
        ClientError::Protocol {
            method: self.method.clone(),
            path: self.path.clone(),
            detail,
        }
    }

    /// An `error`/`failed` event's ErrorBody as an error.
    pub(crate) fn failure(&self, data: &str) -> ClientError {
        let v: Value = serde_json::from_str(data).unwrap_or(Value::Null);
        ClientError::Stream {
            method: self.method.clone(),
            path: self.path.clone(),
            code: v["error"]["code"].as_str().unwrap_or("unknown").to_string(),
            message: v["error"]["message"].as_str().unwrap_or(data).to_string(),
        }
    }

    pub(crate) fn parse<T: DeserializeOwned>(&self, ev: &SseEvent) -> Result<T> {
        serde_json::from_str(&ev.data)
            .map_err(|e| self.protocol(format!("bad {} event: {e}", ev.event)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls() {
        let t = parse_base_url("http://127.0.0.1:7423").unwrap();
        assert_eq!((t.addr.as_str(), t.prefix.as_str()), ("127.0.0.1:7423", ""));
        let t = parse_base_url("http://daemon/").unwrap();
        assert_eq!((t.addr.as_str(), t.prefix.as_str()), ("daemon:80", ""));
        let t = parse_base_url("http://10.0.0.2:80/hatchery/").unwrap();
        assert_eq!(t.prefix, "/hatchery");
        let t = parse_base_url("http://[::1]:7423").unwrap();
        assert_eq!(t.addr, "[::1]:7423");
        let t = parse_base_url("http://[::1]").unwrap();
        assert_eq!(t.addr, "[::1]:80");
        for bad in [
            "https://x",
            "ftp://x",
            "http://",
            "http://a:b",
            "http://u@h",
            "127.0.0.1:7423",
            "http://h/?q",
        ] {
            assert!(parse_base_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn error_bodies() {
        let e = status_error(
            &Method::GET,
            "/v1/sandboxes/x",
            StatusCode::NOT_FOUND,
            br#"{"error":{"code":"not_found","message":"no sandbox x"}}"#,
        );
        assert!(e.is_not_found());
        assert_eq!(e.code(), Some("not_found"));
        assert_eq!(e.message(), Some("no sandbox x"));
        let e = status_error(&Method::GET, "/", StatusCode::BAD_GATEWAY, b"upstream down");
        assert_eq!(e.code(), Some("unknown"));
        assert_eq!(e.message(), Some("upstream down"));
    }
}
