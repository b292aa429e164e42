//! MCP fronting: the broker is an MCP client of operator-configured
//! servers (`--broker-mcp-config FILE`) and offers their tools to agents
//! as `mcp.<server>.<tool>`, through the same recorded, policy-checked
//! path as its own tools (service.rs). JSON-RPC 2.0: `initialize`,
//! `notifications/initialized`, `tools/list`, `tools/call`, over stdio
//! (mcp_stdio.rs) or streamable HTTP (mcp_http.rs, with the optional
//! GET stream of the server's own messages in mcp_listen.rs).
//!
//! Everything a server says about its tools (descriptions, schemas,
//! annotations such as `readOnlyHint`) is untrusted: it is capped and
//! shown to agents as data (`GET /v1/tools`), and never read by policy.

use crate::http_client::Trust;
use crate::mcp_http::{HttpConn, HttpSpec};
use crate::mcp_stdio::StdioConn;
// The error and the stdio spec sit below both this module and its
// transport (mcp_error.rs, mcp_stdio.rs), so the transport needs nothing
// from here; their paths here stay.
pub use crate::mcp_error::McpError;
pub use crate::mcp_stdio::StdioSpec;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The protocol version the broker asks for; it accepts what the server
/// answers with (the server's choice is recorded in the tool list).
pub const PROTOCOL_VERSION: &str = "2025-06-18";
pub const MAX_SERVERS: usize = 32;
/// Tools kept per server (the rest are not offered).
pub const MAX_TOOLS_PER_SERVER: usize = 256;
/// Caps on what a server's tool list may make us show.
pub const MAX_DESCRIPTION_BYTES: usize = 1024;
pub const MAX_SCHEMA_BYTES: usize = 16 << 10;
pub const MAX_ANNOTATIONS_BYTES: usize = 2048;
/// Defaults of the per-server caps.
pub const DEFAULT_CALL_TIMEOUT_S: u64 = 30;
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 256 << 10;
pub const MAX_RESPONSE_BYTES_LIMIT: usize = 4 << 20;
pub const MAX_CALL_TIMEOUT_S: u64 = 600;
/// Start (initialize + tools/list) must finish within this.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Restart backoff after a crash or failed start: 0.5 s doubling to 30 s,
/// back to none after a call that worked.
const BACKOFF_BASE: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// One server, as the operator configures it (JSON, `servers: [...]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSpec {
    pub name: String,
    /// `stdio` (`argv`, `env`, `cwd`) or `http` (`url`, `headers`).
    pub transport: String,
    #[serde(default)]
    pub argv: Vec<String>,
    /// `http`: the server's MCP endpoint.
    #[serde(default)]
    pub url: Option<String>,
    /// `http`: headers sent with every message (a credential the host
    /// holds; never shown to agents).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    #[serde(default)]
    pub call_timeout_s: Option<u64>,
    #[serde(default)]
    pub max_response_bytes: Option<usize>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpFile {
    pub servers: Vec<ServerSpec>,
}

#[derive(Debug, Clone)]
pub enum Transport {
    Stdio(StdioSpec),
    Http(HttpSpec),
}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub name: String,
    pub transport: Transport,
    pub call_timeout: Duration,
    pub max_response_bytes: usize,
}

