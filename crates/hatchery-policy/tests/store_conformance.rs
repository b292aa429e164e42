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
use hatchery_policy::{DbPolicyStore, PolicyStore, StoreError};
use std::sync::Arc;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_on_postgres() {
    let pg = pg_server::TestPg::start();
    // Two daemons starting at once on an empty database: one schema, one
    // built-in policy.
    let (a, b) = tokio::join!(
        DbPolicyStore::open(Db::postgres(&pg.dsn, 4).unwrap()),
        DbPolicyStore::open(Db::postgres(&pg.dsn, 4).unwrap())
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.schema_version().await.unwrap(), 1);
    let id = conformance::versions(&a).await;
    conformance::concurrent_versions(Arc::new(a.clone())).await;

    // What one host wrote, another reads, version for version.
    let on_b = b.version(&id, 1).await.unwrap();
    assert_eq!(on_b.sha256, a.version(&id, 1).await.unwrap().sha256);
    assert_eq!(b.latest(&id).await.unwrap().version, 2);
    let standard = b
        .list()
        .await
        .unwrap()
        .into_iter()
        .filter(|p| p.builtin)
        .count();
    assert_eq!(standard, 1, "one built-in policy, however many daemons");

    // A migration run twice is a no-op.
    let again = DbPolicyStore::open(Db::postgres(&pg.dsn, 1).unwrap())
        .await
        .unwrap();
    assert_eq!(again.schema_version().await.unwrap(), 1);
    assert_eq!(again.latest(&id).await.unwrap().version, 2);

    let db = Db::postgres(&pg.dsn, 1).unwrap();
    conformance::versions_are_immutable(&db, &id).await;
    assert_eq!(b.version(&id, 1).await.unwrap().sha256, on_b.sha256);

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
