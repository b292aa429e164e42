//! The budget store on PostgreSQL, for a gateway shared by many hosts. The
//! same contract as the SQLite store (`budget.rs`), checked by the same
//! conformance suite (`conformance.rs`). A reservation locks the budget rows
//! of its scopes (`SELECT … FOR UPDATE`, in scope order so two reservations
//! never deadlock) and then sums the live reservations: under READ
//! COMMITTED each statement sees everything committed before it, so the
//! second of two racing reservations sees the first.

use crate::budget::{Amount, Budget, BudgetError, BudgetStore, Caller, KeyStore};
use async_trait::async_trait;
use deadpool_postgres::Pool;

/// Numbered migrations; `gateway_schema` holds how many have run. Each runs
/// in the transaction that records it, under an advisory lock, so two
/// gateways starting at once both end up with one schema.
const MIGRATIONS: &[&str] = &[
    "CREATE TABLE budgets (
        scope TEXT PRIMARY KEY,
        limit_tokens BIGINT,
        limit_usd_cents BIGINT,
        used_tokens BIGINT NOT NULL DEFAULT 0,
        used_usd_cents BIGINT NOT NULL DEFAULT 0
     );
     CREATE TABLE reservations (
        id TEXT NOT NULL,
        scope TEXT NOT NULL,
        tokens BIGINT NOT NULL,
        usd_cents BIGINT NOT NULL,
        expires_ms BIGINT NOT NULL,
        PRIMARY KEY (id, scope)
     );
     CREATE INDEX reservations_scope ON reservations(scope);
     CREATE INDEX reservations_expiry ON reservations(expires_ms);
     CREATE TABLE settlements (id TEXT PRIMARY KEY, tokens BIGINT NOT NULL, usd_cents BIGINT NOT NULL);",
    "CREATE TABLE keys (
        hash TEXT PRIMARY KEY,
        session TEXT NOT NULL,
        tenant TEXT,
        expires_ms BIGINT NOT NULL
     );",
    "CREATE TABLE sandbox_bindings (
        sandbox TEXT PRIMARY KEY,
        session TEXT NOT NULL,
        tenant TEXT
     );",
];

/// Any fixed number: the advisory lock that serializes migrations.
const MIGRATION_LOCK: i64 = 0x6861_7463_6867_7731;

const SCHEMA: hatchery_store::PgMigrations = hatchery_store::PgMigrations {
    name: "gateway",
    table: "gateway_schema",
    lock: MIGRATION_LOCK,
    steps: MIGRATIONS,
};

pub struct PgBudgets {
    pool: Pool,
}

fn pg(what: &'static str) -> impl FnOnce(tokio_postgres::Error) -> BudgetError {
    move |source| BudgetError::Pg { what, source }
}

fn i(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}

impl PgBudgets {
    /// `dsn`: a libpq connection string or `postgres://` URL.
    pub async fn connect(dsn: &str, pool_size: usize) -> Result<Self, BudgetError> {
        let pool = hatchery_store::pg_pool(dsn, pool_size)
            .map_err(|e| BudgetError::Pool(format!("bad connection string: {}", e.0)))?;
        let s = PgBudgets { pool };
        s.migrate().await?;
        Ok(s)
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, BudgetError> {
        self.pool
            .get()
            .await
            .map_err(|e| BudgetError::Pool(e.to_string()))
    }

    async fn migrate(&self) -> Result<(), BudgetError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(pg("begin migration"))?;
        SCHEMA.run(&tx).await.map_err(|e| match e {
            // The driver error itself, so a database that went away is
            // still told from one that refused (the daemon retries it).
            hatchery_store::MigrateError::Pg { what, source, .. } => {
                BudgetError::Pg { what, source }
            }
            e => BudgetError::Schema(e.to_string()),
        })?;
        tx.commit().await.map_err(pg("commit migration"))
    }
}

