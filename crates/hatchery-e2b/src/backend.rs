//! The narrow interface this crate needs from Hatchery. The
//! `hatchery-e2b-backend` crate implements it over hatchery-core's
//! manager; this crate never sees Hatchery's internals, only these types.

use async_trait::async_trait;
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::sync::mpsc;

/// What went wrong, in the categories both protocols need to tell apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailKind {
    SandboxNotFound,
    TemplateNotFound,
    SnapshotNotFound,
    FileNotFound,
    ProcessNotFound,
    ContextNotFound,
    Invalid,
    /// Exists but is the wrong kind (a directory where a file was wanted).
    WrongType,
    Conflict,
    PermissionDenied,
    TooLarge,
    NoSpace,
    TooMany,
    Capacity,
    /// The template exists only as a build in progress: retry later.
    TemplateBuilding,
    NotRunning,
    PortClosed,
    Unresponsive,
    Internal,
}

/// A failure as the protocols answer it: a kind and the message sent to
/// the client. `source`, when the backend has one, keeps the error it
/// came from for logs (shared, so the error stays `Clone`).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct BackendError {
    pub kind: FailKind,
    pub message: String,
    #[source]
    pub source: Option<std::sync::Arc<dyn std::error::Error + Send + Sync>>,
}

impl BackendError {
    pub fn new(kind: FailKind, message: impl Into<String>) -> Self {
        BackendError {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// An error of `kind` answered with `message`, caused by `source`.
    pub fn caused_by(
        kind: FailKind,
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        BackendError {
            kind,
            message: message.into(),
            source: Some(std::sync::Arc::new(source)),
        }
    }
}

pub type BResult<T> = Result<T, BackendError>;

/// The sandbox and snapshot metadata key that names their tenant, as
/// Hatchery's own API writes it (`metadata.tenant`): a tenant's E2B
/// sandboxes and snapshots carry it, set from the caller's key.
pub const TENANT_KEY: &str = "tenant";

/// Who an E2B request comes from: the deployment's key (everything), or
/// one tenant's key (only what records that tenant; see [`crate::tenancy`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    Operator,
    Tenant(String),
}

impl Caller {
    pub fn tenant(&self) -> Option<&str> {
        match self {
            Caller::Operator => None,
            Caller::Tenant(t) => Some(t),
        }
    }
}

/// A live sandbox as Hatchery reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxView {
    pub id: String,
    pub template: String,
    pub created_at_ms: u64,
    pub expires_at_ms: u64,
    pub metadata: BTreeMap<String, String>,
    pub cpus: f64,
    pub memory_mb: u64,
    pub disk_mb: u64,
    /// E2B's lifecycle settings, once read from the metadata by the
    /// adapter (`state::present`); the default from a backend.
    pub lifecycle: crate::lifecycle::Lifecycle,
}

#[derive(Debug, Clone, Default)]
pub struct CreateSpec {
    pub template: String,
    pub ttl_seconds: u64,
    pub metadata: BTreeMap<String, String>,
    pub env: BTreeMap<String, String>,
    /// Egress: `None` keeps Hatchery's default (deny all).
    pub network: Option<NetworkSpec>,
    /// `network.rules`: headers the egress proxy adds to the sandbox's
    /// requests to these hosts (the backend stores the values sealed and
    /// never puts them in the sandbox); empty: none.
    pub header_rules: Vec<HeaderRule>,
}

/// One host's headers from E2B's `network.rules` (checked by
/// `header_rules::parse`), in the order E2B's rules give them (a name set
/// twice keeps the later value, as E2B replaces).
#[derive(Clone, PartialEq, Eq)]
pub struct HeaderRule {
    /// Lower case: a host name, `*.domain` (below it, two labels at
    /// least), or one IPv4 address.
    pub host: String,
    /// Name and value. The value is the secret: never logged.
    pub headers: Vec<(String, String)>,
}

/// Names only: a value never goes into a log line.
impl std::fmt::Debug for HeaderRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("HeaderRule")
            .field("host", &self.host)
            .field("headers", &names)
            .finish()
    }
}

/// Egress rules from E2B's options, checked at the edge (`network`):
/// everything not covered by `allow` or `deny` follows `allow_all`.
/// `deny` never overlaps an address `allow` names when `allow_all` is
/// set, so the order a backend applies them in does not matter there.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NetworkSpec {
    pub allow_all: bool,
    pub allow: Vec<Dest>,
    pub deny: Vec<Dest>,
}

