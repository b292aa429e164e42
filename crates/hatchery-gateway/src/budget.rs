//! Budgets and reservations. Before a model call the gateway reserves its
//! worst case against every scope the call is charged to (the session and
//! its tenant) in one transaction that checks
//! `used + live reservations + estimate <= limit` for each; after the call it
//! settles the actual usage and drops the reservation. So recorded spend can
//! pass a limit only by what the calls already in flight under-estimated,
//! which is at most the largest single reservation (the estimate is an
//! upper bound, see `estimate.rs`). A reservation left by a crash expires
//! after its TTL and the janitor deletes it.

use async_trait::async_trait;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// What a call may cost, or did cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Amount {
    pub tokens: u64,
    pub usd_cents: u64,
}

/// A budget's limits (None: unlimited in that unit) and what it has spent.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Budget {
    pub scope: String,
    pub limit_tokens: Option<u64>,
    pub limit_usd_cents: Option<u64>,
    pub used_tokens: u64,
    pub used_usd_cents: u64,
    /// Held by live reservations (calls in flight).
    pub reserved_tokens: u64,
    pub reserved_usd_cents: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum BudgetError {
    #[error("budget {scope} is exhausted: {unit} used {used} + reserved {reserved} + this call's estimate {estimate} > limit {limit}")]
    Exhausted {
        scope: String,
        unit: &'static str,
        used: u64,
        reserved: u64,
        estimate: u64,
        limit: u64,
    },
    #[error("no budget for scope {0}")]
    UnknownScope(String),
    #[error("budget store {path}: {source}")]
    Db {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("budget store task failed: {0}")]
    Task(String),
    #[error("budget store (PostgreSQL): {what}: {source}")]
    Pg {
        what: &'static str,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error("budget store (PostgreSQL) pool: {0}")]
    Pool(String),
    /// Its migrations could not run (or the schema is newer than this build).
    #[error("budget store (PostgreSQL) schema: {0}")]
    Schema(String),
}

/// The store behind budgets; SQLite here, PostgreSQL later.
#[async_trait]
pub trait BudgetStore: Send + Sync {
    async fn set_limits(
        &self,
        scope: &str,
        tokens: Option<u64>,
        usd_cents: Option<u64>,
    ) -> Result<Budget, BudgetError>;
    async fn get(&self, scope: &str) -> Result<Budget, BudgetError>;
    /// Reserves `estimate` against every scope in one transaction, or
    /// nothing. Scopes without a budget row are unlimited.
    async fn reserve(
        &self,
        id: &str,
        scopes: &[String],
        estimate: Amount,
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<(), BudgetError>;
    /// Records `actual` against the reservation's scopes (creating an
    /// unlimited row for a scope that has none) and deletes it.
    /// Idempotent per reservation id: a second settle records nothing.
    /// Returns false if the id was already settled.
    async fn settle(
        &self,
        id: &str,
        scopes: &[String],
        actual: Amount,
    ) -> Result<bool, BudgetError>;
    /// Deletes reservations whose TTL has passed; returns how many.
    async fn expire(&self, now_ms: u64) -> Result<u64, BudgetError>;
    /// The clock reservations are stamped and expired by. A store shared
    /// by several processes answers with its own (the database's) clock,
    /// so that a process whose clock runs ahead cannot expire the others'
    /// reservations early (and let a budget be overspent by them).
    async fn now_ms(&self) -> Result<u64, BudgetError> {
        Ok(crate::now_ms())
    }
}

const MIGRATIONS: &[&str] = &[
    // 1: budgets, reservations and the scopes each one holds.
    "CREATE TABLE budgets (
        scope TEXT PRIMARY KEY,
        limit_tokens INTEGER,
        limit_usd_cents INTEGER,
        used_tokens INTEGER NOT NULL DEFAULT 0,
        used_usd_cents INTEGER NOT NULL DEFAULT 0
     );
     CREATE TABLE reservations (
        id TEXT NOT NULL,
        scope TEXT NOT NULL,
        tokens INTEGER NOT NULL,
        usd_cents INTEGER NOT NULL,
        expires_ms INTEGER NOT NULL,
        PRIMARY KEY (id, scope)
     );
     CREATE INDEX reservations_scope ON reservations(scope);
     CREATE INDEX reservations_expiry ON reservations(expires_ms);
     CREATE TABLE settlements (id TEXT PRIMARY KEY, tokens INTEGER NOT NULL, usd_cents INTEGER NOT NULL);",
    // 2: gateway keys: what a caller presents instead of the upstream key,
    // stored as SHA-256, each naming the session (and tenant) it charges.
    "CREATE TABLE keys (
        hash TEXT PRIMARY KEY,
        session TEXT NOT NULL,
        tenant TEXT,
        expires_ms INTEGER NOT NULL
     );",
    // 3: sandboxes bound to a caller: calls that arrive through the
    // daemon's host-service relay carry the sandbox id (set by the host,
    // never by the guest) and need no key at all.
    "CREATE TABLE sandbox_bindings (
        sandbox TEXT PRIMARY KEY,
        session TEXT NOT NULL,
        tenant TEXT
     );",
];

