//! SQLite state: sandboxes, their metadata and expiry, and lifecycle events.
//! Expiry lives here so that a restarted daemon still kills what expired
//! while it was down. One connection behind a mutex is plenty: writes are
//! a few per sandbox lifetime.

use rusqlite::{params, Connection, OptionalExtension};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

#[derive(Debug, Clone, PartialEq)]
pub struct SandboxRow {
    pub id: String,
    pub template: String,
    pub state: String,
    pub created_at_ms: u64,
    pub expires_at_ms: u64,
    pub metadata: BTreeMap<String, String>,
    pub env: BTreeMap<String, String>,
}

pub const STATE_STARTING: &str = "starting";
pub const STATE_RUNNING: &str = "running";
pub const STATE_STOPPED: &str = "stopped";
/// Restored from a template checkpoint, never touched by a request, waiting
/// in the warm pool. Invisible to the API.
pub const STATE_POOLED: &str = "pooled";

#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotRow {
    pub id: String,
    pub sandbox_id: String,
    pub template: String,
    pub created_at_ms: u64,
    pub expires_at_ms: u64,
    pub size_bytes: u64,
    pub metadata: BTreeMap<String, String>,
    /// The sandbox's create-time env, inherited by forks.
    pub env: BTreeMap<String, String>,
    /// What the snapshot must be restored on: the rootfs and resource
    /// shape of its sandbox, independent of later template rebuilds.
    pub rootfs: String,
    pub limits: String,
}

pub struct Store {
    conn: Mutex<Connection>,
}

type Result<T> = std::result::Result<T, rusqlite::Error>;

impl Store {
    pub fn open(path: &Path) -> Result<Store> {
        let conn = Connection::open(path)?;
        conn.execute_batch(
            "PRAGMA journal_mode=WAL;
             PRAGMA synchronous=NORMAL;
             PRAGMA busy_timeout=5000;
             CREATE TABLE IF NOT EXISTS sandboxes (
               id TEXT PRIMARY KEY,
               template TEXT NOT NULL,
               state TEXT NOT NULL,
               created_at_ms INTEGER NOT NULL,
               expires_at_ms INTEGER NOT NULL,
               ended_at_ms INTEGER,
               end_reason TEXT,
               metadata TEXT NOT NULL,
               env TEXT NOT NULL
             );
             CREATE INDEX IF NOT EXISTS sandboxes_state ON sandboxes(state, expires_at_ms);
             CREATE TABLE IF NOT EXISTS events (
               seq INTEGER PRIMARY KEY AUTOINCREMENT,
               sandbox_id TEXT NOT NULL,
               at_ms INTEGER NOT NULL,
               kind TEXT NOT NULL,
               detail TEXT NOT NULL
             );
             CREATE INDEX IF NOT EXISTS events_sandbox ON events(sandbox_id, seq);
             CREATE TABLE IF NOT EXISTS snapshots (
               id TEXT PRIMARY KEY,
               sandbox_id TEXT NOT NULL,
               template TEXT NOT NULL,
               created_at_ms INTEGER NOT NULL,
               expires_at_ms INTEGER NOT NULL,
               size_bytes INTEGER NOT NULL,
               metadata TEXT NOT NULL,
               env TEXT NOT NULL,
               rootfs TEXT NOT NULL,
               limits TEXT NOT NULL
             );
             -- The network slot a live sandbox holds and its policy, so a
             -- restarted daemon keeps both for the sandboxes it adopts.
             CREATE TABLE IF NOT EXISTS sandbox_net (
               id TEXT PRIMARY KEY,
               slot INTEGER NOT NULL,
               policy TEXT NOT NULL
             );",
        )?;
        Ok(Store {
            conn: Mutex::new(conn),
        })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn insert(&self, r: &SandboxRow) -> Result<()> {
        let c = self.conn();
        c.execute(
            "INSERT INTO sandboxes (id, template, state, created_at_ms, expires_at_ms, metadata, env)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                r.id,
                r.template,
                r.state,
                r.created_at_ms as i64,
                r.expires_at_ms as i64,
                serde_json::to_string(&r.metadata).unwrap_or_default(),
                serde_json::to_string(&r.env).unwrap_or_default()
            ],
        )?;
        event(&c, &r.id, "created", &r.template)
    }

