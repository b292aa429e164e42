//! Prometheus metrics of the gateway.

use crate::budget::Amount;
use crate::usage::Flavor;
use prometheus::{Histogram, HistogramOpts, IntCounterVec, Opts, Registry};

pub struct Metrics {
    pub registry: Registry,
    /// By API and outcome (an embedding daemon registers it next to its own).
    pub calls: IntCounterVec,
    pub reserve_seconds: Histogram,
    /// Tokens upstreams reported above calls' reservations (not charged).
    pub overage_tokens: IntCounterVec,
    /// Cents upstreams reported above calls' reservations (not charged).
    pub overage_cents: IntCounterVec,
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
        let over = |name: &str, help: &str| {
            IntCounterVec::new(Opts::new(name, help), &["api"]).expect("static metric")
        };
        let overage_tokens = over(
            "hatchery_gateway_overage_tokens_total",
            "Tokens upstreams reported above the calls' reservations, not charged",
        );
        let overage_cents = over(
            "hatchery_gateway_overage_usd_cents_total",
            "US cents upstreams reported above the calls' reservations, not charged",
        );
        registry.register(Box::new(calls.clone())).expect("unique");
        registry
            .register(Box::new(overage_tokens.clone()))
            .expect("unique");
        registry
            .register(Box::new(overage_cents.clone()))
            .expect("unique");
        registry
            .register(Box::new(reserve_seconds.clone()))
            .expect("unique");
        Metrics {
            registry,
            calls,
            reserve_seconds,
            overage_tokens,
            overage_cents,
        }
    }
}

impl Metrics {
    pub fn call(&self, flavor: Flavor, outcome: &str) {
        self.calls
            .with_label_values(&[flavor.name(), outcome])
            .inc();
    }

    /// What an upstream reported above a call's reservation.
    pub fn overage(&self, flavor: Flavor, excess: Amount) {
        let api = [flavor.name()];
        self.overage_tokens
            .with_label_values(&api)
            .inc_by(excess.tokens);
        self.overage_cents
            .with_label_values(&api)
            .inc_by(excess.usd_cents);
    }
}
