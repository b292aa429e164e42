//! One database per deployment. A daemon opens one [`Db`]: a SQLite file
//! in its data dir (the default) or a PostgreSQL URL (many hosts), with
//! one pool either way. Every product's store is its queries over a
//! [`Tx`] from it, written once in the SQL both databases share
//! ([`dialect`] says which subset, and rewrites the little that differs
//! for SQLite), and its schema is a numbered [`Migrations`] set run by the
//! one runner here, recorded in the one `hatchery_migrations` table.
//! Because every product writes the same database, one transaction can
//! span two products: the broker's call and the session events it writes
//! commit together or not at all.
//!
//! Contract of a [`Tx`]:
//! - [`Db::begin`] is a write transaction. On SQLite writers take turns
//!   (one at a time, queued in order, the file's write lock taken at
//!   `BEGIN IMMEDIATE`), so a read-then-write in one is never raced; on
//!   PostgreSQL it is READ COMMITTED and a store that reads before it
//!   writes locks what it read (`FOR UPDATE`, or [`Tx::lock`]).
//! - [`Db::read`] is a read-only snapshot (REPEATABLE READ on PostgreSQL,
//!   a deferred transaction on SQLite's WAL).
//! - Nothing is written unless [`Tx::commit`] returns `Ok`. A `Tx`
//!   dropped without it (an error, a cancelled future) is rolled back in
//!   the background and its connection reused.
//! - SQLite work runs on tokio's blocking pool, never on the executor.

mod dialect;
mod error;
mod import;
mod joined;
mod migrate;
pub mod pg_pool;
mod race;
mod record;
mod sqlite;
mod value;
mod wait;

pub use dialect::{sqlite_schema, sqlite_sql, Dialect};
pub use error::DbError;
pub use import::{Import, Imported};
pub use joined::{Alone, Joined};
pub use migrate::{MigrateError, Migrations, Step, MIGRATIONS_TABLE};
pub use pg_pool::{
    pg_message, pg_pool, pg_pool_read_only, pg_unavailable, PoolConfigError, POOL_TIMEOUT,
    TCP_USER_TIMEOUT,
};
pub use race::{race, run_id};
pub use record::{Record, ToValue};
// For `json!`.
#[doc(hidden)]
pub use serde_json;
pub use sqlite::{BUSY_TIMEOUT, SQLITE_CONNECTIONS};
pub use value::{bind, ColumnIndex, FromValue, Row, Value};
pub use wait::{retry_while_unreachable, STARTUP_WAIT};

use sqlite::{SqliteConn, SqliteDb};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The database's file name in a data dir.
pub const DB_FILE: &str = "hatchery.db";
/// Default PostgreSQL connections per daemon.
pub const DEFAULT_PG_POOL: usize = 16;

/// The deployment's database; cheap to clone (one pool behind it).
#[derive(Clone)]
pub struct Db {
    backend: Backend,
}

