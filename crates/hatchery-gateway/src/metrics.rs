//! Prometheus metrics of the gateway.

use crate::usage::Flavor;
use prometheus::{Histogram, HistogramOpts, IntCounterVec, Opts, Registry};

pub struct Metrics {
    pub registry: Registry,
    /// By API and outcome (an embedding daemon registers it next to its own).
    pub calls: IntCounterVec,
    pub reserve_seconds: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        let registry = Registry::new();
        let calls = IntCounterVec::new(
            Opts::new(
                "hatchery_gateway_calls_total",
                "Model calls by API and outcome",
            ),
            &["api", "outcome"],
        )
        .expect("static metric");
        let reserve_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "hatchery_gateway_reserve_seconds",
                "Time to reserve a call's worst case",
            )
            .buckets(vec![0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.25]),
        )
        .expect("static metric");
        registry.register(Box::new(calls.clone())).expect("unique");
        registry
            .register(Box::new(reserve_seconds.clone()))
            .expect("unique");
        Metrics {
            registry,
            calls,
            reserve_seconds,
        }
    }
}

impl Metrics {
    pub fn call(&self, flavor: Flavor, outcome: &str) {
        self.calls
            .with_label_values(&[flavor.name(), outcome])
            .inc();
    }
}