    pub fn set_running(&self, id: &str) -> Result<()> {
        let c = self.conn();
        c.execute(
            "UPDATE sandboxes SET state=?2 WHERE id=?1",
            params![id, STATE_RUNNING],
        )?;
        event(&c, id, "running", "")
    }

    /// Marks a sandbox stopped; returns false if it already was.
    pub fn stop(&self, id: &str, reason: &str, now_ms: u64) -> Result<bool> {
        let c = self.conn();
        let n = c.execute(
            "UPDATE sandboxes SET state=?2, ended_at_ms=?3, end_reason=?4 WHERE id=?1 AND state != ?2",
            params![id, STATE_STOPPED, now_ms as i64, reason],
        )?;
        if n > 0 {
            event(&c, id, "stopped", reason)?;
        }
        Ok(n > 0)
    }

    pub fn set_expiry(&self, id: &str, expires_at_ms: u64) -> Result<bool> {
        let c = self.conn();
        let n = c.execute(
            "UPDATE sandboxes SET expires_at_ms=?2 WHERE id=?1 AND state != ?3",
            params![id, expires_at_ms as i64, STATE_STOPPED],
        )?;
        if n > 0 {
            event(&c, id, "ttl", &expires_at_ms.to_string())?;
        }
        Ok(n > 0)
    }

    pub fn get_live(&self, id: &str) -> Result<Option<SandboxRow>> {
        let c = self.conn();
        c.query_row(
            &format!("{SELECT} WHERE id=?1 AND state IN (?2, ?3)"),
            params![id, STATE_STARTING, STATE_RUNNING],
            row,
        )
        .optional()
    }

    pub fn list_live(&self) -> Result<Vec<SandboxRow>> {
        let c = self.conn();
        let mut st = c.prepare(&format!(
            "{SELECT} WHERE state IN (?1, ?2) ORDER BY created_at_ms"
        ))?;
        let rows = st.query_map(params![STATE_STARTING, STATE_RUNNING], row)?;
        rows.collect()
    }

    /// Every row not stopped, pooled ones included: what reconcile must
    /// account for on the host.
    pub fn list_unstopped(&self) -> Result<Vec<SandboxRow>> {
        let c = self.conn();
        let mut st = c.prepare(&format!(
            "{SELECT} WHERE state != ?1 ORDER BY created_at_ms"
        ))?;
        let rows = st.query_map(params![STATE_STOPPED], row)?;
        rows.collect()
    }

    /// Hands a pooled sandbox to a request: from here on it is a normal,
    /// running sandbox whose lifetime starts now.
    pub fn claim(&self, id: &str, r: &SandboxRow) -> Result<bool> {
        let c = self.conn();
        let n = c.execute(
            "UPDATE sandboxes SET state=?2, created_at_ms=?3, expires_at_ms=?4, metadata=?5, env=?6
             WHERE id=?1 AND state=?7",
            params![
                id,
                STATE_RUNNING,
                r.created_at_ms as i64,
                r.expires_at_ms as i64,
                serde_json::to_string(&r.metadata).unwrap_or_default(),
                serde_json::to_string(&r.env).unwrap_or_default(),
                STATE_POOLED
            ],
        )?;
        if n > 0 {
            event(&c, id, "claimed", "")?;
        }
        Ok(n > 0)
    }

    pub fn set_state(&self, id: &str, state: &str) -> Result<()> {
        let c = self.conn();
        c.execute(
            "UPDATE sandboxes SET state=?2 WHERE id=?1",
            params![id, state],
        )?;
        event(&c, id, state, "")
    }

