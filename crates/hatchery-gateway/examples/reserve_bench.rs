//! `make bench`: reserve + settle on the budget store on a SQLite file
//! (hatchery-db), one scope and two scopes, N=500 each.

use hatchery_gateway::budget::{Amount, BudgetStore};
use hatchery_gateway::store::GatewayStore;
use std::time::Instant;

fn pct(xs: &mut [f64], p: f64) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    xs[((xs.len() - 1) as f64 * p / 100.0).round() as usize]
}

#[tokio::main]
async fn main() {
    let dir = std::env::temp_dir().join(format!("hx-reserve-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = hatchery_db::Db::sqlite(&dir.join("b.db")).await.unwrap();
    let s = GatewayStore::open(db).await.unwrap();
    s.set_limits("session:s", Some(u64::MAX / 4), None)
        .await
        .unwrap();
    s.set_limits("tenant:t", Some(u64::MAX / 4), None)
        .await
        .unwrap();
    println!("\nBudget store (SQLite), N=500\n");
    println!("| operation | p50 ms | p99 ms |\n|---|---|---|");
    for scopes in [
        vec!["session:s".to_string()],
        vec!["session:s".into(), "tenant:t".into()],
    ] {
        let (mut r, mut st) = (Vec::new(), Vec::new());
        for i in 0..500 {
            let id = format!("r{}-{i}", scopes.len());
            let a = Amount {
                tokens: 100,
                usd_cents: 1,
            };
            let t = Instant::now();
            s.reserve(&id, &scopes, a, 0, 60_000).await.unwrap();
            r.push(t.elapsed().as_secs_f64() * 1000.0);
            let t = Instant::now();
            s.settle(&id, &scopes, a).await.unwrap();
            st.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        println!(
            "| reserve, {} scope(s) | {:.3} | {:.3} |",
            scopes.len(),
            pct(&mut r, 50.0),
            pct(&mut r, 99.0)
        );
        println!(
            "| settle, {} scope(s) | {:.3} | {:.3} |",
            scopes.len(),
            pct(&mut st, 50.0),
            pct(&mut st, 99.0)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
