//! One contract, two backends: the session store's conformance suite
//! against a SQLite database and against a PostgreSQL this test starts
//! itself (it fails, never skips, if it cannot; `HATCHERY_TEST_PG_DSN`
//! names an existing database instead). After the suite, the rows
//! themselves are checked: per session, seqs 1..n, epochs that only grow
//! and change only at a `host_changed` event (which records the epoch it
//! moved to), and a hash chain that verifies, also through `hatchery
//! audit verify`'s reader, which names a tampered row.

#[path = "../../hatchery-store/tests/support/pg_server.rs"]
mod pg_server;

use hatchery_db::{args, Db};
use hatchery_sessions::events::{Actor, EventKind};
use hatchery_sessions::store::chain::seal_after;
use hatchery_sessions::store::{conformance, DbSessionStore, SessionStore};
use hatchery_sessions_schema::AuditReader;
use std::sync::Arc;
use tokio_postgres::NoTls;
hatchery_db::record! {
    /// One event row as stored (`session` and `kind` are the columns
    /// `session_id` and `type`, renamed by the query that reads them;
    /// `owner_epoch` is its session's epoch).
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
        owner_epoch: u64,
    }
}

/// The invariants over every stored event row (grouped by session, in seq
/// order), and the sessions' own epochs; returns the number of sessions.
async fn check_rows(db: &Db) -> usize {
    let sql = "SELECT e.*, e.session_id AS session, e.type AS kind, s.epoch AS owner_epoch \
               FROM session_events e JOIN sessions s ON s.id = e.session_id \
               ORDER BY e.session_id, e.seq";
    let rows = db.query(sql, args![]).await.unwrap();
    let rows: Vec<Row> = rows.iter().map(|r| Row::from_row(r).unwrap()).collect();
    let chains: Vec<&[Row]> = rows.chunk_by(|a, b| a.session == b.session).collect();
    for rows in &chains {
        let s = &rows[0].session;
        let (mut prev, mut epoch) = (None, 1);
        for (i, r) in rows.iter().enumerate() {
            assert_eq!(r.seq, i as u64 + 1, "{s}: seq gap or duplicate");
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
            prev = Some(h);
        }
        assert_eq!(rows[0].owner_epoch, epoch, "{s}: row epoch");
    }
    chains.len()
}

/// The suite, the row invariants, a second migration run (a no-op), and
/// `hatchery audit verify`'s reader on the result: every chain verifies
/// as stored, one changed byte in an event's data is named, and so is an
/// anchored head cut off its chain.
async fn suite(db: &Db) {
    let store = DbSessionStore::open(db.clone(), "suite").await.unwrap();
    let open = |h: &str| -> Arc<dyn SessionStore> { Arc::new(store.as_host(h).unwrap()) };
    conformance::run_all(&open).await;

    assert!(check_rows(db).await >= 20);
    assert_eq!(store.schema_version().await.unwrap(), 3);
    let again = DbSessionStore::open(db.clone(), "again").await.unwrap();
    assert_eq!(again.schema_version().await.unwrap(), 3);

    let reader = AuditReader::on(db.clone()).await.unwrap();
    let chains = reader.chains().await.unwrap();
    assert!(chains.len() >= 20);
    let mut long = vec![];
    for ch in &chains {
        let r = reader.verify(ch, &[]).await.unwrap();
        assert!(r.ok(), "{ch}: {r:?}");
        if r.verified >= 3 {
            long.push(ch.clone());
        }
    }
    assert!(long.len() >= 3, "{long:?}");
    let victim = &chains[0];
    let head = reader.verify(victim, &[]).await.unwrap().head.unwrap();
    let sql = "UPDATE session_events SET data = replace(data, '\"', '\" ') \
               WHERE session_id = $1 AND seq = 1";
    db.execute(sql, args![victim]).await.unwrap();
    let anchors = std::slice::from_ref(&head);
    let r = reader.verify(victim, anchors).await.unwrap();
    assert_eq!(r.first_bad.map(|b| b.seq), Some(1), "tampering not caught");
    let mut gone = head;
    gone.seq += 1;
    assert!(reader.verify(&chains[1], &[]).await.unwrap().ok());
    gone.chain = chains[1].clone();
    let r = reader.verify(&chains[1], &[gone]).await.unwrap();
    assert!(!r.ok(), "{r:?}");
    let chains = long;
    // The actor is covered by the hash too, and a removed row is a gap.
    let r = |r: hatchery_audit::Report| r.first_bad.map(|b| b.seq);
    let sql = "UPDATE session_events SET actor = 'nobody' WHERE session_id = $1 AND seq = 2";
    db.execute(sql, args![&chains[1]]).await.unwrap();
    assert_eq!(r(reader.verify(&chains[1], &[]).await.unwrap()), Some(2));
    let sql = "DELETE FROM session_events WHERE session_id = $1 AND seq = 2";
    db.execute(sql, args![&chains[2]]).await.unwrap();
    assert_eq!(r(reader.verify(&chains[2], &[]).await.unwrap()), Some(2));
}