async fn read_budget(
    c: &impl deadpool_postgres::GenericClient,
    scope: &str,
) -> Result<Option<Budget>, BudgetError> {
    let Some(r) = c
        .query_opt(
            "SELECT b.limit_tokens, b.limit_usd_cents, b.used_tokens, b.used_usd_cents,
                    COALESCE((SELECT SUM(tokens) FROM reservations WHERE scope = b.scope), 0)::BIGINT AS rt,
                    COALESCE((SELECT SUM(usd_cents) FROM reservations WHERE scope = b.scope), 0)::BIGINT AS rc
             FROM budgets b WHERE b.scope = $1",
            &[&scope],
        )
        .await
        .map_err(pg("read budget"))?
    else {
        return Ok(None);
    };
    let u = |v: i64| v.max(0) as u64;
    Ok(Some(Budget {
        scope: scope.to_string(),
        limit_tokens: r.get::<_, Option<i64>>("limit_tokens").map(u),
        limit_usd_cents: r.get::<_, Option<i64>>("limit_usd_cents").map(u),
        used_tokens: u(r.get("used_tokens")),
        used_usd_cents: u(r.get("used_usd_cents")),
        reserved_tokens: u(r.get("rt")),
        reserved_usd_cents: u(r.get("rc")),
    }))
}

#[async_trait]
impl BudgetStore for PgBudgets {
    async fn set_limits(
        &self,
        scope: &str,
        tokens: Option<u64>,
        usd_cents: Option<u64>,
    ) -> Result<Budget, BudgetError> {
        let c = self.client().await?;
        c.execute(
            "INSERT INTO budgets (scope, limit_tokens, limit_usd_cents) VALUES ($1, $2, $3)
             ON CONFLICT (scope) DO UPDATE SET limit_tokens = $2, limit_usd_cents = $3",
            &[&scope, &tokens.map(i), &usd_cents.map(i)],
        )
        .await
        .map_err(pg("set limits"))?;
        Ok(read_budget(&c, scope).await?.expect("just written"))
    }

    async fn get(&self, scope: &str) -> Result<Budget, BudgetError> {
        let c = self.client().await?;
        read_budget(&c, scope)
            .await?
            .ok_or_else(|| BudgetError::UnknownScope(scope.to_string()))
    }

    async fn reserve(
        &self,
        id: &str,
        scopes: &[String],
        estimate: Amount,
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<(), BudgetError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(pg("begin reserve"))?;
        let mut sorted = scopes.to_vec();
        sorted.sort();
        tx.execute(
            "SELECT 1 FROM budgets WHERE scope = ANY($1) ORDER BY scope FOR UPDATE",
            &[&sorted],
        )
        .await
        .map_err(pg("lock budgets"))?;
        for scope in scopes {
            if let Some(b) = read_budget(&tx, scope).await? {
                crate::budget::admits(&b, estimate)?;
            }
            tx.execute(
                "INSERT INTO reservations (id, scope, tokens, usd_cents, expires_ms)
                 VALUES ($1, $2, $3, $4, $5)",
                &[
                    &id,
                    scope,
                    &i(estimate.tokens),
                    &i(estimate.usd_cents),
                    &i(now_ms.saturating_add(ttl_ms)),
                ],
            )
            .await
            .map_err(pg("insert reservation"))?;
        }
        // Dropping the transaction on an early return above rolls it back.
        tx.commit().await.map_err(pg("commit reserve"))
    }

