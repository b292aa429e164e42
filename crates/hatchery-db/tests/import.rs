//! Upgrading a data dir: an old per-product SQLite file is copied into
//! the one database once, entirely or not at all.

use hatchery_db::{args, Db, Import, Imported, Migrations, Step};

static STEPS: &[Step] = &[Step::Both(
    "CREATE TABLE imp_items (id TEXT PRIMARY KEY, n BIGINT NOT NULL)",
)];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_file_is_imported_once_and_whole() {
    let dir = tempfile::tempdir().unwrap();
    let old = rusqlite::Connection::open(dir.path().join("items.db")).unwrap();
    old.execute_batch(
        "CREATE TABLE items (id TEXT PRIMARY KEY, n INTEGER);
         INSERT INTO items VALUES ('a', 1), ('b', 2);",
    )
    .unwrap();
    drop(old);
    let db = Db::sqlite(&dir.path().join("hatchery.db")).await.unwrap();
    db.migrate(&Migrations {
        product: "imp",
        steps: STEPS,
    })
    .await
    .unwrap();

    // A copy that fails half way leaves nothing, and no record: the next
    // start tries again.
    let broken = Import {
        file: "items.db",
        copy: &[
            "INSERT INTO imp_items (id, n) SELECT id, n FROM old.items",
            "INSERT INTO imp_items (id, n) SELECT id, n FROM old.items",
        ],
    };
    assert!(db.import_sqlite(dir.path(), &broken).await.is_err());
    let n: i64 = db
        .query_opt("SELECT count(*) FROM imp_items", args![])
        .await
        .unwrap()
        .unwrap()
        .get(0)
        .unwrap();
    assert_eq!(n, 0);

    let good = Import {
        file: "items.db",
        copy: &["INSERT INTO imp_items (id, n) SELECT id, n FROM old.items"],
    };
    assert_eq!(
        db.import_sqlite(dir.path(), &good).await.unwrap(),
        Imported::Now
    );
    assert_eq!(
        db.import_sqlite(dir.path(), &good).await.unwrap(),
        Imported::Before
    );
    let total: i64 = db
        .query_opt("SELECT CAST(SUM(n) AS BIGINT) FROM imp_items", args![])
        .await
        .unwrap()
        .unwrap()
        .get(0)
        .unwrap();
    assert_eq!(total, 3);
    // A data dir without the file has nothing to import.
    let other = Import {
        file: "absent.db",
        copy: good.copy,
    };
    assert_eq!(
        db.import_sqlite(dir.path(), &other).await.unwrap(),
        Imported::Nothing
    );
    // The database is usable afterwards (the old file detached).
    db.execute("INSERT INTO imp_items VALUES ($1, $2)", args!["c", 3])
        .await
        .unwrap();
}