/// One egress destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dest {
    /// An IPv4 network (a bare address is a /32).
    Net {
        addr: std::net::Ipv4Addr,
        prefix: u8,
    },
    /// A host name, resolved by the backend.
    Host(String),
}

impl std::fmt::Display for Dest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dest::Net { addr, prefix } => write!(f, "{addr}/{prefix}"),
            Dest::Host(h) => f.write_str(h),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct ProcSpec {
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// Ends the process after this long; `None`: as long as the sandbox.
    pub timeout: Option<Duration>,
}

/// A background process.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcView {
    pub id: String,
    pub pid: u32,
    pub argv: Vec<String>,
    pub running: bool,
    pub exit_code: Option<i32>,
    /// Why it ended (`exited`, `signaled`, `timeout`, ...).
    pub reason: Option<String>,
    pub stdin_open: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct OutputChunk {
    pub offset: u64,
    pub stderr: bool,
    pub data: Vec<u8>,
}

#[derive(Debug, Clone, Default)]
pub struct ExecOutput {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct FileEntry {
    pub name: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: String,
    pub size: u64,
    pub mode: u32,
    pub mtime: i64,
}

#[derive(Debug, Clone, Default)]
pub struct CodeSpec {
    pub code: String,
    /// `python` or `bash`; empty with a `context` (the context's own).
    pub language: String,
    pub context: Option<String>,
    pub env: BTreeMap<String, String>,
    pub timeout: Duration,
    /// Where the default context goes before this run if nothing has
    /// placed it yet; created if missing.
    pub initial_cwd: Option<String>,
}

/// What a code run reports while it runs.
#[derive(Debug, Clone, PartialEq)]
pub enum CodeEvent {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    /// A rich result or the cell's error, as the kernel reported it
    /// (`{"type": "result"|"error", ...}`).
    Rich(serde_json::Value),
}

#[derive(Debug, Clone, Default)]
pub struct CodeDone {
    pub execution_count: u64,
    /// `exited` when the cell ran to its end, else why it was stopped.
    pub reason: String,
    pub error: Option<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ContextView {
    pub id: String,
    pub language: String,
    pub cwd: String,
}

/// One terminal (a program on a pseudo-terminal) in a sandbox.
#[async_trait]
pub trait Pty: Send + Sync {
    fn pid(&self) -> u32;
    /// The next output, or the exit code once the program has ended.
    async fn next(&self) -> BResult<PtyEvent>;
    async fn input(&self, data: &[u8]) -> BResult<()>;
    async fn resize(&self, cols: u16, rows: u16) -> BResult<()>;
    /// Ends the program and everything started in it.
    async fn close(&self);
}

#[derive(Debug, Clone, PartialEq)]
pub enum PtyEvent {
    Output(Vec<u8>),
    Exit { exit_code: i32, signaled: bool },
}

/// A sandbox's resource use as the host accounts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// CPU time since the sandbox started, in nanoseconds.
    pub cpu_ns: u64,
}

/// How long a resume claim outlives a holder that died mid-resume (a
/// restore takes runsc's 60 s checkpoint limit at worst, plus margin).
pub const RESUME_CLAIM_TTL_S: u64 = 180;

/// A held claim on resuming one paused sandbox (the store's lease on it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumeClaim {
    pub resource: String,
    pub owner: String,
    pub epoch: u64,
}

