//! The tenant store's contract on PostgreSQL, against a server this test
//! starts itself (it fails, never skips, if it cannot;
//! `HATCHERY_TEST_PG_DSN` names an existing database instead).

#[path = "../../hatchery-store/tests/support/pg_server.rs"]
mod pg_server;

use hatchery_db::Db;
use hatchery_tenants::store::conformance;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_on_postgres() {
    let pg = pg_server::TestPg::start();
    conformance::run_all(async || Db::postgres(&pg.dsn, 4).unwrap()).await;
}
