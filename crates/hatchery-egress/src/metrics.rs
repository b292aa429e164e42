//! Prometheus metrics of one proxy; the daemon registers `registry()`'s
//! collectors next to its own (or renders them on /metrics).

use prometheus::{IntCounterVec, IntGauge, Opts, Registry};

pub struct EgressMetrics {
    registry: Registry,
    /// By verdict (`allowed`, `denied`) and answered status.
    pub connections: IntCounterVec,
    pub tunnels_open: IntGauge,
    /// Connections held for a person's decision now.
    pub held: IntGauge,
    /// Bytes relayed, by direction (`up` to the destination, `down`).
    pub bytes: IntCounterVec,
}

impl EgressMetrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let connections = IntCounterVec::new(
            Opts::new(
                "hatchery_egress_connections_total",
                "Egress proxy connection attempts",
            ),
            &["verdict", "status"],
        )
        .expect("valid metric");
        let tunnels_open = IntGauge::new(
            "hatchery_egress_tunnels_open",
            "Egress tunnels relaying now",
        )
        .expect("valid metric");
        let held = IntGauge::new(
            "hatchery_egress_held",
            "Egress connections waiting for an approval",
        )
        .expect("valid metric");
        let bytes = IntCounterVec::new(
            Opts::new(
                "hatchery_egress_bytes_total",
                "Bytes relayed by the egress proxy",
            ),
            &["direction"],
        )
        .expect("valid metric");
        for c in [
            Box::new(connections.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(tunnels_open.clone()),
            Box::new(held.clone()),
            Box::new(bytes.clone()),
        ] {
            registry.register(c).expect("unique metric names");
        }
        EgressMetrics {
            registry,
            connections,
            tunnels_open,
            held,
            bytes,
        }
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        use prometheus::Encoder;
        let mut out = Vec::new();
        let _ = prometheus::TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

impl Default for EgressMetrics {
    fn default() -> Self {
        Self::new()
    }
}