fn valid_name(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Parses and checks the config file's text; errors name the server.
/// `trust` is what `https` servers are verified against.
pub fn parse_config(text: &str, trust: &Arc<Trust>) -> Result<Vec<ServerConfig>, McpError> {
    let f: McpFile = serde_json::from_str(text)
        .map_err(|e| McpError::Config(hatchery_serve::error_text::with_causes(&e)))?;
    if f.servers.len() > MAX_SERVERS {
        return Err(McpError::Config(format!("at most {MAX_SERVERS} servers")));
    }
    let mut out: Vec<ServerConfig> = vec![];
    for s in f.servers {
        let bad = |m: String| McpError::Config(format!("server {:?}: {m}", s.name));
        if !valid_name(&s.name, 32) {
            return Err(bad("name must be 1-32 of [A-Za-z0-9_-]".into()));
        }
        if out.iter().any(|o| o.name == s.name) {
            return Err(bad("named twice".into()));
        }
        let transport = match s.transport.as_str() {
            "stdio" => {
                if s.argv.is_empty() || s.argv[0].is_empty() {
                    return Err(bad("stdio needs argv".into()));
                }
                if s.url.is_some() || !s.headers.is_empty() {
                    return Err(bad("url and headers are for the http transport".into()));
                }
                Transport::Stdio(StdioSpec {
                    argv: s.argv.clone(),
                    env: s.env.clone(),
                    cwd: s.cwd.clone(),
                })
            }
            "http" => {
                if !s.argv.is_empty() || !s.env.is_empty() || s.cwd.is_some() {
                    return Err(bad("argv, env and cwd are for the stdio transport".into()));
                }
                let url = s
                    .url
                    .as_deref()
                    .ok_or_else(|| bad("http needs url".into()))?;
                Transport::Http(HttpSpec::new(url, &s.headers, trust.clone()).map_err(bad)?)
            }
            other => {
                return Err(bad(format!(
                    "transport {other:?} is not supported (stdio or http)"
                )))
            }
        };
        let call_timeout_s = s.call_timeout_s.unwrap_or(DEFAULT_CALL_TIMEOUT_S);
        if !(1..=MAX_CALL_TIMEOUT_S).contains(&call_timeout_s) {
            return Err(bad(format!(
                "call_timeout_s must be 1-{MAX_CALL_TIMEOUT_S}"
            )));
        }
        let max_response_bytes = s.max_response_bytes.unwrap_or(DEFAULT_MAX_RESPONSE_BYTES);
        if !(1024..=MAX_RESPONSE_BYTES_LIMIT).contains(&max_response_bytes) {
            return Err(bad(format!(
                "max_response_bytes must be 1024-{MAX_RESPONSE_BYTES_LIMIT}"
            )));
        }
        out.push(ServerConfig {
            name: s.name,
            transport,
            call_timeout: Duration::from_secs(call_timeout_s),
            max_response_bytes,
        });
    }
    Ok(out)
}

/// A tool of a server, as offered to agents. Only `name` is used by the
/// broker (to route the call); the rest is the server's word, capped.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ToolInfo {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
    pub annotations: Value,
}

/// How a `tools/call` ended.
#[derive(Debug)]
pub enum CallOutcome {
    /// The tool's result (`content`, `structuredContent`).
    Ok(Value),
    /// `isError: true`: the tool ran and reported a failure.
    ToolError(Value),
    /// The server answered with a JSON-RPC error: it did not run the call.
    Rpc { code: i64, message: String },
    /// Nothing was sent (the server is not up); no effect.
    NotSent(String),
    /// Sent, and then the server crashed, timed out or answered with
    /// something unusable: whether the tool had its effect is unknown.
    Unknown(String),
}

/// A live connection to a server, over its transport.
enum Conn {
    Stdio(StdioConn),
    Http(HttpConn),
}

impl Conn {
    async fn request(
        &mut self,
        method: &str,
        params: Value,
        max_bytes: usize,
    ) -> Result<Result<Value, (i64, String)>, McpError> {
        match self {
            Conn::Stdio(c) => c.request(method, params, max_bytes).await,
            Conn::Http(c) => c.request(method, params, max_bytes).await,
        }
    }

    async fn notify(&mut self, method: &str, params: Option<Value>) -> Result<(), McpError> {
        match self {
            Conn::Stdio(c) => c.notify(method, params).await,
            Conn::Http(c) => c.notify(method, params).await,
        }
    }

    fn tools_changed(&mut self) -> &mut bool {
        match self {
            Conn::Stdio(c) => &mut c.tools_changed,
            Conn::Http(c) => c.tools_changed_mut(),
        }
    }

    fn pid(&self) -> Option<u32> {
        match self {
            Conn::Stdio(c) => c.pid(),
            Conn::Http(_) => None,
        }
    }
}

struct ServerState {
    conn: Option<Conn>,
    tools: Vec<ToolInfo>,
    protocol: String,
    failures: u32,
    not_before: Option<Instant>,
}

pub struct Server {
    cfg: ServerConfig,
    state: tokio::sync::Mutex<ServerState>,
    pub(crate) starts: std::sync::atomic::AtomicU64,
}

impl Server {
    fn new(cfg: ServerConfig) -> Server {
        Server {
            cfg,
            state: tokio::sync::Mutex::new(ServerState {
                conn: None,
                tools: vec![],
                protocol: String::new(),
                failures: 0,
                not_before: None,
            }),
            starts: 0.into(),
        }
    }