/// The partial index that answers the broker's lookup (with_sandbox).
const LIVE_SANDBOX: &str = "sessions_live_sandbox";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_on_sqlite() {
    let db = Db::sqlite_memory().unwrap();
    suite(&db).await;
    // The broker asks for a sandbox's session on every call: that lookup
    // is an index search, not a scan of every session.
    let sql = "EXPLAIN QUERY PLAN SELECT id FROM sessions WHERE sandbox_id = $1 \
               AND state NOT IN ('completed','failed','cancelled') ORDER BY ord";
    let plan = db.query(sql, args!["sbx_1"]).await.unwrap();
    let plan: Vec<String> = plan.iter().map(|r| r.get(3).unwrap()).collect();
    assert!(plan.iter().any(|d| d.contains(LIVE_SANDBOX)), "{plan:?}");
    // A database no daemon has run on is a clear error for the reader.
    let empty = Db::sqlite_memory().unwrap();
    let e = AuditReader::on(empty).await.err().unwrap();
    assert!(e.to_string().contains("no session schema"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_on_postgres() {
    let pg = pg_server::TestPg::start();
    let db = Db::postgres(&pg.dsn, 8).unwrap();
    suite(&db).await;

    // The broker's lookup of a sandbox's session (with_sandbox) can be
    // answered from the partial index: with scans ruled out, the plan
    // names it (on a table this small a scan would otherwise win).
    let mut tx = db.begin().await.unwrap();
    tx.batch("SET LOCAL enable_seqscan = off").await.unwrap();
    let sql = "EXPLAIN SELECT id FROM sessions WHERE sandbox_id = 'sbx_x' \
               AND state NOT IN ('completed','failed','cancelled')";
    let plan = tx.query(sql, args![]).await.unwrap();
    let plan: Vec<String> = plan.iter().map(|r| r.get(0).unwrap()).collect();
    tx.rollback().await.unwrap();
    assert!(plan.iter().any(|l| l.contains(LIVE_SANDBOX)), "{plan:?}");

    // `hatchery audit verify --db postgres://...` opens read-only: the
    // server refuses a write on its connections.
    let ro = Db::postgres_read_only(&pg.dsn, 1).unwrap();
    let sql = "INSERT INTO session_deliveries VALUES ('s', 'k')";
    let e = ro.execute(sql, args![]).await.unwrap_err();
    assert!(e.to_string().contains("read-only"), "{e}");
    assert!(AuditReader::open(&pg.dsn).await.is_ok());

    // A database no daemon has run on is a clear error, not an empty report.
    if std::env::var("HATCHERY_TEST_PG_DSN").is_err() {
        let (c, conn) = tokio_postgres::connect(&pg.dsn, NoTls).await.unwrap();
        tokio::spawn(conn);
        c.execute("CREATE DATABASE audit_empty", &[]).await.unwrap();
        let empty = pg.dsn.replace("/hatchery", "/audit_empty");
        let e = AuditReader::open(&empty).await.err().unwrap();
        assert!(e.to_string().contains("no session schema"), "{e}");
    }
}

/// Two daemons starting at once against one database both migrate safely,
/// and a migration run twice is a no-op.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrations_race_and_repeat_conformance_on_postgres() {
    let pg = pg_server::TestPg::start();
    let open = |host| DbSessionStore::open(Db::postgres(&pg.dsn, 2).unwrap(), host);
    let (a, b) = tokio::join!(open("a"), open("b"));
    for s in [a.unwrap(), b.unwrap(), open("c").await.unwrap()] {
        assert_eq!(s.schema_version().await.unwrap(), 3);
    }
}

/// The previous release's PostgreSQL tables (its own migration runner's
/// final schema, copied here as it was) upgrade in place: the new store
/// opens on them and finds every row, its chain still verifying, and
/// keeps writing them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previous_release_upgrades_in_place_conformance_on_postgres() {
    use hatchery_sessions::store::{ListFilter, Patch};
    let pg = pg_server::TestPg::start();
    // A schema of its own: a shared test database holds the new tables.
    let dsn = hatchery_db::scratch_schema(&pg.dsn).await.unwrap();
    let db = Db::postgres(&dsn, 2).unwrap();
    let mut tx = db.begin().await.unwrap();
    tx.batch(OLD_PG_SCHEMA).await.unwrap();
    tx.commit().await.unwrap();
    let spec = serde_json::to_string(&conformance::spec("git://127.0.0.1/old.git")).unwrap();
    for (i, id) in ["ses_old1", "ses_old2"].iter().enumerate() {
        let sql = "INSERT INTO sessions (id, spec, state, repo, request_hash, created_at, host_id, epoch, last_seq, sandbox_id) \
             VALUES ($1, $2, 'running', 'git://127.0.0.1/old.git', 'h', '2026-01-01T00:00:00.000Z', 'local', 1, 1, $3)";
        let sbx = format!("sbx_old{i}");
        db.execute(sql, args![*id, &spec, sbx]).await.unwrap();
        // Its first event, sealed as the previous release sealed it.
        let data = serde_json::to_string(&EventKind::CancelRequested).unwrap();
        let at = "2026-01-01T00:00:00.000Z";
        let (p, h) = seal_after(None, id, 1, at, "system", "cancel_requested", &data).unwrap();
        let sql = "INSERT INTO session_events (session_id, seq, at, actor, type, data, prev_hash, hash, epoch) \
             VALUES ($1, 1, $2, 'system', 'cancel_requested', $3, $4, $5, 1)";
        db.execute(sql, args![*id, at, data, p, h]).await.unwrap();
    }
    let sql = "INSERT INTO session_approvals (id, session_id, action, details, state, created_at) \
         VALUES ('apr_old', 'ses_old1', 'push', 'd', 'pending', '2026-01-01T00:00:00.000Z')";
    db.execute(sql, args![]).await.unwrap();
    let s = DbSessionStore::open(db.clone(), "local").await.unwrap();
    let all = ListFilter {
        limit: 10,
        ..Default::default()
    };
    let all = s.list(&all).await.unwrap();
    let ids: Vec<_> = all.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["ses_old1", "ses_old2"], "creation order kept");
    assert_eq!(s.events("ses_old1", 0, 10).await.unwrap().len(), 1);
    let p = s.pending_approval("ses_old1").await.unwrap().unwrap();
    assert_eq!(p.approval_id, "apr_old");
    let found = s.with_sandbox("sbx_old1").await.unwrap().unwrap();
    assert_eq!(found.id, "ses_old2");
    let cancel = (Actor::System, EventKind::CancelRequested);
    let ev = s.append("ses_old1", vec![cancel], Patch::default()).await;
    assert_eq!(ev.unwrap()[0].seq, 2);
    let reader = AuditReader::on(db.clone()).await.unwrap();
    for ch in ["ses_old1", "ses_old2"] {
        let r = reader.verify(ch, &[]).await.unwrap();
        assert!(r.ok(), "{ch}: {r:?}");
    }
}

