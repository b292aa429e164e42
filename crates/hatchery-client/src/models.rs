//! The wire shapes of the API (docs/openapi.json is the source of truth; a
//! unit test checks these field names against it). Answers are read
//! leniently (unknown fields ignored, unknown enum values kept as
//! `Unknown`) so a newer daemon does not break an older client. Build
//! request structs with `..Default::default()`: fields get added.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

fn is_false(b: &bool) -> bool {
    !*b
}

/// `GET /healthz`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Health {
    pub status: String,
    #[serde(default)]
    pub runtime: String,
    /// Live sandboxes.
    #[serde(default)]
    pub live: u64,
}

// ---- sandboxes ----

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CreateSandbox {
    /// Default: the daemon's default template.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// Environment of every command run in the sandbox.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Egress policy from the start (default: the daemon's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkPolicy>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sandbox {
    pub id: String,
    pub template: String,
    /// `starting`, `running` or `stopped`.
    pub state: String,
    pub created_at: String,
    pub expires_at: String,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// On create and fork only: `pool`, `restore`, `cold` or `fork`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_ms: Option<u64>,
    /// Lost sandboxes only (`?state=lost`): the host it was lost with,
    /// when (RFC 3339) and why (`host_lost`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxList {
    pub sandboxes: Vec<Sandbox>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PatchSandbox {
    pub ttl_seconds: u64,
}

// ---- templates ----

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TemplateInfo {
    pub name: String,
    pub version: String,
    pub base: String,
    #[serde(default)]
    pub packages: Vec<String>,
    #[serde(default)]
    pub pip: Vec<String>,
    #[serde(default)]
    pub files: Vec<String>,
    #[serde(default)]
    pub setup: Vec<String>,
    pub cpus: f64,
    pub memory_mb: u64,
    pub pids_max: u32,
    pub disk_mb: u64,
    #[serde(default)]
    pub checkpoint_ready: bool,
    /// `Ready` (older daemons send none), or `Building`: no version yet,
    /// creates answer 503 `template_building` until the build is done.
    #[serde(default)]
    pub state: TemplateState,
    /// The build of this template in progress, if any.
    #[serde(default)]
    pub build: Option<BuildProgress>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TemplateState {
    #[default]
    Ready,
    Building,
    /// A state this client does not know yet.
    #[serde(other)]
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BuildProgress {
    pub build_id: String,
    pub version: String,
    /// `queued`, `rootfs`, `setup` or `activate`.
    pub step: String,
    pub percent: u32,
    pub events_url: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TemplateList {
    pub templates: Vec<TemplateInfo>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CreateTemplate {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub packages: Vec<String>,
    /// Python requirements installed into the rootfs by the host's pip.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pip: Vec<String>,
    /// Path in the image → text content.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub files: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub setup: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pids_max: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_mb: Option<u64>,
    /// The build's network (deny-only; see docs/api.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BuildAccepted {
    pub build_id: String,
    pub name: String,
    pub version: String,
    pub events_url: String,
}

/// One event of a template build: `step`, `log`, `done` or `error`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BuildEvent {
    pub kind: String,
    pub data: serde_json::Value,
}

// ---- exec ----

/// `text` (default) or `base64` for stdout/stderr.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputEncoding {
    #[default]
    Text,
    Base64,
}

/// Why a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecReason {
    Exited,
    Signaled,
    Timeout,
    CpuLimit,
    Oom,
    OutputLimit,
    Cancelled,
    /// A reason this client does not know yet.
    #[serde(other)]
    Unknown,
}

/// A command: exactly one of `cmd` (run by `/bin/sh -c`) or `argv`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExecRequest {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cmd: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<String>>,
    /// Absolute working directory (default `/`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Sent to stdin, which is then closed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// Default 60 (the daemon's default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u64>,
    /// Per-stream cap (default 1 MiB).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<u64>,
    /// CPU time of everything the command started, after which it is all
    /// killed (`reason` `cpu_limit`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_limit_ms: Option<u64>,
    /// The clock `cpu_limit_ms` is judged on (default `Guest`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_limit_basis: Option<CpuLimitBasis>,
    /// Set by `Client::start_process`; `Client::exec` clears it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub background: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<OutputEncoding>,
}

impl ExecRequest {
    /// `/bin/sh -c CMD`.
    pub fn cmd(cmd: impl Into<String>) -> Self {
        ExecRequest {
            cmd: Some(cmd.into()),
            ..Default::default()
        }
    }

    /// A program and its arguments, no shell.
    pub fn argv<I, S>(argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ExecRequest {
            argv: Some(argv.into_iter().map(Into::into).collect()),
            ..Default::default()
        }
    }

    pub fn cwd(mut self, cwd: impl Into<String>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }

    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(key.into(), value.into());
        self
    }

    pub fn stdin(mut self, data: impl Into<String>) -> Self {
        self.stdin = Some(data.into());
        self
    }

    pub fn timeout_seconds(mut self, s: u64) -> Self {
        self.timeout_seconds = Some(s);
        self
    }

    pub fn max_output_bytes(mut self, n: u64) -> Self {
        self.max_output_bytes = Some(n);
        self
    }

    pub fn cpu_limit_ms(mut self, ms: u64) -> Self {
        self.cpu_limit_ms = Some(ms);
        self
    }

    pub fn output(mut self, enc: OutputEncoding) -> Self {
        self.output = Some(enc);
        self
    }

    /// Judges `cpu_limit_ms` on the host's accounting of the whole sandbox
    /// (`host_cpu_ms`), steadier than the guest's on a busy host.
    pub fn cpu_limit_on_host(mut self) -> Self {
        self.cpu_limit_basis = Some(CpuLimitBasis::Host);
        self
    }
}

