//! One contract, one store, two databases: the same suite against a
//! SQLite file and against a PostgreSQL this test starts itself (it fails
//! if it cannot). Also: migrations racing and repeating, a server that is
//! not there, and a database of the previous release upgraded in place.

#[path = "support/pg_server.rs"]
mod pg_server;

use hatchery_db::Db;
use hatchery_store::{conformance, DbStore, Store};
use std::sync::Arc;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::sqlite(&dir.path().join("hatchery.db")).await.unwrap();
    let s: Arc<dyn Store> = Arc::new(DbStore::open(db).await.unwrap());
    assert_eq!(s.backend(), "sqlite");
    conformance::run_all(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_on_postgres() {
    let pg = pg_server::TestPg::start();
    let s = DbStore::open(Db::postgres(&pg.dsn, 8).unwrap()).await;
    let s: Arc<dyn Store> = Arc::new(s.unwrap());
    assert_eq!(s.backend(), "postgres");
    conformance::run_all(s).await;
}

/// Two daemons starting at once against one database both migrate safely,
/// and a migration run twice is a no-op.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrations_race_and_repeat_conformance_on_postgres() {
    let pg = pg_server::TestPg::start();
    let open = || DbStore::open(Db::postgres(&pg.dsn, 2).unwrap());
    let (a, b) = tokio::join!(open(), open());
    let (a, b) = (a.unwrap(), b.unwrap());
    let v = a.schema_version().await.unwrap();
    assert_eq!(v, b.schema_version().await.unwrap());
    let c = open().await.unwrap();
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
    let db = Db::postgres(&format!("postgres://postgres@127.0.0.1:{port}/x"), 2).unwrap();
    let e = DbStore::open(db).await.err().expect("connected to nothing");
    assert!(e.is_unavailable(), "{e}");
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
}

/// A PostgreSQL database of the previous release (the old store's final
/// schema: unprefixed tables, its own record table) is upgraded in place:
/// renamed, rows kept, readable through the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previous_release_upgrades_in_place_conformance_on_postgres() {
    use hatchery_store::SnapshotLocation;
    let pg = pg_server::TestPg::start();
    // A schema of its own: a shared test database holds the core's tables.
    let dsn = hatchery_db::scratch_schema(&pg.dsn).await.unwrap();
    let old = Db::postgres(&dsn, 1).unwrap();
    let mut tx = old.begin().await.unwrap();
    tx.batch(OLD_PG_SCHEMA).await.unwrap();
    tx.batch(
        "INSERT INTO sandboxes (id, template, state, created_at_ms, expires_at_ms, metadata, env, host_id)
           VALUES ('sbx_old', 'python', 'running', 1, 4102444800000, '{\"team\": \"a\"}', '{}', 'h1');
         INSERT INTO events (sandbox_id, at_ms, kind, detail, epoch) VALUES ('sbx_old', 1, 'created', 'python', 3);
         INSERT INTO snapshots (id, sandbox_id, template, created_at_ms, expires_at_ms, size_bytes, metadata, env, rootfs, limits, host_id, location)
           VALUES ('snap_old', 'sbx_old', 'python', 1, 2, 3, '{}', '{}', '/r', '{}', 'h1', 'local:h1');
         INSERT INTO hosts (id, address, capacity, epoch, registered_at_ms, heartbeat_at_ms) VALUES ('h1', '127.0.0.1:1', 8, 3, 1, 1);
         INSERT INTO leases VALUES ('host:h1', 'h1', 3, 0);
         INSERT INTO deployment_secrets VALUES ('daemon_key', 'k');",
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let s = DbStore::open(Db::postgres(&dsn, 2).unwrap()).await.unwrap();
    let mut filter = hatchery_store::SandboxFilter::default();
    filter.metadata.insert("team".into(), "a".into());
    let live = s.list_live(&filter).await.unwrap();
    assert_eq!(live.len(), 1, "the old row, found by its metadata");
    assert_eq!(s.events("sbx_old").await.unwrap()[0].epoch, 3);
    let snap = s.get_snapshot("snap_old").await.unwrap().unwrap();
    assert_eq!(snap.location, SnapshotLocation::Local { host: "h1".into() });
    assert_eq!(s.list_hosts().await.unwrap()[0].capacity, 8);
    assert_eq!(s.get_lease("host:h1").await.unwrap().unwrap().epoch, 3);
    assert_eq!(s.deployment_secret("daemon_key", "new").await.unwrap(), "k");
    // New writes go on after the old sequence.
    let l = s.take_lease("host:h1", "h1", 10_000).await.unwrap();
    assert_eq!(l.epoch, 4);
}

