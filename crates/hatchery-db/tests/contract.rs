//! The database layer's contract, the same on both backends: a SQLite
//! file, and a PostgreSQL server this test starts itself (it fails, never
//! skips, if it cannot; `HATCHERY_TEST_PG_DSN` names an existing database
//! instead, shared with other suites, hence the prefixed names).

#[path = "../../hatchery-store/tests/support/pg_server.rs"]
mod pg_server;

use hatchery_db::{args, Db, MigrateError, Migrations, Step, Value};
use std::sync::Arc;

static STEPS: &[Step] = &[
    Step::Both(
        "CREATE TABLE dbt_items (
             seq BIGSERIAL PRIMARY KEY,
             name TEXT NOT NULL UNIQUE,
             small INT NOT NULL,
             big BIGINT,
             ratio DOUBLE PRECISION,
             blob BYTEA,
             flag BOOLEAN NOT NULL DEFAULT FALSE
         );
         CREATE TABLE dbt_counter (id TEXT PRIMARY KEY, n BIGINT NOT NULL);",
    ),
    Step::Each {
        sqlite: "CREATE TABLE dbt_doc (id TEXT PRIMARY KEY, body TEXT NOT NULL)",
        postgres: "CREATE TABLE dbt_doc (id TEXT PRIMARY KEY, body JSONB NOT NULL)",
    },
];

static SET: Migrations = Migrations {
    product: "dbt",
    steps: STEPS,
};

