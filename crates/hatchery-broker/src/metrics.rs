//! Prometheus metrics of the broker (the daemon registers them).

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

pub struct BrokerMetrics {
    pub calls: IntCounterVec,
    pub policy_seconds: prometheus::Histogram,
    pub effect_seconds: HistogramVec,
    pub mcp_calls: IntCounterVec,
    /// Calls refused at a per-session cap, by cap.
    pub caps_hit: IntCounterVec,
    /// `git_push` calls whose own `diff` argument differed from the
    /// host's count (and was ignored).
    pub agent_diff_ignored: prometheus::IntCounter,
}

impl BrokerMetrics {
    pub fn new() -> Self {
        BrokerMetrics {
            agent_diff_ignored: prometheus::IntCounter::new(
                "hatchery_broker_agent_diff_ignored_total",
                "git_push calls whose agent-supplied diff argument differed from the size the host measured (the host's is what the policy sees)",
            )
            .expect("metric"),
            caps_hit: IntCounterVec::new(
                Opts::new(
                    "hatchery_broker_session_caps_hit_total",
                    "Broker calls refused at a per-session cap (session_call_cap, session_call_rate, session_arg_bytes_cap, session_approval_cap)",
                ),
                &["cap"],
            )
            .expect("metric"),
            calls: IntCounterVec::new(
                Opts::new(
                    "hatchery_broker_calls_total",
                    "Broker invocations answered, by tool and call status",
                ),
                &["tool", "status"],
            )
            .expect("metric"),
            policy_seconds: prometheus::Histogram::with_opts(
                HistogramOpts::new(
                    "hatchery_broker_policy_seconds",
                    "Policy evaluation time per new call",
                )
                .buckets(vec![1e-6, 5e-6, 2e-5, 1e-4, 1e-3]),
            )
            .expect("metric"),
            effect_seconds: HistogramVec::new(
                HistogramOpts::new("hatchery_broker_effect_seconds", "Time of a tool's effect"),
                &["tool"],
            )
            .expect("metric"),
            mcp_calls: IntCounterVec::new(
                Opts::new(
                    "hatchery_broker_mcp_calls_total",
                    "MCP tools/call outcomes, by server and outcome",
                ),
                &["server", "outcome"],
            )
            .expect("metric"),
        }
    }

    pub fn register(&self, r: &Registry) -> prometheus::Result<()> {
        r.register(Box::new(self.calls.clone()))?;
        r.register(Box::new(self.policy_seconds.clone()))?;
        r.register(Box::new(self.effect_seconds.clone()))?;
        r.register(Box::new(self.mcp_calls.clone()))?;
        r.register(Box::new(self.caps_hit.clone()))?;
        r.register(Box::new(self.agent_diff_ignored.clone()))?;
        Ok(())
    }
}

impl Default for BrokerMetrics {
    fn default() -> Self {
        Self::new()
    }
}