/// The old PostgreSQL store's schema after its five migrations.
const OLD_PG_SCHEMA: &str = "CREATE TABLE sandboxes (
   id TEXT PRIMARY KEY, template TEXT NOT NULL, state TEXT NOT NULL,
   created_at_ms BIGINT NOT NULL, expires_at_ms BIGINT NOT NULL, ended_at_ms BIGINT,
   end_reason TEXT, metadata JSONB NOT NULL, env JSONB NOT NULL, host_id TEXT NOT NULL);
 CREATE INDEX sandboxes_state ON sandboxes(state, expires_at_ms);
 CREATE INDEX sandboxes_host ON sandboxes(host_id, state, expires_at_ms);
 CREATE INDEX sandboxes_metadata ON sandboxes USING GIN (metadata jsonb_path_ops);
 CREATE TABLE events (
   seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, sandbox_id TEXT NOT NULL,
   at_ms BIGINT NOT NULL, kind TEXT NOT NULL, detail TEXT NOT NULL, epoch BIGINT NOT NULL);
 CREATE INDEX events_sandbox ON events(sandbox_id, seq);
 CREATE TABLE snapshots (
   id TEXT PRIMARY KEY, sandbox_id TEXT NOT NULL, template TEXT NOT NULL,
   created_at_ms BIGINT NOT NULL, expires_at_ms BIGINT NOT NULL, size_bytes BIGINT NOT NULL,
   metadata JSONB NOT NULL, env JSONB NOT NULL, rootfs TEXT NOT NULL, limits TEXT NOT NULL,
   host_id TEXT NOT NULL, location TEXT NOT NULL);
 CREATE INDEX snapshots_host ON snapshots(host_id, expires_at_ms);
 CREATE INDEX snapshots_location ON snapshots(location, expires_at_ms);
 CREATE TABLE sandbox_net (id TEXT PRIMARY KEY, slot INTEGER NOT NULL, policy TEXT NOT NULL, host_id TEXT NOT NULL);
 CREATE TABLE leases (resource TEXT PRIMARY KEY, owner TEXT NOT NULL, epoch BIGINT NOT NULL, expires_at_ms BIGINT NOT NULL);
 CREATE TABLE hosts (id TEXT PRIMARY KEY, address TEXT NOT NULL, capacity INTEGER NOT NULL,
   live INTEGER NOT NULL DEFAULT 0, epoch BIGINT NOT NULL, registered_at_ms BIGINT NOT NULL,
   heartbeat_at_ms BIGINT NOT NULL, warm_templates TEXT NOT NULL DEFAULT '[]');
 CREATE TABLE deployment_secrets (name TEXT PRIMARY KEY, value TEXT NOT NULL);
 CREATE TABLE hatchery_schema (version INT NOT NULL);
 INSERT INTO hatchery_schema VALUES (1), (2), (3), (4), (5);";

