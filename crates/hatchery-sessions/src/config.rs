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
    /// away), the session resumes from the last one on another host. 0:
    /// none (a session whose sandbox is lost fails). Use it with a shared
    /// snapshot store, which other hosts can read.
    #[arg(long = "sessions-checkpoint-interval", env = "HATCHERY_SESSIONS_CHECKPOINT_INTERVAL",
          default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=86_400))]
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
    /// Largest repository checkout (as a tar) moved into a sandbox.
    pub max_repo_bytes: u64,
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
            max_repo_bytes: 64 << 20,
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
            max_repo_bytes: 64 << 20,
        }
    }
}
