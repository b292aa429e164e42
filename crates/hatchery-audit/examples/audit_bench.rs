//! Audit figures for `make bench`: append overhead (a sealed, hash-chained
//! append against a plain INSERT of the same row into the same kind of
//! table, measured in the same run) and verify throughput over an
//! untouched chain of N events (default 10,000; goal: under a second).
//! `cargo run --release -p hatchery-audit --example audit_bench -- [N]`

use hatchery_audit::SqliteAuditLog;
use rusqlite::params;
use serde_json::json;
use std::time::Instant;

fn pct(mut v: Vec<f64>, q: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 * q) as usize).min(v.len() - 1)]
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    let dir = std::env::temp_dir().join(format!("hatchery-audit-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("audit.db");
    let mut log = SqliteAuditLog::open(&path).unwrap();
    log.connection()
        .execute_batch("CREATE TABLE plain (chain TEXT, seq INTEGER, ts TEXT, kind TEXT, data TEXT, PRIMARY KEY (chain, seq))")
        .unwrap();
    let data = |i: usize| json!({"tool": "git_push", "seq": i, "args": {"branch": "hatchery/ses_1", "remote": "origin"}, "decision": {"effect": "allow", "rule": "push-session-branch"}});

    let samples = n.min(1000);
    // Interleaved, so both see the same disk and WAL state over the run.
    let mut plain = Vec::with_capacity(samples);
    let mut sealed = Vec::with_capacity(samples);
    for i in 0..samples {
        let d = data(i).to_string();
        let t = Instant::now();
        log.connection()
            .execute(
                "INSERT INTO plain (chain, seq, ts, kind, data) VALUES ('ses_x', ?1, '2026-01-01T00:00:00Z', 'tool_call', ?2)",
                params![i as i64, d],
            )
            .unwrap();
        plain.push(t.elapsed().as_secs_f64() * 1e6);
        let t = Instant::now();
        log.append("ses_1", "tool_call", data(i)).unwrap();
        sealed.push(t.elapsed().as_secs_f64() * 1e6);
    }
    // The rest of the chain for the verify figure, without waiting for a
    // disk flush per event (the timed appends above did wait).
    log.connection()
        .pragma_update(None, "synchronous", "OFF")
        .unwrap();
    for i in samples..n {
        log.append("ses_1", "tool_call", data(i)).unwrap();
    }
    // The CPU part of an append alone: canonical JSON + SHA-256.
    let mut prev = hatchery_audit::GENESIS;
    let mut seal = Vec::with_capacity(n);
    for i in 0..n {
        let ev = hatchery_audit::Event {
            chain: "ses_1".into(),
            seq: i as u64 + 1,
            ts: "2026-01-01T00:00:00Z".into(),
            kind: "tool_call".into(),
            data: data(i),
        };
        let t = Instant::now();
        prev = ev.seal(prev).unwrap().hash;
        seal.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let t = Instant::now();
    let r = log.verify_chain("ses_1", &[]).unwrap();
    let verify_s = t.elapsed().as_secs_f64();
    assert!(r.ok() && r.verified == n as u64, "{r:?}");

    let (p50, p99, b50, b99) = (
        pct(sealed.clone(), 0.5),
        pct(sealed, 0.99),
        pct(plain.clone(), 0.5),
        pct(plain, 0.99),
    );
    println!("audit log (hatchery-audit example audit_bench), SQLite WAL file:");
    println!("  plain INSERT (baseline)  n={samples} p50={b50:.1} us p99={b99:.1} us");
    println!("  chained append           n={samples} p50={p50:.1} us p99={p99:.1} us  (+{:.1} us p50 over baseline)", p50 - b50);
    println!(
        "  seal only (canonical JSON + SHA-256) p50={:.2} us p99={:.2} us",
        pct(seal.clone(), 0.5),
        pct(seal, 0.99)
    );
    println!("  (each append commits on its own; the fsync of the commit dominates both rows)");
    println!(
        "  verify {n} events         {:.3} s ({:.0} events/s; goal < 1 s for 10,000)",
        verify_s,
        n as f64 / verify_s
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