    async fn settle(
        &self,
        id: &str,
        scopes: &[String],
        actual: Amount,
    ) -> Result<bool, BudgetError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(pg("begin settle"))?;
        let fresh = tx
            .execute(
                "INSERT INTO settlements (id, tokens, usd_cents) VALUES ($1, $2, $3)
                 ON CONFLICT (id) DO NOTHING",
                &[&id, &i(actual.tokens), &i(actual.usd_cents)],
            )
            .await
            .map_err(pg("record settlement"))?
            == 1;
        if fresh {
            let mut sorted = scopes.to_vec();
            sorted.sort();
            for scope in &sorted {
                tx.execute(
                    "INSERT INTO budgets (scope, used_tokens, used_usd_cents) VALUES ($1, $2, $3)
                     ON CONFLICT (scope) DO UPDATE SET
                        used_tokens = budgets.used_tokens + $2,
                        used_usd_cents = budgets.used_usd_cents + $3",
                    &[scope, &i(actual.tokens), &i(actual.usd_cents)],
                )
                .await
                .map_err(pg("charge budget"))?;
            }
        }
        tx.execute("DELETE FROM reservations WHERE id = $1", &[&id])
            .await
            .map_err(pg("drop reservation"))?;
        tx.commit().await.map_err(pg("commit settle"))?;
        Ok(fresh)
    }

    async fn now_ms(&self) -> Result<u64, BudgetError> {
        let c = self.client().await?;
        let r = c
            .query_one(
                "SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT AS now_ms",
                &[],
            )
            .await
            .map_err(pg("read the database clock"))?;
        Ok(r.get::<_, i64>("now_ms").max(0) as u64)
    }

    async fn expire(&self, now_ms: u64) -> Result<u64, BudgetError> {
        let c = self.client().await?;
        c.execute(
            "DELETE FROM reservations WHERE expires_ms < $1",
            &[&i(now_ms)],
        )
        .await
        .map_err(pg("expire reservations"))
    }
}

#[async_trait]
impl KeyStore for PgBudgets {
    async fn add_key(
        &self,
        hash: &str,
        caller: &Caller,
        expires_ms: u64,
    ) -> Result<(), BudgetError> {
        let c = self.client().await?;
        c.execute(
            "INSERT INTO keys (hash, session, tenant, expires_ms) VALUES ($1, $2, $3, $4)",
            &[&hash, &caller.session, &caller.tenant, &i(expires_ms)],
        )
        .await
        .map_err(pg("add key"))?;
        Ok(())
    }

    async fn caller(&self, hash: &str, now_ms: u64) -> Result<Option<Caller>, BudgetError> {
        let c = self.client().await?;
        Ok(c.query_opt(
            "SELECT session, tenant FROM keys WHERE hash = $1 AND expires_ms > $2",
            &[&hash, &i(now_ms)],
        )
        .await
        .map_err(pg("read key"))?
        .map(|r| Caller {
            session: r.get("session"),
            tenant: r.get("tenant"),
        }))
    }

    async fn bind_sandbox(&self, sandbox: &str, caller: &Caller) -> Result<(), BudgetError> {
        let c = self.client().await?;
        c.execute(
            "INSERT INTO sandbox_bindings (sandbox, session, tenant) VALUES ($1, $2, $3)
             ON CONFLICT (sandbox) DO UPDATE SET session = $2, tenant = $3",
            &[&sandbox, &caller.session, &caller.tenant],
        )
        .await
        .map_err(pg("bind sandbox"))?;
        Ok(())
    }

    async fn unbind_sandbox(&self, sandbox: &str) -> Result<bool, BudgetError> {
        let c = self.client().await?;
        Ok(c.execute(
            "DELETE FROM sandbox_bindings WHERE sandbox = $1",
            &[&sandbox],
        )
        .await
        .map_err(pg("unbind sandbox"))?
            == 1)
    }

    async fn caller_of_sandbox(&self, sandbox: &str) -> Result<Option<Caller>, BudgetError> {
        let c = self.client().await?;
        Ok(c.query_opt(
            "SELECT session, tenant FROM sandbox_bindings WHERE sandbox = $1",
            &[&sandbox],
        )
        .await
        .map_err(pg("read binding"))?
        .map(|r| Caller {
            session: r.get("session"),
            tenant: r.get("tenant"),
        }))
    }
}
