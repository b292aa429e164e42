//! Upgrade in place: the previous release kept budgets, reservations,
//! settlements, keys and sandbox bindings in a SQLite file of their own
//! (DATA_DIR/gateway.db in the daemon, `--db` for the standalone
//! gateway), in unprefixed tables. Both ways in find every row through
//! the store.

use hatchery_db::{args, Db, Imported};
use hatchery_gateway::budget::{Amount, BudgetStore, Caller, KeyStore};
use hatchery_gateway::store::{schema, GatewayStore};

/// The previous release's schema: its three SQLite migrations, verbatim
/// (crates/hatchery-gateway/src/budget.rs before issue 32).
const OLD_SCHEMA: &str = "CREATE TABLE budgets (
        scope TEXT PRIMARY KEY,
        limit_tokens INTEGER,
        limit_usd_cents INTEGER,
        used_tokens INTEGER NOT NULL DEFAULT 0,
        used_usd_cents INTEGER NOT NULL DEFAULT 0
     );
     CREATE TABLE reservations (
        id TEXT NOT NULL,
        scope TEXT NOT NULL,
        tokens INTEGER NOT NULL,
        usd_cents INTEGER NOT NULL,
        expires_ms INTEGER NOT NULL,
        PRIMARY KEY (id, scope)
     );
     CREATE INDEX reservations_scope ON reservations(scope);
     CREATE INDEX reservations_expiry ON reservations(expires_ms);
     CREATE TABLE settlements (id TEXT PRIMARY KEY, tokens INTEGER NOT NULL, usd_cents INTEGER NOT NULL);
     CREATE TABLE keys (
        hash TEXT PRIMARY KEY,
        session TEXT NOT NULL,
        tenant TEXT,
        expires_ms INTEGER NOT NULL
     );
     CREATE TABLE sandbox_bindings (
        sandbox TEXT PRIMARY KEY,
        session TEXT NOT NULL,
        tenant TEXT
     );
     PRAGMA user_version = 3;";

const OLD_ROWS: &[&str] = &[
    "INSERT INTO budgets VALUES ('session:s1', 1000, 50, 300, 7)",
    "INSERT INTO budgets VALUES ('tenant:t1', NULL, NULL, 42, 2)",
    "INSERT INTO reservations VALUES ('call_1', 'session:s1', 100, 1, 9999999999999)",
    "INSERT INTO settlements VALUES ('call_0', 300, 7)",
    "INSERT INTO keys VALUES ('hash_1', 's1', 't1', 9999999999999)",
    "INSERT INTO sandbox_bindings VALUES ('sbx_1', 's1', NULL)",
];

async fn old_file(path: &std::path::Path) {
    let old = Db::sqlite(path).await.unwrap();
    let mut tx = old.begin().await.unwrap();
    tx.batch(OLD_SCHEMA).await.unwrap();
    for r in OLD_ROWS {
        tx.execute(r, args![]).await.unwrap();
    }
    tx.commit().await.unwrap();
}

/// Every old row, through the store's API.
async fn finds_every_row(s: &GatewayStore) {
    let b = s.get("session:s1").await.unwrap();
    assert_eq!((b.limit_tokens, b.limit_usd_cents), (Some(1000), Some(50)));
    assert_eq!((b.used_tokens, b.used_usd_cents), (300, 7));
    assert_eq!((b.reserved_tokens, b.reserved_usd_cents), (100, 1));
    let t = s.get("tenant:t1").await.unwrap();
    assert_eq!(
        (t.limit_tokens, t.used_tokens, t.used_usd_cents),
        (None, 42, 2)
    );
    let c = Caller {
        session: "s1".into(),
        tenant: Some("t1".into()),
    };
    assert_eq!(s.caller("hash_1", 0).await.unwrap(), Some(c));
    let bound = s.caller_of_sandbox("sbx_1").await.unwrap().unwrap();
    assert_eq!((bound.session.as_str(), bound.tenant), ("s1", None));
    // The settled call stays settled (a retry records nothing), the live
    // reservation settles once.
    let a = Amount {
        tokens: 300,
        usd_cents: 7,
    };
    let scopes = ["session:s1".to_string()];
    assert!(!s.settle("call_0", &scopes, a).await.unwrap());
    assert!(s.settle("call_1", &scopes, a).await.unwrap());
    let b = s.get("session:s1").await.unwrap();
    assert_eq!((b.used_tokens, b.reserved_tokens), (600, 0));
}

