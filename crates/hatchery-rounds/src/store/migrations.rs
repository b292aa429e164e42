//! Numbered schema migrations. `PRAGMA user_version` records how many have
//! run; each runs in its own transaction with the version bump, so a crash
//! leaves the schema at one version or the next, never between.

use rusqlite::Connection;

pub const MIGRATIONS: &[(u32, &str)] = &[(
    1,
    "CREATE TABLE rounds (
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
     );",
)];

pub fn migrate(conn: &mut Connection) -> rusqlite::Result<u32> {
    let mut version: u32 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    for (n, sql) in MIGRATIONS {
        if *n <= version {
            continue;
        }
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", n)?;
        tx.commit()?;
        version = *n;
    }
    Ok(version)
}

#[cfg(test)]
mod tests {
    #[test]
    fn numbered_and_idempotent() {
        let mut c = rusqlite::Connection::open_in_memory().unwrap();
        for (i, (n, _)) in super::MIGRATIONS.iter().enumerate() {
            assert_eq!(*n as usize, i + 1, "migrations are numbered 1, 2, ...");
        }
        let v = super::migrate(&mut c).unwrap();
        assert_eq!(v as usize, super::MIGRATIONS.len());
        assert_eq!(
            super::migrate(&mut c).unwrap(),
            v,
            "a second run changes nothing"
        );
    }
}