    pub fn insert_snapshot(&self, s: &SnapshotRow) -> Result<()> {
        self.conn().execute(
            "INSERT INTO snapshots (id, sandbox_id, template, created_at_ms, expires_at_ms, size_bytes, metadata, env, rootfs, limits)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            params![
                s.id,
                s.sandbox_id,
                s.template,
                s.created_at_ms as i64,
                s.expires_at_ms as i64,
                s.size_bytes as i64,
                serde_json::to_string(&s.metadata).unwrap_or_default(),
                serde_json::to_string(&s.env).unwrap_or_default(),
                s.rootfs,
                s.limits
            ],
        )?;
        Ok(())
    }

    pub fn get_snapshot(&self, id: &str) -> Result<Option<SnapshotRow>> {
        self.conn()
            .query_row(&format!("{SNAP_SELECT} WHERE id=?1"), params![id], snap_row)
            .optional()
    }

    pub fn list_snapshots(&self) -> Result<Vec<SnapshotRow>> {
        let c = self.conn();
        let mut st = c.prepare(&format!("{SNAP_SELECT} ORDER BY created_at_ms"))?;
        let rows = st.query_map([], snap_row)?;
        rows.collect()
    }

    pub fn count_snapshots_of(&self, template: &str) -> Result<u64> {
        self.conn().query_row(
            "SELECT COUNT(*) FROM snapshots WHERE template=?1",
            params![template],
            |r| r.get::<_, i64>(0).map(|n| n as u64),
        )
    }

    pub fn delete_snapshot(&self, id: &str) -> Result<bool> {
        Ok(self
            .conn()
            .execute("DELETE FROM snapshots WHERE id=?1", params![id])?
            > 0)
    }

    pub fn expired_snapshots(&self, now_ms: u64) -> Result<Vec<String>> {
        let c = self.conn();
        let mut st = c.prepare("SELECT id FROM snapshots WHERE expires_at_ms <= ?1")?;
        let rows = st.query_map(params![now_ms as i64], |r| r.get(0))?;
        rows.collect()
    }

    pub fn expired(&self, now_ms: u64) -> Result<Vec<String>> {
        let c = self.conn();
        let mut st =
            c.prepare("SELECT id FROM sandboxes WHERE state != ?1 AND expires_at_ms <= ?2")?;
        let rows = st.query_map(params![STATE_STOPPED, now_ms as i64], |r| r.get(0))?;
        rows.collect()
    }

    pub fn events(&self, id: &str) -> Result<Vec<(u64, String, String)>> {
        let c = self.conn();
        let mut st =
            c.prepare("SELECT at_ms, kind, detail FROM events WHERE sandbox_id=?1 ORDER BY seq")?;
        let rows = st.query_map(params![id], |r| {
            Ok((r.get::<_, i64>(0)? as u64, r.get(1)?, r.get(2)?))
        })?;
        rows.collect()
    }
}

impl Store {
    pub fn set_net(&self, id: &str, slot: u32, policy: &str) -> Result<()> {
        self.conn().execute(
            "INSERT INTO sandbox_net (id, slot, policy) VALUES (?1, ?2, ?3)
             ON CONFLICT(id) DO UPDATE SET slot=?2, policy=?3",
            params![id, slot, policy],
        )?;
        Ok(())
    }

    pub fn event(&self, id: &str, kind: &str, detail: &str) -> Result<()> {
        event(&self.conn(), id, kind, detail)
    }

    pub fn clear_net(&self, id: &str) -> Result<()> {
        self.conn()
            .execute("DELETE FROM sandbox_net WHERE id=?1", params![id])?;
        Ok(())
    }

    /// (sandbox, slot, policy JSON) of every recorded slot.
    pub fn all_net(&self) -> Result<Vec<(String, u32, String)>> {
        let c = self.conn();
        let mut st = c.prepare("SELECT id, slot, policy FROM sandbox_net")?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        rows.collect()
    }
}