fn temp_dir() -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!(
        "hx-gw-import-{}-{}",
        std::process::id(),
        rand::random::<u64>()
    ));
    std::fs::create_dir_all(&p).unwrap();
    p
}

#[tokio::test]
async fn a_previous_release_gateway_db_is_imported_once() {
    let dir = temp_dir();
    old_file(&dir.join("gateway.db")).await;
    let db = Db::sqlite(&dir.join("hatchery.db")).await.unwrap();
    let s = GatewayStore::open(db.clone()).await.unwrap();
    assert_eq!(
        db.import_sqlite(&dir, &schema::IMPORT).await.unwrap(),
        Imported::Now
    );
    finds_every_row(&s).await;
    assert_eq!(
        db.import_sqlite(&dir, &schema::IMPORT).await.unwrap(),
        Imported::Before
    );
    assert_eq!(s.get("session:s1").await.unwrap().used_tokens, 600);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The standalone gateway given the old file itself as `--db`.
#[tokio::test]
async fn a_previous_release_file_as_db_keeps_its_rows() {
    let dir = temp_dir();
    let path = dir.join("gateway.db");
    old_file(&path).await;
    let db = Db::sqlite(&path).await.unwrap();
    let s = GatewayStore::open(db.clone()).await.unwrap();
    assert!(schema::adopt_old_tables(&db).await.unwrap());
    finds_every_row(&s).await;
    // The old tables are gone: a second start adopts nothing.
    let s = GatewayStore::open(db.clone()).await.unwrap();
    assert!(!schema::adopt_old_tables(&db).await.unwrap());
    assert_eq!(s.get("session:s1").await.unwrap().used_tokens, 600);
    let _ = std::fs::remove_dir_all(&dir);
}

#[path = "../../hatchery-store/tests/support/pg_server.rs"]
mod pg_server;

/// The previous release's PostgreSQL schema (budget_pg.rs before issue
/// 32): the same tables, unprefixed, BIGINT.
const OLD_PG_SCHEMA: &str = "CREATE TABLE budgets (
        scope TEXT PRIMARY KEY,
        limit_tokens BIGINT,
        limit_usd_cents BIGINT,
        used_tokens BIGINT NOT NULL DEFAULT 0,
        used_usd_cents BIGINT NOT NULL DEFAULT 0
     );
     CREATE TABLE reservations (
        id TEXT NOT NULL,
        scope TEXT NOT NULL,
        tokens BIGINT NOT NULL,
        usd_cents BIGINT NOT NULL,
        expires_ms BIGINT NOT NULL,
        PRIMARY KEY (id, scope)
     );
     CREATE INDEX reservations_scope ON reservations(scope);
     CREATE INDEX reservations_expiry ON reservations(expires_ms);
     CREATE TABLE settlements (id TEXT PRIMARY KEY, tokens BIGINT NOT NULL, usd_cents BIGINT NOT NULL);
     CREATE TABLE keys (
        hash TEXT PRIMARY KEY,
        session TEXT NOT NULL,
        tenant TEXT,
        expires_ms BIGINT NOT NULL
     );
     CREATE TABLE sandbox_bindings (
        sandbox TEXT PRIMARY KEY,
        session TEXT NOT NULL,
        tenant TEXT
     );";

/// A shared PostgreSQL database of the previous release: its tables are
/// renamed in place by the first migration and keep every row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previous_release_tables_are_renamed_conformance_on_postgres() {
    let pg = pg_server::TestPg::start();
    let db = Db::postgres(&hatchery_db::scratch_schema(&pg.dsn).await.unwrap(), 4).unwrap();
    let mut tx = db.begin().await.unwrap();
    tx.batch(OLD_PG_SCHEMA).await.unwrap();
    for r in OLD_ROWS {
        tx.execute(r, args![]).await.unwrap();
    }
    tx.commit().await.unwrap();
    let s = GatewayStore::open(db.clone()).await.unwrap();
    finds_every_row(&s).await;
    assert!(db
        .query_opt(
            "SELECT tablename FROM pg_tables
             WHERE schemaname = current_schema() AND tablename = 'budgets'",
            args![]
        )
        .await
        .unwrap()
        .is_none());
    // The renamed index serves the renamed table; nothing was made twice.
    let n: i64 = db
        .query_opt(
            "SELECT count(*) FROM pg_indexes
             WHERE schemaname = current_schema() AND tablename = 'gateway_reservations'",
            args![],
        )
        .await
        .unwrap()
        .unwrap()
        .get(0)
        .unwrap();
    assert_eq!(n, 3, "primary key, scope and expiry");
}
