//! The narrow view of sandboxes a session needs. Implemented over the
//! typed `hatchery-client` (HTTP to the daemon) in `client_sandboxes.rs`;
//! `fake` is an in-memory one for tests (`cfg(test)`, or the `fake`
//! feature for other crates' tests).

#[cfg(any(test, feature = "fake"))]
pub mod fake;

use async_trait::async_trait;
use futures::stream::BoxStream;
use std::collections::BTreeMap;

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("not found: {0}")]
    NotFound(String),
    #[error("template {0} not found")]
    TemplateNotFound(String),
    /// Out of capacity (retry later).
    #[error("capacity: {0}")]
    Capacity(String),
    /// A network policy the daemon refused (or that does not parse).
    #[error("invalid network policy: {0}")]
    InvalidNetwork(String),
    /// The daemon's snapshot store is at its storage cap.
    #[error("snapshot store full: {0}")]
    StoreFull(String),
    #[error("{0}")]
    Other(String),
}

#[derive(Debug, Clone)]
pub struct NewSandbox {
    pub template: String,
    pub ttl_s: u64,
    pub env: BTreeMap<String, String>,
    pub metadata: BTreeMap<String, String>,
    /// Egress policy from the start (a NetworkPolicy object); `None` is
    /// the daemon's default (deny-all). An environment's set-up opens its
    /// own holes with it.
    pub network: Option<serde_json::Value>,
}

#[derive(Debug, Clone)]
pub struct SandboxInfo {
    pub id: String,
    pub boot_mode: Option<String>,
    pub boot_ms: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct ExecOutcome {
    pub exit_code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// How a [`Sandboxes::run_python`] snippet ended.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PythonOutcome {
    pub stdout: String,
    /// `Name: value` of the exception it raised, if it raised one.
    pub error: Option<String>,
}

/// A connection attempt the sandbox's network policy refused in the
/// kernel (nftables), as the daemon logged it.
/// A sandbox's kernel refusals as its daemon reports them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KernelDenials {
    /// What the kernel logged, the last 256, oldest first.
    pub list: Vec<KernelDenial>,
    /// Every new connection refused since the sandbox got its network
    /// slot, logged or not (the slot's nftables counter); `None` from a
    /// daemon that does not count.
    pub total: Option<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct KernelDenial {
    /// 1, 2, ... per sandbox in the order logged; the daemon keeps the
    /// last 256, so a gap before the first one returned is how many were
    /// dropped before they were read.
    pub seq: u64,
    /// `tcp`, `udp`, `icmp` or `other`.
    pub protocol: String,
    pub destination: String,
    pub port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ProcState {
    Running,
    Exited {
        exit_code: Option<i32>,
        reason: Option<String>,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub enum OutputItem {
    /// Bytes at `offset` in the process's output (stdout and stderr share
    /// one offset space).
    Chunk {
        stdout: bool,
        offset: u64,
        data: Vec<u8>,
    },
    Exit(ProcState),
}

#[async_trait]
pub trait Sandboxes: Send + Sync + 'static {
    async fn template_exists(&self, name: &str) -> Result<bool, SandboxError>;
    /// The template's current version (it changes with every rebuild);
    /// `None` when there is no such template. An environment records it
    /// at build and is rebuilt when it differs.
    async fn template_version(&self, name: &str) -> Result<Option<String>, SandboxError>;
    async fn create(&self, req: NewSandbox) -> Result<SandboxInfo, SandboxError>;
    /// The sandbox is there and not stopped: false once it was deleted
    /// or lost, even while its record is still kept.
    async fn exists(&self, id: &str) -> Result<bool, SandboxError>;
    /// Idempotent.
    async fn delete(&self, id: &str) -> Result<(), SandboxError>;
    async fn exec(
        &self,
        id: &str,
        argv: Vec<String>,
        cwd: &str,
        timeout_s: u64,
    ) -> Result<ExecOutcome, SandboxError>;
    async fn write_file(&self, id: &str, path: &str, data: Vec<u8>) -> Result<(), SandboxError>;
    /// The file's bytes; `NotFound` when it does not exist.
    async fn read_file(&self, id: &str, path: &str) -> Result<Vec<u8>, SandboxError>;
    /// Runs Python `code` in the sandbox's warm interpreter (its default
    /// Python context): no process starts, so a step of the session's
    /// start costs a round trip instead of an interpreter's start (about
    /// 100 ms in gVisor). The context is the sandbox's own; the code must
    /// leave nothing in its globals.
    async fn run_python(
        &self,
        id: &str,
        code: &str,
        timeout_s: u64,
    ) -> Result<PythonOutcome, SandboxError>;
    /// Starts `argv` in the background with stdin open; returns its id.
    async fn start_process(
        &self,
        id: &str,
        argv: Vec<String>,
        cwd: &str,
        env: BTreeMap<String, String>,
    ) -> Result<String, SandboxError>;
    async fn process_state(&self, id: &str, pid: &str) -> Result<ProcState, SandboxError>;
    async fn write_stdin(&self, id: &str, pid: &str, data: Vec<u8>) -> Result<(), SandboxError>;
    /// Output from `offset` on, following; ends with `Exit` (or with the
    /// stream simply ending when the connection broke).
    async fn follow_output(
        &self,
        id: &str,
        pid: &str,
        offset: u64,
    ) -> Result<BoxStream<'static, Result<OutputItem, SandboxError>>, SandboxError>;
    async fn kill_process(&self, id: &str, pid: &str) -> Result<(), SandboxError>;
    async fn snapshot(
        &self,
        id: &str,
        retention_s: u64,
        metadata: BTreeMap<String, String>,
    ) -> Result<String, SandboxError>;
    async fn fork(
        &self,
        snapshot_id: &str,
        ttl_s: u64,
        metadata: BTreeMap<String, String>,
    ) -> Result<SandboxInfo, SandboxError>;
    async fn delete_snapshot(&self, id: &str) -> Result<(), SandboxError>;
    /// Replaces the sandbox's egress policy (a NetworkPolicy object).
    async fn set_network(&self, id: &str, policy: serde_json::Value) -> Result<(), SandboxError>;
    /// The attempts the sandbox's network policy refused in the kernel
    /// that the daemon still keeps (its last 256), oldest first, and how
    /// many it refused in all (exact; the list is what the rate-limited
    /// kernel log reported).
    async fn kernel_denials(&self, id: &str) -> Result<KernelDenials, SandboxError>;
    /// Keeps `size` forks of the snapshot restored and parked on its host
    /// (0 drops them), so that a fork claims one (`boot_mode` `pool`).
    async fn set_snapshot_pool(&self, snapshot_id: &str, size: u64) -> Result<(), SandboxError>;
    /// The metadata a snapshot was taken with.
    async fn snapshot_metadata(&self, id: &str) -> Result<BTreeMap<String, String>, SandboxError>;
}
