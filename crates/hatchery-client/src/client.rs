//! `Client`: one method per API call.

use crate::error::{ClientError, Result};
use crate::models::*;
use crate::streams::{BuildStream, CodeStream, ExecStream, ProcessStream};
use crate::transport::{parse_base_url, ClientConfig, EventStream, ReqBody, Transport};
use bytes::Bytes;
use hyper::{Method, StatusCode};
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;

/// The daemon's default exec/code timeout, used for the call's deadline
/// when a request does not set one.
const DEFAULT_RUN_TIMEOUT_S: u64 = 60;
/// The daemon's default per-stream output cap.
const DEFAULT_OUTPUT_BYTES: u64 = 1 << 20;
/// The daemon's cap on one stdin write.
pub const MAX_STDIN_WRITE: usize = 1 << 20;
/// The daemon's longest process wait (`procs::MAX_WAIT`).
const MAX_WAIT_S: u64 = 300;

/// A client of one daemon. Cheap to clone; safe to share between tasks.
#[derive(Clone)]
pub struct Client {
    t: Transport,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Client")
            .field("addr", &self.t.target.addr)
            .field("prefix", &self.t.target.prefix)
            .finish()
    }
}

fn json<T: Serialize>(v: &T) -> ReqBody {
    ReqBody::Json(serde_json::to_vec(v).expect("request types serialize"))
}