async fn contract(db: Db) {
    // A database no daemon has run on has no schema for `check`.
    assert!(matches!(
        SET.check(&db).await,
        Err(MigrateError::Missing { .. })
    ));
    // Two runs at once: one schema, each step recorded once.
    let (a, b) = tokio::join!(db.migrate(&SET), db.migrate(&SET));
    assert_eq!(a.unwrap() + b.unwrap(), 2);
    assert_eq!(db.migrate(&SET).await.unwrap(), 0);
    assert_eq!(SET.check(&db).await.unwrap(), 2);
    // A build that knows fewer steps refuses the newer schema.
    let older = Migrations {
        product: "dbt",
        steps: &STEPS[..1],
    };
    assert!(matches!(
        older.run(&db).await,
        Err(MigrateError::TooNew {
            found: 2,
            known: 1,
            ..
        })
    ));
    // A failing step leaves nothing of its set behind.
    static BAD: &[Step] = &[
        Step::Both("CREATE TABLE dbt_half (x BIGINT)"),
        Step::Both("CREATE TABLE dbt_half (x BIGINT)"),
    ];
    let bad = Migrations {
        product: "dbt_bad",
        steps: BAD,
    };
    assert!(bad.run(&db).await.is_err());
    assert!(matches!(
        bad.check(&db).await,
        Err(MigrateError::Missing { .. })
    ));
    assert!(db.query("SELECT x FROM dbt_half", args![]).await.is_err());

    // Every type goes in and comes back, whatever the column's width.
    let mut tx = db.begin().await.unwrap();
    let seq: i64 = tx
        .query_one(
            "INSERT INTO dbt_items (name, small, big, ratio, blob, flag)
             VALUES ($1, $2, $3, $4, $5, $6) RETURNING seq",
            args!["a", 7u64, Some(1i64 << 40), 0.5, vec![0u8, 255], true],
        )
        .await
        .unwrap()
        .get(0)
        .unwrap();
    let seq2: i64 = tx
        .query_one(
            "INSERT INTO dbt_items (name, small) VALUES ($1, $2) RETURNING seq",
            args!["b", -3],
        )
        .await
        .unwrap()
        .get("seq")
        .unwrap();
    assert!(seq2 > seq);
    tx.commit().await.unwrap();
    let r = db
        .query_opt(
            "SELECT name, small, big, ratio, blob, flag FROM dbt_items WHERE name = $1",
            args!["a"],
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.get::<String>("name").unwrap(), "a");
    assert_eq!(r.get::<u32>("small").unwrap(), 7);
    assert_eq!(r.get::<i64>("big").unwrap(), 1 << 40);
    assert_eq!(r.get::<f64>("ratio").unwrap(), 0.5);
    assert_eq!(r.get::<Vec<u8>>("blob").unwrap(), vec![0, 255]);
    assert!(r.get::<bool>("flag").unwrap());
    let r = db
        .query_opt(
            "SELECT big, blob, flag FROM dbt_items WHERE name = $1",
            args!["b"],
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.get::<Option<i64>>("big").unwrap(), None);
    assert_eq!(r.get::<Option<Vec<u8>>>(1).unwrap(), None);
    assert!(!r.get::<bool>("flag").unwrap());
    // An aggregate reads as an integer on both (CAST around SUM).
    let total: i64 = db
        .query_opt(
            "SELECT CAST(COALESCE(SUM(small), 0) AS BIGINT) FROM dbt_items",
            args![],
        )
        .await
        .unwrap()
        .unwrap()
        .get(0)
        .unwrap();
    assert_eq!(total, 4);
    // A JSON column (JSONB on PostgreSQL) takes and gives text.
    db.execute(
        "INSERT INTO dbt_doc (id, body) VALUES ($1, $2)",
        args!["d", r#"{"k": [1, 2]}"#],
    )
    .await
    .unwrap();
    let body: String = db
        .query_opt("SELECT body FROM dbt_doc WHERE id = $1", args!["d"])
        .await
        .unwrap()
        .unwrap()
        .get(0)
        .unwrap();
    assert_eq!(
        body.replace(' ', ""),
        r#"{"k":[1,2]}"#,
        "the document comes back"
    );

    // A duplicate key is told apart from other errors.
    let dup = db
        .execute(
            "INSERT INTO dbt_items (name, small) VALUES ($1, 1)",
            args!["a"],
        )
        .await
        .unwrap_err();
    assert!(dup.unique_violation(), "{dup}");
    assert!(!dup.unavailable());

    // A transaction dropped without commit writes nothing, and the next
    // writer is not kept waiting by it.
    {
        let mut tx = db.begin().await.unwrap();
        tx.execute(
            "INSERT INTO dbt_items (name, small) VALUES ($1, 1)",
            args!["dropped"],
        )
        .await
        .unwrap();
    }
    let mut tx = db.begin().await.unwrap();
    let n: i64 = tx
        .query_one(
            "SELECT count(*) FROM dbt_items WHERE name = $1",
            args!["dropped"],
        )
        .await
        .unwrap()
        .get(0)
        .unwrap();
    assert_eq!(n, 0);
    tx.rollback().await.unwrap();
    // An error inside a transaction, then dropped: the same.
    {
        let mut tx = db.begin().await.unwrap();
        tx.execute(
            "INSERT INTO dbt_items (name, small) VALUES ($1, 1)",
            args!["c"],
        )
        .await
        .unwrap();
        assert!(tx
            .execute("SELECT nope FROM nowhere", args![])
            .await
            .is_err());
    }
    assert!(db
        .query_opt("SELECT 1 FROM dbt_items WHERE name = $1", args!["c"])
        .await
        .unwrap()
        .is_none());

    // A relaxed transaction commits and rolls back as any other, and
    // leaves its connection durable again (SQLite: synchronous=FULL).
    let mut tx = db.begin_relaxed().await.unwrap();
    tx.execute(
        "INSERT INTO dbt_items (name, small) VALUES ($1, 1)",
        args!["relaxed"],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    {
        let mut tx = db.begin_relaxed().await.unwrap();
        tx.execute(
            "INSERT INTO dbt_items (name, small) VALUES ($1, 1)",
            args!["relaxed-dropped"],
        )
        .await
        .unwrap();
    }
    let names: Vec<String> = db
        .query(
            "SELECT name FROM dbt_items WHERE name LIKE 'relaxed%' ORDER BY name",
            args![],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0).unwrap())
        .collect();
    assert_eq!(names, ["relaxed"]);
    if db.dialect() == hatchery_db::Dialect::Sqlite {
        // Every pooled connection (taken all at once) is back to FULL (2).
        let mut held = Vec::new();
        for _ in 0..hatchery_db::SQLITE_CONNECTIONS {
            let mut tx = db.read().await.unwrap();
            let sync: i64 = tx
                .query_one("PRAGMA synchronous", args![])
                .await
                .unwrap()
                .get(0)
                .unwrap();
            assert_eq!(sync, 2, "a connection left relaxed");
            held.push(tx);
        }
    }

    // Read-then-write under contention: every increment counts once.
    db.execute("INSERT INTO dbt_counter (id, n) VALUES ($1, 0)", args!["k"])
        .await
        .unwrap();
    let db = Arc::new(db);
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let db = db.clone();
        tasks.push(tokio::spawn(async move {
            let mut tx = db.begin().await.unwrap();
            let n: i64 = tx
                .query_one(
                    "SELECT n FROM dbt_counter WHERE id = $1 FOR UPDATE",
                    args!["k"],
                )
                .await
                .unwrap()
                .get(0)
                .unwrap();
            tx.execute(
                "UPDATE dbt_counter SET n = $1 WHERE id = $2",
                args![n + 1, "k"],
            )
            .await
            .unwrap();
            tx.commit().await.unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let n: i64 = db
        .query_opt("SELECT n FROM dbt_counter WHERE id = $1", args!["k"])
        .await
        .unwrap()
        .unwrap()
        .get(0)
        .unwrap();
    assert_eq!(n, 16);

    // A reader is not held up by an open writer, and sees the last commit.
    let mut w = db.begin().await.unwrap();
    w.execute("UPDATE dbt_counter SET n = 99 WHERE id = $1", args!["k"])
        .await
        .unwrap();
    let seen: i64 = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        db.query_opt("SELECT n FROM dbt_counter WHERE id = $1", args!["k"]),
    )
    .await
    .expect("a reader waited for a writer")
    .unwrap()
    .unwrap()
    .get(0)
    .unwrap();
    assert_eq!(seen, 16);
    w.commit().await.unwrap();
    let v: Value = db
        .query_opt("SELECT n FROM dbt_counter WHERE id = $1", args!["k"])
        .await
        .unwrap()
        .unwrap()
        .get(0)
        .unwrap();
    assert_eq!(v, Value::Int(99));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contract_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path().join("hatchery.db").to_str().unwrap())
        .await
        .unwrap();
    assert_eq!(db.dialect(), hatchery_db::Dialect::Sqlite);
    contract(db).await;
    // The file is one database: a second open sees the schema.
    let again = Db::sqlite(&dir.path().join("hatchery.db")).await.unwrap();
    assert_eq!(SET.check(&again).await.unwrap(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contract_on_sqlite_in_memory() {
    contract(Db::sqlite_memory().unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contract_conformance_on_postgres() {
    let pg = pg_server::TestPg::start();
    let db = Db::open(&pg.dsn).await.unwrap();
    assert_eq!(db.dialect(), hatchery_db::Dialect::Postgres);
    // The server ends a session left idle inside a transaction (a host cut
    // off mid-transaction must not hold its row locks for hours).
    let r = db
        .query_opt(
            "SELECT current_setting('idle_in_transaction_session_timeout') AS v",
            args![],
        )
        .await
        .unwrap()
        .unwrap();
    let v: String = r.get("v").unwrap();
    assert_eq!(v, "20s");
    // A shared database (HATCHERY_TEST_PG_DSN) may hold a previous run's.
    for t in ["dbt_items", "dbt_counter", "dbt_doc", "dbt_half"] {
        db.execute(&format!("DROP TABLE IF EXISTS {t}"), args![])
            .await
            .unwrap();
    }
    db.migrate(&Migrations {
        product: "dbt_reset",
        steps: &[],
    })
    .await
    .unwrap();
    db.execute(
        "DELETE FROM hatchery_migrations WHERE product LIKE 'dbt%'",
        args![],
    )
    .await
    .unwrap();
    contract(db).await;
}