/// Who a call is charged to.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Caller {
    pub session: String,
    pub tenant: Option<String>,
}

impl Caller {
    /// The budget scopes a call of this caller is reserved against.
    pub fn scopes(&self) -> Vec<String> {
        let mut v = vec![format!("session:{}", self.session)];
        if let Some(t) = &self.tenant {
            v.push(format!("tenant:{t}"));
        }
        v
    }
}

/// Gateway keys, stored hashed.
#[async_trait]
pub trait KeyStore: Send + Sync {
    async fn add_key(
        &self,
        hash: &str,
        caller: &Caller,
        expires_ms: u64,
    ) -> Result<(), BudgetError>;
    async fn caller(&self, hash: &str, now_ms: u64) -> Result<Option<Caller>, BudgetError>;
    /// Binds (or rebinds) a sandbox to the caller its calls are charged to.
    async fn bind_sandbox(&self, sandbox: &str, caller: &Caller) -> Result<(), BudgetError>;
    /// Returns whether there was a binding.
    async fn unbind_sandbox(&self, sandbox: &str) -> Result<bool, BudgetError>;
    async fn caller_of_sandbox(&self, sandbox: &str) -> Result<Option<Caller>, BudgetError>;
}

pub struct SqliteBudgets {
    path: PathBuf,
    conn: Arc<Mutex<Connection>>,
}

impl SqliteBudgets {
    pub fn open(path: &Path) -> Result<Self, BudgetError> {
        let db = |source| BudgetError::Db {
            path: path.to_path_buf(),
            source,
        };
        let mut conn = Connection::open(path).map_err(db)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(db)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(db)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(db)?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(db)?;
        let version: i64 = tx
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(db)?;
        for (i, m) in MIGRATIONS.iter().enumerate().skip(version as usize) {
            tx.execute_batch(m).map_err(db)?;
            tx.pragma_update(None, "user_version", (i + 1) as i64)
                .map_err(db)?;
        }
        tx.commit().map_err(db)?;
        Ok(SqliteBudgets {
            path: path.to_path_buf(),
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, BudgetFail> + Send + 'static,
    ) -> Result<T, BudgetError> {
        let conn = self.conn.clone();
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || {
            let mut c = conn.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut c).map_err(|e| match e {
                BudgetFail::Db(source) => BudgetError::Db { path, source },
                BudgetFail::Refused(e) => e,
            })
        })
        .await
        .map_err(|e| BudgetError::Task(e.to_string()))?
    }
}

/// Inside a store closure: a database error (gets the path attached) or a
/// refusal that is already a [`BudgetError`].
enum BudgetFail {
    Db(rusqlite::Error),
    Refused(BudgetError),
}

impl From<rusqlite::Error> for BudgetFail {
    fn from(e: rusqlite::Error) -> Self {
        BudgetFail::Db(e)
    }
}