/// Percent-encodes one path segment or query value.
pub fn encode_component(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Percent-encodes a sandbox path for `?path=` (slashes kept).
fn encode_path(path: &str) -> Result<String> {
    if !path.starts_with('/') {
        return Err(ClientError::InvalidRequest(format!(
            "sandbox paths are absolute: {path:?} does not start with /"
        )));
    }
    Ok(path
        .split('/')
        .map(encode_component)
        .collect::<Vec<_>>()
        .join("/"))
}

/// `?metadata.k=v&...` for list filters.
fn metadata_query(filter: &BTreeMap<String, String>) -> String {
    if filter.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = filter
        .iter()
        .map(|(k, v)| format!("metadata.{}={}", encode_component(k), encode_component(v)))
        .collect();
    format!("?{}", parts.join("&"))
}

fn sbx(id: &str) -> String {
    format!("/v1/sandboxes/{}", encode_component(id))
}

impl Client {
    /// `base_url` is `http://host[:port][/prefix]`; `api_key` may be empty
    /// for `health` only.
    pub fn new(base_url: &str, api_key: &str) -> Result<Self> {
        Self::with_config(base_url, api_key, ClientConfig::default())
    }

    pub fn with_config(base_url: &str, api_key: &str, config: ClientConfig) -> Result<Self> {
        let target = parse_base_url(base_url)?;
        Ok(Client {
            t: Transport::new(target, Some(api_key), config),
        })
    }

    /// `host:port` of the daemon.
    pub fn addr(&self) -> &str {
        &self.t.target.addr
    }

    /// The base URL as given, normalised (`http://host:port/prefix`).
    pub fn base_url(&self) -> String {
        format!("http://{}{}", self.t.target.addr, self.t.target.prefix)
    }

    pub fn config(&self) -> &ClientConfig {
        &self.t.config
    }

    /// The same daemon and key with other limits (a shorter deadline for
    /// one caller, say).
    pub fn with_limits(&self, config: ClientConfig) -> Client {
        let mut c = self.clone();
        c.t.config = config;
        c
    }

    async fn get<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T> {
        let c = &self.t.config;
        self.t
            .json(
                Method::GET,
                path,
                ReqBody::Empty,
                StatusCode::OK,
                c.max_json_bytes,
                c.call_timeout,
            )
            .await
    }

    async fn send<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: ReqBody,
        ok: StatusCode,
    ) -> Result<T> {
        let c = &self.t.config;
        self.t
            .json(method, path, body, ok, c.max_json_bytes, c.call_timeout)
            .await
    }

    fn run_deadline(&self, timeout_seconds: Option<u64>) -> Duration {
        Duration::from_secs(timeout_seconds.unwrap_or(DEFAULT_RUN_TIMEOUT_S))
            + self.t.config.run_slack
    }

    /// Room for a buffered run's answer: each stream up to its cap,
    /// JSON-escaped (at worst 6 bytes per byte), plus the envelope.
    fn run_limit(&self, max_output_bytes: Option<u64>, streams: usize) -> usize {
        let cap = max_output_bytes.unwrap_or(DEFAULT_OUTPUT_BYTES) as usize;
        self.t
            .config
            .max_json_bytes
            .max(cap.saturating_mul(6 * streams).saturating_add(64 << 10))
    }

    // ---- meta ----

    /// `GET /healthz` (no key needed).
    pub async fn health(&self) -> Result<Health> {
        self.get("/healthz").await
    }

    /// Polls `/healthz` until it answers ok or `within` passes (a daemon
    /// just started); the last error when it never did.
    pub async fn wait_healthy(&self, within: Duration) -> Result<Health> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let short = self.with_limits(
                self.t
                    .config
                    .clone()
                    .call_timeout(
                        left.min(Duration::from_secs(5))
                            .max(Duration::from_millis(10)),
                    )
                    .connect_timeout(
                        left.min(Duration::from_secs(2))
                            .max(Duration::from_millis(10)),
                    ),
            );
            match short.health().await {
                Ok(h) if h.status == "ok" => return Ok(h),
                Ok(_) | Err(_)
                    if tokio::time::Instant::now() + Duration::from_millis(100) < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                Ok(h) => {
                    return Err(ClientError::Protocol {
                        method: "GET".into(),
                        path: "/healthz".into(),
                        detail: format!("status {:?}", h.status),
                    })
                }
                Err(e) => return Err(e),
            }
        }
    }

    // ---- templates ----

    pub async fn list_templates(&self) -> Result<Vec<TemplateInfo>> {
        Ok(self.get::<TemplateList>("/v1/templates").await?.templates)
    }

    pub async fn get_template(&self, name: &str) -> Result<TemplateInfo> {
        self.get(&format!("/v1/templates/{}", encode_component(name)))
            .await
    }

    /// Starts a build (202); follow it with `template_build_events`.
    pub async fn create_template(&self, req: &CreateTemplate) -> Result<BuildAccepted> {
        self.send(
            Method::POST,
            "/v1/templates",
            json(req),
            StatusCode::ACCEPTED,
        )
        .await
    }

    pub async fn template_build_events(&self, name: &str, build_id: &str) -> Result<BuildStream> {
        let path = format!(
            "/v1/templates/{}/builds/{}/events",
            encode_component(name),
            encode_component(build_id)
        );
        let s = self
            .t
            .events(
                Method::GET,
                &path,
                ReqBody::Empty,
                self.t.config.max_sse_line,
            )
            .await?;
        Ok(BuildStream::new(s))
    }

    pub async fn delete_template(&self, name: &str) -> Result<()> {
        self.t
            .empty(
                Method::DELETE,
                &format!("/v1/templates/{}", encode_component(name)),
                ReqBody::Empty,
            )
            .await
    }

    // ---- sandboxes ----

    pub async fn create_sandbox(&self, req: &CreateSandbox) -> Result<Sandbox> {
        // A create can boot cold: give it the run slack on top.
        let c = &self.t.config;
        self.t
            .json(
                Method::POST,
                "/v1/sandboxes",
                json(req),
                StatusCode::CREATED,
                c.max_json_bytes,
                c.call_timeout + c.run_slack,
            )
            .await
    }

    pub async fn get_sandbox(&self, id: &str) -> Result<Sandbox> {
        self.get(&sbx(id)).await
    }

    /// Sandboxes whose metadata has every entry of `filter` (empty: all).
    pub async fn list_sandboxes(&self, filter: &BTreeMap<String, String>) -> Result<Vec<Sandbox>> {
        let path = format!("/v1/sandboxes{}", metadata_query(filter));
        Ok(self.get::<SandboxList>(&path).await?.sandboxes)
    }

    /// Destroys a sandbox; idempotent (a gone sandbox is not an error).
    pub async fn delete_sandbox(&self, id: &str) -> Result<()> {
        self.t.empty(Method::DELETE, &sbx(id), ReqBody::Empty).await
    }

    /// Sets the TTL from now.
    pub async fn set_ttl(&self, id: &str, ttl_seconds: u64) -> Result<Sandbox> {
        self.send(
            Method::PATCH,
            &sbx(id),
            json(&PatchSandbox { ttl_seconds }),
            StatusCode::OK,
        )
        .await
    }

    // ---- exec ----

    /// Runs a command to its end and answers its output.
    pub async fn exec(&self, id: &str, req: &ExecRequest) -> Result<ExecResponse> {
        let mut req = req.clone();
        req.background = false;
        self.t
            .json(
                Method::POST,
                &format!("{}/exec", sbx(id)),
                json(&req),
                StatusCode::OK,
                self.run_limit(req.max_output_bytes, 2),
                self.run_deadline(req.timeout_seconds),
            )
            .await
    }

    /// Runs a command and streams its output. Dropping the stream kills it.
    pub async fn exec_stream(&self, id: &str, req: &ExecRequest) -> Result<ExecStream> {
        let mut req = req.clone();
        req.background = false;
        let s = self
            .t
            .events(
                Method::POST,
                &format!("{}/exec/stream", sbx(id)),
                json(&req),
                self.t.config.max_sse_line,
            )
            .await?;
        Ok(ExecStream::new(s))
    }

    // ---- background processes ----

    /// Starts a background process (202). Without `timeout_seconds` it
    /// runs as long as the sandbox.
    pub async fn start_process(&self, id: &str, req: &ExecRequest) -> Result<ProcessInfo> {
        let mut req = req.clone();
        req.background = true;
        self.send(
            Method::POST,
            &format!("{}/exec", sbx(id)),
            json(&req),
            StatusCode::ACCEPTED,
        )
        .await
    }

    pub async fn list_processes(&self, id: &str) -> Result<Vec<ProcessInfo>> {
        Ok(self
            .get::<ProcessList>(&format!("{}/processes", sbx(id)))
            .await?
            .processes)
    }

    fn proc_path(id: &str, pid: &str) -> String {
        format!("{}/processes/{}", sbx(id), encode_component(pid))
    }

    pub async fn get_process(&self, id: &str, pid: &str) -> Result<ProcessInfo> {
        self.get(&Self::proc_path(id, pid)).await
    }

    /// Replays the process's kept output from `offset`, then (following)
    /// streams it live until it exits. Dropping the stream leaves the
    /// process running.
    pub async fn process_output(
        &self,
        id: &str,
        pid: &str,
        opts: &OutputOptions,
    ) -> Result<ProcessStream> {
        let mut q = Vec::new();
        if let Some(o) = opts.offset {
            q.push(format!("offset={o}"));
        }
        if let Some(f) = opts.follow {
            q.push(format!("follow={f}"));
        }
        if let Some(e) = opts.encoding {
            q.push(format!(
                "encoding={}",
                match e {
                    OutputEncoding::Text => "text",
                    OutputEncoding::Base64 => "base64",
                }
            ));
        }
        let mut path = format!("{}/output", Self::proc_path(id, pid));
        if !q.is_empty() {
            path = format!("{path}?{}", q.join("&"));
        }
        let s = self
            .t
            .events(
                Method::GET,
                &path,
                ReqBody::Empty,
                self.t.config.max_sse_line,
            )
            .await?;
        Ok(ProcessStream::new(s))
    }

    /// Writes bytes to the process's stdin (at most 1 MiB a call).
    pub async fn write_stdin(&self, id: &str, pid: &str, data: impl Into<Bytes>) -> Result<()> {
        let data = data.into();
        if data.len() > MAX_STDIN_WRITE {
            return Err(ClientError::InvalidRequest(format!(
                "stdin writes are at most {MAX_STDIN_WRITE} bytes"
            )));
        }
        self.t
            .empty(
                Method::POST,
                &format!("{}/stdin", Self::proc_path(id, pid)),
                ReqBody::Bytes(data),
            )
            .await
    }

    pub async fn close_stdin(&self, id: &str, pid: &str) -> Result<()> {
        self.t
            .empty(
                Method::POST,
                &format!("{}/stdin/close", Self::proc_path(id, pid)),
                ReqBody::Empty,
            )
            .await
    }

    pub async fn signal_process(
        &self,
        id: &str,
        pid: &str,
        signal: impl Into<Signal>,
    ) -> Result<ProcessInfo> {
        self.send(
            Method::POST,
            &format!("{}/signal", Self::proc_path(id, pid)),
            json(&SignalBody {
                signal: signal.into(),
            }),
            StatusCode::OK,
        )
        .await
    }

    /// Answers when the process has exited, or after `timeout_seconds`
    /// (default 30, at most 300) with it still running.
    pub async fn wait_process(
        &self,
        id: &str,
        pid: &str,
        timeout_seconds: Option<u64>,
    ) -> Result<ProcessInfo> {
        let mut path = format!("{}/wait", Self::proc_path(id, pid));
        if let Some(t) = timeout_seconds {
            path = format!("{path}?timeout_seconds={t}");
        }
        let c = &self.t.config;
        let secs = timeout_seconds.unwrap_or(30).min(MAX_WAIT_S);
        self.t
            .json(
                Method::POST,
                &path,
                ReqBody::Empty,
                StatusCode::OK,
                c.max_json_bytes,
                Duration::from_secs(secs) + c.run_slack,
            )
            .await
    }

    /// Kills the process and everything it started; answers it reaped.
    pub async fn kill_process(&self, id: &str, pid: &str) -> Result<ProcessInfo> {
        self.send(
            Method::DELETE,
            &Self::proc_path(id, pid),
            ReqBody::Empty,
            StatusCode::OK,
        )
        .await
    }

    // ---- files ----

    /// Writes a file (parents created).
    pub async fn write_file(&self, id: &str, path: &str, data: impl Into<Bytes>) -> Result<()> {
        let p = format!("{}/files?path={}", sbx(id), encode_path(path)?);
        self.t
            .empty(Method::PUT, &p, ReqBody::Bytes(data.into()))
            .await
    }

    /// Reads a file (at most `max_file_bytes`).
    pub async fn read_file(&self, id: &str, path: &str) -> Result<Bytes> {
        let p = format!("{}/files?path={}", sbx(id), encode_path(path)?);
        let c = &self.t.config;
        let (status, body) = self
            .t
            .call(
                Method::GET,
                &p,
                ReqBody::Empty,
                c.max_file_bytes,
                c.call_timeout,
            )
            .await?;
        if status != StatusCode::OK {
            return Err(crate::transport::status_error(
                &Method::GET,
                &p,
                status,
                &body,
            ));
        }
        Ok(body)
    }

    pub async fn list_files(&self, id: &str, path: &str) -> Result<FileList> {
        self.get(&format!(
            "{}/files/list?path={}",
            sbx(id),
            encode_path(path)?
        ))
        .await
    }

    pub async fn delete_file(&self, id: &str, path: &str) -> Result<()> {
        let p = format!("{}/files?path={}", sbx(id), encode_path(path)?);
        self.t.empty(Method::DELETE, &p, ReqBody::Empty).await
    }

    // ---- snapshots ----

    pub async fn create_snapshot(&self, id: &str, req: &CreateSnapshot) -> Result<Snapshot> {
        let c = &self.t.config;
        self.t
            .json(
                Method::POST,
                &format!("{}/snapshots", sbx(id)),
                json(req),
                StatusCode::CREATED,
                c.max_json_bytes,
                c.call_timeout + c.run_slack,
            )
            .await
    }

    pub async fn list_snapshots(&self, filter: &BTreeMap<String, String>) -> Result<Vec<Snapshot>> {
        let path = format!("/v1/snapshots{}", metadata_query(filter));
        Ok(self.get::<SnapshotList>(&path).await?.snapshots)
    }

    pub async fn get_snapshot(&self, id: &str) -> Result<Snapshot> {
        self.get(&format!("/v1/snapshots/{}", encode_component(id)))
            .await
    }

    pub async fn delete_snapshot(&self, id: &str) -> Result<()> {
        self.t
            .empty(
                Method::DELETE,
                &format!("/v1/snapshots/{}", encode_component(id)),
                ReqBody::Empty,
            )
            .await
    }

    /// Stores a secret (operator key only); answers what the API shows of
    /// it, never the value.
    pub async fn create_secret(&self, req: &CreateSecret) -> Result<SecretInfo> {
        let c = &self.t.config;
        self.t
            .json(
                Method::POST,
                "/v1/secrets",
                json(req),
                StatusCode::CREATED,
                c.max_json_bytes,
                c.call_timeout,
            )
            .await
    }

    pub async fn list_secrets(&self) -> Result<Vec<SecretInfo>> {
        Ok(self.get::<SecretList>("/v1/secrets").await?.secrets)
    }

    pub async fn delete_secret(&self, name: &str) -> Result<()> {
        self.t
            .empty(
                Method::DELETE,
                &format!("/v1/secrets/{}", encode_component(name)),
                ReqBody::Empty,
            )
            .await
    }

    /// New sandboxes from a snapshot (`count`, default 1).
    pub async fn fork(&self, snapshot_id: &str, req: &ForkRequest) -> Result<Vec<Sandbox>> {
        let c = &self.t.config;
        let list: SandboxList = self
            .t
            .json(
                Method::POST,
                &format!("/v1/snapshots/{}/fork", encode_component(snapshot_id)),
                json(req),
                StatusCode::CREATED,
                c.max_json_bytes,
                c.call_timeout + c.run_slack,
            )
            .await?;
        Ok(list.sandboxes)
    }

    /// One sandbox restored from a snapshot (a fork of one).
    pub async fn restore(&self, snapshot_id: &str, req: &ForkRequest) -> Result<Sandbox> {
        let mut req = req.clone();
        req.count = Some(1);
        let path = format!("/v1/snapshots/{}/fork", encode_component(snapshot_id));
        self.fork(snapshot_id, &req)
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| ClientError::Protocol {
                method: "POST".into(),
                path,
                detail: "a fork of one answered no sandbox".into(),
            })
    }

    /// Keeps `size` forks of the snapshot restored and parked on its host
    /// (0 drops them): a later fork claims one instead of restoring.
    pub async fn set_snapshot_pool(&self, snapshot_id: &str, size: u64) -> Result<SnapshotPool> {
        self.send(
            Method::PUT,
            &format!("/v1/snapshots/{}/pool", encode_component(snapshot_id)),
            json(&SnapshotPoolRequest { size }),
            StatusCode::OK,
        )
        .await
    }

    pub async fn snapshot_pool(&self, snapshot_id: &str) -> Result<SnapshotPool> {
        self.get(&format!(
            "/v1/snapshots/{}/pool",
            encode_component(snapshot_id)
        ))
        .await
    }

    // ---- network ----

    pub async fn get_network(&self, id: &str) -> Result<NetworkPolicy> {
        self.get(&format!("{}/network", sbx(id))).await
    }

    /// Replaces the egress policy (applied to live connections too).
    pub async fn set_network(&self, id: &str, policy: &NetworkPolicy) -> Result<NetworkPolicy> {
        self.send(
            Method::PUT,
            &format!("{}/network", sbx(id)),
            json(policy),
            StatusCode::OK,
        )
        .await
    }

    pub async fn network_events(&self, id: &str) -> Result<Vec<EgressEvent>> {
        Ok(self.network_event_list(id).await?.events)
    }

    /// The events and the exact count of refused connections.
    pub async fn network_event_list(&self, id: &str) -> Result<EgressEventList> {
        self.get::<EgressEventList>(&format!("{}/network/events", sbx(id)))
            .await
    }

    // ---- code ----

    /// Runs code in an interpreter context (state carries over).
    pub async fn run_code(&self, id: &str, req: &CodeRequest) -> Result<CodeResponse> {
        self.t
            .json(
                Method::POST,
                &format!("{}/code", sbx(id)),
                json(req),
                StatusCode::OK,
                self.run_limit(req.max_output_bytes, 3),
                self.run_deadline(req.timeout_seconds),
            )
            .await
    }

    /// Runs code and streams its events. Dropping the stream cancels it.
    pub async fn run_code_stream(&self, id: &str, req: &CodeRequest) -> Result<CodeStream> {
        // A result event carries its whole MIME bundle on one line.
        let cap = req.max_output_bytes.unwrap_or(DEFAULT_OUTPUT_BYTES) as usize;
        let max_line = self
            .t
            .config
            .max_sse_line
            .max(cap.saturating_mul(2).saturating_add(64 << 10));
        let s = self
            .t
            .events(
                Method::POST,
                &format!("{}/code/stream", sbx(id)),
                json(req),
                max_line,
            )
            .await?;
        Ok(CodeStream::new(s))
    }

    pub async fn create_context(&self, id: &str, req: &CreateContext) -> Result<CodeContext> {
        self.send(
            Method::POST,
            &format!("{}/code/contexts", sbx(id)),
            json(req),
            StatusCode::CREATED,
        )
        .await
    }

    pub async fn list_contexts(&self, id: &str) -> Result<Vec<CodeContext>> {
        Ok(self
            .get::<CodeContextList>(&format!("{}/code/contexts", sbx(id)))
            .await?
            .contexts)
    }

    pub async fn restart_context(&self, id: &str, context_id: &str) -> Result<CodeContext> {
        let path = format!(
            "{}/code/contexts/{}/restart",
            sbx(id),
            encode_component(context_id)
        );
        self.send(Method::POST, &path, ReqBody::Empty, StatusCode::OK)
            .await
    }

    pub async fn delete_context(&self, id: &str, context_id: &str) -> Result<()> {
        let path = format!("{}/code/contexts/{}", sbx(id), encode_component(context_id));
        self.t.empty(Method::DELETE, &path, ReqBody::Empty).await
    }

    // ---- ports and terminals ----

    /// A signed, expiring URL for a port of the sandbox (no key needed to
    /// use it).
    pub async fn preview_url(
        &self,
        id: &str,
        port: u16,
        ttl_seconds: Option<u64>,
    ) -> Result<PreviewUrl> {
        self.send(
            Method::POST,
            &format!("{}/ports/{port}/preview-url", sbx(id)),
            json(&CreatePreviewUrl { ttl_seconds }),
            StatusCode::OK,
        )
        .await
    }

    /// The path that proxies to a port of the sandbox (with the key).
    pub fn port_path(&self, id: &str, port: u16) -> String {
        format!("{}{}/ports/{port}/", self.t.target.prefix, sbx(id))
    }

    /// A short-lived token for the terminal WebSocket.
    pub async fn terminal_token(&self, id: &str) -> Result<TerminalToken> {
        self.send(
            Method::POST,
            &format!("{}/pty/token", sbx(id)),
            ReqBody::Empty,
            StatusCode::OK,
        )
        .await
    }

    /// The terminal WebSocket URL (`ws://.../v1/sandboxes/{id}/pty?token=`).
    pub fn terminal_url(&self, id: &str, token: &str) -> String {
        format!(
            "ws://{}{}{}/pty?token={}",
            self.t.target.addr,
            self.t.target.prefix,
            sbx(id),
            encode_component(token)
        )
    }

    // ---- raw calls, for routes this crate does not type yet ----

    /// A JSON call to any route: the JSON answer, or `Value::Null` for an
    /// empty (204) one. Any non-2xx is an error.
    pub async fn request_json(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value> {
        let c = &self.t.config;
        let body = body.map(json).unwrap_or(ReqBody::Empty);
        let (status, bytes) = self
            .t
            .call(method.clone(), path, body, c.max_json_bytes, c.call_timeout)
            .await?;
        if !status.is_success() {
            return Err(crate::transport::status_error(
                &method, path, status, &bytes,
            ));
        }
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Protocol {
            method: method.to_string(),
            path: path.to_string(),
            detail: format!("answer is not JSON: {e}"),
        })
    }

    /// Raw bytes to and from any route (`application/octet-stream` when a
    /// body is given): the answer's bytes, at most `max_file_bytes`. Any
    /// non-2xx is an error.
    pub async fn request_bytes(
        &self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
    ) -> Result<Bytes> {
        let c = &self.t.config;
        let body = body.map(ReqBody::Bytes).unwrap_or(ReqBody::Empty);
        let (status, bytes) = self
            .t
            .call(method.clone(), path, body, c.max_file_bytes, c.call_timeout)
            .await?;
        if !status.is_success() {
            return Err(crate::transport::status_error(
                &method, path, status, &bytes,
            ));
        }
        Ok(bytes)
    }

    /// Opens any event-stream route.
    pub async fn request_events(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<EventStream> {
        let body = body.map(json).unwrap_or(ReqBody::Empty);
        self.t
            .events(method, path, body, self.t.config.max_sse_line)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes() {
        assert_eq!(encode_path("/a b/c%d").unwrap(), "/a%20b/c%25d");
        assert!(encode_path("rel").is_err());
        assert_eq!(encode_component("../x"), "..%2Fx");
        let mut f = BTreeMap::new();
        assert_eq!(metadata_query(&f), "");
        f.insert("owner".to_string(), "a&b".to_string());
        assert_eq!(metadata_query(&f), "?metadata.owner=a%26b");
    }

    #[test]
    fn requests_serialize_only_what_is_set() {
        let r = ExecRequest::cmd("echo hi").cpu_limit_ms(500).env("A", "1");
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"cmd": "echo hi", "cpu_limit_ms": 500, "env": {"A": "1"}})
        );
        let v = serde_json::to_value(CreateSandbox::default()).unwrap();
        assert_eq!(v, serde_json::json!({}));
        let v = serde_json::to_value(SignalBody {
            signal: "TERM".into(),
        })
        .unwrap();
        assert_eq!(v, serde_json::json!({"signal": "TERM"}));
        let v = serde_json::to_value(SignalBody { signal: 9.into() }).unwrap();
        assert_eq!(v, serde_json::json!({"signal": 9}));
    }

    #[test]
    fn unknown_reason_is_kept() {
        let r: ExecReason = serde_json::from_str("\"something_new\"").unwrap();
        assert_eq!(r, ExecReason::Unknown);
    }

    #[test]
    fn deadlines_cover_the_run() {
        let c = Client::new("http://127.0.0.1:1", "k").unwrap();
        assert_eq!(c.run_deadline(Some(100)), Duration::from_secs(130));
        assert!(c.run_limit(Some(8 << 20), 2) > 2 * (8 << 20));
        assert_eq!(
            c.terminal_url("sbx_1", "a+b"),
            "ws://127.0.0.1:1/v1/sandboxes/sbx_1/pty?token=a%2Bb"
        );
        let c = Client::new("http://127.0.0.1:1", "secret-key").unwrap();
        assert!(!format!("{c:?}").contains("secret-key"));
    }
}