#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// The daemon's API key, which E2B clients send as `X-API-KEY`.
    fn api_key(&self) -> &str;
    /// The tenant whose API key `key` is, if it is a tenant's (not
    /// whether it is the operator's: that is [`Backend::api_key`]). A
    /// backend without tenants knows none.
    async fn tenant_of_key(&self, _key: &str) -> BResult<Option<String>> {
        Ok(None)
    }
    /// Whether the template exists (after E2B aliases are resolved).
    fn template_exists(&self, name: &str) -> bool;
    /// Why a create of template `name`, which does not exist yet, should
    /// be retried later (`FailKind::TemplateBuilding`), if it should.
    fn template_building(&self, name: &str) -> Option<BackendError> {
        let _ = name;
        None
    }
    async fn create(&self, spec: CreateSpec) -> BResult<SandboxView>;
    async fn get(&self, id: &str) -> BResult<SandboxView>;
    async fn list(&self) -> BResult<Vec<SandboxView>>;
    /// Live sandboxes whose metadata holds every pair of `filter` (on a
    /// shared store, every host's).
    async fn find(&self, filter: BTreeMap<String, String>) -> BResult<Vec<SandboxView>>;
    /// Snapshots whose metadata holds every pair of `filter`: each one's
    /// id and a view of it (its template, metadata and times).
    async fn find_snapshots(
        &self,
        filter: BTreeMap<String, String>,
    ) -> BResult<Vec<(String, SandboxView)>>;
    /// Idempotent.
    async fn kill(&self, id: &str);
    /// The sandbox's CPU use from the host's accounting (its cgroup);
    /// `None` if this host cannot read it.
    async fn usage(&self, id: &str) -> BResult<Option<Usage>>;
    async fn set_ttl(&self, id: &str, ttl_seconds: u64) -> BResult<SandboxView>;
    /// Replaces the egress policy.
    async fn set_network(&self, id: &str, net: NetworkSpec) -> BResult<()>;
    /// Checkpoints the sandbox (it keeps running) and returns the snapshot id.
    async fn snapshot(&self, id: &str, metadata: BTreeMap<String, String>) -> BResult<String>;
    /// Saves the sandbox's files only, not its memory (it keeps running),
    /// and returns the snapshot id; `restore` of it boots the template
    /// with those files (a filesystem-only pause).
    async fn snapshot_files(&self, id: &str, metadata: BTreeMap<String, String>)
        -> BResult<String>;
    /// A new sandbox restored from the snapshot, with egress `network`
    /// (`None`: denied, as Hatchery's forks).
    async fn restore(
        &self,
        snapshot: &str,
        ttl_seconds: u64,
        metadata: BTreeMap<String, String>,
        network: Option<NetworkSpec>,
    ) -> BResult<SandboxView>;
    async fn delete_snapshot(&self, snapshot: &str);
    /// Claims the resume of paused sandbox `e2b_id` across every daemon on
    /// the state store (`None`: another daemon holds the claim). With a
    /// shared snapshot store any host may resume a paused sandbox, so the
    /// per-daemon guard alone would let two hosts restore it at once. Held
    /// until released, or for [`RESUME_CLAIM_TTL_S`] if its holder dies.
    async fn claim_resume(&self, e2b_id: &str) -> BResult<Option<ResumeClaim>>;
    async fn release_resume(&self, claim: ResumeClaim);

    async fn exec(
        &self,
        id: &str,
        argv: Vec<String>,
        stdin: Option<String>,
        timeout: Duration,
    ) -> BResult<ExecOutput>;
    async fn start_process(&self, id: &str, spec: ProcSpec) -> BResult<ProcView>;
    async fn list_processes(&self, id: &str) -> BResult<Vec<ProcView>>;
    /// Output from `offset`; with `follow`, until the process ends. Returns
    /// the process as it ended (or as it is, without `follow`).
    async fn read_process(
        &self,
        id: &str,
        proc_id: &str,
        offset: u64,
        follow: bool,
        tx: mpsc::Sender<OutputChunk>,
    ) -> BResult<ProcView>;
    async fn write_stdin(&self, id: &str, proc_id: &str, data: &[u8]) -> BResult<()>;
    async fn close_stdin(&self, id: &str, proc_id: &str) -> BResult<()>;
    async fn signal_process(&self, id: &str, proc_id: &str, signal: i32) -> BResult<()>;

    async fn read_file(&self, id: &str, path: &str) -> BResult<Vec<u8>>;
    async fn write_file(&self, id: &str, path: &str, data: &[u8]) -> BResult<()>;
    async fn list_dir(&self, id: &str, path: &str) -> BResult<Vec<FileEntry>>;
    async fn remove(&self, id: &str, path: &str) -> BResult<()>;

    async fn run_code(
        &self,
        id: &str,
        spec: CodeSpec,
        tx: mpsc::Sender<CodeEvent>,
    ) -> BResult<CodeDone>;
    /// A new context in `cwd`; `make_cwd`: create it if missing.
    async fn create_context(
        &self,
        id: &str,
        language: &str,
        cwd: String,
        make_cwd: bool,
    ) -> BResult<ContextView>;
    async fn list_contexts(&self, id: &str) -> BResult<Vec<ContextView>>;
    async fn restart_context(&self, id: &str, ctx: &str) -> BResult<()>;
    async fn delete_context(&self, id: &str, ctx: &str) -> BResult<()>;

    /// Relays an HTTP request to `127.0.0.1:port` inside the sandbox.
    async fn proxy_port(
        &self,
        id: &str,
        port: u16,
        req: axum::extract::Request,
        path_and_query: String,
    ) -> BResult<axum::response::Response>;

    async fn open_pty(
        &self,
        id: &str,
        argv: Vec<String>,
        env: BTreeMap<String, String>,
        cols: u16,
        rows: u16,
    ) -> BResult<Box<dyn Pty>>;
}