    fn failed(&self, st: &mut ServerState, why: &str) {
        st.conn = None;
        st.failures = st.failures.saturating_add(1);
        let d = BACKOFF_BASE
            .saturating_mul(1u32 << st.failures.saturating_sub(1).min(10))
            .min(BACKOFF_MAX);
        st.not_before = Some(Instant::now() + d);
        tracing::warn!(server = %self.cfg.name, failures = st.failures, backoff_ms = d.as_millis() as u64, reason = %why, "mcp server down");
    }

    /// A running, initialized connection (started if need be).
    async fn ensure(&self, st: &mut ServerState) -> Result<(), McpError> {
        if let Some(c) = &mut st.conn {
            if !*c.tools_changed() {
                return Ok(());
            }
        }
        if st.conn.is_none() {
            if let Some(t) = st.not_before {
                let now = Instant::now();
                if now < t {
                    return Err(McpError::Backoff((t - now).as_millis()));
                }
            }
            self.starts
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let started = tokio::time::timeout(START_TIMEOUT, self.start()).await;
            match started {
                Ok(Ok((c, protocol))) => {
                    st.conn = Some(c);
                    st.protocol = protocol;
                }
                Ok(Err(e)) => {
                    self.failed(st, &hatchery_serve::error_text::with_causes(&e));
                    return Err(e);
                }
                Err(_) => {
                    let e = McpError::Timeout(START_TIMEOUT.as_secs());
                    self.failed(st, &hatchery_serve::error_text::with_causes(&e));
                    return Err(e);
                }
            }
        }
        let Some(c) = st.conn.as_mut() else {
            return Err(McpError::Closed("no connection".into()));
        };
        *c.tools_changed() = false;
        let max = self.cfg.max_response_bytes;
        match tokio::time::timeout(START_TIMEOUT, list_tools(c, max)).await {
            Ok(Ok(t)) => {
                st.tools = t;
                Ok(())
            }
            Ok(Err(e)) => {
                self.failed(st, &hatchery_serve::error_text::with_causes(&e));
                Err(e)
            }
            Err(_) => {
                let e = McpError::Timeout(START_TIMEOUT.as_secs());
                self.failed(st, &hatchery_serve::error_text::with_causes(&e));
                Err(e)
            }
        }
    }

    async fn start(&self) -> Result<(Conn, String), McpError> {
        let mut c = match &self.cfg.transport {
            Transport::Stdio(spec) => Conn::Stdio(StdioConn::spawn(&self.cfg.name, spec)?),
            Transport::Http(spec) => Conn::Http(HttpConn::new(spec)),
        };
        let r = c
            .request(
                "initialize",
                json!({"protocolVersion": PROTOCOL_VERSION, "capabilities": {},
                       "clientInfo": {"name": "hatchery-broker", "version": env!("CARGO_PKG_VERSION")}}),
                self.cfg.max_response_bytes,
            )
            .await?
            .map_err(|(code, m)| McpError::Start(format!("initialize: error {code}: {m}")))?;
        let protocol = r
            .get("protocolVersion")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .chars()
            .take(32)
            .collect::<String>();
        if r.pointer("/capabilities/tools").is_none() {
            return Err(McpError::Start("the server offers no tools".into()));
        }
        if let Conn::Http(h) = &mut c {
            h.set_protocol(&protocol);
        }
        c.notify("notifications/initialized", None).await?;
        if let Conn::Http(h) = &mut c {
            // The server's own messages, if it offers a GET stream.
            let task = crate::mcp_listen::spawn(
                self.cfg.name.clone(),
                h.session().clone(),
                h.pushed_flag(),
                crate::mcp_listen::Limits::for_server(self.cfg.max_response_bytes),
            );
            h.attach_listener(task);
        }
        tracing::info!(server = %self.cfg.name, pid = c.pid(), protocol = %protocol, "mcp server started");
        Ok((c, protocol))
    }

    pub async fn tools(&self) -> Result<(Vec<ToolInfo>, String), McpError> {
        let mut st = self.state.lock().await;
        self.ensure(&mut st).await?;
        Ok((st.tools.clone(), st.protocol.clone()))
    }

