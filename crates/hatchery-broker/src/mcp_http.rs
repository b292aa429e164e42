//! The streamable HTTP transport of MCP (protocol 2025-06-18): every
//! client message is a POST to the server's endpoint; a request's answer
//! comes back as one JSON body or as an SSE stream that carries it (and
//! possibly the server's own requests and notifications first). The
//! session id the server hands out at `initialize` (`Mcp-Session-Id`) and
//! the negotiated protocol version go with every later message. The
//! endpoint is `https://` verified against the broker's trust, or
//! `http://` to a loopback address only, since `headers` may hold a
//! host-side credential. One request is in flight per connection (the
//! caller holds the server's lock). The optional GET stream a server may
//! offer for messages of its own is mcp_listen.rs's.

use crate::http_client::{self, Base, Trust};
use crate::mcp_error::McpError;
use crate::mcp_rpc::{self, Incoming};
use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderName, HeaderValue};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const SESSION_HEADER: &str = "mcp-session-id";
const PROTOCOL_HEADER: &str = "mcp-protocol-version";
/// The GET stream's resumption header (mcp_listen.rs).
pub const LAST_EVENT_ID_HEADER: &str = "last-event-id";
/// Headers the transport sets itself; an operator's `headers` may not.
const RESERVED: &[&str] = &[
    "host",
    "content-type",
    "content-length",
    "accept",
    "transfer-encoding",
    "connection",
    SESSION_HEADER,
    PROTOCOL_HEADER,
    LAST_EVENT_ID_HEADER,
];
/// A session id longer than this is a broken server, not an id.
const MAX_SESSION_ID: usize = 256;

/// How to reach one HTTP server (from the operator's config, mcp.rs).
#[derive(Debug, Clone)]
pub struct HttpSpec {
    pub base: Base,
    /// Sent with every message (e.g. `Authorization`): host-held.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub trust: Arc<Trust>,
}

impl HttpSpec {
    /// Checks the URL and the operator's headers.
    pub fn new(
        url: &str,
        headers: &BTreeMap<String, String>,
        trust: Arc<Trust>,
    ) -> Result<HttpSpec, String> {
        let base = Base::parse(url).map_err(|e| e.to_string())?;
        let mut out = vec![];
        for (k, v) in headers {
            let name = HeaderName::from_bytes(k.as_bytes())
                .map_err(|_| format!("header name {k:?} is not valid"))?;
            if RESERVED.contains(&name.as_str()) {
                return Err(format!("header {k:?} is set by the transport"));
            }
            let value = HeaderValue::from_str(v)
                .map_err(|_| format!("the value of header {k:?} is not valid"))?;
            out.push((name, value));
        }
        Ok(HttpSpec {
            base,
            headers: out,
            trust,
        })
    }
}

/// Where messages of one MCP session go and what they carry besides
/// their body: the operator's headers, and the session id and protocol
/// version once `initialize` gave them. The POSTs of [`HttpConn`] and the
/// GET stream's listener (mcp_listen.rs) both send with it.
#[derive(Debug, Clone)]
pub struct Session {
    pub spec: HttpSpec,
    pub id: Option<HeaderValue>,
    pub protocol: Option<HeaderValue>,
}

impl Session {
    /// A request to the endpoint with the transport's headers.
    pub fn builder(&self, method: hyper::Method, accept: &str) -> hyper::http::request::Builder {
        let b = &self.spec.base;
        let path = if b.prefix.is_empty() { "/" } else { &b.prefix };
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", &b.hostport)
            .header("accept", accept)
            .header("user-agent", "hatchery-broker");
        for (k, v) in &self.spec.headers {
            req = req.header(k, v);
        }
        if let Some(s) = &self.id {
            req = req.header(SESSION_HEADER, s);
        }
        if let Some(p) = &self.protocol {
            req = req.header(PROTOCOL_HEADER, p);
        }
        req
    }

    /// POSTs one message; the answer as it came (status not checked).
    pub async fn send(&self, msg: &Value, max: usize) -> Result<http_client::Answer, McpError> {
        let body = serde_json::to_vec(msg).map_err(|e| McpError::Protocol(e.to_string()))?;
        let req = self
            .builder(hyper::Method::POST, "application/json, text/event-stream")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| McpError::Http(e.into()))?;
        http_client::send(&self.spec.trust, self.spec.base.target(), req, max)
            .await
            .map_err(McpError::Http)
    }
}

pub struct HttpConn {
    session: Session,
    next_id: u64,
    /// The server said its tool list changed.
    pub tools_changed: bool,
    /// Set by the GET stream's listener when the server says so there.
    pushed: Arc<AtomicBool>,
    /// That listener, stopped with this connection (one per session).
    listener: Option<tokio::task::AbortHandle>,
}

impl Drop for HttpConn {
    fn drop(&mut self) {
        if let Some(l) = &self.listener {
            l.abort();
        }
    }
}

impl HttpConn {
    pub fn new(spec: &HttpSpec) -> HttpConn {
        HttpConn {
            session: Session {
                spec: spec.clone(),
                id: None,
                protocol: None,
            },
            next_id: 1,
            tools_changed: false,
            pushed: Arc::new(AtomicBool::new(false)),
            listener: None,
        }
    }

    /// The version negotiated at `initialize`, sent from then on.
    pub fn set_protocol(&mut self, version: &str) {
        self.session.protocol = HeaderValue::from_str(version).ok();
    }

