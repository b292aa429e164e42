use hatchery_runtime::RuntimeError;
use hatchery_templates::TemplateError;

#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    #[error("sandbox {0} not found")]
    SandboxNotFound(String),
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// The template exists only as a build in progress: a create may
    /// retry once it is done.
    #[error("template '{name}' is still being built ({step}, {percent}%); retry shortly")]
    TemplateBuilding {
        name: String,
        step: String,
        percent: u32,
    },
    #[error("{0}")]
    Invalid(String),
    #[error("file not found: {0}")]
    FileNotFound(String),
    #[error("{0}")]
    FileConflict(String),
    #[error("{0}")]
    TooLarge(String),
    #[error("sandbox capacity reached ({0} live); try again later")]
    Capacity(usize),
    #[error("{0}")]
    Conflict(String),
    #[error("{0} terminals are attached to this sandbox already (the limit); close one first")]
    TooManyTerminals(usize),
    #[error("sandbox {0} is not running")]
    NotRunning(String),
    #[error("the sandbox's guest stopped answering: {0}")]
    GuestUnresponsive(String),
    /// The sandbox died of memory while the request ran in it; `reason`
    /// is its stop reason (`host_oom` or `guest_oom`, see
    /// `hatchery_runtime::EndCause`).
    #[error("sandbox {id} ended: out of memory ({reason})")]
    SandboxOom { id: String, reason: &'static str },
    #[error("guest error ({code}): {message}")]
    Guest { code: String, message: String },
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("code context {0}")]
    ContextNotFound(String),
    #[error("process {0}")]
    ProcessNotFound(String),
    #[error("{0}")]
    TooMany(String),
    #[error("snapshot {0} not found")]
    SnapshotNotFound(String),
    /// The snapshot would take its store past the storage cap.
    #[error("the snapshot store is full: {used} of {cap} bytes used, this snapshot needs {need} more; delete snapshots or raise --snapshot-store-max-mb")]
    SnapshotStoreFull { used: u64, need: u64, cap: u64 },
    #[error("{0}")]
    SnapshotCorrupt(String),
    #[error(transparent)]
    Network(#[from] hatchery_net::NetError),
    #[error("{0}")]
    PortClosed(String),
    #[error("{0}")]
    TooManyConnections(String),
    #[error("the sandbox's server answered badly: {0}")]
    BadGateway(String),
    #[error("service worker scripts are not served through the relay: a guest page may not install a worker")]
    ServiceWorkerRefused,
    #[error(transparent)]
    HostService(#[from] crate::host_services::HostServiceError),
    #[error("state store: {0}")]
    Store(#[from] hatchery_store::StoreError),
    #[error("internal: {0}")]
    Internal(String),
}
