//! Figures for the hash chain over session events: event append p50/p99
//! with the chain, the part of it that is hashing (the overhead), and
//! `verify` throughput over a 10,000-event session.
//! `cargo run --release -p hatchery-sessions --example chain_bench`

use hatchery_db::Db;
use hatchery_sessions::events::{Actor, EventKind};
use hatchery_sessions::store::{AgentSpec, DbSessionStore, Patch, SessionSpec, SessionStore};
use std::time::Instant;

const N: usize = 10_000;

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

#[tokio::main]
async fn main() {
    let d = tempfile::tempdir().unwrap();
    let db = Db::sqlite(&d.path().join("hatchery.db")).await.unwrap();
    let s = DbSessionStore::open(db.clone(), "local").await.unwrap();
    let spec = SessionSpec {
        repo: "https://git.example/a.git".into(),
        git_ref: "main".into(),
        task: "t".into(),
        policy_id: "pol_standard".into(),
        policy_version: 1,
        budget_tokens: 1,
        budget_usd_cents: 0,
        budget_wall_s: 1,
        template: "code-interpreter".into(),
        agent: AgentSpec {
            kind: "reference".into(),
            model_url: "http://127.0.0.1:9100/v1".into(),
            model: "m".into(),
            max_steps: 1,
            command: None,
        },
        env: Default::default(),
        metadata: Default::default(),
        environment: None,
        tenant: None,
    };
    s.create("ses_bench", &spec, None, "h").await.unwrap();
    let mut append = Vec::with_capacity(N);
    for i in 0..N - 1 {
        let t = Instant::now();
        s.append(
            "ses_bench",
            vec![(
                Actor::Agent,
                EventKind::CommandRun {
                    call_id: format!("c{i}"),
                    command: "python3 -m unittest -v".into(),
                    exit_code: 0,
                    duration_ms: 12,
                    output: "ok ".repeat(40),
                    output_ref: None,
                    truncated: false,
                },
            )],
            Patch::default(),
        )
        .await
        .unwrap();
        append.push(t.elapsed().as_secs_f64() * 1e6);
    }
    // The hashing part of an append: canonical JSON and SHA-256 of a
    // comparable event (what the chain adds to each transaction, besides
    // one indexed read of the previous hash).
    let mut hashing = Vec::with_capacity(N);
    for i in 0..N {
        let ev = hatchery_audit::Event {
            chain: "ses_bench".into(),
            seq: i as u64 + 2,
            ts: "2026-12-01T00:00:00.000Z".into(),
            kind: "command_run".into(),
            data: serde_json::json!({"type": "command_run", "actor": "agent", "call_id": format!("c{i}"),
                "command": "python3 -m unittest -v", "exit_code": 0, "duration_ms": 12,
                "output": "ok ".repeat(40), "truncated": false}),
        };
        let t = Instant::now();
        std::hint::black_box(ev.hash(&hatchery_audit::GENESIS).unwrap());
        hashing.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let log = hatchery_sessions_schema::AuditReader::on(db).await.unwrap();
    let mut verify = vec![];
    for _ in 0..5 {
        let t = Instant::now();
        let r = log.verify("ses_bench", &[]).await.unwrap();
        assert!(r.ok() && r.verified == N as u64, "{r:?}");
        verify.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let (a50, a99) = (pct(&mut append.clone(), 0.5), pct(&mut append, 0.99));
    let (h50, h99) = (pct(&mut hashing.clone(), 0.5), pct(&mut hashing, 0.99));
    let v50 = pct(&mut verify, 0.5);
    println!("session event append (chained, SQLite WAL, synchronous=FULL): p50 {a50:.1} µs, p99 {a99:.1} µs");
    println!("  of which hashing (canonical JSON + SHA-256): p50 {h50:.1} µs, p99 {h99:.1} µs = {:.1}% of the append p50", 100.0 * h50 / a50);
    println!(
        "verify {N} events (hatchery audit verify's path): p50 {v50:.1} ms = {:.0} events/s",
        N as f64 / (v50 / 1e3)
    );
}