/// The clock a CPU limit is judged on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CpuLimitBasis {
    /// The command's own CPU as the guest counts it (`cpu_ms`).
    Guest,
    /// The sandbox's CPU as the host counts it (`host_cpu_ms`).
    Host,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecResponse {
    pub exit_code: i32,
    pub stdout: String,
    pub stderr: String,
    pub reason: ExecReason,
    pub duration_ms: u64,
    pub cpu_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_peak_bytes: Option<u64>,
    #[serde(default)]
    pub timed_out: bool,
    #[serde(default)]
    pub truncated: bool,
    #[serde(default)]
    pub oom_killed: bool,
    /// Every process the command started was gone when it ended.
    #[serde(default)]
    pub contained: bool,
    /// CPU the host spent on the whole sandbox meanwhile (`None`: the
    /// daemon's runtime cannot tell).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_cpu_ms: Option<u64>,
}

/// `{"data": ...}` of an exec stream's stdout/stderr event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputChunk {
    pub data: String,
}

// ---- background processes ----

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessInfo {
    /// `proc_...`: the id in `/processes/{pid}` paths.
    pub id: String,
    /// The guest's pid.
    pub pid: i32,
    pub argv: Vec<String>,
    pub started_at: String,
    /// `running` or `exited`.
    pub state: String,
    #[serde(default)]
    pub exit_code: Option<i32>,
    #[serde(default)]
    pub signal: Option<i32>,
    #[serde(default)]
    pub reason: Option<ExecReason>,
    /// Memory ended it (`reason` is then `oom`).
    #[serde(default)]
    pub oom_killed: bool,
    pub cpu_ms: u64,
    pub output_bytes: u64,
    pub first_offset: u64,
    pub stdin_open: bool,
}

impl ProcessInfo {
    pub fn is_running(&self) -> bool {
        self.state == "running"
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessList {
    pub processes: Vec<ProcessInfo>,
}

/// A piece of a background process's output and its offset in the ring.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessChunk {
    pub data: String,
    pub offset: u64,
}

/// Where `process_output` starts and whether it follows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OutputOptions {
    /// Default 0 (the oldest byte still kept).
    pub offset: Option<u64>,
    /// Default true: keep streaming until the process exits.
    pub follow: Option<bool>,
    pub encoding: Option<OutputEncoding>,
}

/// A signal by number or by name (`"TERM"`, `"SIGINT"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Signal {
    Number(i32),
    Name(String),
}

impl From<i32> for Signal {
    fn from(n: i32) -> Self {
        Signal::Number(n)
    }
}

impl From<&str> for Signal {
    fn from(s: &str) -> Self {
        Signal::Name(s.to_string())
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SignalBody {
    pub signal: Signal,
}

// ---- files ----

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileEntry {
    pub name: String,
    /// `file`, `dir`, `symlink` or `other`.
    #[serde(rename = "type")]
    pub kind: String,
    pub size: u64,
    pub mode: u32,
    /// Seconds since the epoch.
    pub mtime: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileList {
    pub path: String,
    pub entries: Vec<FileEntry>,
}

// ---- snapshots ----

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CreateSnapshot {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retention_seconds: Option<u64>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// `Some(false)`: the sandbox's files only (a filesystem-only pause).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub id: String,
    pub sandbox_id: String,
    pub template: String,
    pub created_at: String,
    pub expires_at: String,
    pub size_bytes: u64,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Whether it holds memory and processes (`false`: files only). An
    /// older daemon does not say: all its snapshots do.
    #[serde(default = "yes")]
    pub memory: bool,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotList {
    pub snapshots: Vec<Snapshot>,
}

/// `POST /v1/snapshots/{id}/fork`: `count` sandboxes from one snapshot
/// (restoring a snapshot is a fork of one).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ForkRequest {
    /// Default 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// The forks' egress policy (default deny-all: a fork never inherits
    /// an open network).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkPolicy>,
}

/// `PUT /v1/snapshots/{id}/pool` (operator only).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SnapshotPoolRequest {
    /// Forks to keep restored and parked on the host (0..8; 0 drops them).
    pub size: u64,
}

/// A snapshot's warm pool of forks on its host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotPool {
    pub snapshot_id: String,
    pub size: u64,
    /// Forks ready now.
    pub ready: u64,
    /// Their sandbox ids (parked until a fork claims one).
    #[serde(default)]
    pub sandbox_ids: Vec<String>,
}

// ---- network ----

/// What happens to traffic no rule matches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EgressMode {
    #[default]
    Deny,
    Allow,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cidr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Empty: every port.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<u16>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkPolicy {
    #[serde(default)]
    pub egress: EgressMode,
    #[serde(default)]
    pub allow: Vec<NetworkRule>,
    #[serde(default)]
    pub deny: Vec<NetworkRule>,
}

impl NetworkPolicy {
    /// No egress at all.
    pub fn deny_all() -> Self {
        NetworkPolicy::default()
    }