const SELECT: &str =
    "SELECT id, template, state, created_at_ms, expires_at_ms, metadata, env FROM sandboxes";

fn row(r: &rusqlite::Row<'_>) -> Result<SandboxRow> {
    let metadata: String = r.get(5)?;
    let env: String = r.get(6)?;
    Ok(SandboxRow {
        id: r.get(0)?,
        template: r.get(1)?,
        state: r.get(2)?,
        created_at_ms: r.get::<_, i64>(3)? as u64,
        expires_at_ms: r.get::<_, i64>(4)? as u64,
        metadata: serde_json::from_str(&metadata).unwrap_or_default(),
        env: serde_json::from_str(&env).unwrap_or_default(),
    })
}

const SNAP_SELECT: &str =
    "SELECT id, sandbox_id, template, created_at_ms, expires_at_ms, size_bytes, metadata, env, rootfs, limits FROM snapshots";

fn snap_row(r: &rusqlite::Row<'_>) -> Result<SnapshotRow> {
    let metadata: String = r.get(6)?;
    let env: String = r.get(7)?;
    Ok(SnapshotRow {
        id: r.get(0)?,
        sandbox_id: r.get(1)?,
        template: r.get(2)?,
        created_at_ms: r.get::<_, i64>(3)? as u64,
        expires_at_ms: r.get::<_, i64>(4)? as u64,
        size_bytes: r.get::<_, i64>(5)? as u64,
        metadata: serde_json::from_str(&metadata).unwrap_or_default(),
        env: serde_json::from_str(&env).unwrap_or_default(),
        rootfs: r.get(8)?,
        limits: r.get(9)?,
    })
}

fn event(c: &Connection, id: &str, kind: &str, detail: &str) -> Result<()> {
    c.execute(
        "INSERT INTO events (sandbox_id, at_ms, kind, detail) VALUES (?1, ?2, ?3, ?4)",
        params![id, crate::now_ms() as i64, kind, detail],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp_store() -> (Store, std::path::PathBuf) {
        let p = std::env::temp_dir().join(format!(
            "hx-store-{}-{}.db",
            std::process::id(),
            rand::random::<u32>()
        ));
        (Store::open(&p).unwrap(), p)
    }

    #[test]
    fn lifecycle_and_expiry_survive_reopen() {
        let (s, path) = tmp_store();
        let mut md = BTreeMap::new();
        md.insert("k".to_string(), "v".to_string());
        let r = SandboxRow {
            id: "sbx_a".into(),
            template: "t".into(),
            state: STATE_STARTING.into(),
            created_at_ms: 1,
            expires_at_ms: 100,
            metadata: md,
            env: BTreeMap::new(),
        };
        s.insert(&r).unwrap();
        s.set_running("sbx_a").unwrap();
        assert_eq!(s.expired(50).unwrap(), Vec::<String>::new());
        drop(s);
        let s = Store::open(&path).unwrap();
        assert_eq!(s.expired(100).unwrap(), vec!["sbx_a".to_string()]);
        assert_eq!(s.get_live("sbx_a").unwrap().unwrap().metadata["k"], "v");
        assert!(s.set_expiry("sbx_a", 500).unwrap());
        assert!(s.expired(100).unwrap().is_empty());
        assert!(s.stop("sbx_a", "deleted", 2).unwrap());
        assert!(
            !s.stop("sbx_a", "deleted", 3).unwrap(),
            "second stop is a no-op"
        );
        assert!(s.get_live("sbx_a").unwrap().is_none());
        assert!(!s.set_expiry("sbx_a", 900).unwrap());
        let kinds: Vec<String> = s
            .events("sbx_a")
            .unwrap()
            .into_iter()
            .map(|e| e.1)
            .collect();
        assert_eq!(kinds, ["created", "running", "ttl", "stopped"]);
        std::fs::remove_file(path).ok();
    }
}
