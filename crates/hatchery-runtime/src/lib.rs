//! The seam between the sandbox lifecycle and the isolation technology.
//!
//! The core never names gVisor. It asks a [`Runtime`] to create a sandbox
//! from a root filesystem with fixed limits, to hand it a byte stream to the
//! guest agent, and to destroy it completely. gVisor implements this with
//! `runsc` and a per-sandbox shim that owns the agent's stdio pipes; a
//! Firecracker runtime would implement it with a jailer and a vsock stream.
//! Nothing above this trait changes when one is added.

#[cfg(any(test, feature = "fake"))]
pub mod fake;

use async_trait::async_trait;
use std::path::PathBuf;
use std::pin::Pin;
use tokio::io::{AsyncRead, AsyncWrite};

/// Resource shape of a sandbox, fixed by its template.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Limits {
    /// CPU quota in cores (1.0 = one full core).
    pub cpus: f64,
    pub memory_mb: u64,
    /// Processes and threads inside the sandbox.
    pub pids_max: u32,
    /// Cap on what the sandbox may write to its root filesystem.
    pub disk_mb: u64,
}

#[derive(Debug, Clone)]
pub struct SandboxSpec {
    /// Unique on this host for this daemon; also the runtime's container id.
    pub id: String,
    /// Read-only root filesystem shared by every sandbox of a template.
    pub rootfs: PathBuf,
    pub limits: Limits,
    /// Wall-clock deadline (ms since the epoch) after which the runtime must
    /// destroy the sandbox on its own, even if the daemon is not running.
    pub expires_at_ms: u64,
    /// Network namespace to attach the sandbox's own network stack to (the
    /// interfaces, addresses and routes found there). `None`: no network
    /// at all.
    pub netns: Option<PathBuf>,
    /// Started ahead of demand (a warm pool refill): it gets the least CPU
    /// weight the runtime can give until [`Runtime::foreground`], so its
    /// restore and warm-up never take CPU from sandboxes in use.
    pub background: bool,
}

/// A duplex byte stream to the guest agent, speaking `hatchery-agent-proto`.
pub trait AgentIo: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> AgentIo for T {}
pub type AgentStream = Pin<Box<dyn AgentIo>>;

/// Why a guest ended on its own, when the runtime can tell (see
/// [`Runtime::end_cause`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndCause {
    /// The host's backstop fired: the host killed part of the runtime
    /// itself (gVisor's Sentry or gofer) for memory. The guest's own
    /// ceiling should always act first; this one means it did not.
    HostOom,
    /// The guest's own memory ceiling was hit and the guest did not survive
    /// it (the OOM killer chose a process the sandbox needs, its agent).
    GuestOom,
}

impl EndCause {
    /// The sandbox's stop reason and the API's error code for it.
    pub fn reason(self) -> &'static str {
        match self {
            EndCause::HostOom => "host_oom",
            EndCause::GuestOom => "guest_oom",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("sandbox {0} not found in the runtime")]
    NotFound(String),
    #[error("{0} is not supported by the {1} runtime")]
    Unsupported(&'static str, &'static str),
    #[error("runtime failed to start sandbox: {0}")]
    Start(String),
    #[error("runtime i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("runtime: {0}")]
    Other(String),
    /// An export would have been larger than the cap it was given.
    #[error("the sandbox's files are larger than {limit} bytes")]
    TooLarge { limit: u64 },
}

/// A sandbox's resource use, read from the host's accounting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// CPU time used since the sandbox started (Sentry, gofer and guest),
    /// in nanoseconds.
    pub cpu_ns: u64,
}