fn read_budget(c: &Connection, scope: &str) -> rusqlite::Result<Option<Budget>> {
    let row = c
        .query_row(
            "SELECT limit_tokens, limit_usd_cents, used_tokens, used_usd_cents
             FROM budgets WHERE scope = ?1",
            params![scope],
            |r| {
                Ok((
                    r.get::<_, Option<i64>>("limit_tokens")?,
                    r.get::<_, Option<i64>>("limit_usd_cents")?,
                    r.get::<_, i64>("used_tokens")?,
                    r.get::<_, i64>("used_usd_cents")?,
                ))
            },
        )
        .optional()?;
    let Some((lt, lc, ut, uc)) = row else {
        return Ok(None);
    };
    let (rt, rc): (i64, i64) = c.query_row(
        "SELECT COALESCE(SUM(tokens), 0) AS t, COALESCE(SUM(usd_cents), 0) AS c
         FROM reservations WHERE scope = ?1",
        params![scope],
        |r| Ok((r.get("t")?, r.get("c")?)),
    )?;
    Ok(Some(Budget {
        scope: scope.to_string(),
        limit_tokens: lt.map(|v| v as u64),
        limit_usd_cents: lc.map(|v| v as u64),
        used_tokens: ut as u64,
        used_usd_cents: uc as u64,
        reserved_tokens: rt as u64,
        reserved_usd_cents: rc as u64,
    }))
}

/// Whether `estimate` fits in budget `b`, in every unit.
pub(crate) fn admits(b: &Budget, estimate: Amount) -> Result<(), BudgetError> {
    check(
        &b.scope,
        "tokens",
        b.limit_tokens,
        b.used_tokens,
        b.reserved_tokens,
        estimate.tokens,
    )?;
    check(
        &b.scope,
        "usd_cents",
        b.limit_usd_cents,
        b.used_usd_cents,
        b.reserved_usd_cents,
        estimate.usd_cents,
    )
}

/// The check of one unit: `used + reserved + estimate <= limit`.
fn check(
    scope: &str,
    unit: &'static str,
    limit: Option<u64>,
    used: u64,
    reserved: u64,
    estimate: u64,
) -> Result<(), BudgetError> {
    match limit {
        Some(limit) if used.saturating_add(reserved).saturating_add(estimate) > limit => {
            Err(BudgetError::Exhausted {
                scope: scope.to_string(),
                unit,
                used,
                reserved,
                estimate,
                limit,
            })
        }
        _ => Ok(()),
    }
}

#[async_trait]
impl BudgetStore for SqliteBudgets {
    async fn set_limits(
        &self,
        scope: &str,
        tokens: Option<u64>,
        usd_cents: Option<u64>,
    ) -> Result<Budget, BudgetError> {
        let scope = scope.to_string();
        self.with(move |c| {
            c.execute(
                "INSERT INTO budgets (scope, limit_tokens, limit_usd_cents) VALUES (?1, ?2, ?3)
                 ON CONFLICT(scope) DO UPDATE SET limit_tokens = ?2, limit_usd_cents = ?3",
                params![scope, tokens.map(|v| v as i64), usd_cents.map(|v| v as i64)],
            )?;
            Ok(read_budget(c, &scope)?.expect("just written"))
        })
        .await
    }

    async fn get(&self, scope: &str) -> Result<Budget, BudgetError> {
        let scope = scope.to_string();
        self.with(move |c| {
            read_budget(c, &scope)?
                .ok_or_else(|| BudgetFail::Refused(BudgetError::UnknownScope(scope.clone())))
        })
        .await
    }

