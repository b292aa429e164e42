//! Policy evaluation figures for `make bench`: a 100-rule policy whose only
//! matching rule is the last (the worst case for first-match), against a
//! 1-rule policy measured in the same run as the baseline.
//! `cargo run --release -p hatchery-policy --example policy_bench -- [N]`

use hatchery_policy::{Destination, Policy, PolicyDocument, Request};
use serde_json::{json, Map, Value};
use std::hint::black_box;
use std::time::Instant;

fn hundred_rules() -> PolicyDocument {
    let mut rules: Vec<Value> = Vec::new();
    // 99 rules that each look at the request and miss, in the shapes real
    // policies use: tool globs, argument comparisons, hosts and ports.
    for i in 0..99 {
        rules.push(match i % 4 {
            0 => json!({"id": format!("tool-{i}"), "effect": "allow",
                        "match": {"tools": [format!("mcp.server{i}.*"), format!("tool_{i}")]}}),
            1 => json!({"id": format!("args-{i}"), "effect": "deny",
                        "match": {"tools": ["git_push"], "args": [
                            {"field": "branch", "op": "eq", "value": format!("release-{i}")},
                            {"field": "diff.lines", "op": "gt", "value": 500}]}}),
            2 => json!({"id": format!("host-{i}"), "effect": "allow",
                        "match": {"tools": ["http_fetch", "egress"],
                                  "hosts": [format!("host{i}.example.com"), format!("*.svc{i}.example.org"), "10.0.0.0/8"],
                                  "ports": [443, "8000-8100"]}}),
            _ => json!({"id": format!("glob-{i}"), "effect": "require_approval",
                        "match": {"tools": ["git_push"], "args": [
                            {"field": "branch", "op": "glob", "value": format!("hotfix-{i}/*")},
                            {"field": "remote", "op": "prefix", "value": "https://"}]}}),
        });
    }
    rules.push(json!({"id": "push-session-branch", "effect": "allow",
        "match": {"tools": ["git_push"], "args": [
            {"field": "branch", "op": "eq", "value": {"ctx": "session_branch"}},
            {"field": "diff.lines", "op": "le", "value": 500}]}}));
    serde_json::from_value(json!({"name": "bench", "rules": rules})).unwrap()
}

fn one_rule() -> PolicyDocument {
    serde_json::from_value(json!({"name": "base", "rules": [
        {"id": "push-session-branch", "effect": "allow",
         "match": {"tools": ["git_push"], "args": [
             {"field": "branch", "op": "eq", "value": {"ctx": "session_branch"}},
             {"field": "diff.lines", "op": "le", "value": 500}]}}]}))
    .unwrap()
}

fn percentiles(mut ns: Vec<u64>) -> (f64, f64) {
    ns.sort_unstable();
    let at = |q: f64| ns[((ns.len() as f64 * q) as usize).min(ns.len() - 1)] as f64 / 1000.0;
    (at(0.50), at(0.99))
}

/// Each sample times a batch of 10 evaluations, so the clock's own cost
/// (tens of ns) stays small against the work; reported per evaluation.
fn measure(p: &Policy, req: &Request<'_>, n: usize) -> (f64, f64) {
    for _ in 0..1000 {
        black_box(p.evaluate(black_box(req)));
    }
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        for _ in 0..10 {
            black_box(p.evaluate(black_box(req)));
        }
        samples.push(t.elapsed().as_nanos() as u64 / 10);
    }
    percentiles(samples)
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20_000);
    let big = Policy::compile(&hundred_rules()).unwrap();
    let base = Policy::compile(&one_rule()).unwrap();
    let mut ctx = Map::new();
    ctx.insert("session_branch".into(), json!("hatchery/ses_1"));
    let args = json!({"branch": "hatchery/ses_1", "remote": "origin", "diff": {"lines": 120}});
    let req = Request {
        tool: "git_push",
        args: &args,
        cost_cents: None,
        dest: None,
        ctx: Some(&ctx),
    };
    assert_eq!(
        big.evaluate(&req).rule_index,
        Some(99),
        "the last rule decides"
    );
    assert_eq!(base.evaluate(&req).rule_index, Some(0));
    let egress = Request {
        tool: "egress",
        args: &Value::Null,
        cost_cents: None,
        dest: Some(Destination {
            host: "pypi.org",
            ip: Some("151.101.0.223".parse().unwrap()),
            port: 443,
        }),
        ctx: Some(&ctx),
    };
    assert_eq!(
        big.evaluate(&egress).rule_index,
        None,
        "egress to pypi: default deny after 100 rules"
    );

    let (b50, b99) = measure(&base, &req, n);
    let (p50, p99) = measure(&big, &req, n);
    let (e50, e99) = measure(&big, &egress, n);
    println!("policy evaluation (hatchery-policy example policy_bench), n={n} samples of 10:");
    println!("  1-rule policy (baseline)          p50={b50:.2} us p99={b99:.2} us");
    println!("  100-rule policy, last rule        p50={p50:.2} us p99={p99:.2} us  ({:.1}x baseline; goal p50 <= 20 us)", p50 / b50.max(0.001));
    println!("  100-rule policy, egress no match  p50={e50:.2} us p99={e99:.2} us");
}
