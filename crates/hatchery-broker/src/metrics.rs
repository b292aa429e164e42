//! Prometheus metrics of the broker (the daemon registers them).

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

pub struct BrokerMetrics {
    pub calls: IntCounterVec,
    pub policy_seconds: prometheus::Histogram,
    pub effect_seconds: HistogramVec,
    pub mcp_calls: IntCounterVec,
}

impl BrokerMetrics {
    pub fn new() -> Self {
        BrokerMetrics {
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
        Ok(())
    }
}

impl Default for BrokerMetrics {
    fn default() -> Self {
        Self::new()
    }
}