    async fn reserve(
        &self,
        id: &str,
        scopes: &[String],
        estimate: Amount,
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<(), BudgetError> {
        let (id, scopes) = (id.to_string(), scopes.to_vec());
        self.with(move |c| {
            // IMMEDIATE: the write lock is taken before the reads, so two
            // reservations never both see the same headroom.
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            for scope in &scopes {
                if let Some(b) = read_budget(&tx, scope)? {
                    admits(&b, estimate).map_err(BudgetFail::Refused)?;
                }
                tx.execute(
                    "INSERT INTO reservations (id, scope, tokens, usd_cents, expires_ms)
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![
                        id,
                        scope,
                        estimate.tokens as i64,
                        estimate.usd_cents as i64,
                        now_ms.saturating_add(ttl_ms) as i64
                    ],
                )?;
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }

    async fn settle(
        &self,
        id: &str,
        scopes: &[String],
        actual: Amount,
    ) -> Result<bool, BudgetError> {
        let (id, scopes) = (id.to_string(), scopes.to_vec());
        self.with(move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let fresh = tx.execute(
                "INSERT OR IGNORE INTO settlements (id, tokens, usd_cents) VALUES (?1, ?2, ?3)",
                params![id, actual.tokens as i64, actual.usd_cents as i64],
            )? == 1;
            if fresh {
                // Spend is recorded even if the janitor already dropped the
                // reservation: the call happened.
                for scope in &scopes {
                    // A scope without limits gets a row too: its spend is
                    // visible even when nothing caps it.
                    tx.execute(
                        "INSERT INTO budgets (scope, used_tokens, used_usd_cents) VALUES (?1, ?2, ?3)
                         ON CONFLICT(scope) DO UPDATE SET
                            used_tokens = used_tokens + ?2, used_usd_cents = used_usd_cents + ?3",
                        params![scope, actual.tokens as i64, actual.usd_cents as i64],
                    )?;
                }
            }
            tx.execute("DELETE FROM reservations WHERE id = ?1", params![id])?;
            tx.commit()?;
            Ok(fresh)
        })
        .await
    }

    async fn expire(&self, now_ms: u64) -> Result<u64, BudgetError> {
        self.with(move |c| {
            let n = c.execute(
                "DELETE FROM reservations WHERE expires_ms < ?1",
                params![now_ms as i64],
            )?;
            Ok(n as u64)
        })
        .await
    }
}

#[async_trait]
impl KeyStore for SqliteBudgets {
    async fn add_key(
        &self,
        hash: &str,
        caller: &Caller,
        expires_ms: u64,
    ) -> Result<(), BudgetError> {
        let (hash, caller) = (hash.to_string(), caller.clone());
        self.with(move |c| {
            c.execute(
                "INSERT INTO keys (hash, session, tenant, expires_ms) VALUES (?1, ?2, ?3, ?4)",
                params![hash, caller.session, caller.tenant, expires_ms as i64],
            )?;
            Ok(())
        })
        .await
    }

    async fn caller(&self, hash: &str, now_ms: u64) -> Result<Option<Caller>, BudgetError> {
        let hash = hash.to_string();
        self.with(move |c| {
            Ok(c.query_row(
                "SELECT session, tenant FROM keys WHERE hash = ?1 AND expires_ms > ?2",
                params![hash, now_ms as i64],
                read_caller,
            )
            .optional()?)
        })
        .await
    }

    async fn bind_sandbox(&self, sandbox: &str, caller: &Caller) -> Result<(), BudgetError> {
        let (sandbox, caller) = (sandbox.to_string(), caller.clone());
        self.with(move |c| {
            c.execute(
                "INSERT INTO sandbox_bindings (sandbox, session, tenant) VALUES (?1, ?2, ?3)
                 ON CONFLICT(sandbox) DO UPDATE SET session = ?2, tenant = ?3",
                params![sandbox, caller.session, caller.tenant],
            )?;
            Ok(())
        })
        .await
    }

    async fn unbind_sandbox(&self, sandbox: &str) -> Result<bool, BudgetError> {
        let sandbox = sandbox.to_string();
        self.with(move |c| {
            Ok(c.execute(
                "DELETE FROM sandbox_bindings WHERE sandbox = ?1",
                params![sandbox],
            )? == 1)
        })
        .await
    }

    async fn caller_of_sandbox(&self, sandbox: &str) -> Result<Option<Caller>, BudgetError> {
        let sandbox = sandbox.to_string();
        self.with(move |c| {
            Ok(c.query_row(
                "SELECT session, tenant FROM sandbox_bindings WHERE sandbox = ?1",
                params![sandbox],
                read_caller,
            )
            .optional()?)
        })
        .await
    }
}

fn read_caller(r: &rusqlite::Row<'_>) -> rusqlite::Result<Caller> {
    Ok(Caller {
        session: r.get("session")?,
        tenant: r.get("tenant")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn conformance_on_sqlite() {
        let d = crate::conformance::TempDir::new();
        let s = SqliteBudgets::open(&d.0.join("b.db")).unwrap();
        crate::conformance::run_all(&s).await;
    }

    #[tokio::test]
    async fn migrations_run_once() {
        let d = crate::conformance::TempDir::new();
        let p = d.0.join("b.db");
        SqliteBudgets::open(&p)
            .unwrap()
            .set_limits("x", Some(1), None)
            .await
            .unwrap();
        let s = SqliteBudgets::open(&p).unwrap();
        assert_eq!(s.get("x").await.unwrap().limit_tokens, Some(1));
    }
}
