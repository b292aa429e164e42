//! The daemon's flags. Each is also a key of the configuration file
//! (keys.rs names it); names are stable: scripts and SDKs rely on them.

use crate::products::{EgressArgs, GatewayArgs};
use crate::roles::{NetworkMode, Role};
use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Debug, Clone, Args)]
pub struct DaemonArgs {
    /// A TOML file with any of these settings, one section per concern
    /// (`hatcheryd config example`); a flag or variable beats the file.
    #[arg(long, env = "HATCHERY_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, env = "HATCHERY_LISTEN", default_value = "127.0.0.1:7423")]
    pub listen: SocketAddr,
    /// State, key file, runtime state and (by default) templates.
    #[arg(long, env = "HATCHERY_DATA_DIR", default_value = "/var/lib/hatchery")]
    pub data_dir: PathBuf,
    /// The deployment's one database: a `postgres://` URL (shared by many
    /// hosts) or a SQLite file path (default: DATA_DIR/hatchery.db).
    #[arg(long, env = "HATCHERY_DB")]
    pub db: Option<String>,
    /// PostgreSQL connections this daemon may hold at once.
    #[arg(long, env = "HATCHERY_DB_POOL", default_value_t = hatchery_store::DEFAULT_PG_POOL)]
    pub db_pool: usize,
    /// This host's identity in the state store: it owns the sandboxes it
    /// creates, and reconcile and the reaper touch only its own rows.
    #[arg(long, env = "HATCHERY_HOST_ID", default_value = "local")]
    pub host_id: String,
    /// Seconds a host's lease lasts unrenewed (renewed every third of it;
    /// 6 to 300). Every daemon sharing a store must use the same. Shorter:
    /// a lost host's sessions resume sooner; longer: a database or network
    /// blip must last longer before a host gives its sandboxes up.
    #[arg(long, env = "HATCHERY_HOST_LEASE_TTL", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(6..=300))]
    pub host_lease_ttl: u64,
    /// Seconds a stopping daemon (SIGTERM) waits, at most, for its
    /// sessions to move to other hosts and then again for requests in
    /// flight (running commands) to finish, before it exits (1 to 3600).
    #[arg(long, env = "HATCHERY_STOP_GRACE", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub stop_grace: u64,
    /// `all`: one daemon does everything (the default). `control`: the
    /// public API and placement, no runtime (needs a postgres:// --db).
    /// `host`: runtime, slots and pool on a shared postgres:// --db,
    /// registered and heartbeating for a control plane to route to.
    #[arg(long, env = "HATCHERY_ROLE", value_enum, default_value_t = Role::All)]
    pub role: Role,
    /// The URL other hosts and the control plane reach this host's API at
    /// (registered in the store); default: http://LISTEN.
    #[arg(long, env = "HATCHERY_ADVERTISE_URL")]
    pub advertise_url: Option<String>,
    /// Where baked templates live (default: DATA_DIR/templates).
    #[arg(long, env = "HATCHERY_TEMPLATES_DIR")]
    pub templates_dir: Option<PathBuf>,
    /// A template spec file (the JSON body of POST /v1/templates) to build
    /// in the background once the daemon serves, one at a time, at low
    /// CPU priority; a no-op when its version is already current.
    /// Repeatable. Until it is built, creates naming it answer 503
    /// `template_building` with Retry-After. Read when the daemon starts:
    /// a missing or invalid file stops it.
    #[arg(long = "build-template", env = "HATCHERY_BUILD_TEMPLATES",
          value_delimiter = ' ', value_name = "PATH", value_parser = spec_file)]
    pub build_templates: Vec<hatchery_templates::SpecFile>,
    /// Where new snapshots go: `local` (DATA_DIR/snapshots, this host
    /// only) or `shared:/abs/path`, a directory every host mounts (NFS),
    /// so any host forks, reads and deletes them (docs/operations.md,
    /// "Snapshot store"). The directory must exist and be writable.
    #[arg(long, env = "HATCHERY_SNAPSHOT_STORE", default_value = "local")]
    pub snapshot_store: hatchery_templates::SnapshotStoreSpec,
    /// The snapshot store's storage cap in MiB (0: none): a snapshot
    /// that would take the store past it is refused with 507
    /// `snapshot_store_full` and nothing is kept. A local store counts
    /// this host's snapshots, a shared one every host's.
    #[arg(long, env = "HATCHERY_SNAPSHOT_STORE_MAX_MB", default_value_t = 20_480)]
    pub snapshot_store_max_mb: u64,
    /// The runsc binary.
    #[arg(long, env = "HATCHERY_RUNSC", default_value = "runsc")]
    pub runsc: PathBuf,
    /// gVisor platform: systrap here, kvm on hosts with real KVM.
    #[arg(long, env = "HATCHERY_PLATFORM", default_value = "systrap")]
    pub platform: String,
    /// Longest TTL a sandbox may ask for, in seconds.
    #[arg(long, env = "HATCHERY_MAX_TTL", default_value_t = 86_400)]
    pub max_ttl: u64,
    /// Most sandboxes alive at once; creates beyond it get 503.
    #[arg(long, env = "HATCHERY_MAX_SANDBOXES", default_value_t = 64)]
    pub max_sandboxes: usize,
    /// Hard cap for an exec's per-stream output, in bytes.
    #[arg(long, env = "HATCHERY_MAX_OUTPUT_BYTES", default_value_t = 16 << 20)]
    pub max_output_bytes: u64,
    /// Largest file accepted or returned by the files API, in bytes.
    #[arg(long, env = "HATCHERY_MAX_FILE_BYTES", default_value_t = 64 << 20)]
    pub max_file_bytes: u64,
    /// Warm, never-used sandboxes kept ready per template (0 disables the
    /// pool; creates then restore the template checkpoint).
    #[arg(long, env = "HATCHERY_POOL_SIZE", default_value_t = 4)]
    pub pool_size: usize,
    /// Memory the warm pool may use in all, in MiB.
    #[arg(long, env = "HATCHERY_POOL_MEMORY_MB", default_value_t = 1024)]
    pub pool_memory_mb: u64,
    /// Drain the pool and stop refilling while the host's available memory
    /// is below this fraction of its total.
    #[arg(long, env = "HATCHERY_POOL_MIN_AVAILABLE", default_value_t = 0.15)]
    pub pool_min_available: f64,
    /// `on`: every sandbox gets its own network namespace and egress policy
    /// (default deny). `off`: sandboxes have no network at all, and
    /// policies other than deny-all are refused.
    #[arg(long, env = "HATCHERY_NETWORK", value_enum, default_value_t = NetworkMode::On)]
    pub network: NetworkMode,
    /// Names this daemon's netns (`hxPREFIX-N`), host veths (`hxPREFIX.N`)
    /// and nftables table (`hatchery_PREFIX`); 1-5 lowercase letters.
    #[arg(long, env = "HATCHERY_NET_PREFIX", default_value = "hy")]
    pub net_prefix: String,
    /// IPv4 range carved into one /30 per sandbox (a /16 gives 16,384).
    /// Always blocked as a destination.
    #[arg(long, env = "HATCHERY_NET_RANGE", default_value = "10.231.0.0/16")]
    pub net_range: String,
    /// Network slots made ahead of creates.
    #[arg(long, env = "HATCHERY_NET_READY_SLOTS", default_value_t = 8)]
    pub net_ready_slots: usize,
    /// Fixed answers for `host` rules, in /etc/hosts format, consulted
    /// before DNS (internal mirrors; tests).
    #[arg(long, env = "HATCHERY_NET_HOSTS_FILE")]
    pub net_hosts_file: Option<PathBuf>,
    /// A host service every sandbox reaches at 127.0.0.1:GUEST_PORT inside
    /// the guest, relayed over the agent channel to HOST_ADDR (IP:PORT or
    /// unix:/path). Repeatable: NAME=GUEST_PORT=HOST_ADDR[,identity=http|proxy].
    /// `http` (default) sets `X-Hatchery-Sandbox: <id>` on every request;
    /// `proxy` sends a PROXY protocol v1 line `PROXY UNKNOWN <id>` first.
    #[arg(
        long = "host-service",
        env = "HATCHERY_HOST_SERVICES",
        value_delimiter = ' ',
        value_name = "NAME=GUEST_PORT=HOST_ADDR"
    )]
    pub host_services: Vec<hatchery_core::HostService>,
    /// Base of the absolute links interview rounds hand out (the API's
    /// public origin, e.g. https://hatchery.example.com); default: the
    /// request's Host header. Preview URLs are not on it: --preview-url.
    #[arg(long, env = "HATCHERY_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// Where previews (`/preview/{token}/`) and E2B's relayed ports are
    /// served: a listener of their own, so no guest page ever shares an
    /// origin with the API, the rounds pages or the terminal. Default:
    /// the --listen address with the next port (7424 beside 7423).
    #[arg(long, env = "HATCHERY_PREVIEW_LISTEN")]
    pub preview_listen: Option<SocketAddr>,
    /// Base of the preview URLs handed out, the preview listener's public
    /// origin (e.g. https://previews.example.com), or with `*` as the
    /// first label of its host (https://*.previews.example.com): every
    /// sandbox port then gets a host name, and an origin, of its own
    /// (`8000-<id>.previews.example.com`; needs a wildcard DNS record).
    /// Must not be the API's origin. Default: `http://` + the host name
    /// the API was reached at + the preview listener's port.
    #[arg(long, env = "HATCHERY_PREVIEW_URL", value_parser = preview_url)]
    pub preview_url: Option<String>,
    /// A file holding a token that opens `GET /metrics` (as
    /// `Authorization: Bearer <token>`) and nothing else, for a scraper
    /// that should not hold the API key; 16 to 4096 visible characters.
    #[arg(long, env = "HATCHERY_METRICS_TOKEN_FILE")]
    pub metrics_token_file: Option<PathBuf>,
    /// Seconds without input (keystrokes or resizes) after which a
    /// terminal (`GET /v1/sandboxes/{id}/pty`) is closed and everything
    /// started in it killed.
    #[arg(long, env = "HATCHERY_TERMINAL_IDLE_TIMEOUT", default_value_t = 900,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub terminal_idle_timeout: u64,
    /// Milliseconds a claimed sandbox must go unused (no request in
    /// flight, nothing of the user's running in it) before it is parked:
    /// stopped whole, costing no CPU, until the next request starts it
    /// again. 0 turns idle parking off.
    #[arg(long, env = "HATCHERY_IDLE_PARK_MS", default_value_t = 3000,
          value_parser = idle_park_ms)]
    pub idle_park_ms: u64,
    /// Terminals attached to one sandbox at once; more get 429.
    #[arg(long, env = "HATCHERY_MAX_TERMINALS", default_value_t = 8,
          value_parser = clap::value_parser!(u64).range(1..=256))]
    pub max_terminals: u64,
    /// HTTP connection limits (timeouts, caps in total and per peer).
    #[command(flatten)]
    pub http: hatchery_serve::HttpLimits,
    /// Seconds between passes of the interview-rounds reaper (replays past
    /// their retention window, sessions past their length).
    #[arg(long, env = "HATCHERY_ROUNDS_REAP_INTERVAL", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub rounds_reap_interval: u64,
    /// Agent sessions (`/v1/sessions`).
    #[command(flatten)]
    pub sessions: hatchery_sessions::SessionArgs,
    /// The tool broker of sessions.
    #[command(flatten)]
    pub broker: hatchery_broker::BrokerArgs,
    /// The model gateway sessions call their model through.
    #[command(flatten)]
    pub gateway: GatewayArgs,
    /// The egress proxy of session sandboxes.
    #[command(flatten)]
    pub egress: EgressArgs,
    /// Log as JSON lines instead of text.
    #[arg(long, env = "HATCHERY_LOG_JSON")]
    pub log_json: bool,
}