#[derive(Clone)]
enum Backend {
    Sqlite(Arc<SqliteDb>),
    Pg(deadpool_postgres::Pool),
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl Db {
    /// The SQLite file at `path` (created if missing).
    pub async fn sqlite(path: &Path) -> Result<Db, DbError> {
        let path = path.to_path_buf();
        let db = tokio::task::spawn_blocking(move || SqliteDb::open(Some(path)))
            .await
            .map_err(DbError::Task)??;
        Ok(Db {
            backend: Backend::Sqlite(db),
        })
    }

    /// A private scratch SQLite database, removed when the last clone
    /// goes (tests).
    pub fn sqlite_memory() -> Result<Db, DbError> {
        Ok(Db {
            backend: Backend::Sqlite(SqliteDb::open(None)?),
        })
    }

    /// A PostgreSQL database; connects lazily, at most `pool` at once.
    pub fn postgres(dsn: &str, pool: usize) -> Result<Db, DbError> {
        Ok(Db {
            backend: Backend::Pg(pg_pool(dsn, pool)?),
        })
    }

    /// The same, every connection read-only (`hatchery audit verify`).
    pub fn postgres_read_only(dsn: &str, pool: usize) -> Result<Db, DbError> {
        Ok(Db {
            backend: Backend::Pg(pg_pool_read_only(dsn, pool)?),
        })
    }

    /// `postgres://` or `postgresql://` (or a libpq `key=value` string
    /// with `host=`) opens PostgreSQL; anything else is a SQLite path.
    pub async fn open(address: &str) -> Result<Db, DbError> {
        if is_postgres(address) {
            Db::postgres(address, DEFAULT_PG_POOL)
        } else {
            Db::sqlite(Path::new(address)).await
        }
    }

    pub fn dialect(&self) -> Dialect {
        match self.backend {
            Backend::Sqlite(_) => Dialect::Sqlite,
            Backend::Pg(_) => Dialect::Postgres,
        }
    }

    /// For logs: the file, or "postgres" (never the URL: it may carry a
    /// password).
    pub fn describe(&self) -> String {
        match &self.backend {
            Backend::Sqlite(s) => match s.path() {
                Some(p) => format!("sqlite {}", p.display()),
                None => "sqlite scratch".into(),
            },
            Backend::Pg(_) => "postgres".into(),
        }
    }

    /// The SQLite file, if this is one.
    pub fn sqlite_path(&self) -> Option<PathBuf> {
        match &self.backend {
            Backend::Sqlite(s) => s.path().map(Path::to_path_buf),
            Backend::Pg(_) => None,
        }
    }

    fn sqlite_db(&self) -> Option<&Arc<SqliteDb>> {
        match &self.backend {
            Backend::Sqlite(s) => Some(s),
            Backend::Pg(_) => None,
        }
    }

    /// The PostgreSQL pool, for a store not yet moved onto [`Tx`] (it
    /// then shares this pool rather than opening its own).
    pub fn pg_pool(&self) -> Option<&deadpool_postgres::Pool> {
        match &self.backend {
            Backend::Pg(p) => Some(p),
            Backend::Sqlite(_) => None,
        }
    }

    /// A write transaction (see the crate's contract): on disk when
    /// its commit returns.
    pub async fn begin(&self) -> Result<Tx, DbError> {
        self.start(Mode::Write).await
    }

    /// A write transaction whose commit returns before it is on disk, on
    /// SQLite (`synchronous=NORMAL` in WAL): atomic and isolated as any
    /// other, safe against a crash of the process, durable at the next
    /// durable commit or checkpoint, but a power loss or OS crash (which
    /// ends this host's sandboxes too) can lose the last few. For state
    /// the daemon can rebuild (a sandbox row, its lifecycle events), never
    /// for a record that promises an effect was logged before it happened.
    /// On PostgreSQL it is [`Db::begin`]: there the database is shared and
    /// can crash on its own (`synchronous_commit = off` would lose commits
    /// hosts have acted on; `tests/store/test_faults.py` kills it to check).
    pub async fn begin_relaxed(&self) -> Result<Tx, DbError> {
        self.start(Mode::Relaxed).await
    }

    /// A read-only snapshot.
    pub async fn read(&self) -> Result<Tx, DbError> {
        self.start(Mode::Read).await
    }

    async fn start(&self, mode: Mode) -> Result<Tx, DbError> {
        let conn = match &self.backend {
            Backend::Sqlite(db) => {
                let c = db.conn(mode != Mode::Read).await?;
                // Sent with the first statement, in the same trip to the
                // blocking pool (the writer's turn is already held).
                let begin = match mode {
                    Mode::Read => "BEGIN",
                    Mode::Write => "BEGIN IMMEDIATE",
                    Mode::Relaxed => "PRAGMA synchronous=NORMAL; BEGIN IMMEDIATE",
                };
                return Ok(Tx {
                    conn: Conn::Sqlite(c),
                    begin: Some(begin),
                });
            }
            Backend::Pg(pool) => {
                let c = pool.get().await?;
                let begin = match mode {
                    Mode::Read => "BEGIN READ ONLY ISOLATION LEVEL REPEATABLE READ",
                    Mode::Write | Mode::Relaxed => "BEGIN",
                };
                c.batch_execute(begin).await?;
                Conn::Pg(Some(c))
            }
        };
        Ok(Tx { conn, begin: None })
    }

    /// One statement on its own (atomic by itself; no BEGIN/COMMIT round
    /// trips, one blocking hop on SQLite).
    pub async fn execute(&self, sql: &str, args: &[Value]) -> Result<u64, DbError> {
        match &self.backend {
            Backend::Sqlite(db) => {
                let mut c = db.conn(true).await?;
                let (sql, args) = (sqlite_sql(sql), args.to_vec());
                c.run(move |c| sqlite::execute(c, &sql, &args)).await
            }
            Backend::Pg(pool) => {
                let c = pool.get().await?;
                let st = c.prepare_cached(sql).await?;
                Ok(c.execute(&st, &pg_args(args)).await?)
            }
        }
    }

    /// One query on its own (a consistent read by itself).
    pub async fn query(&self, sql: &str, args: &[Value]) -> Result<Vec<Row>, DbError> {
        match &self.backend {
            Backend::Sqlite(db) => {
                let mut c = db.conn(false).await?;
                let (sql, args) = (sqlite_sql(sql), args.to_vec());
                c.run(move |c| sqlite::query(c, &sql, &args)).await
            }
            Backend::Pg(pool) => {
                let c = pool.get().await?;
                pg_query(&c, sql, args).await
            }
        }
    }

    pub async fn query_opt(&self, sql: &str, args: &[Value]) -> Result<Option<Row>, DbError> {
        Ok(self.query(sql, args).await?.into_iter().next())
    }

    /// One record's row, inserted on its own.
    pub async fn insert<R: Record>(&self, r: &R) -> Result<u64, DbError> {
        self.execute(&R::insert_sql(), &r.values()?).await
    }

    /// The records of `SELECT * FROM <R's table> <rest>`.
    pub async fn select<R: Record>(&self, rest: &str, args: &[Value]) -> Result<Vec<R>, DbError> {
        let sql = format!("SELECT * FROM {} {rest}", R::TABLE);
        let rows = self.query(&sql, args).await?;
        rows.iter().map(R::from_row).collect()
    }

    /// The first record of `SELECT * FROM <R's table> <rest>`, if any.
    pub async fn select_opt<R: Record>(
        &self,
        rest: &str,
        args: &[Value],
    ) -> Result<Option<R>, DbError> {
        Ok(self.select(rest, args).await?.into_iter().next())
    }

    /// Runs a product's migrations (see [`Migrations::run`]).
    pub async fn migrate(&self, set: &Migrations) -> Result<u64, MigrateError> {
        set.run(self).await
    }
}

/// A new, empty PostgreSQL schema in the database `dsn` names, and a DSN
/// whose sessions use it: a database of their own for tests that need one
/// (a previous release's tables built by hand) on a server shared with
/// other tests. Nothing removes it; it goes with the test server.
pub async fn scratch_schema(dsn: &str) -> Result<String, DbError> {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let name = format!(
        "hx_scratch_{}_{}_{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0)
    );
    Db::postgres(dsn, 1)?
        .execute(&format!("CREATE SCHEMA {name}"), args![])
        .await?;
    Ok(if dsn.contains("://") {
        let sep = if dsn.contains('?') { '&' } else { '?' };
        format!("{dsn}{sep}options=-csearch_path%3D{name}")
    } else {
        format!("{dsn} options='-csearch_path={name}'")
    })
}

/// Whether a database address names PostgreSQL.
pub fn is_postgres(address: &str) -> bool {
    address.starts_with("postgres://")
        || address.starts_with("postgresql://")
        || (address.contains("host=") && address.contains('='))
}

fn pg_args(args: &[Value]) -> Vec<&(dyn tokio_postgres::types::ToSql + Sync)> {
    args.iter()
        .map(|a| a as &(dyn tokio_postgres::types::ToSql + Sync))
        .collect()
}

async fn pg_query(
    c: &deadpool_postgres::Object,
    sql: &str,
    args: &[Value],
) -> Result<Vec<Row>, DbError> {
    let st = c.prepare_cached(sql).await?;
    let names: Arc<[String]> = st.columns().iter().map(|c| c.name().to_owned()).collect();
    let rows = c.query(&st, &pg_args(args)).await?;
    rows.iter().map(|r| value::pg_row(r, &names)).collect()
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Read,
    Write,
    Relaxed,
}

enum Conn {
    Sqlite(SqliteConn),
    // `None` once committed or rolled back.
    Pg(Option<deadpool_postgres::Object>),
}

/// A transaction on the deployment's database.
pub struct Tx {
    conn: Conn,
    /// SQLite: the BEGIN not yet sent (it goes with the first statement).
    begin: Option<&'static str>,
}

/// Runs a pending BEGIN, then `f`, on one SQLite connection.
fn begun<R>(
    c: &mut rusqlite::Connection,
    begin: Option<&'static str>,
    f: impl FnOnce(&mut rusqlite::Connection) -> Result<R, DbError>,
) -> Result<R, DbError> {
    if let Some(b) = begin {
        c.execute_batch(b)?;
    }
    f(c)
}

impl Tx {
    pub fn dialect(&self) -> Dialect {
        match self.conn {
            Conn::Sqlite(_) => Dialect::Sqlite,
            Conn::Pg(_) => Dialect::Postgres,
        }
    }

