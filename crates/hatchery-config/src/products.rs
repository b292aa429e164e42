//! The flags of the two products whose assembly lives in the daemon (the
//! model gateway and the egress proxy); the others' are in their crates
//! (`SessionArgs`, `BrokerArgs`).

use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Clone, Args)]
pub struct GatewayArgs {
    /// OpenAI-compatible upstream (http://host:port[/prefix] or
    /// https://host[:port][/prefix]) for the
    /// in-process model gateway. With this (or the Anthropic one) set,
    /// sessions call their model only through the gateway.
    #[arg(
        long = "gateway-openai-upstream",
        env = "HATCHERY_GATEWAY_OPENAI_UPSTREAM"
    )]
    pub openai_upstream: Option<String>,
    /// Anthropic-compatible upstream (http://host:port[/prefix]).
    #[arg(
        long = "gateway-anthropic-upstream",
        env = "HATCHERY_GATEWAY_ANTHROPIC_UPSTREAM"
    )]
    pub anthropic_upstream: Option<String>,
    /// CA bundle (PEM) for https:// upstreams (default: the system bundle).
    #[arg(
        long = "gateway-upstream-ca-file",
        env = "HATCHERY_GATEWAY_UPSTREAM_CA_FILE"
    )]
    pub upstream_ca_file: Option<PathBuf>,
    /// File with the upstream's API key; only the daemon reads it.
    #[arg(
        long = "gateway-upstream-key-file",
        env = "HATCHERY_GATEWAY_UPSTREAM_KEY_FILE"
    )]
    pub upstream_key_file: Option<PathBuf>,
    /// Price table (JSON, docs/gateway.md "Prices"); required with an upstream.
    #[arg(long = "gateway-prices", env = "HATCHERY_GATEWAY_PRICES")]
    pub prices: Option<PathBuf>,
    /// Where guest code reaches the gateway: 127.0.0.1:PORT in the sandbox.
    /// The sessions model URL default (http://127.0.0.1:9100/v1) names it.
    #[arg(id = "gateway_guest_port", value_name = "PORT", long = "gateway-guest-port", env = "HATCHERY_GATEWAY_GUEST_PORT", default_value_t = 9100,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub guest_port: u16,
    /// Largest max_tokens a call may ask for (and what a call without one gets).
    #[arg(long = "gateway-max-output-tokens", env = "HATCHERY_GATEWAY_MAX_OUTPUT_TOKENS", default_value_t = 4096,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_output_tokens: u64,
    /// Seconds a reservation lives without a settlement before the janitor
    /// frees it.
    #[arg(long = "gateway-reservation-ttl", env = "HATCHERY_GATEWAY_RESERVATION_TTL", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub reservation_ttl_s: u64,
    /// Longest the upstream may take to start answering, in seconds. On a
    /// host that relays to the control role: how long the control plane
    /// may take, less 30 s of margin (give both the same value).
    #[arg(long = "gateway-upstream-timeout", env = "HATCHERY_GATEWAY_UPSTREAM_TIMEOUT", default_value_t = 120,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub upstream_timeout_s: u64,
    /// On a host (--role host, with a shared postgres:// --db): the control
    /// plane's URL (http://host:port). Sandboxes' model calls go to the
    /// control role's gateway there, so this host holds no upstream key;
    /// the upstream options are then given to the control role instead.
    #[arg(long = "gateway-control-url", env = "HATCHERY_GATEWAY_CONTROL_URL")]
    pub control_url: Option<String>,
}

impl GatewayArgs {
    /// Whether this daemon calls a model upstream itself.
    pub fn has_upstream(&self) -> bool {
        self.openai_upstream.is_some() || self.anthropic_upstream.is_some()
    }
}

#[derive(Debug, Clone, Args)]
pub struct EgressArgs {
    /// Where guest code reaches the egress proxy (127.0.0.1:PORT in the
    /// sandbox); session agents get HTTPS_PROXY/HTTP_PROXY pointing there.
    /// 0 turns the proxy off.
    #[arg(
        long = "egress-guest-port",
        env = "HATCHERY_EGRESS_GUEST_PORT",
        default_value_t = 3128
    )]
    pub guest_port: u16,
    /// Tunnels open at once through the proxy, in all.
    #[arg(long = "egress-max-tunnels", env = "HATCHERY_EGRESS_MAX_TUNNELS", default_value_t = 1024,
          value_parser = clap::value_parser!(u64).range(1..=65_536))]
    pub max_tunnels: u64,
    /// Tunnels open at once per session (the relay also caps a sandbox at 64
    /// guest-started connections in all).
    #[arg(long = "egress-max-tunnels-per-session", env = "HATCHERY_EGRESS_MAX_TUNNELS_PER_SESSION", default_value_t = 32,
          value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub max_per_session: u64,
    /// Seconds a tunnel may carry no byte either way before it is closed.
    #[arg(long = "egress-idle-timeout", env = "HATCHERY_EGRESS_IDLE_TIMEOUT", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub idle_s: u64,
    /// Seconds per `egress_denied` session event: refusals (by the proxy
    /// or the sandbox's nftables policy) of one destination in between
    /// are written as that event's count, the first one at once.
    #[arg(long = "egress-denied-interval", env = "HATCHERY_EGRESS_DENIED_INTERVAL", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub denied_interval_s: u64,
    /// Certificates (PEM) the proxy trusts for destinations it intercepts
    /// to inject a credential (docs/policy.md, "Credentials"); the host's
    /// trust store (/etc/ssl/certs/ca-certificates.crt) when not given.
    /// Tests name a test CA here.
    // Its own id: the gateway's field has the same name, and clap ids
    // of flattened structs share one namespace.
    #[arg(
        id = "egress_upstream_ca_file",
        value_name = "FILE",
        long = "egress-upstream-ca-file",
        env = "HATCHERY_EGRESS_UPSTREAM_CA_FILE"
    )]
    pub upstream_ca_file: Option<PathBuf>,
    /// The directory of the interception CA (`ca.pem`, `ca.key` 0600),
    /// made at first start; DATA_DIR/egress-ca by default.
    #[arg(long = "egress-ca-dir", env = "HATCHERY_EGRESS_CA_DIR")]
    pub ca_dir: Option<PathBuf>,
    /// The key that seals stored secrets (32 bytes, 0600, made at first
    /// start); DATA_DIR/secrets.key by default. Keep it out of database
    /// backups and back it up on its own: without it no secret opens.
    #[arg(long = "secrets-key-file", env = "HATCHERY_SECRETS_KEY_FILE")]
    pub secrets_key_file: Option<PathBuf>,
}