    /// The session as it stands (after `initialize`: with its id).
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// The flag the GET stream's listener raises on
    /// `notifications/tools/list_changed`.
    pub fn pushed_flag(&self) -> Arc<AtomicBool> {
        self.pushed.clone()
    }

    /// Keeps the session's GET stream listener, to stop it with this
    /// connection (a second one replaces, and stops, the first).
    pub fn attach_listener(&mut self, task: tokio::task::AbortHandle) {
        if let Some(old) = self.listener.replace(task) {
            old.abort();
        }
    }

    /// Whether the tool list changed, by a message on either stream.
    pub fn tools_changed_mut(&mut self) -> &mut bool {
        if self.pushed.swap(false, Ordering::Relaxed) {
            self.tools_changed = true;
        }
        &mut self.tools_changed
    }

    async fn post(&mut self, msg: &Value, max: usize) -> Result<http_client::Answer, McpError> {
        let a = self.session.send(msg, max).await?;
        if a.status == 404 && self.session.id.is_some() {
            // The server ended the session: start afresh (the caller
            // drops this connection and initializes a new one).
            return Err(McpError::Closed("the server ended the MCP session".into()));
        }
        if !(200..300).contains(&a.status) {
            let text: String = String::from_utf8_lossy(&a.body).chars().take(300).collect();
            return Err(McpError::Protocol(format!(
                "the server answered {}: {text}",
                a.status
            )));
        }
        if self.session.id.is_none() {
            if let Some(id) = a.headers.get(SESSION_HEADER) {
                if id.len() > MAX_SESSION_ID {
                    return Err(McpError::Protocol("an oversized session id".into()));
                }
                self.session.id = Some(id.clone());
            }
        }
        Ok(a)
    }

    pub async fn notify(&mut self, method: &str, params: Option<Value>) -> Result<(), McpError> {
        self.post(&mcp_rpc::notification(method, params), 64 << 10)
            .await
            .map(|_| ())
    }

    /// Sends one request and returns its answer, from a JSON body or from
    /// the SSE stream the server answered with. No timeout here: the
    /// caller bounds the whole exchange.
    pub async fn request(
        &mut self,
        method: &str,
        params: Value,
        max_bytes: usize,
    ) -> Result<Result<Value, (i64, String)>, McpError> {
        let id = self.next_id;
        self.next_id += 1;
        let a = self
            .post(&mcp_rpc::request(id, method, params), max_bytes)
            .await?;
        let sse = a
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("text/event-stream"));
        let messages = if sse {
            sse_messages(&a.body)?
        } else {
            vec![serde_json::from_slice(&a.body)
                .map_err(|e| McpError::Protocol(format!("not JSON from the server: {e}")))?]
        };
        let mut answer = None;
        for msg in messages {
            match mcp_rpc::classify(&msg, id) {
                Incoming::ServerRequest(reply) => {
                    self.post(&reply, 64 << 10).await?;
                }
                Incoming::ToolsChanged => self.tools_changed = true,
                Incoming::Ignored => {}
                Incoming::Answer(r) => answer = Some(r),
            }
        }
        answer.ok_or_else(|| {
            McpError::Protocol("the server's answer did not carry the response".into())
        })
    }
}

/// The JSON messages of an SSE body: each event's `data` lines joined.
fn sse_messages(body: &[u8]) -> Result<Vec<Value>, McpError> {
    let text = std::str::from_utf8(body)
        .map_err(|_| McpError::Protocol("an event stream that is not UTF-8".into()))?
        .replace("\r\n", "\n");
    let mut out = vec![];
    for event in text.split("\n\n") {
        let data: Vec<&str> = event
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|d| d.strip_prefix(' ').unwrap_or(d))
            .collect();
        if data.is_empty() || data.iter().all(|d| d.is_empty()) {
            continue;
        }
        let v = serde_json::from_str(&data.join("\n"))
            .map_err(|e| McpError::Protocol(format!("an event that is not JSON: {e}")))?;
        out.push(v);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_carry_messages() {
        let body = b"event: message\r\nid: 1\r\ndata: {\"method\":\"notifications/tools/list_changed\"}\r\n\r\n: keepalive\n\nevent: message\ndata: {\"id\":1,\ndata: \"result\":{}}\n\n";
        let m = sse_messages(body).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[1]["id"], 1);
        assert!(sse_messages(b"data: {not json\n\n").is_err());
    }

    #[test]
    fn specs_are_checked() {
        let t = Arc::new(Trust::default());
        let h = |k: &str, v: &str| BTreeMap::from([(k.to_string(), v.to_string())]);
        assert!(HttpSpec::new(
            "https://mcp.corp/mcp",
            &h("Authorization", "Bearer x"),
            t.clone()
        )
        .is_ok());
        assert!(HttpSpec::new("http://127.0.0.1:8000/mcp", &BTreeMap::new(), t.clone()).is_ok());
        assert!(HttpSpec::new("http://mcp.corp/mcp", &BTreeMap::new(), t.clone()).is_err());
        assert!(HttpSpec::new("https://h/mcp", &h("Mcp-Session-Id", "x"), t.clone()).is_err());
        assert!(HttpSpec::new("https://h/mcp", &h("bad name", "x"), t.clone()).is_err());
        assert!(HttpSpec::new("https://h/mcp", &h("X-A", "line\nbreak"), t).is_err());
    }
}
