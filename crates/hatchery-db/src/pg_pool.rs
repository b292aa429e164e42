//! One way to open a PostgreSQL pool for every crate that keeps state
//! there (this store, the session store, the gateway's budgets), so that
//! each gets the same bounds: a request waits at most 10 s for a
//! connection, a connect at most 10 s, and a connection whose data goes
//! unacknowledged (a network that drops packets) is closed by the kernel
//! after 5 s, unless the URL sets its own `tcp_user_timeout`.

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use std::time::Duration;
use tokio_postgres::NoTls;

/// Waiting for a free connection, and opening one.
pub const POOL_TIMEOUT: Duration = Duration::from_secs(10);
/// Unacknowledged data on a connection before the kernel gives up on it.
pub const TCP_USER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the server lets a session sit idle inside a transaction before
/// it ends the session. The client side notices a dead network within
/// [`TCP_USER_TIMEOUT`], but the server does not: a host cut off between
/// two statements of a transaction left its backend "idle in transaction"
/// holding row locks (its lease's, its sandboxes') until the server's TCP
/// keepalive noticed, two hours by default, and every other host's sweeper
/// that had to mark its sandboxes lost waited on those locks. No
/// transaction here waits on anything but the database between statements,
/// so 20 s is far above a healthy gap and below the default 30 s host lease.
pub const IDLE_IN_TRANSACTION: Duration = Duration::from_secs(20);

/// Why a pool could not be made: the connection string, as the driver
/// read it (nothing is connected yet).
#[derive(Debug, thiserror::Error)]
#[error("PostgreSQL connection string: {0}")]
pub struct PoolConfigError(pub String);

/// A pool of at most `size` connections to `dsn` (a `postgres://` URL or
/// a libpq `key=value` string). Connects lazily.
pub fn pg_pool(dsn: &str, size: usize) -> Result<Pool, PoolConfigError> {
    build(dsn, size, false)
}

/// The same, for tools that only read (`hatchery audit verify`): every
/// session the pool opens is `default_transaction_read_only`, so the
/// server itself refuses a write, a migration included.
pub fn pg_pool_read_only(dsn: &str, size: usize) -> Result<Pool, PoolConfigError> {
    build(dsn, size, true)
}

fn build(dsn: &str, size: usize, read_only: bool) -> Result<Pool, PoolConfigError> {
    let mut cfg: tokio_postgres::Config = dsn
        .parse()
        .map_err(|e: tokio_postgres::Error| PoolConfigError(e.to_string()))?;
    cfg.options(session_options(
        cfg.get_options().unwrap_or_default(),
        read_only,
    ));
    if cfg.get_tcp_user_timeout().is_none() {
        cfg.tcp_user_timeout(TCP_USER_TIMEOUT);
    }
    cfg.keepalives(true);
    let mgr = Manager::from_config(
        cfg,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(mgr)
        .max_size(size.max(1))
        .wait_timeout(Some(POOL_TIMEOUT))
        .create_timeout(Some(POOL_TIMEOUT))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .build()
        .map_err(|e| PoolConfigError(e.to_string()))
}

/// The server-side settings every session of the pool starts with, after
/// any the connection string gave (which therefore lose to these: the
/// bounds are not a caller's choice).
fn session_options(given: &str, read_only: bool) -> String {
    let mut opts = format!(
        "{given} -c idle_in_transaction_session_timeout={}",
        IDLE_IN_TRANSACTION.as_millis()
    );
    if read_only {
        opts.push_str(" -c default_transaction_read_only=on");
    }
    opts.trim().to_string()
}

/// Whether a driver error means the database is not there right now (a
/// dropped connection, a server shutting down or starting, a refused
/// connect): retryable, answered 503, never a 500. Every crate that keeps
/// state in PostgreSQL classifies its errors with this one test.
pub fn pg_unavailable(e: &tokio_postgres::Error) -> bool {
    let io = std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>());
    let code = e.code().map(|c| c.code()).unwrap_or_default();
    let down = code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03");
    e.is_closed() || io || down
}

/// A driver error as a log line: for an error the server sent, its
/// message and SQLSTATE (the driver's own Display says only "db error").
pub fn pg_message(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => format!("{} ({})", d.message(), d.code().code()),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_session_gets_the_idle_in_transaction_bound() {
        assert_eq!(
            session_options("", false),
            "-c idle_in_transaction_session_timeout=20000"
        );
        assert_eq!(
            session_options("-c search_path=x", true),
            "-c search_path=x -c idle_in_transaction_session_timeout=20000 -c default_transaction_read_only=on"
        );
    }

    #[test]
    fn bad_strings_are_refused_before_connecting() {
        assert!(pg_pool("postgres://u@h:notaport/db", 2).is_err());
        assert!(pg_pool("postgres://u@127.0.0.1:1/db", 2).is_ok());
    }
}
