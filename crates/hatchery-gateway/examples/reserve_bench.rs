//! `make bench`: reserve + settle on the budget store, one scope and two
//! scopes (session + tenant, as a tenant's session's calls), N=500 each:
//! on a SQLite file (hatchery-db), and on PostgreSQL when
//! `HATCHERY_TEST_PG_DSN` names one (`python3 tests/pg/pg.py --
//! target/release/examples/reserve_bench` starts a private one; each run
//! gets a scratch schema of its own).

use hatchery_gateway::budget::{Amount, BudgetStore};
use hatchery_gateway::store::GatewayStore;
use std::time::Instant;

const N: usize = 500;

fn pct(xs: &mut [f64], p: f64) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    xs[((xs.len() - 1) as f64 * p / 100.0).round() as usize]
}

async fn run(name: &str, db: hatchery_db::Db) {
    let s = GatewayStore::open(db).await.unwrap();
    s.set_limits("session:s", Some(u64::MAX / 4), None)
        .await
        .unwrap();
    s.set_limits("tenant:t", Some(u64::MAX / 4), None)
        .await
        .unwrap();
    println!("\nBudget store ({name}), N={N}\n");
    println!("| operation | p50 ms | p99 ms |\n|---|---|---|");
    for scopes in [
        vec!["session:s".to_string()],
        vec!["session:s".into(), "tenant:t".into()],
    ] {
        let (mut r, mut st, mut both) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..N {
            let id = format!("r{}-{i}", scopes.len());
            let a = Amount {
                tokens: 100,
                usd_cents: 1,
            };
            let t = Instant::now();
            s.reserve(&id, &scopes, a, 0, 60_000).await.unwrap();
            let reserved = t.elapsed().as_secs_f64() * 1000.0;
            let t2 = Instant::now();
            s.settle(&id, &scopes, a).await.unwrap();
            st.push(t2.elapsed().as_secs_f64() * 1000.0);
            r.push(reserved);
            both.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        let n = scopes.len();
        for (what, xs) in [
            ("reserve", &mut r),
            ("settle", &mut st),
            ("reserve + settle", &mut both),
        ] {
            println!(
                "| {what}, {n} scope(s) | {:.3} | {:.3} |",
                pct(xs, 50.0),
                pct(xs, 99.0)
            );
        }
    }
}

#[tokio::main]
async fn main() {
    let dir = std::env::temp_dir().join(format!("hx-reserve-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = hatchery_db::Db::sqlite(&dir.join("b.db")).await.unwrap();
    run("SQLite, WAL", db).await;
    let _ = std::fs::remove_dir_all(&dir);
    match std::env::var("HATCHERY_TEST_PG_DSN") {
        Ok(dsn) if !dsn.is_empty() => {
            let scratch = hatchery_db::scratch_schema(&dsn).await.unwrap();
            let db = hatchery_db::Db::open(&scratch).await.unwrap();
            run("PostgreSQL, loopback", db).await;
        }
        _ => println!(
            "\n(PostgreSQL: not run; set HATCHERY_TEST_PG_DSN, or run under tests/pg/pg.py)"
        ),
    }
}
