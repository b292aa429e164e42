//! Every flag's key in the configuration file: `[section] name`. The file
//! is read against this table (an unknown key is an error that names it);
//! a test checks that it and the flags match one for one.

/// The TOML type a key takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Int,
    Float,
    Bool,
    Str,
    /// An array of strings (a repeatable flag).
    List,
}

impl Kind {
    pub fn describe(self) -> &'static str {
        match self {
            Kind::Int => "an integer",
            Kind::Float => "a number",
            Kind::Bool => "true or false",
            Kind::Str => "a string",
            Kind::List => "an array of strings",
        }
    }
}

/// Which roles a key matters to (bits of `Role`), for `config example`.
pub type Roles = u8;
pub const ALL: Roles = 1;
pub const HOST: Roles = 2;
pub const CONTROL: Roles = 4;
const EVERY: Roles = ALL | HOST | CONTROL;
/// The roles that run sandboxes.
const RUNS: Roles = ALL | HOST;
/// The roles that face clients with the products' state.
const FRONT: Roles = ALL | CONTROL;

#[derive(Debug)]
pub struct Key {
    pub section: &'static str,
    pub name: &'static str,
    /// The flag, without its `--`.
    pub long: &'static str,
    pub kind: Kind,
    pub roles: Roles,
}

impl Key {
    /// `section.name`, as errors show it.
    pub fn path(&self) -> String {
        format!("{}.{}", self.section, self.name)
    }
}

const fn k(
    section: &'static str,
    name: &'static str,
    long: &'static str,
    kind: Kind,
    roles: Roles,
) -> Key {
    Key {
        section,
        name,
        long,
        kind,
        roles,
    }
}

use Kind::{Bool, Float, Int, List, Str};

/// Sections in the order `config example` prints them.
pub const SECTIONS: &[&str] = &[
    "server",
    "store",
    "role",
    "runtime",
    "templates",
    "limits",
    "pool",
    "network",
    "http",
    "rounds",
    "sessions",
    "broker",
    "audit",
    "gateway",
    "egress",
];

