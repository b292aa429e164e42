//! SQLite behind the async API: a few connections to one WAL file, every
//! statement run on the blocking pool (never on the async executor), and
//! one write transaction at a time queued on an async mutex instead of
//! SQLite's sleeping busy handler, so writers wait in order and without
//! polling. Readers run beside the writer (WAL). Another process writing
//! the same file is still serialized by `BEGIN IMMEDIATE` and the busy
//! timeout.

use crate::error::DbError;
use crate::value::{sqlite_value, Row, Value};
use rusqlite::Connection;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{OwnedMutexGuard, OwnedSemaphorePermit, Semaphore};

/// How long a statement waits for another process's write lock.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections per file: one writer and readers beside it.
pub const SQLITE_CONNECTIONS: usize = 4;

pub(crate) struct SqliteDb {
    path: PathBuf,
    /// A scratch database ([`crate::Db::sqlite_memory`]): its files are
    /// removed with the pool.
    scratch: bool,
    idle: Mutex<Vec<Connection>>,
    slots: Arc<Semaphore>,
    writer: Arc<tokio::sync::Mutex<()>>,
}

impl SqliteDb {
    /// `None` is a scratch database: a file in memory (`/dev/shm`) that
    /// behaves as the real one does (WAL, readers beside the writer, which
    /// an in-memory SQLite database does not), removed with the pool.
    pub(crate) fn open(path: Option<PathBuf>) -> Result<Arc<Self>, DbError> {
        static SCRATCH: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let scratch = path.is_none();
        let path = path.unwrap_or_else(|| {
            let n = SCRATCH.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let shm = std::path::Path::new("/dev/shm");
            let dir = if shm.is_dir() {
                shm.to_path_buf()
            } else {
                std::env::temp_dir()
            };
            dir.join(format!("hatchery-scratch-{}-{n}.db", std::process::id()))
        });
        let first = connect(&path)?;
        Ok(Arc::new(SqliteDb {
            path,
            scratch,
            idle: Mutex::new(vec![first]),
            slots: Arc::new(Semaphore::new(SQLITE_CONNECTIONS)),
            writer: Arc::new(tokio::sync::Mutex::new(())),
        }))
    }

    /// The file, unless it is a scratch database.
    pub(crate) fn path(&self) -> Option<&std::path::Path> {
        (!self.scratch).then_some(self.path.as_path())
    }

    /// A connection for reads, or with `write` the writer's turn too.
    pub(crate) async fn conn(self: &Arc<Self>, write: bool) -> Result<SqliteConn, DbError> {
        // The writer's turn first, then a connection: a writer holding a
        // connection while it queued would starve the readers.
        let turn = if write {
            Some(self.writer.clone().lock_owned().await)
        } else {
            None
        };
        let permit = self
            .slots
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let pooled = self.idle.lock().expect("poisoned").pop();
        let conn = match pooled {
            Some(c) => c,
            None => {
                let path = self.path.clone();
                tokio::task::spawn_blocking(move || connect(&path))
                    .await
                    .map_err(DbError::Task)??
            }
        };
        Ok(SqliteConn {
            conn: Some(conn),
            db: self.clone(),
            permit: Some(permit),
            turn,
        })
    }
}

fn connect(path: &std::path::Path) -> Result<Connection, DbError> {
    let c = Connection::open(path)?;
    c.busy_timeout(BUSY_TIMEOUT)?;
    c.pragma_update(None, "journal_mode", "WAL")?;
    // Every commit is on disk when it returns: the audit log and the
    // broker's call records promise that, and one file means one setting.
    c.pragma_update(None, "synchronous", "FULL")?;
    c.pragma_update(None, "foreign_keys", true)?;
    Ok(c)
}

impl Drop for SqliteDb {
    fn drop(&mut self) {
        if self.scratch {
            // The last connection is gone with the pool's `idle` list.
            self.idle.get_mut().map(|v| v.clear()).ok();
            for ext in ["", "-wal", "-shm"] {
                let mut p = self.path.clone().into_os_string();
                p.push(ext);
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

/// A pooled connection; back to the pool when dropped.
pub(crate) struct SqliteConn {
    conn: Option<Connection>,
    db: Arc<SqliteDb>,
    permit: Option<OwnedSemaphorePermit>,
    turn: Option<OwnedMutexGuard<()>>,
}

impl SqliteConn {
    /// Runs `f` on the blocking pool with the connection.
    pub(crate) async fn run<R: Send + 'static>(
        &mut self,
        f: impl FnOnce(&mut Connection) -> Result<R, DbError> + Send + 'static,
    ) -> Result<R, DbError> {
        let mut conn = self
            .conn
            .take()
            .ok_or_else(|| DbError::Sqlite(rusqlite::Error::InvalidQuery))?;
        let (conn, out) = tokio::task::spawn_blocking(move || {
            let out = f(&mut conn);
            (conn, out)
        })
        .await
        .map_err(DbError::Task)?;
        self.conn = Some(conn);
        out
    }
}

impl Drop for SqliteConn {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else { return };
        if conn.is_autocommit() {
            self.db.idle.lock().expect("poisoned").push(conn);
            return;
        }
        // Left inside a transaction (an error, a dropped future): roll it
        // back on the blocking pool, holding the writer's turn and the
        // slot until it has, then pool the connection again.
        let db = self.db.clone();
        let held = (self.permit.take(), self.turn.take());
        let job = move || {
            if conn
                .execute_batch("ROLLBACK; PRAGMA synchronous=FULL")
                .is_ok()
                && conn.is_autocommit()
            {
                db.idle.lock().expect("poisoned").push(conn);
            }
            drop(held);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn_blocking(job);
            }
            Err(_) => job(),
        }
    }
}

pub(crate) fn query(c: &Connection, sql: &str, args: &[Value]) -> Result<Vec<Row>, DbError> {
    let mut st = c.prepare_cached(sql)?;
    let names: Arc<[String]> = st.column_names().iter().map(|n| n.to_string()).collect();
    let n = names.len();
    let mut rows = st.query(rusqlite::params_from_iter(args.iter()))?;
    let mut out = Vec::new();
    while let Some(r) = rows.next()? {
        let mut values = Vec::with_capacity(n);
        for i in 0..n {
            values.push(sqlite_value(r.get_ref(i)?));
        }
        out.push(Row {
            names: names.clone(),
            values,
        });
    }
    Ok(out)
}

pub(crate) fn execute(c: &Connection, sql: &str, args: &[Value]) -> Result<u64, DbError> {
    let mut st = c.prepare_cached(sql)?;
    Ok(st.execute(rusqlite::params_from_iter(args.iter()))? as u64)
}