/// A spec file, read and checked now; clap shows only the message, so it
/// carries the whole cause.
fn spec_file(s: &str) -> Result<hatchery_templates::SpecFile, String> {
    hatchery_templates::SpecFile::read(std::path::Path::new(s)).map_err(|e| {
        let mut msg = e.to_string();
        let mut cause = std::error::Error::source(&e);
        while let Some(c) = cause {
            msg.push_str(": ");
            msg.push_str(&c.to_string());
            cause = c.source();
        }
        msg
    })
}

/// `http(s)://host[:port]`, nothing after the authority, `*` only as the
/// whole first label: a base the preview path is appended to.
pub(crate) fn preview_url(s: &str) -> Result<String, String> {
    let s = s.trim_end_matches('/');
    let rest = s
        .strip_prefix("http://")
        .or_else(|| s.strip_prefix("https://"))
        .ok_or("must start with http:// or https://")?;
    if rest.is_empty() || rest.contains(['/', '?', '#', '@']) {
        return Err("must be scheme://host[:port], with no path".into());
    }
    let star_ok = rest.strip_prefix("*.").unwrap_or(rest);
    if star_ok.contains('*') || star_ok.is_empty() || star_ok.starts_with([':', '.']) {
        return Err(
            "`*` may only be the whole first label of the host (https://*.previews.example)".into(),
        );
    }
    Ok(s.to_string())
}

