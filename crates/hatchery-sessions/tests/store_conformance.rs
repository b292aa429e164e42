//! One contract, two backends: the session store's conformance suite
//! against SQLite and against a PostgreSQL this test starts itself (it
//! fails, never skips, if it cannot; `HATCHERY_TEST_PG_DSN` names an
//! existing database instead). After the suite, the rows themselves are
//! checked: per session, seqs 1..n, epochs that only grow and change only
//! at a `host_changed` event (which records the epoch it moved to), and a
//! hash chain that verifies.

#[path = "../../hatchery-store/tests/support/pg_server.rs"]
mod pg_server;

use hatchery_sessions::store::chain::seal_after;
use hatchery_sessions::store::{conformance, PgSessionStore, SessionStore, SqliteStore};
use hatchery_sessions_schema::PgAuditReader;
use std::sync::Arc;

/// One event row as stored.
struct Row {
    session: String,
    seq: u64,
    at: String,
    actor: String,
    kind: String,
    data: String,
    prev_hash: String,
    hash: String,
    epoch: u64,
}

/// The invariants over every stored event row (grouped by session, in seq
/// order), and the sessions' own epochs.
fn check_rows(rows: &[Row], session_epoch: &std::collections::HashMap<String, u64>) -> usize {
    let mut i = 0;
    let mut sessions = 0;
    while i < rows.len() {
        let s = &rows[i].session;
        let mut j = i;
        let mut prev: Option<String> = None;
        let mut epoch = 1;
        while j < rows.len() && rows[j].session == *s {
            let r = &rows[j];
            assert_eq!(r.seq, (j - i + 1) as u64, "{s}: seq gap or duplicate");
            let (p, h) =
                seal_after(prev.as_deref(), s, r.seq, &r.at, &r.actor, &r.kind, &r.data).unwrap();
            assert_eq!((&p, &h), (&r.prev_hash, &r.hash), "{s}/{}: chain", r.seq);
            if r.kind == "host_changed" {
                let d: serde_json::Value = serde_json::from_str(&r.data).unwrap();
                assert_eq!(d["epoch"].as_u64(), Some(r.epoch), "{s}/{}", r.seq);
                assert!(r.epoch > epoch, "{s}/{}: epoch did not grow", r.seq);
                epoch = r.epoch;
            }
            assert_eq!(r.epoch, epoch, "{s}/{}: written under a stale epoch", r.seq);
            prev = Some(r.hash.clone());
            j += 1;
        }
        assert_eq!(session_epoch[s], epoch, "{s}: row epoch");
        sessions += 1;
        i = j;
    }
    sessions
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sessions.db");
    let open =
        |h: &str| -> Arc<dyn SessionStore> { Arc::new(SqliteStore::open_as(&path, h).unwrap()) };
    conformance::run_all(&open).await;

    let c = rusqlite::Connection::open(&path).unwrap();
    let mut st = c
        .prepare(
            "SELECT session_id, seq, at, actor, type, data, prev_hash, hash, epoch FROM events \
             ORDER BY session_id, seq",
        )
        .unwrap();
    let rows: Vec<Row> = st
        .query_map([], |r| {
            Ok(Row {
                session: r.get("session_id")?,
                seq: r.get::<_, i64>("seq")? as u64,
                at: r.get("at")?,
                actor: r.get("actor")?,
                kind: r.get("type")?,
                data: r.get("data")?,
                prev_hash: r.get("prev_hash")?,
                hash: r.get("hash")?,
                epoch: r.get::<_, i64>("epoch")? as u64,
            })
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let mut st = c.prepare("SELECT id, epoch FROM sessions").unwrap();
    let epochs = st
        .query_map([], |r| Ok((r.get("id")?, r.get::<_, i64>("epoch")? as u64)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(check_rows(&rows, &epochs) >= 20);
    // A migration run twice (a reopen) changes nothing.
    let v: i64 = c
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    drop(SqliteStore::open(&path).unwrap());
    let v2: i64 = c
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!((v, v2), (6, 6));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_on_postgres() {
    let pg = pg_server::TestPg::start();
    let store = PgSessionStore::connect(&pg.dsn, 8, "conformance")
        .await
        .unwrap();
    let open = |h: &str| -> Arc<dyn SessionStore> { Arc::new(store.as_host(h).unwrap()) };
    conformance::run_all(&open).await;

    let (c, conn) = tokio_postgres::connect(&pg.dsn, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let rows: Vec<Row> = c
        .query(
            "SELECT session_id, seq, at, actor, type, data, prev_hash, hash, epoch FROM session_events \
             ORDER BY session_id, seq",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| Row {
            session: r.get("session_id"),
            seq: r.get::<_, i64>("seq") as u64,
            at: r.get("at"),
            actor: r.get("actor"),
            kind: r.get("type"),
            data: r.get("data"),
            prev_hash: r.get("prev_hash"),
            hash: r.get("hash"),
            epoch: r.get::<_, i64>("epoch") as u64,
        })
        .collect();
    let epochs = c
        .query("SELECT id, epoch FROM sessions", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get("id"), r.get::<_, i64>("epoch") as u64))
        .collect();
    assert!(check_rows(&rows, &epochs) >= 20);

    // The broker's lookup of a sandbox's session (with_sandbox) can be
    // answered from the partial index: with scans ruled out, the plan
    // names it (on a table this small a scan would otherwise win).
    c.batch_execute("SET enable_seqscan = off").await.unwrap();
    let plan: Vec<String> = c
        .query(
            "EXPLAIN SELECT id FROM sessions WHERE sandbox_id = 'sbx_x' \
             AND state NOT IN ('completed','failed','cancelled')",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        plan.iter().any(|l| l.contains("sessions_live_sandbox")),
        "{plan:?}"
    );
    c.batch_execute("RESET enable_seqscan").await.unwrap();

    // `hatchery audit verify --db postgres://...` (its read-only opening):
    // every chain verifies as stored, and one changed byte in an event's
    // data is named.
    let store = PgAuditReader::open(&pg.dsn).await.unwrap();
    let chains = store.chains().await.unwrap();
    assert!(chains.len() >= 20);
    for ch in &chains {
        let r = store.verify(ch, &[]).await.unwrap();
        assert!(r.ok(), "{ch}: {r:?}");
    }
    let victim = &chains[0];
    let head = store.verify(victim, &[]).await.unwrap().head.unwrap();
    c.execute(
        "UPDATE session_events SET data = replace(data, '\"', '\" ') WHERE session_id = $1 AND seq = 1",
        &[victim],
    )
    .await
    .unwrap();
    let r = store
        .verify(victim, std::slice::from_ref(&head))
        .await
        .unwrap();
    assert_eq!(r.first_bad.map(|b| b.seq), Some(1), "tampering not caught");
    // An anchored head that was cut off the chain is named too.
    let mut gone = head;
    gone.seq += 1;
    let r = store.verify(&chains[1], &[]).await.unwrap();
    assert!(r.ok());
    gone.chain = chains[1].clone();
    let r = store.verify(&chains[1], &[gone]).await.unwrap();
    assert!(!r.ok(), "{r:?}");
    // The reader's connections (hatchery_store::pg_pool_read_only) cannot
    // write: the server refuses it.
    let ro = hatchery_store::pg_pool_read_only(&pg.dsn, 1).unwrap();
    let e = ro
        .get()
        .await
        .unwrap()
        .execute("INSERT INTO session_deliveries VALUES ('s', 'k')", &[])
        .await
        .unwrap_err();
    let why = e.as_db_error().map(|d| d.message().to_string());
    assert!(why.as_deref().unwrap_or("").contains("read-only"), "{e:?}");

    // A database no daemon has run on is a clear error, not an empty report.
    if std::env::var("HATCHERY_TEST_PG_DSN").is_err() {
        c.execute("CREATE DATABASE audit_empty", &[]).await.unwrap();
        let empty = pg.dsn.replace("/hatchery", "/audit_empty");
        let e = PgAuditReader::open(&empty).await.err().unwrap();
        assert!(e.to_string().contains("no Hatchery sessions schema"), "{e}");
    }
}

/// Two daemons starting at once against one database both migrate safely,
/// and a migration run twice is a no-op; the sessions schema lives beside
/// the daemon's state store's in one database.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_migrations_race_and_repeat() {
    let pg = pg_server::TestPg::start();
    let (a, b) = tokio::join!(
        PgSessionStore::connect(&pg.dsn, 2, "a"),
        PgSessionStore::connect(&pg.dsn, 2, "b")
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    let v = a.schema_version().await.unwrap();
    assert_eq!(v, b.schema_version().await.unwrap());
    let c = PgSessionStore::connect(&pg.dsn, 2, "c").await.unwrap();
    assert_eq!(c.schema_version().await.unwrap(), v);
    assert_eq!(v, 4);
    let state = hatchery_store_pg(&pg.dsn).await;
    assert!(state >= 1, "the state store migrates in the same database");
}

async fn hatchery_store_pg(dsn: &str) -> u64 {
    // The daemon's state store has its own `events`; the session tables
    // are prefixed, so both schemas fit one database.
    let (c, conn) = tokio_postgres::connect(dsn, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    c.batch_execute(
        "CREATE TABLE IF NOT EXISTS events (seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY)",
    )
    .await
    .unwrap();
    let n: i64 = c
        .query_one(
            "SELECT count(*) AS n FROM information_schema.tables WHERE table_name IN \
             ('sessions', 'session_events', 'session_blobs', 'session_approvals', 'events')",
            &[],
        )
        .await
        .unwrap()
        .get("n");
    assert_eq!(n, 5);
    1
}

/// A database that is not there is a clear, retryable error, not a hang;
/// a bad host id or connection string is a configuration error.
#[tokio::test]
async fn postgres_down_is_unavailable() {
    use hatchery_sessions::store::StoreError;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port(); // dropped: nothing listens there
    let started = std::time::Instant::now();
    let e = PgSessionStore::connect(&format!("postgres://postgres@127.0.0.1:{port}/x"), 2, "h")
        .await
        .err()
        .expect("connected to nothing");
    assert!(matches!(e, StoreError::Unavailable(_)), "{e}");
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    assert!(matches!(
        PgSessionStore::connect("postgres://127.0.0.1/x", 2, "bad host").await,
        Err(StoreError::Config(_))
    ));
    assert!(matches!(
        PgSessionStore::connect("port=notanumber", 2, "h").await,
        Err(StoreError::Config(_))
    ));
}

/// `pg_ctl` of the installed server, as the postgres user when root.
fn pg_ctl(args: &[&str]) {
    let bin = std::fs::read_dir("/usr/lib/postgresql")
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("bin/pg_ctl"))
        .filter(|p| p.exists())
        .max()
        .expect("pg_ctl");
    let root = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"));
    let mut cmd = if root {
        let mut c = std::process::Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin);
        c
    } else {
        std::process::Command::new(bin)
    };
    let out = cmd.args(args).output().unwrap();
    assert!(out.status.success(), "pg_ctl {args:?}: {out:?}");
}

/// The database stops under a running store: reads and writes are
/// `Unavailable` (503 + Retry-After in the API), a write that failed
/// committed nothing, and the same store works again once the database is
/// back (the pool drops dead connections).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stopped_under_the_store_is_unavailable_then_recovers() {
    use hatchery_sessions::store::{Patch, StoreError};
    if std::env::var("HATCHERY_TEST_PG_DSN").is_ok() {
        // A shared server is not ours to stop; the private one is the test.
        eprintln!("HATCHERY_TEST_PG_DSN set: not stopping a shared server; test not run");
        return;
    }
    let pg = pg_server::TestPg::start();
    let s = PgSessionStore::connect(&pg.dsn, 2, "h").await.unwrap();
    let id = format!("ses_u{:08x}", rand::random::<u32>());
    s.create(&id, &conformance::spec("git://127.0.0.1/u.git"), None, "h")
        .await
        .unwrap();
    let (c, conn) = tokio_postgres::connect(&pg.dsn, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let setting = |name: &'static str| {
        let c = &c;
        async move {
            c.query_one(&format!("SHOW {name}"), &[])
                .await
                .unwrap()
                .get::<_, String>(0)
        }
    };
    let data = setting("data_directory").await;
    let port = setting("port").await;
    let sock = setting("unix_socket_directories").await;
    drop(c);
    pg_ctl(&["-D", &data, "-m", "immediate", "-w", "stop"]);
    let e = s.get(&id).await.unwrap_err();
    assert!(matches!(e, StoreError::Unavailable(_)), "{e}");
    let msg = (
        hatchery_sessions::events::Actor::User,
        hatchery_sessions::events::EventKind::Message { text: "x".into() },
    );
    let e = s
        .append(&id, vec![msg.clone()], Patch::default())
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::Unavailable(_)), "{e}");
    let opts = format!("-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off");
    let log = format!("{data}/../pg-restart.log");
    pg_ctl(&[
        "-D", &data, "-l", &log, "-w", "-t", "60", "start", "-o", &opts,
    ]);
    let mut back = None;
    for _ in 0..50 {
        if let Ok(x) = s.get(&id).await {
            back = Some(x);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let back = back.expect("the store did not recover after the database came back");
    assert_eq!(back.last_seq, 1, "the failed append committed nothing");
    let evs = s.append(&id, vec![msg], Patch::default()).await.unwrap();
    assert_eq!(evs[0].seq, 2);
}
