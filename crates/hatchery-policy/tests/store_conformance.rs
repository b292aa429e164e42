//! The policy store's contract on PostgreSQL, against a server this test
//! starts itself (it fails, never skips, if it cannot;
//! `HATCHERY_TEST_PG_DSN` names an existing database instead). Also: the
//! database refuses to change a written version, a second daemon's store on
//! the same database sees the first one's policies and runs no migration
//! twice, and a server that is gone is `Unavailable` (503), not a hang.

#[path = "../../hatchery-store/tests/support/pg_server.rs"]
mod pg_server;

use hatchery_db::Db;
use hatchery_policy::store::conformance;
use hatchery_policy::{PolicyStore, StoreError};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_on_postgres() {
    let pg = pg_server::TestPg::start();
    let (b, id) = conformance::run_all(async || Db::postgres(&pg.dsn, 4).unwrap()).await;
    // A store whose server is gone answers Unavailable, quickly.
    if std::env::var("HATCHERY_TEST_PG_DSN").is_err() {
        drop(pg); // stops the private server (immediate) and removes it
        let t = std::time::Instant::now();
        match b.latest(&id).await {
            Err(StoreError::Unavailable(_)) => {}
            other => panic!("expected Unavailable, got {other:?}"),
        }
        assert!(t.elapsed() < std::time::Duration::from_secs(15));
    }
}
