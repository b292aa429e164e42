//! Upgrading a single-host data dir: the previous release's
//! `DATA_DIR/rounds.db` (its own tables, unprefixed) is copied into the
//! one database once, and every row is found through the store.

use hatchery_db::{Db, Imported};
use hatchery_rounds::state::{RoundState, SessionState};
use hatchery_rounds::store::{DbStore, RoundStore, RunRecord, Scope, IMPORT};

/// The previous release's rounds.db at its last schema (its
/// `store/migrations.rs`, step 1, verbatim), with a few rows.
const OLD: &str = "CREATE TABLE rounds (
       id TEXT PRIMARY KEY,
       name TEXT NOT NULL,
       state TEXT NOT NULL,
       template TEXT NOT NULL,
       template_version TEXT NOT NULL,
       spec TEXT NOT NULL,
       tests TEXT NOT NULL,
       prepared_snapshot TEXT,
       error TEXT,
       created_at_ms INTEGER NOT NULL
     );
     CREATE TABLE sessions (
       id TEXT PRIMARY KEY,
       round_id TEXT NOT NULL REFERENCES rounds(id),
       candidate TEXT NOT NULL,
       state TEXT NOT NULL,
       sandbox_id TEXT,
       created_at_ms INTEGER NOT NULL,
       expires_at_ms INTEGER NOT NULL,
       error TEXT
     );
     CREATE INDEX sessions_round ON sessions(round_id, created_at_ms);
     CREATE INDEX sessions_expiry ON sessions(state, expires_at_ms);
     CREATE TABLE tokens (
       hash TEXT PRIMARY KEY,
       scope TEXT NOT NULL,
       round_id TEXT NOT NULL,
       session_id TEXT,
       created_at_ms INTEGER NOT NULL,
       expires_at_ms INTEGER NOT NULL
     );
     CREATE TABLE runs (
       seq INTEGER PRIMARY KEY AUTOINCREMENT,
       id TEXT NOT NULL UNIQUE,
       session_id TEXT NOT NULL,
       created_at_ms INTEGER NOT NULL,
       result TEXT NOT NULL
     );
     CREATE INDEX runs_session ON runs(session_id, seq);
     CREATE TABLE submissions (
       seq INTEGER PRIMARY KEY AUTOINCREMENT,
       id TEXT NOT NULL UNIQUE,
       session_id TEXT NOT NULL,
       round_id TEXT NOT NULL,
       files TEXT NOT NULL,
       sha256 TEXT NOT NULL,
       created_at_ms INTEGER NOT NULL
     );
     CREATE INDEX submissions_session ON submissions(session_id, seq);
     CREATE TABLE gradings (
       seq INTEGER PRIMARY KEY AUTOINCREMENT,
       id TEXT NOT NULL UNIQUE,
       submission_id TEXT NOT NULL,
       created_at_ms INTEGER NOT NULL,
       status TEXT NOT NULL,
       passed INTEGER NOT NULL,
       total INTEGER NOT NULL,
       report TEXT NOT NULL
     );
     CREATE INDEX gradings_submission ON gradings(submission_id, seq);
     CREATE TABLE replays (
       id TEXT PRIMARY KEY,
       session_id TEXT NOT NULL,
       round_id TEXT NOT NULL,
       snapshot_id TEXT NOT NULL,
       reason TEXT NOT NULL,
       created_at_ms INTEGER NOT NULL,
       expires_at_ms INTEGER NOT NULL,
       state TEXT NOT NULL
     );
     CREATE INDEX replays_session ON replays(session_id, created_at_ms);
     CREATE INDEX replays_due ON replays(state, expires_at_ms);
     CREATE TABLE forks (
       id TEXT PRIMARY KEY,
       replay_id TEXT NOT NULL,
       round_id TEXT NOT NULL,
       sandbox_id TEXT NOT NULL,
       owner TEXT NOT NULL,
       created_at_ms INTEGER NOT NULL,
       expires_at_ms INTEGER NOT NULL
     );
     PRAGMA user_version = 1;
     INSERT INTO rounds VALUES ('rnd_a', 'Two sum', 'ready', 'python', 'v3',
       '{\"language\":\"python\"}', '{\"cases\":[]}', 'snp_a', NULL, 10);
     INSERT INTO rounds VALUES ('rnd_b', 'Broken', 'failed', 'python', 'v3', '{}', '{}',
       NULL, 'setup failed', 20);
     INSERT INTO sessions VALUES ('ses_a', 'rnd_a', 'Ada', 'graded', 'sbx_a', 11, 5000, NULL);
     INSERT INTO sessions VALUES ('ses_b', 'rnd_a', 'Bob', 'ended', NULL, 12, 6000, 'expired');
     INSERT INTO tokens VALUES ('h_rev', 'reviewer', 'rnd_a', NULL, 10, 9000);
     INSERT INTO tokens VALUES ('h_ses_a', 'candidate', 'rnd_a', 'ses_a', 11, 5000);
     INSERT INTO runs (seq, id, session_id, created_at_ms, result)
       VALUES (7, 'run_1', 'ses_a', 30, '{\"n\":1}'), (9, 'run_2', 'ses_a', 20, '{\"n\":2}');
     INSERT INTO submissions (seq, id, session_id, round_id, files, sha256, created_at_ms)
       VALUES (3, 'sub_a', 'ses_a', 'rnd_a', '{\"main.py\":\"x\"}', 'sha_a', 40);
     INSERT INTO gradings (seq, id, submission_id, created_at_ms, status, passed, total, report)
       VALUES (4, 'grd_1', 'sub_a', 50, 'graded', 4294967295, 4294967295, '{}'),
              (5, 'grd_2', 'sub_a', 45, 'error', 0, 2, '{\"e\":1}');
     INSERT INTO replays VALUES ('rpl_a', 'ses_b', 'rnd_a', 'snp_r', 'end', 60, 70, 'active');
     INSERT INTO forks VALUES ('frk_a', 'rpl_a', 'rnd_a', 'sbx_f', 'api_key', 61, 71);";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_previous_release_rounds_db_is_imported_once_and_whole() {
    let dir = tempfile::tempdir().unwrap();
    let old = Db::sqlite(&dir.path().join("rounds.db")).await.unwrap();
    let mut tx = old.begin().await.unwrap();
    tx.batch(OLD).await.unwrap();
    tx.commit().await.unwrap();
    drop(old);

    let db = Db::sqlite(&dir.path().join("hatchery.db")).await.unwrap();
    let s = DbStore::open(db.clone()).await.unwrap();
    assert_eq!(
        db.import_sqlite(dir.path(), &IMPORT).await.unwrap(),
        Imported::Now
    );
    // A second start finds it done (and would not copy twice).
    let s2 = DbStore::open(db.clone()).await.unwrap();
    assert_eq!(
        db.import_sqlite(dir.path(), &IMPORT).await.unwrap(),
        Imported::Before
    );

    let rounds = s2.list_rounds().await.unwrap();
    assert_eq!(
        rounds.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["rnd_a", "rnd_b"]
    );
    let a = s.get_round("rnd_a").await.unwrap().unwrap();
    assert_eq!(
        (
            a.state,
            a.name.as_str(),
            a.spec.as_str(),
            a.prepared_snapshot.as_deref()
        ),
        (
            RoundState::Ready,
            "Two sum",
            r#"{"language":"python"}"#,
            Some("snp_a")
        )
    );
    let b = s.get_round("rnd_b").await.unwrap().unwrap();
    assert_eq!(
        (b.state, b.error.as_deref(), b.created_at_ms),
        (RoundState::Failed, Some("setup failed"), 20)
    );

    let sessions = s.list_sessions("rnd_a").await.unwrap();
    assert_eq!(sessions.len(), 2);
    assert_eq!(
        (
            sessions[0].id.as_str(),
            sessions[0].state,
            sessions[0].sandbox_id.as_deref(),
            sessions[0].expires_at_ms
        ),
        ("ses_a", SessionState::Graded, Some("sbx_a"), 5000)
    );
    assert_eq!(
        (sessions[1].state, sessions[1].error.as_deref()),
        (SessionState::Ended, Some("expired"))
    );

    let rev = s.get_token("h_rev").await.unwrap().unwrap();
    assert_eq!(
        (rev.scope, rev.session_id, rev.expires_at_ms),
        (Scope::Reviewer, None, 9000)
    );
    let cand = s.get_token("h_ses_a").await.unwrap().unwrap();
    assert_eq!(
        (cand.scope, cand.session_id.as_deref()),
        (Scope::Candidate, Some("ses_a"))
    );

    // Runs keep their order (by seq, not by time), and a new run numbers
    // after the imported ones.
    let runs = s.list_runs("ses_a").await.unwrap();
    assert_eq!(
        runs.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["run_1", "run_2"]
    );
    assert_eq!(runs[0].result, r#"{"n":1}"#);
    s.insert_run(
        &RunRecord {
            id: "run_3".into(),
            session_id: "ses_a".into(),
            created_at_ms: 1,
            result: "{}".into(),
        },
        2,
    )
    .await
    .unwrap();
    assert_eq!(
        s.list_runs("ses_a")
            .await
            .unwrap()
            .iter()
            .map(|r| r.id.as_str())
            .collect::<Vec<_>>(),
        ["run_2", "run_3"]
    );

    let subs = s.list_submissions("ses_a").await.unwrap();
    assert_eq!(subs.len(), 1);
    assert_eq!(
        s.get_submission("sub_a").await.unwrap(),
        Some(subs[0].clone())
    );
    assert_eq!(subs[0].files, r#"{"main.py":"x"}"#);
    let gradings = s.list_gradings("sub_a").await.unwrap();
    assert_eq!(
        gradings
            .iter()
            .map(|g| (g.id.as_str(), g.status.as_str(), g.passed, g.total))
            .collect::<Vec<_>>(),
        [
            ("grd_1", "graded", u32::MAX, u32::MAX),
            ("grd_2", "error", 0, 2)
        ]
    );
    // A graded submission stays graded: no second first grading.
    let mut late = gradings[0].clone();
    late.id = "grd_3".into();
    assert!(!s.finish_grading(&late, "ses_a").await.unwrap());

    let rpl = s.get_replay("rpl_a").await.unwrap().unwrap();
    assert_eq!((rpl.state.as_str(), rpl.expires_at_ms), ("active", 70));
    assert_eq!(
        s.due_replays(70)
            .await
            .unwrap()
            .iter()
            .map(|r| r.id.as_str())
            .collect::<Vec<_>>(),
        ["rpl_a"]
    );
    let forks = s.list_forks("rpl_a").await.unwrap();
    assert_eq!(forks.len(), 1);
    assert_eq!(
        (forks[0].owner.as_str(), forks[0].sandbox_id.as_str()),
        ("api_key", "sbx_f")
    );
    assert_eq!(s.get_fork("frk_a").await.unwrap(), Some(forks[0].clone()));
}
