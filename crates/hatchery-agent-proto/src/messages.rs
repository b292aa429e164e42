use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Start a command. `argv[0]` is looked up on the guest's PATH.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExecRequest {
    pub argv: Vec<String>,
    pub cwd: Option<String>,
    pub env: BTreeMap<String, String>,
    /// Written to the command's stdin, which is then closed.
    pub stdin: Option<String>,
    /// In-guest deadline. The host enforces its own, later one on top.
    pub timeout_ms: u64,
    /// Per stream. When a stream passes it the command's whole tree is
    /// killed and the result says `output_limit`.
    pub max_output_bytes: u64,
    /// CPU time of the whole tree after which it is killed (`cpu_limit`).
    #[serde(default)]
    pub cpu_limit_ms: Option<u64>,
}

/// Why a command ended, as the guest saw it. The host adds `Oom` (only it
/// can see its cgroup's OOM kills) and `Timeout` when its own deadline fired.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum EndReason {
    #[default]
    Exited,
    Signaled,
    Timeout,
    CpuLimit,
    Oom,
    OutputLimit,
    Cancelled,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExecResult {
    /// 128+N when killed by signal N.
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub truncated: bool,
    pub duration_ms: u64,
    /// CPU time of every process the command started (its per-exec cgroup
    /// inside the guest), or of the direct child only when `contained` is
    /// false.
    pub cpu_ms: u64,
    #[serde(default)]
    pub reason: EndReason,
    /// Largest memory use seen: sampled from the exec's cgroup, and the
    /// direct child's max RSS.
    #[serde(default)]
    pub memory_peak_bytes: Option<u64>,
    /// Whether the command ran in its own in-guest cgroup (kill and
    /// accounting cover the whole tree) or fell back to process-group kill.
    #[serde(default)]
    pub contained: bool,
}

/// Run code in an interpreter context (`None`: the sandbox's default
/// context, which is running already in every restored sandbox).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CodeRequest {
    pub context: Option<String>,
    /// Must be the context's language; empty: the named context's, whatever
    /// it is. Without a context, the default context of this language.
    pub language: String,
    pub code: String,
    pub env: BTreeMap<String, String>,
    pub timeout_ms: u64,
    pub cpu_limit_ms: Option<u64>,
    /// Per stream, and for the rich results together.
    pub max_output_bytes: u64,
    /// Run the agent's own warm-up cell instead of `code`, leaving the
    /// context's namespace and execution count as they were.
    #[serde(default)]
    pub warm: bool,
    /// Where the default context should be before this run if no request
    /// has placed it yet (it starts wherever the agent found a directory,
    /// before any client was known). The directory is created if missing;
    /// the context stays there afterwards, as after a `%cd`. Other
    /// contexts ignore it: they were given their directory when created.
    #[serde(default)]
    pub initial_cwd: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CodeResult {
    pub context: String,
    pub execution_count: u64,
    pub reason: EndReason,
    pub truncated: bool,
    pub duration_ms: u64,
    pub cpu_ms: u64,
    pub memory_peak_bytes: Option<u64>,
    /// The interpreter died or was killed during the run and a clean one
    /// replaced it: the context's variables are gone.
    pub restarted: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ContextRequest {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub language: Option<String>,
    #[serde(default)]
    pub cwd: Option<String>,
    /// Create `cwd` (and its parents) if it does not exist, instead of
    /// refusing the context.
    #[serde(default)]
    pub make_cwd: bool,
}

/// The answer to a `Quiet` request: whether nothing of the user's runs in
/// the guest (no command, terminal, background process or interpreter run,
/// and no process besides the agent's own), so the host may stop the whole
/// sandbox until it is used again. `busy` says what keeps it running.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct QuietReport {
    pub quiet: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ContextInfo {
    pub id: String,
    pub language: String,
    pub cwd: String,
    /// `ready`, `busy` or `starting`.
    pub state: String,
    pub execution_count: u64,
}

/// A background process, as the agent keeps it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProcInfo {
    pub id: String,
    pub pid: i32,
    pub argv: Vec<String>,
    pub started_at_ms: u64,
    pub running: bool,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub reason: Option<EndReason>,
    pub cpu_ms: u64,
    /// Bytes of output so far (stdout and stderr share one offset space).
    pub output_bytes: u64,
    /// The oldest offset still in the ring; older output was dropped.
    pub first_offset: u64,
    pub stdin_open: bool,
}

/// Names one background process, with what the operation needs.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProcRequest {
    pub id: String,
    /// ProcRead: the first output offset wanted.
    #[serde(default)]
    pub offset: u64,
    /// ProcRead: keep streaming until the process exits.
    #[serde(default)]
    pub follow: bool,
    /// ProcSignal.
    #[serde(default)]
    pub signal: i32,
    /// ProcWait: how long to wait for the exit.
    #[serde(default)]
    pub timeout_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FileWriteRequest {
    pub path: String,
    pub mode: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FileReadRequest {
    pub path: String,
    pub max_bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FileListRequest {
    pub path: String,
    pub max_entries: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FilePathRequest {
    pub path: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FileEntry {
    pub name: String,
    /// "file", "dir", "symlink" or "other"
    #[serde(rename = "type")]
    pub kind: String,
    pub size: u64,
    pub mode: u32,
    /// Seconds since the epoch.
    pub mtime: i64,
}

/// A typed failure from the guest. `code` is one of a small fixed set
/// (`not_found`, `is_a_directory`, `not_a_directory`, `too_large`,
/// `invalid`, `io`, `spawn_failed`) that the host maps to HTTP statuses.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct GuestError {
    pub code: String,
    pub message: String,
}

impl GuestError {
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        GuestError {
            code: code.to_string(),
            message: message.into(),
        }
    }
}

/// Messages for the per-sandbox shim itself (channel 0), not the agent.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ShimControl {
    /// Move the hard deadline at which the shim destroys the sandbox even if
    /// the daemon is gone.
    SetExpiry {
        unix_ms: u64,
    },
    /// Tear the sandbox down now and exit.
    Shutdown,
    Ack,
}

/// Start a program on a new pseudo-terminal. An empty `argv` is the
/// guest's login shell (`/bin/bash -l`, else `/bin/sh`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PtyRequest {
    pub argv: Vec<String>,
    pub cwd: Option<String>,
    pub env: BTreeMap<String, String>,
    pub size: PtySize,
    /// The guest's own backstop: with no input or resize for this long the
    /// terminal is ended. The host closes idle terminals earlier; this one
    /// catches terminals whose host side is gone (a daemon that died).
    pub idle_timeout_ms: u64,
}

/// A terminal's window, in character cells.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct PtySize {
    pub cols: u16,
    pub rows: u16,
}

/// The answer to every `PtyResize`: the window the terminal reports after
/// it (read back from the terminal, not echoed from the request), and why
/// it is not the size asked for when it is not.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PtyResized {
    pub size: Option<PtySize>,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PtyStarted {
    pub pid: i32,
    /// Whether the terminal has a unit of its own (see `ExecResult`).
    pub contained: bool,
}

/// How a terminal's program ended.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PtyExit {
    /// 128+N when killed by signal N.
    pub exit_code: i32,
    pub signal: Option<i32>,
    /// `exited`, `signaled`, `cancelled` (the host closed it) or `timeout`
    /// (the guest's idle backstop).
    pub reason: EndReason,
}