    /// `tools/call`, with the server's call timeout and response cap.
    pub async fn call(&self, tool: &str, args: &Value) -> CallOutcome {
        let mut st = self.state.lock().await;
        if let Err(e) = self.ensure(&mut st).await {
            return CallOutcome::NotSent(hatchery_serve::error_text::with_causes(&e));
        }
        let Some(c) = st.conn.as_mut() else {
            return CallOutcome::NotSent("no connection".into());
        };
        let fut = c.request(
            "tools/call",
            json!({"name": tool, "arguments": args}),
            self.cfg.max_response_bytes,
        );
        let r = match tokio::time::timeout(self.cfg.call_timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(McpError::Timeout(self.cfg.call_timeout.as_secs())),
        };
        match r {
            Ok(Ok(result)) => {
                st.failures = 0;
                st.not_before = None;
                if result.get("isError").and_then(Value::as_bool) == Some(true) {
                    CallOutcome::ToolError(result)
                } else {
                    CallOutcome::Ok(result)
                }
            }
            Ok(Err((code, message))) => CallOutcome::Rpc { code, message },
            Err(e) => {
                // The connection is in an unknown place mid-exchange: drop
                // it (killing the process); the next call starts afresh.
                self.failed(&mut st, &hatchery_serve::error_text::with_causes(&e));
                CallOutcome::Unknown(hatchery_serve::error_text::with_causes(&e))
            }
        }
    }
}

async fn list_tools(c: &mut Conn, max: usize) -> Result<Vec<ToolInfo>, McpError> {
    let mut out = vec![];
    let mut cursor: Option<String> = None;
    // A bounded number of pages: a server cannot keep us paging forever.
    for _ in 0..16 {
        let params = match &cursor {
            Some(c) => json!({"cursor": c}),
            None => json!({}),
        };
        let r = c
            .request("tools/list", params, max)
            .await?
            .map_err(|(code, m)| McpError::Protocol(format!("tools/list: error {code}: {m}")))?;
        for t in r
            .get("tools")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if out.len() >= MAX_TOOLS_PER_SERVER {
                break;
            }
            if let Some(t) = tool_info(t) {
                out.push(t);
            }
        }
        cursor = r
            .get("nextCursor")
            .and_then(Value::as_str)
            .map(|s| s.chars().take(1024).collect());
        if cursor.is_none() || out.len() >= MAX_TOOLS_PER_SERVER {
            break;
        }
    }
    Ok(out)
}

/// A tool entry of `tools/list`, capped; `None` for a name the broker
/// cannot route (`mcp.<server>.<tool>` must stay one plain token).
fn tool_info(t: &Value) -> Option<ToolInfo> {
    let name = t.get("name")?.as_str()?;
    if !valid_tool_name(name) {
        return None;
    }
    let capped = |v: Option<&Value>, max: usize| match v {
        Some(v) if v.to_string().len() <= max => v.clone(),
        Some(_) => json!({"omitted": format!("over {max} bytes")}),
        None => Value::Null,
    };
    let description = t
        .get("description")
        .and_then(Value::as_str)
        .map(|d| crate::cut::cut(d, MAX_DESCRIPTION_BYTES))
        .unwrap_or_default();
    Some(ToolInfo {
        name: name.to_string(),
        description,
        input_schema: capped(t.get("inputSchema"), MAX_SCHEMA_BYTES),
        annotations: capped(t.get("annotations"), MAX_ANNOTATIONS_BYTES),
    })
}

pub fn valid_tool_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
}

/// `mcp.<server>.<tool>` split, if `name` has that shape.
pub fn split_name(name: &str) -> Option<(&str, &str)> {
    let rest = name.strip_prefix("mcp.")?;
    let (s, t) = rest.split_once('.')?;
    (valid_name(s, 32) && valid_tool_name(t)).then_some((s, t))
}

/// Every configured server.
#[derive(Default)]
pub struct McpHub {
    servers: HashMap<String, Arc<Server>>,
    order: Vec<String>,
}

impl McpHub {
    pub fn new(cfgs: Vec<ServerConfig>) -> McpHub {
        let mut h = McpHub::default();
        for c in cfgs {
            h.order.push(c.name.clone());
            h.servers.insert(c.name.clone(), Arc::new(Server::new(c)));
        }
        h
    }

