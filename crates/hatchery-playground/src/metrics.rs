//! Prometheus metrics for `GET /metrics`.

use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error(transparent)]
    Prometheus(#[from] prometheus::Error),
}

pub struct Metrics {
    registry: Registry,
    /// Requests that got a result, by `source` (`sandbox` or `cache`).
    pub runs: IntCounterVec,
    /// Refused requests by reason (too_large, rate_limited, busy, unknown_template, invalid_json).
    pub refusals: IntCounterVec,
    /// Runs that failed on the daemon's side after being accepted.
    pub errors: IntCounter,
    pub cache_hits: IntCounter,
    pub cache_misses: IntCounter,
    pub cache_entries: IntGauge,
    pub cache_bytes: IntGauge,
    pub in_flight: IntGauge,
    pub run_seconds: Histogram,
    pub first_byte_seconds: Histogram,
}

impl Metrics {
    pub fn new() -> Result<Metrics, MetricsError> {
        let registry = Registry::new();
        let runs = IntCounterVec::new(
            Opts::new(
                "hatchery_playground_runs_total",
                "Runs that produced a result, by source",
            ),
            &["source"],
        )?;
        let refusals = IntCounterVec::new(
            Opts::new(
                "hatchery_playground_refusals_total",
                "Requests refused before any sandbox, by reason",
            ),
            &["reason"],
        )?;
        let errors = IntCounter::new(
            "hatchery_playground_errors_total",
            "Accepted runs that failed on the daemon side",
        )?;
        let cache_hits = IntCounter::new(
            "hatchery_playground_cache_hits_total",
            "Runs answered from the cache",
        )?;
        let cache_misses = IntCounter::new(
            "hatchery_playground_cache_misses_total",
            "Runs that needed a sandbox",
        )?;
        let cache_entries = IntGauge::new(
            "hatchery_playground_cache_entries",
            "Entries in the result cache",
        )?;
        let cache_bytes = IntGauge::new(
            "hatchery_playground_cache_bytes",
            "Bytes held by the result cache",
        )?;
        let in_flight = IntGauge::new("hatchery_playground_in_flight", "Sandbox runs in progress")?;
        let buckets = vec![0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0];
        let run_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "hatchery_playground_run_seconds",
                "Sandbox runs, request to last event",
            )
            .buckets(buckets.clone()),
        )?;
        let first_byte_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "hatchery_playground_first_output_seconds",
                "Request to first output event, by any source",
            )
            .buckets(buckets),
        )?;
        registry.register(Box::new(runs.clone()))?;
        registry.register(Box::new(refusals.clone()))?;
        registry.register(Box::new(errors.clone()))?;
        registry.register(Box::new(cache_hits.clone()))?;
        registry.register(Box::new(cache_misses.clone()))?;
        registry.register(Box::new(cache_entries.clone()))?;
        registry.register(Box::new(cache_bytes.clone()))?;
        registry.register(Box::new(in_flight.clone()))?;
        registry.register(Box::new(run_seconds.clone()))?;
        registry.register(Box::new(first_byte_seconds.clone()))?;
        Ok(Metrics {
            registry,
            runs,
            refusals,
            errors,
            cache_hits,
            cache_misses,
            cache_entries,
            cache_bytes,
            in_flight,
            run_seconds,
            first_byte_seconds,
        })
    }

    pub fn render(&self) -> String {
        let hits = self.cache_hits.get() as f64;
        let total = hits + self.cache_misses.get() as f64;
        let ratio = if total == 0.0 { 0.0 } else { hits / total };
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        let mut s = String::from_utf8_lossy(&buf).into_owned();
        s.push_str(&format!(
            "# HELP hatchery_playground_cache_hit_ratio Cache hits over cache lookups since start\n\
             # TYPE hatchery_playground_cache_hit_ratio gauge\nhatchery_playground_cache_hit_ratio {ratio}\n"
        ));
        s
    }
}