    fn pg(&self) -> &deadpool_postgres::Object {
        match &self.conn {
            Conn::Pg(Some(c)) => c,
            _ => unreachable!("a finished Tx is consumed"),
        }
    }

    /// The rows a statement returns.
    pub async fn query(&mut self, sql: &str, args: &[Value]) -> Result<Vec<Row>, DbError> {
        match &mut self.conn {
            Conn::Sqlite(c) => {
                let (sql, args, begin) = (sqlite_sql(sql), args.to_vec(), self.begin.take());
                c.run(move |c| begun(c, begin, |c| sqlite::query(c, &sql, &args)))
                    .await
            }
            Conn::Pg(_) => pg_query(self.pg(), sql, args).await,
        }
    }

    /// The first row, if any.
    pub async fn query_opt(&mut self, sql: &str, args: &[Value]) -> Result<Option<Row>, DbError> {
        Ok(self.query(sql, args).await?.into_iter().next())
    }

    /// The first row; [`DbError::NoRow`] if there is none.
    pub async fn query_one(&mut self, sql: &str, args: &[Value]) -> Result<Row, DbError> {
        self.query_opt(sql, args).await?.ok_or(DbError::NoRow)
    }

    /// How many rows a statement changed.
    pub async fn execute(&mut self, sql: &str, args: &[Value]) -> Result<u64, DbError> {
        match &mut self.conn {
            Conn::Sqlite(c) => {
                let (sql, args, begin) = (sqlite_sql(sql), args.to_vec(), self.begin.take());
                c.run(move |c| begun(c, begin, |c| sqlite::execute(c, &sql, &args)))
                    .await
            }
            Conn::Pg(_) => {
                let c = self.pg();
                let st = c.prepare_cached(sql).await?;
                Ok(c.execute(&st, &pg_args(args)).await?)
            }
        }
    }