/// The previous release's PostgreSQL schema (hatchery-sessions-schema's
/// four migrations, as released), a fixture.
const OLD_PG_SCHEMA: &str = "CREATE TABLE sessions (
       ord BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
       id TEXT PRIMARY KEY,
       spec TEXT NOT NULL,
       state TEXT NOT NULL,
       repo TEXT NOT NULL,
       idempotency_key TEXT UNIQUE,
       request_hash TEXT NOT NULL,
       created_at TEXT NOT NULL,
       started_at TEXT,
       ended_at TEXT,
       reason TEXT,
       spend_tokens BIGINT NOT NULL DEFAULT 0,
       spend_usd_cents BIGINT NOT NULL DEFAULT 0,
       spend_wall_s BIGINT NOT NULL DEFAULT 0,
       sandbox_id TEXT,
       process_id TEXT,
       snapshot_id TEXT,
       review_snapshot_id TEXT,
       waiting TEXT,
       output_offset BIGINT NOT NULL DEFAULT 0,
       agent_seq BIGINT NOT NULL DEFAULT 0,
       delivered_seq BIGINT NOT NULL DEFAULT 0,
       cancel_requested BOOLEAN NOT NULL DEFAULT false,
       last_seq BIGINT NOT NULL DEFAULT 0,
       host_id TEXT NOT NULL,
       epoch BIGINT NOT NULL
     );
     CREATE INDEX sessions_state ON sessions(state, ord);
     CREATE INDEX sessions_host_state ON sessions(host_id, state);
     CREATE TABLE session_events (
       session_id TEXT NOT NULL REFERENCES sessions(id),
       seq BIGINT NOT NULL,
       at TEXT NOT NULL,
       actor TEXT NOT NULL,
       type TEXT NOT NULL,
       data TEXT NOT NULL,
       prev_hash TEXT NOT NULL,
       hash TEXT NOT NULL,
       epoch BIGINT NOT NULL,
       PRIMARY KEY (session_id, seq)
     );
     CREATE TABLE session_blobs (
       session_id TEXT NOT NULL REFERENCES sessions(id),
       ref TEXT NOT NULL,
       data BYTEA NOT NULL,
       PRIMARY KEY (session_id, ref)
     );
     CREATE TABLE session_approvals (
       id TEXT PRIMARY KEY,
       session_id TEXT NOT NULL REFERENCES sessions(id),
       action TEXT NOT NULL,
       details TEXT NOT NULL,
       state TEXT NOT NULL,
       decision TEXT,
       note TEXT,
       created_at TEXT NOT NULL,
       decided_at TEXT
     );
     CREATE INDEX session_approvals_session ON session_approvals(session_id, state);
     ALTER TABLE sessions ADD COLUMN replay_through BIGINT NOT NULL DEFAULT 0;
     CREATE TABLE session_deliveries (
       session_id TEXT NOT NULL,
       key TEXT NOT NULL,
       PRIMARY KEY (session_id, key)
     );
     CREATE INDEX sessions_live_sandbox ON sessions(sandbox_id)
       WHERE state NOT IN ('completed','failed','cancelled');";

