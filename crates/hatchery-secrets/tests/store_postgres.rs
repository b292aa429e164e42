//! The secrets table on PostgreSQL, against a server this test starts
//! itself (it fails, never skips, if it cannot; `HATCHERY_TEST_PG_DSN`
//! names an existing database instead): migration 2 keeps the rows step 1
//! stored as the operator's, and each owner's names are its own.

#[path = "../../hatchery-store/tests/support/pg_server.rs"]
mod pg_server;

use hatchery_db::Db;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owners_and_the_migration_on_postgres() {
    let pg = pg_server::TestPg::start();
    let dsn = hatchery_db::scratch_schema(&pg.dsn).await.unwrap();
    let db = Db::postgres(&dsn, 2).unwrap();
    hatchery_secrets::conformance::owners_and_the_migration(db).await;
}
