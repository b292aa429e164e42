//! The one error type of the database layer. Each product's store wraps
//! it as the `#[source]` of its own error enum; the questions a caller
//! needs answered (retry later? a duplicate key? no row?) are methods, so
//! no product matches on a driver's error codes.

use crate::pg_pool::{pg_message, pg_unavailable};

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("sqlite: {0}")]
    Sqlite(#[source] rusqlite::Error),
    #[error("postgres: {message}")]
    Pg {
        message: String,
        #[source]
        source: tokio_postgres::Error,
    },
    /// No PostgreSQL connection could be had within the pool's timeout.
    #[error("postgres pool: {0}")]
    Pool(#[source] deadpool_postgres::PoolError),
    #[error("database address: {0}")]
    Config(#[from] crate::pg_pool::PoolConfigError),
    /// Not reachable, said by a caller rather than a driver: a call
    /// bounded in time that ran out, or a test double of a store.
    #[error("database unavailable: {0}")]
    Unavailable(&'static str),
    /// A blocking SQLite task panicked or was cancelled.
    #[error("sqlite task: {0}")]
    Task(#[source] tokio::task::JoinError),
    /// `query_one` found no row.
    #[error("no row")]
    NoRow,
    /// A column's value does not convert to the Rust type asked for.
    #[error("column {column}: {found} is not {wanted}")]
    Type {
        column: String,
        wanted: &'static str,
        found: &'static str,
    },
    /// A column name the statement did not return.
    #[error("no column {0}")]
    NoColumn(String),
    /// A number the database's signed 64-bit integer cannot hold
    /// ([`crate::ToValue`]).
    #[error("column {column}: {value} is out of range")]
    OutOfRange { column: &'static str, value: u64 },
}

impl DbError {
    /// The database is not there right now (a dropped connection, a
    /// server restarting, an exhausted pool, a locked SQLite file past its
    /// busy timeout): retryable, answered 503, never a 500.
    pub fn unavailable(&self) -> bool {
        match self {
            DbError::Pg { source, .. } => pg_unavailable(source),
            DbError::Pool(_) | DbError::Unavailable(_) => true,
            DbError::Sqlite(rusqlite::Error::SqliteFailure(e, _)) => matches!(
                e.code,
                rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
            ),
            _ => false,
        }
    }

    /// A UNIQUE or PRIMARY KEY constraint refused the write.
    pub fn unique_violation(&self) -> bool {
        match self {
            DbError::Pg { source, .. } => {
                source.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION)
            }
            DbError::Sqlite(rusqlite::Error::SqliteFailure(e, _)) => matches!(
                e.extended_code,
                rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
                    | rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
            ),
            _ => false,
        }
    }

    /// A trigger or CHECK refused the write (`RAISE(ABORT, ...)` in
    /// SQLite, `RAISE EXCEPTION` or a check constraint in PostgreSQL).
    pub fn refused_by_schema(&self) -> bool {
        match self {
            DbError::Pg { source, .. } => source.code().is_some_and(|c| {
                *c == tokio_postgres::error::SqlState::RAISE_EXCEPTION
                    || *c == tokio_postgres::error::SqlState::CHECK_VIOLATION
            }),
            DbError::Sqlite(rusqlite::Error::SqliteFailure(e, _)) => {
                e.code == rusqlite::ErrorCode::ConstraintViolation
                    && e.extended_code != rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
                    && e.extended_code != rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
            }
            _ => false,
        }
    }
}

impl From<rusqlite::Error> for DbError {
    fn from(e: rusqlite::Error) -> Self {
        DbError::Sqlite(e)
    }
}

impl From<tokio_postgres::Error> for DbError {
    fn from(source: tokio_postgres::Error) -> Self {
        DbError::Pg {
            message: pg_message(&source),
            source,
        }
    }
}

impl From<deadpool_postgres::PoolError> for DbError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        match e {
            deadpool_postgres::PoolError::Backend(source) => source.into(),
            other => DbError::Pool(other),
        }
    }
}
