//! Session event append latency, PostgreSQL vs SQLite (the baseline) in
//! the same run: one fenced, hash-chained `append` of a command_run event
//! per call, one writer, and the same with 8 writers on 8 sessions at once.
//! PostgreSQL is a private server this starts (as the tests do), on
//! loopback, fsync on; SQLite is the one database's file (WAL +
//! synchronous=FULL), as the daemon runs it. Bounded: 2,000 appends
//! single, 8 x 250 concurrent per backend.
//!
//!   cargo run --release -p hatchery-sessions --example session_store_bench

#[path = "../../hatchery-store/tests/support/pg_server.rs"]
#[allow(dead_code)]
mod pg_server;

use hatchery_db::Db;
use hatchery_sessions::events::{Actor, EventKind};
use hatchery_sessions::store::{conformance::spec, DbSessionStore, Patch, SessionStore};
use std::sync::Arc;
use std::time::Instant;

const APPENDS: usize = 2000;
const WRITERS: usize = 8;
const PER_WRITER: usize = 250;

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn event(n: usize) -> (Actor, EventKind) {
    (
        Actor::Agent,
        EventKind::CommandRun {
            call_id: format!("c{n}"),
            command: "python3 -m unittest -v".into(),
            exit_code: 0,
            duration_ms: 12,
            output: "ok ".repeat(40),
            output_ref: None,
            truncated: false,
        },
    )
}

async fn appends(s: &Arc<dyn SessionStore>, id: &str, n: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(n);
    for k in 0..n {
        let t = Instant::now();
        s.append(id, vec![event(k)], Patch::default())
            .await
            .unwrap();
        out.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    out
}

/// (single p50, p99, concurrent p50, p99), ms.
async fn measure(s: Arc<dyn SessionStore>) -> [f64; 4] {
    let run = format!("{:08x}", rand::random::<u32>());
    let id = format!("ses_bench{run}");
    s.create(&id, &spec("git://127.0.0.1/b.git"), None, "h")
        .await
        .unwrap();
    appends(&s, &id, 50).await; // warm
    let mut one = appends(&s, &id, APPENDS).await;
    let mut tasks = vec![];
    for w in 0..WRITERS {
        let s = s.clone();
        let id = format!("ses_bench{run}w{w}");
        s.create(&id, &spec("git://127.0.0.1/b.git"), None, "h")
            .await
            .unwrap();
        tasks.push(tokio::spawn(
            async move { appends(&s, &id, PER_WRITER).await },
        ));
    }
    let mut many = vec![];
    for t in tasks {
        many.extend(t.await.unwrap());
    }
    [
        pct(&mut one, 0.5),
        pct(&mut one, 0.99),
        pct(&mut many, 0.5),
        pct(&mut many, 0.99),
    ]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::sqlite(&dir.path().join("hatchery.db")).await.unwrap();
    let sqlite = measure(Arc::new(DbSessionStore::open(db, "bench").await.unwrap())).await;
    let pg = pg_server::TestPg::start_with(true);
    let db = Db::postgres(&pg.dsn, 16).unwrap();
    let store = DbSessionStore::open(db, "bench").await.unwrap();
    let postgres = measure(Arc::new(store)).await;
    println!("session event append (ms)        p50     p99   ({APPENDS} single, {WRITERS}x{PER_WRITER} concurrent)");
    for (name, f) in [("sqlite", sqlite), ("postgres", postgres)] {
        println!(
            "  {name:<9} single   {:>7.3} {:>7.3}\n  {name:<9} {WRITERS} writers {:>7.3} {:>7.3}",
            f[0], f[1], f[2], f[3]
        );
    }
    println!(
        "  postgres / sqlite, single p50: {:.2}x; {WRITERS} writers p50: {:.2}x",
        postgres[0] / sqlite[0],
        postgres[2] / sqlite[2]
    );
}