#[rustfmt::skip]
pub const KEYS: &[Key] = &[
    k("server", "listen", "listen", Str, EVERY),
    k("server", "data_dir", "data-dir", Str, EVERY),
    k("server", "preview_listen", "preview-listen", Str, EVERY),
    k("server", "preview_url", "preview-url", Str, EVERY),
    k("server", "public_url", "public-url", Str, FRONT),
    k("server", "log_json", "log-json", Bool, EVERY),
    k("server", "metrics_token_file", "metrics-token-file", Str, EVERY),
    k("store", "db", "db", Str, EVERY),
    k("store", "db_pool", "db-pool", Int, EVERY),
    k("role", "name", "role", Str, EVERY),
    k("role", "host_id", "host-id", Str, EVERY),
    k("role", "advertise_url", "advertise-url", Str, RUNS),
    k("role", "host_lease_ttl", "host-lease-ttl", Int, EVERY),
    k("role", "stop_grace", "stop-grace", Int, EVERY),
    k("runtime", "runsc", "runsc", Str, RUNS),
    k("runtime", "platform", "platform", Str, RUNS),
    k("runtime", "templates_dir", "templates-dir", Str, RUNS),
    k("runtime", "snapshot_store", "snapshot-store", Str, RUNS),
    k("runtime", "snapshot_store_max_mb", "snapshot-store-max-mb", Int, RUNS),
    k("templates", "build_at_start", "build-template", List, RUNS),
    k("limits", "max_ttl", "max-ttl", Int, RUNS),
    k("limits", "max_sandboxes", "max-sandboxes", Int, RUNS),
    k("limits", "max_output_bytes", "max-output-bytes", Int, RUNS),
    k("limits", "max_file_bytes", "max-file-bytes", Int, RUNS),
    k("limits", "terminal_idle_timeout", "terminal-idle-timeout", Int, RUNS),
    k("limits", "max_terminals", "max-terminals", Int, RUNS),
    k("limits", "idle_park_ms", "idle-park-ms", Int, RUNS),
    k("pool", "size", "pool-size", Int, RUNS),
    k("pool", "memory_mb", "pool-memory-mb", Int, RUNS),
    k("pool", "min_available", "pool-min-available", Float, RUNS),
    k("network", "mode", "network", Str, RUNS),
    k("network", "prefix", "net-prefix", Str, RUNS),
    k("network", "range", "net-range", Str, RUNS),
    k("network", "ready_slots", "net-ready-slots", Int, RUNS),
    k("network", "hosts_file", "net-hosts-file", Str, RUNS),
    k("network", "host_services", "host-service", List, RUNS),
    k("http", "header_timeout", "http-header-timeout", Int, EVERY),
    k("http", "body_timeout", "http-body-timeout", Int, EVERY),
    k("http", "body_deadline", "http-body-deadline", Int, EVERY),
    k("http", "max_connections", "http-max-connections", Int, EVERY),
    k("http", "max_connections_per_peer", "http-max-connections-per-peer", Int, EVERY),
    k("rounds", "reap_interval", "rounds-reap-interval", Int, FRONT),
    k("sessions", "max_running", "sessions-max-running", Int, RUNS),
    k("sessions", "idle_timeout", "sessions-idle-timeout", Int, RUNS),
    k("sessions", "checkpoint_interval", "sessions-checkpoint-interval", Int, RUNS),
    k("sessions", "max_streams", "sessions-max-streams", Int, RUNS),
    k("sessions", "max_tokens", "sessions-max-tokens", Int, RUNS),
    k("sessions", "max_usd_cents", "sessions-max-usd-cents", Int, RUNS),
    k("sessions", "max_wall", "sessions-max-wall", Int, RUNS),
    k("sessions", "file_repo_roots", "sessions-file-repo-root", List, RUNS),
    k("sessions", "model_url", "sessions-model-url", Str, RUNS),
    k("sessions", "model", "sessions-model", Str, RUNS),
    k("sessions", "git_credential_file", "sessions-git-credential-file", Str, RUNS),
    k("sessions", "git_credential_hosts", "sessions-git-credential-host", List, RUNS),
    k("sessions", "max_repo_bytes", "sessions-max-repo-bytes", Int, RUNS),
    k("sessions", "max_repo_files", "sessions-max-repo-files", Int, RUNS),
    k("sessions", "max_output_bytes", "sessions-max-output-bytes", Int, RUNS),
    k("sessions", "max_output_lines_per_second", "sessions-max-output-lines-per-second", Int, RUNS),
    k("sessions", "max_blob_bytes", "sessions-max-blob-bytes", Int, RUNS),
    k("sessions", "max_open_approvals", "sessions-max-open-approvals", Int, EVERY),
    k("broker", "guest_port", "broker-guest-port", Int, RUNS),
    k("broker", "control_url", "broker-control-url", Str, HOST),
    k("broker", "for_hosts", "broker-for-hosts", Bool, CONTROL),
    k("broker", "git_push_urls", "broker-git-push-url", List, FRONT),
    k("broker", "git_credential_file", "broker-git-credential-file", Str, FRONT),
    k("broker", "git_credential_hosts", "broker-git-credential-host", List, FRONT),
    k("broker", "github_api", "broker-github-api", Str, FRONT),
    k("broker", "github_token_file", "broker-github-token-file", Str, FRONT),
    k("broker", "ca_file", "broker-ca-file", Str, FRONT),
    k("broker", "mcp_config", "broker-mcp-config", Str, FRONT),
    k("broker", "session_max_calls", "broker-session-max-calls", Int, FRONT),
    k("broker", "session_calls_per_minute", "broker-session-calls-per-minute", Int, FRONT),
    k("broker", "session_max_arg_bytes", "broker-session-max-arg-bytes", Int, FRONT),
    // Hosts anchor the chains they write (a control role's broker and
    // gateway events are committed by the sessions' owning hosts).
    k("audit", "anchor_interval", "audit-anchor-interval", Int, RUNS),
    k("audit", "anchor_hook", "audit-anchor-hook", Str, RUNS),
    k("audit", "anchor_file", "audit-anchor-file", Str, RUNS),
    k("audit", "anchor_s3_url", "audit-anchor-s3-url", Str, RUNS),
    k("audit", "anchor_s3_region", "audit-anchor-s3-region", Str, RUNS),
    k("audit", "anchor_s3_credentials_file", "audit-anchor-s3-credentials-file", Str, RUNS),
    k("audit", "anchor_s3_ca_file", "audit-anchor-s3-ca-file", Str, RUNS),
    k("gateway", "control_url", "gateway-control-url", Str, HOST),
    k("gateway", "openai_upstream", "gateway-openai-upstream", Str, FRONT),
    k("gateway", "anthropic_upstream", "gateway-anthropic-upstream", Str, FRONT),
    k("gateway", "upstream_ca_file", "gateway-upstream-ca-file", Str, FRONT),
    k("gateway", "upstream_key_file", "gateway-upstream-key-file", Str, FRONT),
    k("gateway", "prices", "gateway-prices", Str, FRONT),
    k("gateway", "upstream_timeout", "gateway-upstream-timeout", Int, EVERY),
    k("gateway", "guest_port", "gateway-guest-port", Int, RUNS),
    k("gateway", "max_output_tokens", "gateway-max-output-tokens", Int, FRONT),
    k("gateway", "reservation_ttl", "gateway-reservation-ttl", Int, FRONT),
    k("egress", "guest_port", "egress-guest-port", Int, RUNS),
    k("egress", "max_tunnels", "egress-max-tunnels", Int, RUNS),
    k("egress", "max_tunnels_per_session", "egress-max-tunnels-per-session", Int, RUNS),
    k("egress", "idle_timeout", "egress-idle-timeout", Int, RUNS),
    k("egress", "denied_interval", "egress-denied-interval", Int, RUNS),
    k("egress", "upstream_ca_file", "egress-upstream-ca-file", Str, RUNS),
    k("egress", "ca_dir", "egress-ca-dir", Str, RUNS),
    k("egress", "secrets_key_file", "secrets-key-file", Str, RUNS),
];

/// The key `section.name`.
pub fn find(section: &str, name: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.section == section && k.name == name)
}

/// The key of flag `--long`.
pub fn of_flag(long: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.long == long)
}

/// The key at `section.name`, for the rules, which name keys in code.
pub(crate) fn at(path: &str) -> &'static Key {
    let (s, n) = path.split_once('.').unwrap_or((path, ""));
    find(s, n).unwrap_or_else(|| panic!("no config key {path}"))
}
