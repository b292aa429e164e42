//! State-store write latency, PostgreSQL vs SQLite in the same run (the
//! baseline): a fenced event append, and a sandbox row's life (insert +
//! running + stop, three transactions). PostgreSQL is a private server
//! this starts (as for the tests), on loopback, fsync on. Bounded: 2,000
//! appends and 500 row lives per backend.
//!
//!   cargo run --release -p hatchery-store --example store_bench

#[path = "../tests/support/pg_server.rs"]
#[allow(dead_code)]
mod pg_server;

use hatchery_store::{host_resource, DbStore, Fence, SandboxRow, SandboxState, Store};
use std::sync::Arc;
use std::time::Instant;

const APPENDS: usize = 2000;
const ROWS: usize = 500;

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() - 1) as f64 * p).round() as usize]
}

struct Figures {
    append: (f64, f64),
    row: (f64, f64),
}

async fn measure(s: Arc<dyn Store>) -> Figures {
    let host = format!("bench{:x}", rand::random::<u32>());
    let f = Fence::of(
        &s.take_lease(&host_resource(&host), &host, 60_000)
            .await
            .unwrap(),
    );
    let id = format!("sbx_bench{host}");
    for _ in 0..50 {
        s.append_event(&f, &id, "warm", "").await.unwrap();
    }
    let mut ap = Vec::with_capacity(APPENDS);
    for n in 0..APPENDS {
        let t = Instant::now();
        s.append_event(&f, &id, "tick", &n.to_string())
            .await
            .unwrap();
        ap.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let mut rows = Vec::with_capacity(ROWS);
    for n in 0..ROWS {
        let r = SandboxRow {
            id: format!("sbx_b{host}{n}"),
            template: "t".into(),
            state: SandboxState::Starting,
            created_at_ms: 1,
            expires_at_ms: 2,
            metadata: [("k".to_string(), n.to_string())].into(),
            env: Default::default(),
            host_id: String::new(),
            template_version: String::new(),
            rootfs: String::new(),
            limits: String::new(),
        };
        let t = Instant::now();
        s.insert_sandbox(&f, &r).await.unwrap();
        s.transition(&f, &r.id, &[SandboxState::Starting], SandboxState::Running)
            .await
            .unwrap();
        s.stop(&f, &r.id, "deleted", 3).await.unwrap();
        rows.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    Figures {
        append: (pct(&mut ap, 0.5), pct(&mut ap, 0.99)),
        row: (pct(&mut rows, 0.5), pct(&mut rows, 0.99)),
    }
}

#[tokio::main]
async fn main() {
    let dir = std::env::temp_dir().join(format!("hx-store-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = hatchery_db::Db::sqlite(&dir.join("hatchery.db"))
        .await
        .unwrap();
    let sqlite = measure(Arc::new(DbStore::open(db).await.unwrap())).await;
    std::fs::remove_dir_all(&dir).ok();
    let pg = pg_server::TestPg::start_with(true);
    let db = hatchery_db::Db::postgres(&pg.dsn, 4).unwrap();
    let pgf = measure(Arc::new(DbStore::open(db).await.unwrap())).await;
    println!(
        "store_bench: {APPENDS} event appends, {ROWS} row lives (insert+running+stop) per backend"
    );
    for (what, s, p) in [
        ("event append", sqlite.append, pgf.append),
        ("row life (3 tx)", sqlite.row, pgf.row),
    ] {
        println!(
            "  {what:<16} sqlite p50 {:.3} ms p99 {:.3} ms | postgres p50 {:.3} ms p99 {:.3} ms | ratio pg/sqlite p50 {:.2}x",
            s.0,
            s.1,
            p.0,
            p.1,
            p.0 / s.0
        );
    }
}
