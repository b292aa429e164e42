//! Prometheus metrics. One registry per daemon, so tests can run several.

use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

pub struct Metrics {
    pub registry: Registry,
    pub sandboxes_live: IntGauge,
    pub sandboxes_created: IntCounter,
    pub sandboxes_killed: IntCounterVec,
    pub create_failures: IntCounter,
    pub create_seconds: Histogram,
    pub execs: IntCounter,
    pub code_runs: IntCounter,
    pub exec_seconds: Histogram,
    pub exec_timeouts: IntCounter,
    pub exec_ooms: IntCounter,
    pub exec_truncated: IntCounter,
    pub restore_fallbacks: IntCounter,
    pub snapshots_created: IntCounter,
    /// Snapshots refused because their store was at its storage cap.
    pub snapshot_store_full: IntCounter,
    pub pool_ready: IntGauge,
    pub snapshot_pool_ready: IntGauge,
    pub snapshot_pool_claims: IntCounter,
    pub snapshot_pool_misses: IntCounter,
    pub template_images_baked: IntCounter,
    pub relay: RelayMetrics,
    pub terminals_open: IntGauge,
    pub terminals_opened: IntCounter,
    /// Idle parking of claimed sandboxes (idle.rs).
    pub idle: IdleMetrics,
}

/// Claimed sandboxes stopped while nothing used them (idle.rs).
#[derive(Clone)]
pub struct IdleMetrics {
    pub parked: IntGauge,
    pub parks: IntCounter,
    pub unparks: IntCounter,
}

impl IdleMetrics {
    fn new() -> IdleMetrics {
        IdleMetrics {
            parked: IntGauge::new(
                "hatchery_sandboxes_idle_parked",
                "Claimed sandboxes stopped now because nothing used them",
            )
            .unwrap(),
            parks: IntCounter::new(
                "hatchery_idle_parks_total",
                "Claimed sandboxes stopped because nothing used them",
            )
            .unwrap(),
            unparks: IntCounter::new(
                "hatchery_idle_unparks_total",
                "Idle-parked sandboxes started again by a request or teardown",
            )
            .unwrap(),
        }
    }
}

/// Relayed connections, labelled `kind` = `port` (into the guest: the
/// ports API and previews) or `host_service` (out of it).
#[derive(Clone)]
pub struct RelayMetrics {
    pub connections: IntCounterVec,
    /// Also labelled `direction` = `to_guest` or `from_guest`.
    pub bytes: IntCounterVec,
    pub open: IntGaugeVec,
    /// Also labelled `reason`.
    pub rejected: IntCounterVec,
}

/// Per-connection handles on the relay metrics (one relayed stream's
/// counters, relay.rs). Here, beside the metrics they are cut from, so the
/// metrics need nothing of the relay.
#[derive(Clone)]
pub(crate) struct Meters {
    pub to_guest: IntCounter,
    pub from_guest: IntCounter,
    pub open: IntGauge,
}

impl RelayMetrics {
    fn new() -> RelayMetrics {
        RelayMetrics {
            connections: IntCounterVec::new(
                Opts::new(
                    "hatchery_relay_connections_total",
                    "Connections relayed over agent channels, by kind (port, host_service)",
                ),
                &["kind"],
            )
            .unwrap(),
            bytes: IntCounterVec::new(
                Opts::new(
                    "hatchery_relay_bytes_total",
                    "Bytes relayed over agent channels, by kind and direction",
                ),
                &["kind", "direction"],
            )
            .unwrap(),
            open: IntGaugeVec::new(
                Opts::new(
                    "hatchery_relay_open",
                    "Relayed connections open now, by kind",
                ),
                &["kind"],
            )
            .unwrap(),
            rejected: IntCounterVec::new(
                Opts::new(
                    "hatchery_relay_rejected_total",
                    "Relayed connections refused, by kind and reason",
                ),
                &["kind", "reason"],
            )
            .unwrap(),
        }
    }

    pub(crate) fn meters(&self, kind: &str) -> Meters {
        self.connections.with_label_values(&[kind]).inc();
        Meters {
            to_guest: self.bytes.with_label_values(&[kind, "to_guest"]),
            from_guest: self.bytes.with_label_values(&[kind, "from_guest"]),
            open: self.open.with_label_values(&[kind]),
        }
    }

