//! Upgrade in place: a single-host data dir of the previous release kept
//! the broker's record in DATA_DIR/broker.db (tables `calls`, `epochs`).
//! The daemon copies it into the one database once; every call and epoch
//! is then found through the store.

use hatchery_broker::store::{schema, BrokerStore, CallState};
use hatchery_db::{args, Db, Imported};

/// The previous release's broker.db schema: its three SQLite migrations,
/// verbatim (crates/hatchery-broker/src/store/sqlite.rs before issue 32).
const OLD_SCHEMA: &str = "CREATE TABLE calls (
        session_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        epoch INTEGER NOT NULL,
        tool TEXT NOT NULL,
        args_sha256 TEXT NOT NULL,
        args TEXT NOT NULL,
        state TEXT NOT NULL,
        decision TEXT NOT NULL,
        rule_id TEXT,
        approval_id TEXT,
        event_seq INTEGER,
        result_event_seq INTEGER,
        effect TEXT,
        output TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        PRIMARY KEY (session_id, seq)
    ) WITHOUT ROWID;
    CREATE INDEX calls_state ON calls(state);
    CREATE TABLE epochs (
        sandbox_id TEXT PRIMARY KEY,
        session_id TEXT NOT NULL,
        epoch INTEGER NOT NULL,
        UNIQUE (session_id, epoch)
    ) WITHOUT ROWID;
    ALTER TABLE calls ADD COLUMN review_event_seq INTEGER;
    ALTER TABLE calls ADD COLUMN runner TEXT;
    PRAGMA user_version = 3;";

const OLD_ROWS: &[&str] = &[
    "INSERT INTO calls VALUES ('ses_a', 1, 1, 'git_push', 'h1', '{\"ref\":\"main\"}', 'done',
        'allow', 'r1', NULL, 3, 4, '{\"push\":1}', '{\"ok\":true}',
        '2026-01-01T00:00:00Z', '2026-01-01T00:00:01Z', NULL, 'brn_x')",
    "INSERT INTO calls VALUES ('ses_a', 2, 2, 'open_pr', 'h2', '{}', 'needs_review',
        'allow', NULL, 'apr_1', 6, NULL, '{\"pr\":1}', NULL,
        '2026-01-01T00:00:02Z', '2026-01-01T00:00:03Z', 9, 'brn_y')",
    "INSERT INTO calls VALUES ('ses_b', 1, 1, 'noop', 'h3', '{}', 'executing',
        'allow', NULL, NULL, NULL, NULL, NULL, NULL,
        '2026-01-01T00:00:04Z', '2026-01-01T00:00:04Z', NULL, NULL)",
    "INSERT INTO epochs VALUES ('sbx_1', 'ses_a', 1)",
    "INSERT INTO epochs VALUES ('sbx_2', 'ses_a', 2)",
    "INSERT INTO epochs VALUES ('sbx_3', 'ses_b', 1)",
];

#[tokio::test]
async fn a_previous_release_broker_db_is_imported_once() {
    let dir = tempfile::tempdir().unwrap();
    {
        let old = Db::sqlite(&dir.path().join("broker.db")).await.unwrap();
        let mut tx = old.begin().await.unwrap();
        tx.batch(OLD_SCHEMA).await.unwrap();
        for r in OLD_ROWS {
            tx.execute(r, args![]).await.unwrap();
        }
        tx.commit().await.unwrap();
    }
    let db = Db::sqlite(&dir.path().join("hatchery.db")).await.unwrap();
    let s = BrokerStore::open(db.clone()).await.unwrap();
    assert_eq!(
        db.import_sqlite(dir.path(), &schema::IMPORT).await.unwrap(),
        Imported::Now
    );

    let a = s.calls("ses_a").await.unwrap();
    assert_eq!(a.len(), 2);
    let c = &a[0];
    assert_eq!((c.seq, c.epoch, c.tool.as_str()), (1, 1, "git_push"));
    assert_eq!(
        (c.args_sha256.as_str(), c.args.as_str()),
        ("h1", "{\"ref\":\"main\"}")
    );
    assert_eq!(c.state, CallState::Done);
    assert_eq!(
        (c.decision.as_str(), c.rule_id.as_deref()),
        ("allow", Some("r1"))
    );
    assert_eq!((c.event_seq, c.result_event_seq), (Some(3), Some(4)));
    assert_eq!(c.effect.as_deref(), Some("{\"push\":1}"));
    assert_eq!(c.output.as_deref(), Some("{\"ok\":true}"));
    assert_eq!(
        (c.review_event_seq, c.runner.as_deref()),
        (None, Some("brn_x"))
    );
    assert_eq!(
        (c.created_at.as_str(), c.updated_at.as_str()),
        ("2026-01-01T00:00:00Z", "2026-01-01T00:00:01Z")
    );
    let r = s.get("ses_a", 2).await.unwrap().unwrap();
    assert_eq!(r.state, CallState::NeedsReview);
    assert_eq!(r.approval_id.as_deref(), Some("apr_1"));
    assert_eq!((r.event_seq, r.review_event_seq), (Some(6), Some(9)));
    let ex = s.executing().await.unwrap();
    assert_eq!(ex.len(), 1);
    assert_eq!((ex[0].session_id.as_str(), ex[0].seq), ("ses_b", 1));
    for (sbx, ses, e) in [
        ("sbx_1", "ses_a", 1),
        ("sbx_2", "ses_a", 2),
        ("sbx_3", "ses_b", 1),
    ] {
        assert_eq!(s.known_epoch(sbx).await.unwrap(), Some((ses.into(), e)));
    }
    // Imported calls go on as any other: the next sandbox of ses_a is 3,
    // a reviewed call can be resolved.
    assert_eq!(s.epoch_for("ses_a", "sbx_4").await.unwrap(), 3);
    let (from, to) = (CallState::NeedsReview, CallState::Done);
    let done = s.advance_recorded("ses_a", 2, from, to, Default::default());
    assert!(done.await.unwrap().is_some());

    // A second start copies nothing again.
    assert_eq!(
        db.import_sqlite(dir.path(), &schema::IMPORT).await.unwrap(),
        Imported::Before
    );
    assert_eq!(s.calls("ses_a").await.unwrap().len(), 2);
}

