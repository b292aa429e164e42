use anyhow::Context;
use clap::Parser;
use hatchery_gateway::budget::{BudgetStore, KeyStore};
use hatchery_gateway::store::{schema, GatewayStore};
use hatchery_gateway::upstream::Upstream;
use hatchery_gateway::usage::Flavor;
use hatchery_gateway::{events, metrics, pricing, router, spawn_janitor, Gateway};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tracing_subscriber::EnvFilter;

/// The model gateway (docs/gateway.md).
#[derive(Debug, Parser)]
struct Args {
    #[arg(long, default_value = "127.0.0.1:7425")]
    listen: SocketAddr,
    /// Where budgets, reservations and keys live: a SQLite file, or a
    /// PostgreSQL `postgres://` URL (for a gateway shared by many hosts).
    #[arg(long, default_value = "/var/lib/hatchery/gateway.db")]
    db: String,
    /// Connections to PostgreSQL, at most.
    #[arg(long, default_value_t = 16)]
    db_pool_size: usize,
    /// OpenAI-compatible upstream, http://host:port[/prefix] or
    /// https://host[:port][/prefix].
    #[arg(long)]
    openai_upstream: Option<String>,
    /// Anthropic-compatible upstream, http:// or https://.
    #[arg(long)]
    anthropic_upstream: Option<String>,
    /// CA bundle (PEM) that https:// upstreams are verified against
    /// (default: /etc/ssl/certs/ca-certificates.crt).
    #[arg(long)]
    upstream_ca_file: Option<PathBuf>,
    /// File with the upstream's API key (held only by the gateway).
    #[arg(long)]
    upstream_key_file: Option<PathBuf>,
    /// Price table, JSON: {"models": {name: {"input_cents_per_mtok",
    /// "output_cents_per_mtok"}}, "default": {...}?}.
    #[arg(long)]
    prices: PathBuf,
    /// Admin key for /admin/* (budgets, keys).
    #[arg(long, env = "HATCHERY_GATEWAY_ADMIN_KEY", hide_env_values = true)]
    admin_key: String,
    /// Largest max-tokens a call may ask for (and what a call that asks for
    /// none gets).
    #[arg(long, default_value_t = 4096)]
    max_output_tokens: u64,
    /// Largest request body in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    max_body_bytes: usize,
    /// How long a reservation lives without a settlement before the
    /// janitor frees it (a crash between reserve and settle).
    #[arg(long, default_value_t = 300)]
    reservation_ttl_seconds: u64,
    /// Longest an upstream may take to answer (the head of its answer).
    #[arg(long, default_value_t = 120)]
    upstream_timeout_seconds: u64,
    /// Take the caller from the `X-Hatchery-Sandbox` header that the
    /// daemon's host-service relay sets (sandboxes bound with PUT
    /// /admin/sandboxes/{id}). Only where nothing but the daemon can reach
    /// this listener.
    #[arg(long)]
    trust_sandbox_header: bool,
    #[command(flatten)]
    http: hatchery_serve::HttpLimits,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    let a = Args::parse();
    anyhow::ensure!(
        a.admin_key.len() >= 16,
        "--admin-key must be at least 16 characters"
    );
    anyhow::ensure!(
        (1..=1_000_000).contains(&a.max_output_tokens),
        "--max-output-tokens must be between 1 and 1000000"
    );
    let key = match &a.upstream_key_file {
        Some(p) => std::fs::read_to_string(p)
            .with_context(|| format!("reading {}", p.display()))?
            .trim()
            .to_string(),
        None => String::new(),
    };
    let prices: pricing::Prices = serde_json::from_slice(
        &std::fs::read(&a.prices).with_context(|| format!("reading {}", a.prices.display()))?,
    )
    .with_context(|| format!("parsing the price table {}", a.prices.display()))?;
    let timeout = Duration::from_secs(a.upstream_timeout_seconds.max(1));
    let up = |flavor, url: &Option<String>| -> anyhow::Result<Option<Upstream>> {
        url.as_deref()
            .map(|u| Upstream::with_ca(flavor, u, &key, timeout, a.upstream_ca_file.as_deref()))
            .transpose()
            .map_err(Into::into)
    };
    let db = if hatchery_db::is_postgres(&a.db) {
        hatchery_db::Db::postgres(&a.db, a.db_pool_size)?
    } else {
        hatchery_db::Db::sqlite(&PathBuf::from(&a.db)).await?
    };
    let s = Arc::new(GatewayStore::open(db.clone()).await?);
    // A file of the previous release (its tables unprefixed) keeps its rows.
    if schema::adopt_old_tables(&db).await? {
        tracing::info!(db = %db.describe(), "budgets, keys and bindings moved to the gateway_ tables");
    }
    let (store, keys): (Arc<dyn BudgetStore>, Arc<dyn KeyStore>) = (s.clone(), s);
    let g = Arc::new(Gateway {
        store: store.clone(),
        keys,
        prices,
        openai: up(Flavor::OpenAi, &a.openai_upstream)?,
        anthropic: up(Flavor::Anthropic, &a.anthropic_upstream)?,
        max_output_tokens: a.max_output_tokens,
        max_body: a.max_body_bytes,
        reservation_ttl_ms: a.reservation_ttl_seconds.max(1) * 1000,
        trust_sandbox_header: a.trust_sandbox_header,
        admin_key: a.admin_key.clone(),
        metrics: metrics::Metrics::default(),
        events: Arc::new(events::LogEvents::new(20)),
        // The standalone gateway knows no sessions' policies.
        policy: None,
    });
    spawn_janitor(store, g.events.clone());
    let listener = tokio::net::TcpListener::bind(a.listen)
        .await
        .with_context(|| format!("cannot listen on {}", a.listen))?;
    tracing::info!(listen = %a.listen, "hatchery-gateway serving");
    hatchery_serve::serve(listener, router(g), a.http, shutdown(), None)
        .await
        .context("server failed")?;
    Ok(())
}

async fn shutdown() {
    let _ = tokio::signal::ctrl_c().await;
}
