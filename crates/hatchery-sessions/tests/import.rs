//! Upgrading a single-host data dir: the previous release's
//! `DATA_DIR/sessions.db` is copied into the one database on first start,
//! once, and every session, event (its chain still verifying), blob,
//! approval and delivery key is found through the store afterwards.

use hatchery_db::{Db, Imported};
use hatchery_sessions::events::{Actor, EventKind};
use hatchery_sessions::store::chain::seal_after;
use hatchery_sessions::store::{conformance, DbSessionStore, ListFilter, Patch, SessionStore};
use hatchery_sessions_schema::AuditReader;

/// The previous release's `sessions.db` schema: its SQLite migrations 1
/// to 6, as released (a fixture; the store's schema is
/// hatchery-sessions-schema's now).
const OLD_SCHEMA: &str = "CREATE TABLE sessions (
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
        spend_tokens INTEGER NOT NULL DEFAULT 0,
        spend_usd_cents INTEGER NOT NULL DEFAULT 0,
        spend_wall_s INTEGER NOT NULL DEFAULT 0,
        sandbox_id TEXT,
        process_id TEXT,
        snapshot_id TEXT,
        review_snapshot_id TEXT,
        waiting TEXT,
        output_offset INTEGER NOT NULL DEFAULT 0,
        agent_seq INTEGER NOT NULL DEFAULT 0,
        delivered_seq INTEGER NOT NULL DEFAULT 0,
        cancel_requested INTEGER NOT NULL DEFAULT 0,
        last_seq INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX sessions_state ON sessions(state);
    CREATE TABLE events (
        session_id TEXT NOT NULL REFERENCES sessions(id),
        seq INTEGER NOT NULL,
        at TEXT NOT NULL,
        actor TEXT NOT NULL,
        type TEXT NOT NULL,
        data TEXT NOT NULL,
        PRIMARY KEY (session_id, seq)
    ) WITHOUT ROWID;
    CREATE TABLE blobs (
        session_id TEXT NOT NULL REFERENCES sessions(id),
        ref TEXT NOT NULL,
        data BLOB NOT NULL,
        PRIMARY KEY (session_id, ref)
    ) WITHOUT ROWID;
    CREATE TABLE approvals (
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
    CREATE INDEX approvals_session ON approvals(session_id, state);
    ALTER TABLE events ADD COLUMN prev_hash TEXT;
    ALTER TABLE events ADD COLUMN hash TEXT;
    CREATE VIEW audit_events AS
        SELECT session_id AS chain, seq, at AS ts, type AS kind,
               json_set(data, '$.actor', actor) AS data, prev_hash, hash
        FROM events;
    ALTER TABLE sessions ADD COLUMN host_id TEXT NOT NULL DEFAULT 'local';
    ALTER TABLE sessions ADD COLUMN epoch INTEGER NOT NULL DEFAULT 1;
    ALTER TABLE events ADD COLUMN epoch INTEGER NOT NULL DEFAULT 1;
    CREATE INDEX sessions_host_state ON sessions(host_id, state);
    ALTER TABLE sessions ADD COLUMN replay_through INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE session_deliveries (
       session_id TEXT NOT NULL,
       key TEXT NOT NULL,
       PRIMARY KEY (session_id, key)
     );
    CREATE INDEX sessions_live_sandbox ON sessions(sandbox_id)
       WHERE state NOT IN ('completed','failed','cancelled');
    PRAGMA user_version = 6;";

/// Writes the old file: three sessions (created b, a, c: the creation
/// order is not the id order), chained events, a blob, approvals and a
/// delivery key.
fn old_file(path: &std::path::Path) {
    let c = rusqlite::Connection::open(path).unwrap();
    c.execute_batch(OLD_SCHEMA).unwrap();
    let spec = serde_json::to_string(&conformance::spec("git://127.0.0.1/old.git")).unwrap();
    for (id, state, host, epoch, sandbox, cancel) in [
        ("ses_b", "running", "local", 1, Some("sbx_b"), 0),
        ("ses_a", "completed", "local", 1, None, 0),
        ("ses_c", "idle", "local", 2, None, 1),
    ] {
        c.execute(
            "INSERT INTO sessions (id, spec, state, repo, idempotency_key, request_hash, created_at, \
             spend_tokens, sandbox_id, cancel_requested, host_id, epoch, replay_through, output_offset) \
             VALUES (?1, ?2, ?3, 'git://127.0.0.1/old.git', ?4, 'h', '2026-01-01T00:00:00.000Z', 42, ?5, ?6, ?7, ?8, 3, 99)",
            rusqlite::params![id, spec, state, format!("key-{id}"), sandbox, cancel, host, epoch],
        )
        .unwrap();
        let mut prev: Option<String> = None;
        for seq in 1..=3u64 {
            let kind = EventKind::Message {
                text: format!("{id} m{seq}"),
            };
            let data = serde_json::to_string(&kind).unwrap();
            let at = format!("2026-01-01T00:00:0{seq}.000Z");
            let (p, h) =
                seal_after(prev.as_deref(), id, seq, &at, "user", "message", &data).unwrap();
            c.execute(
                "INSERT INTO events (session_id, seq, at, actor, type, data, prev_hash, hash, epoch) \
                 VALUES (?1, ?2, ?3, 'user', 'message', ?4, ?5, ?6, ?7)",
                rusqlite::params![id, seq, at, data, p, h, epoch],
            )
            .unwrap();
            prev = Some(h);
        }
        c.execute("UPDATE sessions SET last_seq = 3 WHERE id = ?1", [id])
            .unwrap();
    }
    c.execute(
        "INSERT INTO blobs (session_id, ref, data) VALUES ('ses_b', 'b2.0', ?1)",
        [b"whole output".as_slice()],
    )
    .unwrap();
    c.execute_batch(
        "INSERT INTO approvals (id, session_id, action, details, state, created_at) \
         VALUES ('apr_1', 'ses_b', 'push', 'to main', 'pending', '2026-01-01T00:00:05.000Z');
         INSERT INTO approvals (id, session_id, action, details, state, decision, note, created_at, decided_at) \
         VALUES ('apr_0', 'ses_a', 'push', 'x', 'decided', 'approve', 'ok', '2026-01-01T00:00:04.000Z', '2026-01-01T00:00:06.000Z');
         INSERT INTO session_deliveries (session_id, key) VALUES ('ses_b', 'call-1');",
    )
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_sessions_file_is_imported_once_and_found_whole() {
    let dir = tempfile::tempdir().unwrap();
    old_file(&dir.path().join("sessions.db"));
    let db = Db::sqlite(&dir.path().join("hatchery.db")).await.unwrap();
    let s = DbSessionStore::open(db.clone(), "local").await.unwrap();
    assert_eq!(s.import_sqlite(dir.path()).await.unwrap(), Imported::Now);
    assert_eq!(s.import_sqlite(dir.path()).await.unwrap(), Imported::Before);

    // Every session, in creation order, with its fields.
    let all = s
        .list(&ListFilter {
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    let ids: Vec<_> = all.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["ses_b", "ses_a", "ses_c"]);
    let c = s.get("ses_c").await.unwrap();
    assert_eq!(c.spec, conformance::spec("git://127.0.0.1/old.git"));
    assert_eq!((c.epoch, c.last_seq, c.spend_tokens), (2, 3, 42));
    assert_eq!((c.replay_through, c.output_offset), (3, 99));
    assert!(c.cancel_requested);
    assert_eq!(c.idempotency_key.as_deref(), Some("key-ses_c"));
    let unfinished: Vec<_> = s
        .unfinished()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(unfinished, ["ses_b", "ses_c"]);
    assert_eq!(
        s.with_sandbox("sbx_b").await.unwrap().map(|s| s.id),
        Some("ses_b".into())
    );

    // Every event, blob, approval and delivery key.
    for id in ["ses_a", "ses_b", "ses_c"] {
        let evs = s.events(id, 0, 10).await.unwrap();
        assert_eq!(evs.len(), 3, "{id}");
        assert!(matches!(&evs[2].kind, EventKind::Message { text } if *text == format!("{id} m3")));
        assert_eq!(s.deliverables_after(id, 1).await.unwrap().len(), 2);
    }
    assert_eq!(
        s.blob("ses_b", "b2.0").await.unwrap().as_deref(),
        Some(b"whole output".as_slice())
    );
    assert_eq!(
        s.pending_approval("ses_b")
            .await
            .unwrap()
            .unwrap()
            .approval_id,
        "apr_1"
    );
    assert!(s.pending_approval("ses_a").await.unwrap().is_none());
    let u = s.usage("ses_b").await.unwrap();
    assert_eq!((u.events, u.blobs, u.open_approvals), (3, 1, 1));
    let msg = || {
        vec![(
            Actor::User,
            EventKind::Message {
                text: "again".into(),
            },
        )]
    };
    assert!(s
        .append_once("ses_b", "call-1", msg(), Patch::default())
        .await
        .unwrap()
        .is_none());

    // The chains verify (audit verify's reader) and keep growing.
    let ev = s.append("ses_b", msg(), Patch::default()).await.unwrap();
    assert_eq!(ev[0].seq, 4);
    let reader = AuditReader::on(db.clone()).await.unwrap();
    assert_eq!(reader.chains().await.unwrap().len(), 3);
    for id in ["ses_a", "ses_b", "ses_c"] {
        let r = reader.verify(id, &[]).await.unwrap();
        assert!(r.ok(), "{id}: {r:?}");
    }
    let heads = s.chain_heads().await.unwrap();
    assert_eq!(heads.len(), 3);
}
