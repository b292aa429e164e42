//! Prometheus collectors of the sessions layer; the daemon registers them
//! in its own registry so they appear on `/metrics`.

use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry};

pub struct SessionMetrics {
    pub created: IntCounter,
    /// Tenant sessions refused: their tenant's limits had no room.
    pub tenant_refused: IntCounter,
    pub messages: IntCounter,
    pub transitions: IntCounterVec,
    pub append_seconds: Histogram,
    pub open_streams: IntGauge,
    pub streams_refused: IntCounter,
    pub resume_seconds: Histogram,
    pub checkpoint_seconds: Histogram,
    pub start_seconds: Histogram,
    /// Sessions this host handed to another (graceful stop, drain).
    pub handed_over: IntCounter,
    /// Per-session caps reached (docs/sessions.md, "Caps"), by cap.
    pub caps_hit: IntCounterVec,
    /// Agent output lines and bytes not stored because of a cap.
    pub output_dropped_lines: IntCounterVec,
    pub output_dropped_bytes: IntCounterVec,
}

impl SessionMetrics {
    pub fn new() -> Self {
        let buckets = vec![
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
        ];
        let slow = vec![0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
        SessionMetrics {
            caps_hit: IntCounterVec::new(
                Opts::new(
                    "hatchery_sessions_caps_hit_total",
                    "Per-session caps reached: output_bytes, output_rate, output_blob, open_approvals, repo_bytes, repo_disk, repo_files, repo_timeout",
                ),
                &["cap"],
            )
            .expect("metric"),
            output_dropped_lines: IntCounterVec::new(
                Opts::new(
                    "hatchery_sessions_output_dropped_lines_total",
                    "Agent output lines not stored, by the cap that dropped them",
                ),
                &["cap"],
            )
            .expect("metric"),
            output_dropped_bytes: IntCounterVec::new(
                Opts::new(
                    "hatchery_sessions_output_dropped_bytes_total",
                    "Agent output bytes not stored, by the cap that dropped them",
                ),
                &["cap"],
            )
            .expect("metric"),
            handed_over: IntCounter::new(
                "hatchery_sessions_handed_over_total",
                "Sessions this host handed to another host (graceful stop or drain)",
            )
            .expect("metric"),
            created: IntCounter::new("hatchery_sessions_created_total", "Sessions created")
                .expect("metric"),
            tenant_refused: IntCounter::new(
                "hatchery_sessions_tenant_refused_total",
                "Session creates refused 429 tenant_budget_exhausted (the tenant's limits had no room for the budget)",
            )
            .expect("metric"),
            messages: IntCounter::new(
                "hatchery_sessions_messages_total",
                "Steering messages accepted",
            )
            .expect("metric"),
            transitions: IntCounterVec::new(
                Opts::new(
                    "hatchery_sessions_transitions_total",
                    "Session state changes, by new state",
                ),
                &["to"],
            )
            .expect("metric"),
            append_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "hatchery_sessions_event_append_seconds",
                    "Event append (one transaction)",
                )
                .buckets(buckets),
            )
            .expect("metric"),
            open_streams: IntGauge::new(
                "hatchery_sessions_open_streams",
                "Open session event streams",
            )
            .expect("metric"),
            streams_refused: IntCounter::new(
                "hatchery_sessions_streams_refused_total",
                "Event streams refused with 503 at the cap",
            )
            .expect("metric"),
            resume_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "hatchery_sessions_resume_seconds",
                    "Resume from an idle snapshot",
                )
                .buckets(slow.clone()),
            )
            .expect("metric"),
            checkpoint_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "hatchery_sessions_checkpoint_seconds",
                    "A running session's checkpoint (snapshot of its sandbox, agent included)",
                )
                .buckets(slow.clone()),
            )
            .expect("metric"),
            start_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "hatchery_sessions_start_seconds",
                    "Lease to running (sandbox, checkout, agent start)",
                )
                .buckets(slow),
            )
            .expect("metric"),
        }
    }

    pub fn register(&self, r: &Registry) -> prometheus::Result<()> {
        r.register(Box::new(self.created.clone()))?;
        r.register(Box::new(self.tenant_refused.clone()))?;
        r.register(Box::new(self.handed_over.clone()))?;
        r.register(Box::new(self.messages.clone()))?;
        r.register(Box::new(self.transitions.clone()))?;
        r.register(Box::new(self.append_seconds.clone()))?;
        r.register(Box::new(self.open_streams.clone()))?;
        r.register(Box::new(self.streams_refused.clone()))?;
        r.register(Box::new(self.resume_seconds.clone()))?;
        r.register(Box::new(self.start_seconds.clone()))?;
        r.register(Box::new(self.checkpoint_seconds.clone()))?;
        r.register(Box::new(self.caps_hit.clone()))?;
        r.register(Box::new(self.output_dropped_lines.clone()))?;
        r.register(Box::new(self.output_dropped_bytes.clone()))?;
        Ok(())
    }
}

impl Default for SessionMetrics {
    fn default() -> Self {
        Self::new()
    }
}
