//! Operator settings for sessions (daemon flags, `HATCHERY_SESSIONS_*`).

use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Clone, Args)]
pub struct SessionArgs {
    /// Sessions holding a sandbox at once; more wait as `queued`.
    #[arg(
        long = "sessions-max-running",
        env = "HATCHERY_SESSIONS_MAX_RUNNING",
        default_value_t = 8
    )]
    pub max_running: usize,
    /// Seconds a session may wait for a message or an approval before its
    /// sandbox is snapshotted and freed (state `idle`).
    #[arg(long = "sessions-idle-timeout", env = "HATCHERY_SESSIONS_IDLE_TIMEOUT", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub idle_timeout_s: u64,
    /// Seconds between checkpoints of a running session (a snapshot of its
    /// sandbox, agent included). If the sandbox is lost (its host went
    /// away, or it was deleted under the session), the session resumes
    /// from the last one (on another host with a shared snapshot store).
    /// 0: none (a session whose sandbox is lost fails). Each checkpoint
    /// pauses the sandbox for about 0.4 s, under 1% of the session's time
    /// at the default (docs/benchmarks.md, "Session checkpoints: cost").
    #[arg(long = "sessions-checkpoint-interval", env = "HATCHERY_SESSIONS_CHECKPOINT_INTERVAL",
          default_value_t = 60, value_parser = clap::value_parser!(u64).range(0..=86_400))]
    pub checkpoint_interval_s: u64,
    /// Open event streams (SSE) in all; more get 503.
    #[arg(
        long = "sessions-max-streams",
        env = "HATCHERY_SESSIONS_MAX_STREAMS",
        default_value_t = 1024
    )]
    pub max_streams: usize,
    /// Largest `budget.tokens` a session may ask for.
    #[arg(
        long = "sessions-max-tokens",
        env = "HATCHERY_SESSIONS_MAX_TOKENS",
        default_value_t = 10_000_000
    )]
    pub max_tokens: u64,
    /// Largest `budget.usd_cents`.
    #[arg(
        long = "sessions-max-usd-cents",
        env = "HATCHERY_SESSIONS_MAX_USD_CENTS",
        default_value_t = 10_000
    )]
    pub max_usd_cents: u64,
    /// Largest `budget.wall_s`.
    #[arg(
        long = "sessions-max-wall",
        env = "HATCHERY_SESSIONS_MAX_WALL",
        default_value_t = 86_400
    )]
    pub max_wall_s: u64,
    /// Directories under which `file://` repositories may be (repeatable);
    /// without one, `file://` URLs are refused.
    #[arg(
        long = "sessions-file-repo-root",
        env = "HATCHERY_SESSIONS_FILE_REPO_ROOTS",
        value_delimiter = ' '
    )]
    pub file_repo_roots: Vec<PathBuf>,
    /// The model endpoint agents get by default, as the sandbox sees it
    /// (normally a `--host-service`).
    #[arg(
        long = "sessions-model-url",
        env = "HATCHERY_SESSIONS_MODEL_URL",
        default_value = "http://127.0.0.1:9100/v1"
    )]
    pub model_url: String,
    #[arg(
        long = "sessions-model",
        env = "HATCHERY_SESSIONS_MODEL",
        default_value = "default"
    )]
    pub model: String,
    /// A file holding an HTTP header (`Authorization: ...`) the host sends
    /// when fetching repositories. Read by the host only; it never enters
    /// a sandbox.
    #[arg(
        long = "sessions-git-credential-file",
        env = "HATCHERY_SESSIONS_GIT_CREDENTIAL_FILE"
    )]
    pub git_credential_file: Option<PathBuf>,
    /// Hosts (`host` or `host:port`, repeatable) whose `https://`
    /// repositories a tenant's session or environment fetches with the
    /// credential above. The operator's own fetches always send it; a
    /// tenant's to any other host (a repository URL the tenant chose)
    /// send none, so the credential cannot be sent to a host the tenant
    /// runs (issue 36).
    #[arg(
        long = "sessions-git-credential-host",
        env = "HATCHERY_SESSIONS_GIT_CREDENTIAL_HOSTS",
        value_delimiter = ' '
    )]
    pub git_credential_hosts: Vec<String>,
    /// Largest repository checkout (work tree and `.git`, as a tar); also
    /// the largest file and the largest sum of blobs the fetch accepts.
    #[arg(id = "sessions_max_repo_bytes", long = "sessions-max-repo-bytes", env = "HATCHERY_SESSIONS_MAX_REPO_BYTES",
          default_value_t = 64 << 20, value_parser = clap::value_parser!(u64).range(4096..=(1 << 30)))]
    pub max_repo_bytes: u64,
    /// Most paths in a fetched repository's tree.
    #[arg(id = "sessions_max_repo_files", long = "sessions-max-repo-files", env = "HATCHERY_SESSIONS_MAX_REPO_FILES",
          default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub max_repo_files: u64,
    /// Bytes of agent output (events and blobs) one session may store;
    /// past it the output is cut with one `output_capped` event and the
    /// rest dropped (counted).
    #[arg(id = "sessions_max_output_bytes", long = "sessions-max-output-bytes", env = "HATCHERY_SESSIONS_MAX_OUTPUT_BYTES",
          default_value_t = 64 << 20, value_parser = clap::value_parser!(u64).range(65_536..=(1 << 34)))]
    pub max_output_bytes: u64,
    /// Agent output lines a session may store per second (after a burst
    /// of ten seconds' worth); lines over it are dropped and counted.
    #[arg(id = "sessions_max_output_lines_per_s", long = "sessions-max-output-lines-per-second", env = "HATCHERY_SESSIONS_MAX_OUTPUT_LINES_PER_SECOND",
          default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub max_output_lines_per_s: u64,
    /// Largest blob (the whole text of one long field) an agent event
    /// keeps; longer text is cut to it.
    #[arg(id = "sessions_max_blob_bytes", long = "sessions-max-blob-bytes", env = "HATCHERY_SESSIONS_MAX_BLOB_BYTES",
          default_value_t = 1 << 20, value_parser = clap::value_parser!(u64).range(4096..=(1 << 20)))]
    pub max_blob_bytes: u64,
    /// Approvals a session may have open at once (its agent's and its
    /// broker calls'); one more is refused.
    #[arg(id = "sessions_max_open_approvals", long = "sessions-max-open-approvals", env = "HATCHERY_SESSIONS_MAX_OPEN_APPROVALS",
          default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub max_open_approvals: u64,
}