    pub fn from_file(path: &std::path::Path, trust: &Arc<Trust>) -> Result<McpHub, McpError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| McpError::Config(format!("{}: {e}", path.display())))?;
        Ok(McpHub::new(parse_config(&text, trust)?))
    }

    pub fn server(&self, name: &str) -> Option<&Arc<Server>> {
        self.servers.get(name)
    }

    pub fn names(&self) -> &[String] {
        &self.order
    }

    /// What `GET /v1/tools` shows of the MCP servers: their tools under
    /// `untrusted` (the server's own words), or why a server is down.
    pub async fn catalog(&self) -> (Vec<Value>, Vec<Value>) {
        let (mut tools, mut errors) = (vec![], vec![]);
        for name in &self.order {
            let Some(s) = self.servers.get(name) else {
                continue;
            };
            match s.tools().await {
                Ok((ts, protocol)) => {
                    for t in ts {
                        tools.push(json!({
                            "name": format!("mcp.{name}.{}", t.name),
                            "server": name,
                            "protocol_version": protocol,
                            "untrusted": {"description": t.description, "input_schema": t.input_schema,
                                          "annotations": t.annotations},
                        }));
                    }
                }
                Err(e) => errors.push(
                    json!({"server": name, "error": hatchery_serve::error_text::with_causes(&e)}),
                ),
            }
        }
        (tools, errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_is_checked_and_names_the_server() {
        let t = Arc::new(Trust::default());
        let ok = parse_config(
            r#"{"servers":[{"name":"git","transport":"stdio","argv":["mcp-server-git"],"env":{"A":"b"},"call_timeout_s":5},
                           {"name":"web","transport":"http","url":"https://mcp.corp/mcp","headers":{"Authorization":"Bearer t"}}]}"#,
            &t,
        )
        .unwrap();
        assert!(matches!(ok[1].transport, Transport::Http(_)));
        assert_eq!(ok[0].call_timeout, Duration::from_secs(5));
        assert_eq!(ok[0].max_response_bytes, DEFAULT_MAX_RESPONSE_BYTES);
        for (bad, want) in [
            (
                r#"{"servers":[{"name":"a.b","transport":"stdio","argv":["x"]}]}"#,
                "name",
            ),
            (
                r#"{"servers":[{"name":"h","transport":"sse","argv":["x"]}]}"#,
                "not supported",
            ),
            (
                r#"{"servers":[{"name":"h","transport":"http","argv":["x"],"url":"https://h/mcp"}]}"#,
                "stdio transport",
            ),
            (
                r#"{"servers":[{"name":"h","transport":"http"}]}"#,
                "needs url",
            ),
            (
                r#"{"servers":[{"name":"h","transport":"http","url":"http://mcp.corp/mcp"}]}"#,
                "loopback",
            ),
            (
                r#"{"servers":[{"name":"s","transport":"stdio","argv":[]}]}"#,
                "argv",
            ),
            (
                r#"{"servers":[{"name":"s","transport":"stdio","argv":["x"],"call_timeout_s":0}]}"#,
                "call_timeout_s",
            ),
            (
                r#"{"servers":[{"name":"s","transport":"stdio","argv":["x"],"max_response_bytes":10}]}"#,
                "max_response_bytes",
            ),
            (
                r#"{"servers":[{"name":"s","transport":"stdio","argv":["x"]},{"name":"s","transport":"stdio","argv":["x"]}]}"#,
                "twice",
            ),
            (
                r#"{"servers":[{"name":"s","transport":"stdio","argv":["x"],"extra":1}]}"#,
                "unknown field",
            ),
        ] {
            let e = parse_config(bad, &t).unwrap_err().to_string();
            assert!(e.contains(want), "{bad}: {e}");
        }
    }

    #[test]
    fn names_split_and_tool_metadata_is_capped() {
        assert_eq!(
            split_name("mcp.git.git_status"),
            Some(("git", "git_status"))
        );
        assert_eq!(split_name("mcp.git.a.b"), Some(("git", "a.b")));
        assert_eq!(split_name("mcp.git"), None);
        assert_eq!(split_name("mcp..x"), None);
        assert_eq!(split_name("git_push"), None);
        assert_eq!(split_name("mcp.git.a b"), None);
        let t = tool_info(&json!({"name": "t", "description": "x".repeat(5000),
            "inputSchema": {"big": "y".repeat(MAX_SCHEMA_BYTES)}, "annotations": {"readOnlyHint": true}}))
        .unwrap();
        assert_eq!(t.description.len(), MAX_DESCRIPTION_BYTES);
        assert!(t.input_schema.get("omitted").is_some());
        assert_eq!(t.annotations["readOnlyHint"], true);
        assert!(tool_info(&json!({"name": "bad name"})).is_none());
    }
}
