//! One contract, two backends: the same suite against SQLite and against a
//! PostgreSQL this test starts itself (it fails if it cannot).

#[path = "support/pg_server.rs"]
mod pg_server;

use hatchery_store::{conformance, PgStore, SqliteStore, Store};
use std::sync::Arc;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_on_sqlite() {
    let dir = std::env::temp_dir().join(format!("hx-store-conf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let s: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.join("state.db")).unwrap());
    conformance::run_all(s).await;
    std::fs::remove_dir_all(dir).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_on_postgres() {
    let pg = pg_server::TestPg::start();
    let s: Arc<dyn Store> = Arc::new(PgStore::connect(&pg.dsn, 8).await.unwrap());
    assert_eq!(s.backend(), "postgres");
    conformance::run_all(s).await;
}

/// Two daemons starting at once against one database both migrate safely,
/// and a migration run twice is a no-op.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_migrations_race_and_repeat() {
    let pg = pg_server::TestPg::start();
    let (a, b) = tokio::join!(PgStore::connect(&pg.dsn, 2), PgStore::connect(&pg.dsn, 2));
    let (a, b) = (a.unwrap(), b.unwrap());
    let v = a.schema_version().await.unwrap();
    assert_eq!(v, b.schema_version().await.unwrap());
    let c = PgStore::connect(&pg.dsn, 2).await.unwrap();
    assert_eq!(c.schema_version().await.unwrap(), v);
    assert!(v >= 1);
}

/// A database that is not there is a clear, retryable error, not a hang.
#[tokio::test]
async fn postgres_down_is_unavailable() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port(); // dropped: nothing listens there
    let started = std::time::Instant::now();
    let e = PgStore::connect(&format!("postgres://postgres@127.0.0.1:{port}/x"), 2)
        .await
        .err()
        .expect("connected to nothing");
    assert!(e.is_unavailable(), "{e}");
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
}

/// Snapshot rows written before the location column existed become
/// `local:<their writer>` (the migration that adds it; it and the two
/// after it, hosts' warm templates and the deployment's secrets, are the
/// newest, so reverting all three by hand here and reconnecting runs
/// exactly them again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_location_migration_keeps_old_snapshots_local() {
    use hatchery_store::SnapshotLocation;
    let pg = pg_server::TestPg::start();
    let s = PgStore::connect(&pg.dsn, 2).await.unwrap();
    let v = s.schema_version().await.unwrap();
    drop(s);
    let (c, conn) = tokio_postgres::connect(&pg.dsn, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    c.batch_execute(&format!(
        "DROP INDEX snapshots_location;
         ALTER TABLE snapshots DROP COLUMN location;
         ALTER TABLE hosts DROP COLUMN warm_templates;
         DROP TABLE deployment_secrets;
         DELETE FROM hatchery_schema WHERE version >= {v} - 2;
         INSERT INTO snapshots (id, sandbox_id, template, created_at_ms, expires_at_ms, size_bytes, metadata, env, rootfs, limits, host_id)
         VALUES ('snap_old', 'sbx_old', 't', 1, 2, 3, '{{}}', '{{}}', '/r', '{{}}', 'old-host');"
    ))
    .await
    .unwrap();
    let s = PgStore::connect(&pg.dsn, 2).await.unwrap();
    assert_eq!(s.schema_version().await.unwrap(), v);
    let row = s.get_snapshot("snap_old").await.unwrap().unwrap();
    assert_eq!(
        row.location,
        SnapshotLocation::Local {
            host: "old-host".into()
        }
    );
    assert_eq!(
        s.expired_snapshots("old-host", 10).await.unwrap(),
        vec!["snap_old".to_string()]
    );
}
