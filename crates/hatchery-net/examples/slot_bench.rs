//! Measures slot costs on this host: making a slot, and the claim+release
//! cycle a sandbox create/delete pays. Run as root:
//! `cargo run --release -p hatchery-net --example slot_bench -- [N]`.
//! Uses its own prefix and range, so it never touches a daemon's slots.

use hatchery_net::{Network, NetworkConfig, Policy, PolicyLimits};
use std::time::Instant;

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(50);
    let gauge = |name: &str| prometheus::IntGauge::new(name, "x").unwrap();
    let net = Network::start(
        NetworkConfig {
            prefix: "hxb".into(),
            range: "10.233.0.0/16".parse().unwrap(),
            ready_target: 0,
            limits: PolicyLimits::default(),
            hosts_file: None,
        },
        hatchery_net::pool::Metrics {
            denied: prometheus::IntCounter::new("d", "x").unwrap(),
            ready: gauge("r"),
            leased: gauge("l"),
        },
    )
    .expect("start");
    net.reclaim(vec![]).expect("reclaim");
    // Cold: no ready slot, so each claim makes one.
    let mut make = Vec::new();
    for i in 0..n {
        let t = Instant::now();
        net.claim(&format!("o{i}"), &Policy::deny_all())
            .expect("claim");
        make.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    for i in 0..n {
        net.release(&format!("o{i}"));
    }
    // Warm: claims come from the ready queue; releases scrub.
    let (mut claim, mut release, mut update) = (Vec::new(), Vec::new(), Vec::new());
    let open: Policy = serde_json::from_str(
        r#"{"egress":"deny","allow":[{"cidr":"198.51.100.0/24","ports":[443]}]}"#,
    )
    .unwrap();
    // The warm cycle is timed with all `n` slots in the table (ready), so
    // a large `n` shows how table size affects claims and updates.
    for i in 0..n.min(50) {
        let o = format!("w{i}");
        let t = Instant::now();
        net.claim(&o, &Policy::deny_all()).expect("claim");
        claim.push(t.elapsed().as_secs_f64() * 1000.0);
        let t = Instant::now();
        net.set_policy(&o, &open).expect("update");
        update.push(t.elapsed().as_secs_f64() * 1000.0);
        let t = Instant::now();
        net.release(&o);
        release.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    net.shutdown();
    for (name, v) in [
        ("make slot (cold claim)", &mut make),
        ("claim ready slot", &mut claim),
        ("policy update", &mut update),
        ("release (scrub)", &mut release),
    ] {
        println!(
            "{name:<24} n={} slots={n} p50={:.2} ms p99={:.2} ms",
            v.len(),
            pct(v, 0.5),
            pct(v, 0.99)
        );
    }
}