    /// Only to these rules.
    pub fn allow_only(rules: Vec<NetworkRule>) -> Self {
        NetworkPolicy {
            egress: EgressMode::Deny,
            allow: rules,
            deny: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EgressEvent {
    /// 1, 2, ... per sandbox in the order logged (0 from daemons that did
    /// not number them).
    #[serde(default)]
    pub seq: u64,
    pub time: String,
    pub protocol: String,
    pub destination: String,
    #[serde(default)]
    pub port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EgressEventList {
    pub events: Vec<EgressEvent>,
    /// Every new connection the sandbox's policy refused, logged or not.
    #[serde(default)]
    pub denied_total: Option<u64>,
}

// ---- code ----

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CodeRequest {
    pub code: String,
    /// Default `python`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    /// Default: the language's default context.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_limit_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

impl CodeRequest {
    pub fn python(code: impl Into<String>) -> Self {
        CodeRequest {
            code: code.into(),
            ..Default::default()
        }
    }
}

/// The exception a snippet ended with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CodeError {
    pub name: String,
    pub value: String,
    #[serde(default)]
    pub traceback: String,
}

/// A rich result: a MIME bundle (`text/plain`, `image/png`, ...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CodeResultItem {
    pub data: serde_json::Map<String, serde_json::Value>,
    #[serde(default)]
    pub is_main_result: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CodeSummary {
    pub context_id: String,
    pub execution_count: u64,
    #[serde(default)]
    pub error: Option<CodeError>,
    pub reason: ExecReason,
    pub duration_ms: u64,
    pub cpu_ms: u64,
    #[serde(default)]
    pub memory_peak_bytes: Option<u64>,
    #[serde(default)]
    pub truncated: bool,
    #[serde(default)]
    pub oom_killed: bool,
    /// The context's interpreter was restarted (it died or was killed).
    #[serde(default)]
    pub restarted: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CodeResponse {
    pub stdout: String,
    pub stderr: String,
    #[serde(default)]
    pub results: Vec<CodeResultItem>,
    #[serde(flatten)]
    pub summary: CodeSummary,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CreateContext {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CodeContext {
    pub id: String,
    pub language: String,
    pub cwd: String,
    pub state: String,
    pub execution_count: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CodeContextList {
    pub contexts: Vec<CodeContext>,
}

// ---- ports and terminals ----

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CreatePreviewUrl {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreviewUrl {
    pub url: String,
    pub path: String,
    pub expires_at: String,
    pub sandbox_id: String,
    pub port: u16,
}

/// A short-lived grant for `GET /v1/sandboxes/{id}/pty?token=` (browsers
/// cannot set headers on a WebSocket).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TerminalToken {
    pub token: String,
    pub expires_at: String,
}

/// The error body every error answer carries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorDetail {
    pub code: String,
    pub message: String,
}

// ---- secrets ----

/// `POST /v1/secrets`: a secret the egress proxy injects (docs/api.md,
/// "Secrets"). Its value is write-only, and not shown by `Debug`.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct CreateSecret {
    pub name: String,
    pub value: String,
}

impl std::fmt::Debug for CreateSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreateSecret")
            .field("name", &self.name)
            .field("value", &format_args!("<{} bytes>", self.value.len()))
            .finish()
    }
}

/// What the API shows of a secret: never its value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SecretInfo {
    pub name: String,
    /// The tenant whose secret it is; `None` for the operator's.
    #[serde(default)]
    pub tenant: Option<String>,
    /// The value's length in bytes.
    pub bytes: u64,
    pub created_at: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SecretList {
    pub secrets: Vec<SecretInfo>,
}
