//! Shared gateway state, built once from the config.

use crate::cache::Cache;
use crate::config::{parse_daemon_url, parse_template, Cidr, Config, ConfigError, Runner};
use crate::limits::{Buckets, InFlight, RateLimiter};
use crate::metrics::{Metrics, MetricsError};
use crate::run::Limits;
use crate::runs::{Runs, RunsError};
use hatchery_client::{Client, ClientConfig, ClientError};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Runs(#[from] RunsError),
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    #[error(transparent)]
    Client(#[from] ClientError),
}

/// Ordinary daemon calls (create, write, delete) are bounded by this; a
/// run's stream is bounded by the run's own deadline.
pub const DAEMON_CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest JSON answer taken from the daemon.
const DAEMON_MAX_JSON: usize = 1 << 20;

pub struct App {
    pub daemon: Client,
    pub templates: HashMap<String, Runner>,
    pub trusted: Vec<Cidr>,
    pub allow_origins: Vec<String>,
    pub max_code_bytes: usize,
    pub limiter: RateLimiter,
    pub in_flight: InFlight,
    pub limits: Limits,
    pub cache: Cache,
    pub runs: Runs,
    pub metrics: Metrics,
    template_refresh: Duration,
    versions: Mutex<HashMap<String, (Option<String>, Instant)>>,
}

impl App {
    pub fn new(cfg: &Config) -> Result<App, AppError> {
        let templates = cfg
            .templates
            .iter()
            .map(|t| parse_template(t))
            .collect::<Result<HashMap<_, _>, _>>()?;
        let trusted = cfg
            .trusted_proxies
            .iter()
            .map(|s| Cidr::parse(s))
            .collect::<Result<_, _>>()?;
        let salt = cfg.ip_salt.clone().unwrap_or_else(|| {
            use rand::RngCore;
            let mut b = [0u8; 16];
            rand::thread_rng().fill_bytes(&mut b);
            b.iter().map(|x| format!("{x:02x}")).collect()
        });
        Ok(App {
            daemon: Client::with_config(
                &format!("http://{}", parse_daemon_url(&cfg.daemon_url)?),
                &cfg.api_key,
                ClientConfig::default()
                    .call_timeout(DAEMON_CALL_TIMEOUT)
                    .max_json_bytes(DAEMON_MAX_JSON),
            )?,
            templates,
            trusted,
            allow_origins: cfg.allow_origins.clone(),
            max_code_bytes: cfg.max_code_bytes,
            limiter: RateLimiter {
                ip: Buckets::new(cfg.ip_per_minute, cfg.ip_burst),
                session: Buckets::new(cfg.session_per_minute, cfg.session_burst),
            },
            in_flight: InFlight::new(cfg.max_in_flight),
            limits: Limits {
                timeout: cfg.timeout(),
                // The TTL must outlast create + write + the run itself.
                ttl_seconds: cfg.ttl_seconds.max(cfg.timeout().as_secs() + 10),
                max_output_bytes: cfg.max_output_bytes.max(1),
            },
            cache: Cache::new(cfg.cache_entries, cfg.cache_bytes),
            runs: Runs::open(
                &cfg.db,
                salt,
                Duration::from_secs(cfg.retention_days.max(1) * 86400),
            )?,
            metrics: Metrics::new()?,
            template_refresh: Duration::from_secs(cfg.template_refresh_seconds),
            versions: Mutex::new(HashMap::new()),
        })
    }

    /// The template's current version on the daemon (part of the cache key),
    /// asked at most once per refresh interval. None when the daemon does not
    /// know it or cannot be asked; such runs are not cached.
    pub async fn template_version(&self, name: &str) -> Option<String> {
        {
            let v = self.versions.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((ver, at)) = v.get(name) {
                if at.elapsed() < self.template_refresh {
                    return ver.clone();
                }
            }
        }
        // A failed lookup is remembered too (as "no version": not cached), so
        // a daemon that is down or slow is asked once per interval, not per request.
        let ver = match tokio::time::timeout(Duration::from_secs(5), self.daemon.get_template(name))
            .await
        {
            Ok(Ok(t)) => Some(t.version),
            Ok(Err(e)) if e.is_not_found() => None,
            Ok(Err(e)) => {
                tracing::warn!(template = name, error = %e, "template version lookup failed");
                None
            }
            Err(_) => {
                tracing::warn!(template = name, "template version lookup timed out");
                None
            }
        };
        self.versions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string(), (ver.clone(), Instant::now()));
        ver
    }
}
