//! The narrow view of sandboxes that rounds need. The daemon's public API
//! (through `hatchery-client`) implements it in `client_backend.rs`; rounds
//! never reach the core's internals. `fake` is an in-memory one for
//! tests (`cfg(test)`, or the `fake` feature for other crates' tests).

#[cfg(any(test, feature = "fake"))]
pub mod fake;

use async_trait::async_trait;
use futures::stream::BoxStream;
use std::collections::BTreeMap;

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The daemon answered with an error body.
    #[error("{code} ({status}): {message}")]
    Api {
        status: u16,
        code: String,
        message: String,
    },
    /// No answer, or one that was not the API's.
    #[error("transport: {0}")]
    Transport(String),
}

impl SandboxError {
    pub fn code(&self) -> &str {
        match self {
            SandboxError::Api { code, .. } => code,
            SandboxError::Transport(_) => "transport",
        }
    }
    pub fn is_not_found(&self) -> bool {
        matches!(self, SandboxError::Api { status: 404, .. })
    }
}

#[derive(Debug, Clone)]
pub struct TemplateVersion {
    pub name: String,
    pub version: String,
    pub memory_mb: u64,
}

#[derive(Debug, Clone, Default)]
pub struct NewSandbox {
    pub template: String,
    pub ttl_seconds: u64,
    pub metadata: BTreeMap<String, String>,
    /// The daemon's NetworkPolicy JSON; `None` is deny-all.
    pub network: Option<serde_json::Value>,
}

#[derive(Debug, Clone)]
pub struct ExecSpec {
    pub argv: Vec<String>,
    pub cwd: String,
    pub env: BTreeMap<String, String>,
    pub timeout_seconds: u64,
    pub cpu_limit_ms: Option<u64>,
    /// Judge `cpu_limit_ms` on the host's accounting of the sandbox, and
    /// report that as the outcome's `cpu_ms` (docs/interviews.md#fairness).
    pub cpu_on_host: bool,
    pub max_output_bytes: u64,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExecOutcome {
    pub exit_code: i64,
    pub stdout: String,
    pub stderr: String,
    pub duration_ms: u64,
    pub cpu_ms: u64,
    pub memory_peak_bytes: u64,
    /// exited | signaled | timeout | cpu_limit | oom | output_limit | cancelled
    pub reason: String,
    pub truncated: bool,
    pub oom_killed: bool,
}

#[derive(Debug, Clone)]
pub enum ExecEvent {
    Stdout(String),
    Stderr(String),
    Exit(ExecOutcome),
}

#[derive(Debug, Clone)]
pub struct FileEntry {
    pub path: String,
    pub is_dir: bool,
    pub size: u64,
}

#[async_trait]
pub trait Sandboxes: Send + Sync + 'static {
    async fn template(&self, name: &str) -> Result<TemplateVersion, SandboxError>;
    async fn create(&self, req: NewSandbox) -> Result<String, SandboxError>;
    async fn delete(&self, id: &str) -> Result<(), SandboxError>;
    /// Ids of live sandboxes whose metadata has every pair of `filter`.
    async fn list(&self, filter: BTreeMap<String, String>) -> Result<Vec<String>, SandboxError>;
    async fn exists(&self, id: &str) -> Result<bool, SandboxError>;
    async fn set_network(&self, id: &str, policy: serde_json::Value) -> Result<(), SandboxError>;
    async fn write_file(&self, id: &str, path: &str, data: Vec<u8>) -> Result<(), SandboxError>;
    async fn read_file(&self, id: &str, path: &str) -> Result<Vec<u8>, SandboxError>;
    /// Entries directly under `dir` (absolute paths).
    async fn list_dir(&self, id: &str, dir: &str) -> Result<Vec<FileEntry>, SandboxError>;
    async fn exec(&self, id: &str, spec: ExecSpec) -> Result<ExecOutcome, SandboxError>;
    /// Events as the command runs; dropping the stream kills the command.
    async fn exec_stream(
        &self,
        id: &str,
        spec: ExecSpec,
    ) -> Result<BoxStream<'static, Result<ExecEvent, SandboxError>>, SandboxError>;
    /// A sealed snapshot; returns its id.
    async fn snapshot(
        &self,
        id: &str,
        retention_seconds: u64,
        metadata: BTreeMap<String, String>,
    ) -> Result<String, SandboxError>;
    /// One fork of a snapshot, always with deny-all egress.
    async fn fork(
        &self,
        snapshot_id: &str,
        ttl_seconds: u64,
        metadata: BTreeMap<String, String>,
    ) -> Result<String, SandboxError>;
    async fn delete_snapshot(&self, id: &str) -> Result<(), SandboxError>;
    async fn snapshot_exists(&self, id: &str) -> Result<bool, SandboxError>;
    /// A one-use terminal token for the sandbox's PTY route.
    async fn pty_token(&self, id: &str) -> Result<(String, String), SandboxError>;
}