/// A database that is not there is a clear, retryable error, not a hang.
#[tokio::test]
async fn postgres_down_is_unavailable() {
    use hatchery_sessions::store::StoreError;
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = free.local_addr().unwrap().port();
    drop(free); // nothing listens there
    let started = std::time::Instant::now();
    let db = Db::postgres(&format!("postgres://postgres@127.0.0.1:{port}/x"), 2).unwrap();
    let e = DbSessionStore::open(db.clone(), "h").await;
    let e = e.err().expect("connected to nothing");
    assert!(matches!(e, StoreError::Unavailable(_)), "{e}");
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    // A bad host id is a configuration error.
    let bad = DbSessionStore::open(db, "bad host").await;
    assert!(matches!(bad, Err(StoreError::Config(_))));
}

/// `pg_ctl` of the installed server, as the postgres user when root.
fn pg_ctl(args: &[&str]) {
    let out = pg_server::pg("pg_ctl").args(args).output().unwrap();
    assert!(out.status.success(), "pg_ctl {args:?}: {out:?}");
}

/// The database stops under a running store: reads and writes are
/// `Unavailable` (503 + Retry-After in the API), a write that failed
/// committed nothing, and the same store works again once the database is
/// back (the pool drops dead connections).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_under_the_store_is_unavailable_then_recovers_conformance_on_postgres() {
    use hatchery_sessions::store::{Patch, StoreError};
    if std::env::var("HATCHERY_TEST_PG_DSN").is_ok() {
        // A shared server is not ours to stop; the private one is the test.
        eprintln!("HATCHERY_TEST_PG_DSN set: not stopping a shared server; test not run");
        return;
    }
    let pg = pg_server::TestPg::start();
    let db = Db::postgres(&pg.dsn, 2).unwrap();
    let s = DbSessionStore::open(db, "h").await.unwrap();
    let id = format!("ses_u{:08x}", rand::random::<u32>());
    let spec = conformance::spec("git://127.0.0.1/u.git");
    s.create(&id, &spec, None, "h").await.unwrap();
    let (c, conn) = tokio_postgres::connect(&pg.dsn, NoTls).await.unwrap();
    tokio::spawn(conn);
    let sql = "SELECT current_setting('data_directory'), current_setting('port'), \
               current_setting('unix_socket_directories')";
    let r = c.query_one(sql, &[]).await.unwrap();
    let (data, port, sock): (String, String, String) = (r.get(0), r.get(1), r.get(2));
    drop(c);
    pg_ctl(&["-D", &data, "-m", "immediate", "-w", "stop"]);
    let e = s.get(&id).await.unwrap_err();
    assert!(matches!(e, StoreError::Unavailable(_)), "{e}");
    let msg = (Actor::User, EventKind::Message { text: "x".into() });
    let e = s.append(&id, vec![msg.clone()], Patch::default()).await;
    let e = e.unwrap_err();
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