    /// One record's row (see [`Record`]).
    pub async fn insert<R: Record>(&mut self, r: &R) -> Result<u64, DbError> {
        self.execute(&R::insert_sql(), &r.values()?).await
    }

    /// Several statements without parameters (schema).
    pub async fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        match &mut self.conn {
            Conn::Sqlite(c) => {
                let (sql, begin) = (sqlite_schema(sql), self.begin.take());
                c.run(move |c| begun(c, begin, |c| Ok(c.execute_batch(&sql)?)))
                    .await
            }
            Conn::Pg(_) => Ok(self.pg().batch_execute(sql).await?),
        }
    }

    /// Serializes with every other transaction that takes the same `key`
    /// until this one ends. On SQLite a write transaction holds the only
    /// write lock already, so this costs nothing there.
    pub async fn lock(&mut self, key: &str) -> Result<(), DbError> {
        match self.conn {
            Conn::Sqlite(_) => Ok(()),
            Conn::Pg(_) => {
                self.pg()
                    .execute("SELECT pg_advisory_xact_lock(hashtext($1))", &[&key])
                    .await?;
                Ok(())
            }
        }
    }

    pub async fn commit(mut self) -> Result<(), DbError> {
        // SQLite: a relaxed transaction's connection goes back to durable
        // commits (setting it again is harmless).
        let how = match self.conn {
            Conn::Sqlite(_) => "COMMIT; PRAGMA synchronous=FULL",
            Conn::Pg(_) => "COMMIT",
        };
        self.end(how).await
    }

    pub async fn rollback(mut self) -> Result<(), DbError> {
        let how = match self.conn {
            Conn::Sqlite(_) => "ROLLBACK; PRAGMA synchronous=FULL",
            Conn::Pg(_) => "ROLLBACK",
        };
        self.end(how).await
    }

    async fn end(&mut self, how: &'static str) -> Result<(), DbError> {
        if self.begin.take().is_some() {
            // No statement ran: nothing was begun, nothing to end.
            return Ok(());
        }
        match &mut self.conn {
            Conn::Sqlite(c) => c.run(move |c| Ok(c.execute_batch(how)?)).await,
            Conn::Pg(slot) => {
                let c = slot.as_ref().expect("a finished Tx is consumed");
                let r = c.batch_execute(how).await;
                match r {
                    Ok(()) => {
                        slot.take();
                        Ok(())
                    }
                    Err(e) => Err(e.into()),
                }
            }
        }
    }
}

impl Drop for Tx {
    fn drop(&mut self) {
        // SQLite's connection rolls itself back when dropped (SqliteConn).
        if let Conn::Pg(slot) = &mut self.conn {
            if let Some(c) = slot.take() {
                match tokio::runtime::Handle::try_current() {
                    Ok(h) => {
                        h.spawn(async move {
                            if c.batch_execute("ROLLBACK").await.is_err() {
                                // A connection in an unknown state never
                                // goes back to the pool.
                                drop(deadpool_postgres::Object::take(c));
                            }
                        });
                    }
                    Err(_) => drop(deadpool_postgres::Object::take(c)),
                }
            }
        }
    }
}