#[path = "../../hatchery-store/tests/support/pg_server.rs"]
mod pg_server;

/// A shared PostgreSQL database of the previous release (its own runner's
/// `broker_schema`, tables already `broker_`-prefixed): kept as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previous_release_tables_are_kept_conformance_on_postgres() {
    let pg = pg_server::TestPg::start();
    let db = Db::postgres(&hatchery_db::scratch_schema(&pg.dsn).await.unwrap(), 4).unwrap();
    let mut tx = db.begin().await.unwrap();
    // The previous release's pg.rs migrations, verbatim.
    tx.batch(
        "CREATE TABLE broker_calls (
            session_id TEXT NOT NULL,
            seq BIGINT NOT NULL,
            epoch BIGINT NOT NULL,
            tool TEXT NOT NULL,
            args_sha256 TEXT NOT NULL,
            args TEXT NOT NULL,
            state TEXT NOT NULL,
            decision TEXT NOT NULL,
            rule_id TEXT,
            approval_id TEXT,
            event_seq BIGINT,
            result_event_seq BIGINT,
            effect TEXT,
            output TEXT,
            review_event_seq BIGINT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            PRIMARY KEY (session_id, seq)
         );
         CREATE INDEX broker_calls_state ON broker_calls(state);
         CREATE TABLE broker_epochs (
            sandbox_id TEXT PRIMARY KEY,
            session_id TEXT NOT NULL,
            epoch BIGINT NOT NULL,
            UNIQUE (session_id, epoch)
         );
         ALTER TABLE broker_calls ADD COLUMN runner TEXT;
         CREATE TABLE broker_runners (
            runner TEXT PRIMARY KEY,
            expires_at TIMESTAMPTZ NOT NULL
         );",
    )
    .await
    .unwrap();
    tx.execute(
        "INSERT INTO broker_calls (session_id, seq, epoch, tool, args_sha256, args, state,
            decision, created_at, updated_at, runner)
         VALUES ('ses_a', 1, 1, 'noop', 'h', '{}', 'executing', 'allow', 't0', 't1', 'brn_x')",
        args![],
    )
    .await
    .unwrap();
    tx.execute(
        "INSERT INTO broker_epochs VALUES ('sbx_1', 'ses_a', 1)",
        args![],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let s = BrokerStore::open(db.clone()).await.unwrap();
    let c = s.get("ses_a", 1).await.unwrap().unwrap();
    assert_eq!(
        (c.state, c.runner.as_deref()),
        (CallState::Executing, Some("brn_x"))
    );
    assert_eq!(
        s.known_epoch("sbx_1").await.unwrap(),
        Some(("ses_a".into(), 1))
    );
    assert_eq!(s.epoch_for("ses_a", "sbx_2").await.unwrap(), 2);
    s.heartbeat("brn_x", 30).await.unwrap();
    assert!(s.runner_alive("brn_x").await.unwrap());
    // Nothing to import on PostgreSQL.
    assert_eq!(
        db.import_sqlite(std::path::Path::new("/nonexistent"), &schema::IMPORT)
            .await
            .unwrap(),
        Imported::Nothing
    );
}
