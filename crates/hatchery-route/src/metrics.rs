use prometheus::{IntCounterVec, Opts, Registry};

/// `hatchery_route_requests_total{outcome}`: forwarded, host_lost,
/// host_starting, sandbox_lost, unreachable, placed, no_capacity,
/// no_ready_host.
#[derive(Clone)]
pub struct RouteMetrics {
    pub requests: IntCounterVec,
}

impl RouteMetrics {
    pub fn new(registry: &Registry) -> RouteMetrics {
        let requests = IntCounterVec::new(
            Opts::new(
                "hatchery_route_requests_total",
                "Requests routed between hosts, by outcome",
            ),
            &["outcome"],
        )
        .expect("valid metric");
        // A second registration (tests building two routers on one
        // registry) keeps the first; counting still works on this handle.
        let _ = registry.register(Box::new(requests.clone()));
        RouteMetrics { requests }
    }

    pub(crate) fn count(&self, outcome: &str) {
        self.requests.with_label_values(&[outcome]).inc();
    }
}