impl DaemonArgs {
    /// The `postgres://` database this daemon shares with others, if
    /// `--db` names one (`None`: the single-host SQLite files).
    pub fn shared_db(&self) -> Option<&str> {
        self.db
            .as_deref()
            .filter(|d| hatchery_store::is_postgres(d))
    }
}

/// 0 (off) or 500 ms to 1 h: under half a second a sandbox would be stopped
/// between the requests of one client's burst.
fn idle_park_ms(v: &str) -> Result<u64, String> {
    let ms: u64 = v.parse().map_err(|e| format!("{e}"))?;
    if ms == 0 || (500..=3_600_000).contains(&ms) {
        Ok(ms)
    } else {
        Err(format!("{ms}: use 0 (off) or 500 to 3600000"))
    }
}

#[cfg(test)]
mod tests {
    use super::DaemonArgs;
    use clap::{Args, Command, Parser};

    #[test]
    fn preview_urls_are_bases() {
        for ok in [
            "http://127.0.0.1:7424",
            "https://previews.example/",
            "https://*.previews.example",
            "http://*.p.test:7424",
        ] {
            assert!(super::preview_url(ok).is_ok(), "{ok}");
        }
        assert_eq!(
            super::preview_url("https://p.example/").unwrap(),
            "https://p.example"
        );
        for bad in [
            "p.example",
            "ftp://p.example",
            "https://",
            "https://p.example/path",
            "https://p.example?x",
            "https://a*.p.example",
            "https://x.*.example",
            "https://*",
            "https://*.",
            "https://u@p.example",
        ] {
            assert!(super::preview_url(bad).is_err(), "{bad}");
        }
    }

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        daemon: DaemonArgs,
    }

    /// The daemon's flags, flattened from several crates, must not share
    /// an argument id: `--sessions-max-output-bytes` once reused the id of
    /// `--max-output-bytes` and the daemon refused to start.
    #[test]
    fn the_flags_have_distinct_ids_and_parse_with_their_defaults() {
        DaemonArgs::augment_args(Command::new("hatcheryd")).debug_assert();
        let c = Cli::try_parse_from(["hatcheryd"]).expect("defaults parse");
        assert_eq!(c.daemon.max_output_bytes, 16 << 20);
        assert_eq!(c.daemon.sessions.max_output_bytes, 64 << 20);
        let c = Cli::try_parse_from([
            "hatcheryd",
            "--max-output-bytes",
            "1000",
            "--sessions-max-output-bytes",
            "65536",
        ])
        .expect("both parse");
        assert_eq!(c.daemon.max_output_bytes, 1000);
        assert_eq!(c.daemon.sessions.max_output_bytes, 65536);
    }
}