/// The same settings, as the crate uses them.
#[derive(Debug, Clone)]
pub struct SessionsConfig {
    pub max_running: usize,
    pub idle_timeout: std::time::Duration,
    pub checkpoint_every: Option<std::time::Duration>,
    pub max_streams: usize,
    pub max_tokens: u64,
    pub max_usd_cents: u64,
    pub max_wall_s: u64,
    pub file_repo_roots: Vec<PathBuf>,
    pub model_url: String,
    pub model: String,
    pub git_credential_file: Option<PathBuf>,
    /// Where a tenant's fetch may send it (`host` or `host:port`).
    pub git_credential_hosts: Vec<String>,
    /// What one repository fetch may use (repo.rs).
    pub fetch: crate::repo::FetchLimits,
    /// Where fetches work (a directory each, removed after): the daemon
    /// sets DATA_DIR/repo-fetch.
    pub fetch_root: PathBuf,
    /// The per-session caps on what the agent's output stores.
    pub output: OutputCaps,
    pub max_open_approvals: u64,
}

/// What a session's agent output may store (docs/sessions.md, "Caps").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputCaps {
    /// Bytes of agent events (their stored JSON) and blobs, per session.
    pub max_bytes: u64,
    /// Lines per second, sustained.
    pub lines_per_s: u64,
    /// Lines at once before the rate applies.
    pub burst: u64,
    /// Largest blob of one field.
    pub max_blob_bytes: usize,
}

impl Default for OutputCaps {
    fn default() -> Self {
        OutputCaps {
            max_bytes: 64 << 20,
            lines_per_s: 100,
            burst: 1000,
            max_blob_bytes: crate::events::MAX_BLOB_BYTES,
        }
    }
}

impl From<&SessionArgs> for SessionsConfig {
    fn from(a: &SessionArgs) -> Self {
        SessionsConfig {
            max_running: a.max_running.max(1),
            idle_timeout: std::time::Duration::from_secs(a.idle_timeout_s),
            checkpoint_every: (a.checkpoint_interval_s > 0)
                .then(|| std::time::Duration::from_secs(a.checkpoint_interval_s)),
            max_streams: a.max_streams,
            max_tokens: a.max_tokens,
            max_usd_cents: a.max_usd_cents,
            max_wall_s: a.max_wall_s,
            file_repo_roots: a.file_repo_roots.clone(),
            model_url: a.model_url.clone(),
            model: a.model.clone(),
            git_credential_file: a.git_credential_file.clone(),
            git_credential_hosts: a.git_credential_hosts.clone(),
            fetch: crate::repo::FetchLimits::for_bytes(a.max_repo_bytes, a.max_repo_files),
            fetch_root: std::env::temp_dir().join("hatchery-repo-fetch"),
            output: OutputCaps {
                max_bytes: a.max_output_bytes,
                lines_per_s: a.max_output_lines_per_s,
                burst: a.max_output_lines_per_s.saturating_mul(10),
                max_blob_bytes: a.max_blob_bytes as usize,
            },
            max_open_approvals: a.max_open_approvals,
        }
    }
}

impl Default for SessionsConfig {
    fn default() -> Self {
        SessionsConfig {
            max_running: 8,
            idle_timeout: std::time::Duration::from_secs(300),
            checkpoint_every: None,
            max_streams: 1024,
            max_tokens: 10_000_000,
            max_usd_cents: 10_000,
            max_wall_s: 86_400,
            file_repo_roots: vec![],
            model_url: "http://127.0.0.1:9100/v1".into(),
            model: "default".into(),
            git_credential_file: None,
            git_credential_hosts: vec![],
            fetch: crate::repo::FetchLimits::default(),
            fetch_root: std::env::temp_dir().join("hatchery-repo-fetch"),
            output: OutputCaps::default(),
            max_open_approvals: 8,
        }
    }
}