    pub(crate) fn reject(&self, kind: &str, reason: &str) {
        self.rejected.with_label_values(&[kind, reason]).inc();
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let buckets = vec![
            0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            60.0,
        ];
        let m = Metrics {
            sandboxes_live: IntGauge::new("hatchery_sandboxes_live", "Sandboxes currently running")
                .unwrap(),
            sandboxes_created: IntCounter::new(
                "hatchery_sandboxes_created_total",
                "Sandboxes created",
            )
            .unwrap(),
            sandboxes_killed: IntCounterVec::new(
                Opts::new(
                    "hatchery_sandboxes_killed_total",
                    "Sandboxes stopped, by reason",
                ),
                &["reason"],
            )
            .unwrap(),
            create_failures: IntCounter::new(
                "hatchery_sandbox_create_failures_total",
                "Failed creates",
            )
            .unwrap(),
            create_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "hatchery_sandbox_create_seconds",
                    "Create: request to agent ready",
                )
                .buckets(buckets.clone()),
            )
            .unwrap(),
            execs: IntCounter::new("hatchery_execs_total", "Commands executed").unwrap(),
            code_runs: IntCounter::new(
                "hatchery_code_runs_total",
                "Code runs in interpreter contexts",
            )
            .unwrap(),
            exec_seconds: Histogram::with_opts(
                HistogramOpts::new("hatchery_exec_seconds", "Exec wall time").buckets(buckets),
            )
            .unwrap(),
            exec_timeouts: IntCounter::new(
                "hatchery_exec_timeouts_total",
                "Execs killed at their deadline",
            )
            .unwrap(),
            exec_ooms: IntCounter::new(
                "hatchery_exec_oom_kills_total",
                "Execs during which the OOM killer ran",
            )
            .unwrap(),
            restore_fallbacks: IntCounter::new(
                "hatchery_restore_fallbacks_total",
                "Creates that booted cold because the runtime refused the template's checkpoint",
            )
            .unwrap(),
            exec_truncated: IntCounter::new(
                "hatchery_exec_truncated_total",
                "Execs whose output hit the cap",
            )
            .unwrap(),
            snapshots_created: IntCounter::new(
                "hatchery_snapshots_created_total",
                "Snapshots taken",
            )
            .unwrap(),
            snapshot_store_full: IntCounter::new(
                "hatchery_snapshot_store_full_total",
                "Snapshots refused: their store was at its storage cap",
            )
            .unwrap(),
            pool_ready: IntGauge::new(
                "hatchery_pool_ready",
                "Warm, never-used sandboxes ready to claim",
            )
            .unwrap(),
            snapshot_pool_ready: IntGauge::new(
                "hatchery_snapshot_pool_ready",
                "Parked forks of warm snapshots (hot environment versions) ready to claim",
            )
            .unwrap(),
            snapshot_pool_claims: IntCounter::new(
                "hatchery_snapshot_pool_claims_total",
                "Forks served from a snapshot's warm pool",
            )
            .unwrap(),
            snapshot_pool_misses: IntCounter::new(
                "hatchery_snapshot_pool_misses_total",
                "Forks of a snapshot kept warm that found none ready and restored",
            )
            .unwrap(),
            template_images_baked: IntCounter::new(
                "hatchery_template_images_baked_total",
                "Template checkpoints baked",
            )
            .unwrap(),
            relay: RelayMetrics::new(),
            terminals_open: IntGauge::new("hatchery_terminals_open", "PTY terminals attached now")
                .unwrap(),
            terminals_opened: IntCounter::new(
                "hatchery_terminals_opened_total",
                "PTY terminals opened",
            )
            .unwrap(),
            idle: IdleMetrics::new(),
            registry,
        };
        let r = &m.registry;
        r.register(Box::new(m.idle.parked.clone())).unwrap();
        r.register(Box::new(m.idle.parks.clone())).unwrap();
        r.register(Box::new(m.idle.unparks.clone())).unwrap();
        r.register(Box::new(m.sandboxes_live.clone())).unwrap();
        r.register(Box::new(m.sandboxes_created.clone())).unwrap();
        r.register(Box::new(m.sandboxes_killed.clone())).unwrap();
        r.register(Box::new(m.create_failures.clone())).unwrap();
        r.register(Box::new(m.create_seconds.clone())).unwrap();
        r.register(Box::new(m.execs.clone())).unwrap();
        r.register(Box::new(m.code_runs.clone())).unwrap();
        r.register(Box::new(m.exec_seconds.clone())).unwrap();
        r.register(Box::new(m.exec_timeouts.clone())).unwrap();
        r.register(Box::new(m.exec_ooms.clone())).unwrap();
        r.register(Box::new(m.restore_fallbacks.clone())).unwrap();
        r.register(Box::new(m.exec_truncated.clone())).unwrap();
        r.register(Box::new(m.snapshots_created.clone())).unwrap();
        r.register(Box::new(m.snapshot_store_full.clone())).unwrap();
        r.register(Box::new(m.pool_ready.clone())).unwrap();
        r.register(Box::new(m.snapshot_pool_ready.clone())).unwrap();
        r.register(Box::new(m.snapshot_pool_claims.clone()))
            .unwrap();
        r.register(Box::new(m.snapshot_pool_misses.clone()))
            .unwrap();
        r.register(Box::new(m.template_images_baked.clone()))
            .unwrap();
        r.register(Box::new(m.relay.connections.clone())).unwrap();
        r.register(Box::new(m.relay.bytes.clone())).unwrap();
        r.register(Box::new(m.relay.open.clone())).unwrap();
        r.register(Box::new(m.relay.rejected.clone())).unwrap();
        r.register(Box::new(m.terminals_open.clone())).unwrap();
        r.register(Box::new(m.terminals_opened.clone())).unwrap();
        m
    }

    /// Registers and returns the network slot pool's metrics.
    pub fn net_metrics(&self) -> hatchery_net::pool::Metrics {
        let m = hatchery_net::pool::Metrics {
            denied: IntCounter::new(
                "hatchery_egress_denied_total",
                "Denied egress attempts logged (rate-limited per sandbox)",
            )
            .unwrap(),
            ready: IntGauge::new("hatchery_net_slots_ready", "Network slots made and waiting")
                .unwrap(),
            leased: IntGauge::new(
                "hatchery_net_slots_leased",
                "Network slots held by sandboxes",
            )
            .unwrap(),
        };
        self.registry.register(Box::new(m.denied.clone())).unwrap();
        self.registry.register(Box::new(m.ready.clone())).unwrap();
        self.registry.register(Box::new(m.leased.clone())).unwrap();
        m
    }

    pub fn render(&self) -> String {
        use prometheus::Encoder;
        let mut buf = Vec::new();
        let _ = prometheus::TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