#[async_trait]
pub trait Runtime: Send + Sync + 'static {
    /// Short name for logs and metrics ("gvisor", "firecracker").
    fn name(&self) -> &'static str;

    /// Creates and starts a sandbox whose init is the guest agent. Returns
    /// once the agent can be connected to. On error nothing is left behind.
    async fn create(&self, spec: &SandboxSpec) -> Result<(), RuntimeError>;

    /// Opens the channel to the sandbox's agent. Callable again after a
    /// daemon restart: that is how live sandboxes are re-adopted.
    async fn connect(&self, id: &str) -> Result<AgentStream, RuntimeError>;

    /// Moves the self-destruct deadline that holds without the daemon.
    async fn set_expiry(&self, id: &str, expires_at_ms: u64) -> Result<(), RuntimeError>;

    /// Destroys the sandbox and every host resource it had (processes,
    /// mounts, cgroups, state directories). Idempotent.
    async fn destroy(&self, id: &str) -> Result<(), RuntimeError>;

    /// Every sandbox this runtime instance owns on the host, alive or not,
    /// including ones the daemon may have forgotten after a crash.
    async fn list(&self) -> Result<Vec<String>, RuntimeError>;

    /// Number of OOM kills inside the sandbox so far, if the runtime can tell.
    fn oom_kills(&self, id: &str) -> Option<u64>;

    /// Why the guest of `id` ended on its own, if it did and the runtime
    /// knows: readable once the agent's channel has closed, until `destroy`
    /// (which forgets it). `None` for a guest still running, an unknown
    /// cause, or a runtime that cannot tell.
    fn end_cause(&self, _id: &str) -> Option<EndCause> {
        None
    }

    /// The sandbox's resource use as the host accounts it (its cgroups),
    /// if the runtime can tell.
    fn usage(&self, _id: &str) -> Option<Usage> {
        None
    }

    /// A sandbox started with [`SandboxSpec::background`] is about to be
    /// used: it gets the normal CPU weight from now on. Cheap (it is on the
    /// claim path), idempotent, and best effort: a runtime without CPU
    /// weights does nothing, and a failure is the runtime's to log.
    fn foreground(&self, _id: &str) {}

    /// Stops a pooled sandbox outright until it is claimed: a parked
    /// sandbox runs nothing and costs no CPU. [`Runtime::foreground`]
    /// unparks it (first, before anything else may talk to it), and
    /// [`Runtime::destroy`] works on a parked sandbox. Best effort: a
    /// runtime that cannot park does nothing, and a failure is the
    /// runtime's to log; the sandbox is then left running, never half
    /// stopped.
    async fn park(&self, _id: &str) {}

    /// Stops a claimed sandbox that nothing uses, as [`Runtime::park`]
    /// does a pooled one, on the caller's (blocking) thread; true if it is
    /// stopped now. [`Runtime::unpark`] undoes it and must come before
    /// anything talks to the sandbox again. Default: cannot, false.
    fn park_idle(&self, _id: &str) -> bool {
        false
    }

    /// Lets a sandbox [`Runtime::park_idle`] stopped run again. Cheap,
    /// synchronous and idempotent (it is on the path of every request to
    /// an idle-parked sandbox); a sandbox it did not park (not parked,
    /// gone, or stopped by someone else) is left as it is.
    fn unpark(&self, _id: &str) {}

    /// Host resources still present for `id`, described for humans; empty
    /// once teardown is complete. Used by health checks and tests.
    fn leftovers(&self, id: &str) -> Vec<String>;

    /// Identifies what a checkpoint image depends on besides the template
    /// (runtime and agent builds): images made under a different value are
    /// stale and must be rebuilt, not restored.
    fn image_compat(&self) -> String {
        String::new()
    }

    /// Saves the sandbox's whole state to `dir`; snapshots and forks build
    /// on this.
    async fn checkpoint(&self, _id: &str, _dir: &std::path::Path) -> Result<(), RuntimeError> {
        Err(RuntimeError::Unsupported("checkpoint", self.name()))
    }

    /// Starts a new sandbox from a checkpoint made by [`Runtime::checkpoint`].
    async fn restore(
        &self,
        _spec: &SandboxSpec,
        _dir: &std::path::Path,
    ) -> Result<(), RuntimeError> {
        Err(RuntimeError::Unsupported("restore", self.name()))
    }

    /// Saves the files of running sandbox `id` (not its memory or
    /// processes) into the new file `dest`, for [`Runtime::import_files`]:
    /// a filesystem-only pause builds on this.
    ///
    /// Contract: what is saved is every file, directory and symlink of the
    /// guest's writable filesystems (the root and `/tmp`) created or
    /// changed (status change time) at or after `since_ms`, with its
    /// owner, mode and times; never the runtime's own mounts (`/proc`,
    /// `/sys`, `/dev`, the agent) nor what the runtime writes itself at
    /// every boot; and every path of the sandbox's rootfs that the guest
    /// no longer has (deleted), so that `import_files` removes it again.
    /// The format is the runtime's own and opaque to callers;
    /// the host never unpacks it (only a guest does, in `import_files`),
    /// because the guest decided its contents. `dest` never grows past
    /// `max_bytes`: past it the export fails with
    /// [`RuntimeError::TooLarge`] and `dest` is removed. The sandbox keeps
    /// running. Returns the bytes written.
    async fn export_files(
        &self,
        _id: &str,
        _since_ms: u64,
        _dest: &std::path::Path,
        _max_bytes: u64,
    ) -> Result<u64, RuntimeError> {
        Err(RuntimeError::Unsupported("export_files", self.name()))
    }

    /// Unpacks `src`, written by [`Runtime::export_files`] (of any sandbox
    /// of the same runtime), into running sandbox `id`, over what it has:
    /// the other half of a filesystem-only pause, done right after a
    /// sandbox booted and before it is handed out. The unpacking runs
    /// inside the sandbox, so a hostile archive can only harm that
    /// sandbox; it is bounded by the sandbox's own disk.
    async fn import_files(&self, _id: &str, _src: &std::path::Path) -> Result<(), RuntimeError> {
        Err(RuntimeError::Unsupported("import_files", self.name()))
    }
}