/// A single-host data dir of the previous release: its state.db (the old
/// SQLite store's schema after its six migrations) is imported once into
/// the one database, and the daemon's rows read back through the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previous_release_state_db_is_imported() {
    let dir = tempfile::tempdir().unwrap();
    let old = rusqlite::Connection::open(dir.path().join("state.db")).unwrap();
    old.execute_batch(OLD_SQLITE_SCHEMA).unwrap();
    old.execute_batch(
        "INSERT INTO sandboxes VALUES ('sbx_old', 'python', 'running', 1, 4102444800000, NULL, NULL, '{\"team\":\"a\"}', '{}', 'local');
         INSERT INTO events (sandbox_id, at_ms, kind, detail, epoch) VALUES ('sbx_old', 1, 'created', 'python', 2);
         INSERT INTO snapshots VALUES ('snap_old', 'sbx_old', 'python', 1, 2, 3, '{}', '{}', '/r', '{}', 'local', 'local:local');
         INSERT INTO sandbox_net VALUES ('sbx_old', 7, 'deny', 'local');
         INSERT INTO leases VALUES ('host:local', 'local', 2, 0);
         INSERT INTO deployment_secrets VALUES ('daemon_key', 'k');",
    )
    .unwrap();
    drop(old);
    let db = Db::sqlite(&dir.path().join("hatchery.db")).await.unwrap();
    let s = DbStore::open(db.clone()).await.unwrap();
    for once in [hatchery_db::Imported::Now, hatchery_db::Imported::Before] {
        let imported = db.import_sqlite(dir.path(), &hatchery_store::IMPORT);
        assert_eq!(imported.await.unwrap(), once);
    }
    assert_eq!(s.list_unstopped("local").await.unwrap().len(), 1);
    assert_eq!(s.events("sbx_old").await.unwrap().len(), 1);
    assert!(s.get_snapshot("snap_old").await.unwrap().is_some());
    assert_eq!(s.all_net("local").await.unwrap()[0].slot, 7);
    assert_eq!(s.deployment_secret("daemon_key", "new").await.unwrap(), "k");
    // The restarted host fences off its previous incarnation.
    let lease = s.take_lease("host:local", "local", 1000).await.unwrap();
    assert_eq!(lease.epoch, 3);
}

/// The old SQLite store's schema after its six migrations.
const OLD_SQLITE_SCHEMA: &str = "CREATE TABLE sandboxes (id TEXT PRIMARY KEY, template TEXT NOT NULL,
   state TEXT NOT NULL, created_at_ms INTEGER NOT NULL, expires_at_ms INTEGER NOT NULL,
   ended_at_ms INTEGER, end_reason TEXT, metadata TEXT NOT NULL, env TEXT NOT NULL,
   host_id TEXT NOT NULL DEFAULT 'local');
 CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, sandbox_id TEXT NOT NULL,
   at_ms INTEGER NOT NULL, kind TEXT NOT NULL, detail TEXT NOT NULL, epoch INTEGER NOT NULL DEFAULT 0);
 CREATE TABLE snapshots (id TEXT PRIMARY KEY, sandbox_id TEXT NOT NULL, template TEXT NOT NULL,
   created_at_ms INTEGER NOT NULL, expires_at_ms INTEGER NOT NULL, size_bytes INTEGER NOT NULL,
   metadata TEXT NOT NULL, env TEXT NOT NULL, rootfs TEXT NOT NULL, limits TEXT NOT NULL,
   host_id TEXT NOT NULL DEFAULT 'local', location TEXT NOT NULL DEFAULT '');
 CREATE TABLE sandbox_net (id TEXT PRIMARY KEY, slot INTEGER NOT NULL, policy TEXT NOT NULL,
   host_id TEXT NOT NULL DEFAULT 'local');
 CREATE TABLE leases (resource TEXT PRIMARY KEY, owner TEXT NOT NULL, epoch INTEGER NOT NULL,
   expires_at_ms INTEGER NOT NULL);
 CREATE TABLE hosts (id TEXT PRIMARY KEY, address TEXT NOT NULL, capacity INTEGER NOT NULL,
   live INTEGER NOT NULL DEFAULT 0, epoch INTEGER NOT NULL, registered_at_ms INTEGER NOT NULL,
   heartbeat_at_ms INTEGER NOT NULL, warm_templates TEXT NOT NULL DEFAULT '[]');
 CREATE TABLE deployment_secrets (name TEXT PRIMARY KEY, value TEXT NOT NULL);
 PRAGMA user_version = 6;";
