//! The budget and key store: the gateway's tables in the deployment's one
//! database (hatchery-db: a SQLite file, or PostgreSQL for a gateway
//! shared by many hosts), the same SQL on both. The contract is in
//! `budget.rs` and checked on both by `conformance.rs`.
//!
//! A reservation locks the budget rows of its scopes (`SELECT … FOR
//! UPDATE`, in scope order so two reservations never deadlock; on SQLite
//! writers take turns) and then sums the live reservations, so the second
//! of two racing reservations sees the first.

pub mod conformance;
pub mod schema;

/// Declared with the budget contract (`BudgetStore::settle_call`); named
/// here too, where its joined write is, as other crates know it.
pub use crate::budget::Settlement;
use crate::budget::{admits, Amount, Budget, BudgetError, BudgetStore, Caller, Expired, KeyStore};
use async_trait::async_trait;
use hatchery_db::{args, Db, DbError, Dialect, Row, Tx};

#[derive(Clone)]
pub struct GatewayStore {
    db: Db,
}

fn err(what: &'static str) -> impl FnOnce(DbError) -> BudgetError {
    move |source| BudgetError::Db { what, source }
}

/// A u64 as BIGINT, clamped (limits may be "everything").
fn i(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}

/// Scopes in the order their rows are locked and written (the same in
/// every transaction, so two never deadlock).
fn sorted(scopes: &[String]) -> Vec<String> {
    let mut sorted = scopes.to_vec();
    sorted.sort();
    sorted
}

fn u(r: &Row, col: &str) -> Result<u64, DbError> {
    Ok(r.get::<i64>(col)?.max(0) as u64)
}

fn u_opt(r: &Row, col: &str) -> Result<Option<u64>, DbError> {
    Ok(r.get::<Option<i64>>(col)?.map(|v| v.max(0) as u64))
}

impl GatewayStore {
    /// The gateway's tables in `db`, migrated.
    pub async fn open(db: Db) -> Result<Self, BudgetError> {
        db.migrate(&schema::MIGRATIONS)
            .await
            .map_err(BudgetError::Schema)?;
        Ok(GatewayStore { db })
    }

    /// On a scratch SQLite database (tests).
    pub async fn open_in_memory() -> Result<Self, BudgetError> {
        Self::open(Db::sqlite_memory().map_err(err("open"))?).await
    }
}

async fn read_budget(tx: &mut Tx, scope: &str) -> Result<Option<Budget>, BudgetError> {
    let e = || err("read budget");
    let sql = "SELECT b.limit_tokens, b.limit_usd_cents, b.used_tokens, b.used_usd_cents,
            b.overage_tokens, b.overage_usd_cents,
            CAST(COALESCE((SELECT SUM(tokens) FROM gateway_reservations WHERE scope = b.scope), 0)
                AS BIGINT) AS rt,
            CAST(COALESCE((SELECT SUM(usd_cents) FROM gateway_reservations WHERE scope = b.scope), 0)
                AS BIGINT) AS rc
         FROM gateway_budgets b WHERE b.scope = $1";
    let Some(r) = tx.query_opt(sql, args![scope]).await.map_err(e())? else {
        return Ok(None);
    };
    let (limit, used) = (|c| u_opt(&r, c).map_err(e()), |c| u(&r, c).map_err(e()));
    Ok(Some(Budget {
        scope: scope.to_string(),
        limit_tokens: limit("limit_tokens")?,
        limit_usd_cents: limit("limit_usd_cents")?,
        used_tokens: used("used_tokens")?,
        used_usd_cents: used("used_usd_cents")?,
        reserved_tokens: used("rt")?,
        reserved_usd_cents: used("rc")?,
        overage_tokens: used("overage_tokens")?,
        overage_usd_cents: used("overage_usd_cents")?,
    }))
}

fn caller(r: Option<Row>) -> Result<Option<Caller>, DbError> {
    let Some(r) = r else { return Ok(None) };
    let (session, tenant) = (r.get("session")?, r.get("tenant")?);
    Ok(Some(Caller { session, tenant }))
}

/// Records `actual` (and the upstream's `overage` above it) against the
/// reservation's scopes and deletes it, once per reservation id (false:
/// settled before, nothing recorded now).
async fn settle_tx(
    tx: &mut Tx,
    id: &str,
    scopes: &[String],
    actual: Amount,
    overage: Amount,
) -> Result<bool, DbError> {
    let (tokens, cents) = (i(actual.tokens), i(actual.usd_cents));
    let (over_t, over_c) = (i(overage.tokens), i(overage.usd_cents));
    let once = "INSERT INTO gateway_settlements (id, tokens, usd_cents) VALUES ($1, $2, $3)
        ON CONFLICT (id) DO NOTHING";
    let fresh = tx.execute(once, args![id, tokens, cents]).await? == 1;
    if fresh {
        // Spend is recorded even if the janitor already dropped the
        // reservation: the call happened. A scope without limits gets a
        // row too: its spend is visible even when nothing caps it.
        let spend = "INSERT INTO gateway_budgets
                (scope, used_tokens, used_usd_cents, overage_tokens, overage_usd_cents)
            VALUES ($1, $2, $3, $4, $5)
            ON CONFLICT (scope) DO UPDATE SET
               used_tokens = gateway_budgets.used_tokens + $2,
               used_usd_cents = gateway_budgets.used_usd_cents + $3,
               overage_tokens = gateway_budgets.overage_tokens + $4,
               overage_usd_cents = gateway_budgets.overage_usd_cents + $5";
        for scope in &sorted(scopes) {
            let a = args![scope, tokens, cents, over_t, over_c];
            tx.execute(spend, a).await?;
        }
    }
    let done = "DELETE FROM gateway_reservations WHERE id = $1";
    tx.execute(done, args![id]).await?;
    Ok(fresh)
}

#[async_trait]
impl hatchery_db::Joined for Settlement {
    async fn write(&mut self, tx: &mut Tx, _: &[u64]) -> Result<bool, DbError> {
        self.fresh = settle_tx(tx, &self.id, &self.scopes, self.actual, self.overage).await?;
        Ok(self.fresh)
    }
}

/// Charges the reservations `select` finds (rows of id, scope, tokens,
/// usd_cents, ordered by id) their whole amounts in one transaction, each
/// once (`charged` is zero for one settled before), and returns them.
async fn charge_whole(
    db: &Db,
    select: &str,
    a: &[hatchery_db::Value],
    what: &'static str,
) -> Result<Vec<Expired>, BudgetError> {
    let mut tx = db.begin().await.map_err(err(what))?;
    let rows = tx.query(select, a).await;
    let rows = rows.map_err(err("read reservations to charge"))?;
    let mut out: Vec<Expired> = vec![];
    for r in &rows {
        let id: String = r.get("id").map_err(err("read reservations to charge"))?;
        let scope: String = r.get("scope").map_err(err("read reservations to charge"))?;
        let amount = Amount {
            tokens: u(r, "tokens").map_err(err("read reservations to charge"))?,
            usd_cents: u(r, "usd_cents").map_err(err("read reservations to charge"))?,
        };
        match out.last_mut() {
            Some(e) if e.id == id => e.scopes.push(scope),
            _ => out.push(Expired {
                id,
                scopes: vec![scope],
                charged: amount,
            }),
        }
    }
    for e in &mut out {
        let fresh = settle_tx(&mut tx, &e.id, &e.scopes, e.charged, Amount::default()).await;
        if !fresh.map_err(err("charge a reservation whole"))? {
            e.charged = Amount::default();
        }
    }
    tx.commit().await.map_err(err(what))?;
    Ok(out)
}

#[async_trait]
impl BudgetStore for GatewayStore {
    async fn set_limits(
        &self,
        scope: &str,
        tokens: Option<u64>,
        usd_cents: Option<u64>,
    ) -> Result<Budget, BudgetError> {
        let mut tx = self.db.begin().await.map_err(err("begin set limits"))?;
        let sql =
            "INSERT INTO gateway_budgets (scope, limit_tokens, limit_usd_cents) VALUES ($1, $2, $3)
             ON CONFLICT (scope) DO UPDATE SET limit_tokens = $2, limit_usd_cents = $3";
        let a = args![scope, tokens.map(i), usd_cents.map(i)];
        tx.execute(sql, a).await.map_err(err("set limits"))?;
        let b = read_budget(&mut tx, scope).await?;
        tx.commit().await.map_err(err("commit set limits"))?;
        Ok(b.expect("just written"))
    }

    async fn open_reservations(&self, scope: &str) -> Result<u64, BudgetError> {
        let sql = "SELECT CAST(COUNT(*) AS BIGINT) FROM gateway_reservations WHERE scope = $1";
        let r = self
            .db
            .query_opt(sql, args![scope])
            .await
            .map_err(err("count reservations"))?;
        match r {
            Some(r) => Ok(r.get::<i64>(0).map_err(err("count reservations"))?.max(0) as u64),
            None => Ok(0),
        }
    }

    async fn get(&self, scope: &str) -> Result<Budget, BudgetError> {
        let mut tx = self.db.read().await.map_err(err("begin read budget"))?;
        let b = read_budget(&mut tx, scope).await?;
        tx.commit().await.map_err(err("end read budget"))?;
        b.ok_or_else(|| BudgetError::UnknownScope(scope.to_string()))
    }

    async fn reserve(
        &self,
        id: &str,
        scopes: &[String],
        estimate: Amount,
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<(), BudgetError> {
        let mut tx = self.db.begin().await.map_err(err("begin reserve"))?;
        let lock = "SELECT scope FROM gateway_budgets WHERE scope = $1 FOR UPDATE";
        for scope in &sorted(scopes) {
            let locked = tx.query(lock, args![scope]).await;
            locked.map_err(err("lock budget"))?;
        }
        let (tokens, cents) = (i(estimate.tokens), i(estimate.usd_cents));
        let expires = i(now_ms.saturating_add(ttl_ms));
        let insert = "INSERT INTO gateway_reservations (id, scope, tokens, usd_cents, expires_ms)
            VALUES ($1, $2, $3, $4, $5)";
        for scope in scopes {
            if let Some(b) = read_budget(&mut tx, scope).await? {
                // Refused: dropping `tx` rolls back what was reserved.
                admits(&b, estimate)?;
            }
            let a = args![id, scope, tokens, cents, expires];
            let held = tx.execute(insert, a).await;
            held.map_err(err("insert reservation"))?;
        }
        tx.commit().await.map_err(err("commit reserve"))
    }

    async fn settle(
        &self,
        id: &str,
        scopes: &[String],
        actual: Amount,
    ) -> Result<bool, BudgetError> {
        // Relaxed (no fsync of its own on SQLite; durable at the next
        // durable commit): a settle lost to a power loss leaves its
        // reservation held, and the janitor charges an expired reservation
        // its whole estimate (`expire`), which is at least what the call
        // was settled for. So a lost settle can only over-charge: the bound
        // holds. The reservation itself stays a durable commit: it is the
        // record that the call may go out.
        let s = Settlement {
            id: id.to_string(),
            scopes: scopes.to_vec(),
            actual,
            overage: Amount::default(),
            fresh: false,
        };
        self.settle_call(&s).await
    }

    async fn settle_call(&self, s: &Settlement) -> Result<bool, BudgetError> {
        // Relaxed, as `settle` says; an overage lost with it only leaves
        // the scope more room than the upstream's reports would: the
        // recorded bound still holds.
        let mut tx = self.db.begin_relaxed().await.map_err(err("begin settle"))?;
        let fresh = settle_tx(&mut tx, &s.id, &s.scopes, s.actual, s.overage).await;
        let fresh = fresh.map_err(err("settle"))?;
        tx.commit().await.map_err(err("commit settle"))?;
        Ok(fresh)
    }

    async fn expire(&self, now_ms: u64) -> Result<Vec<Expired>, BudgetError> {
        let sql = "SELECT id, scope, tokens, usd_cents FROM gateway_reservations \
                   WHERE expires_ms < $1 ORDER BY id, scope";
        charge_whole(&self.db, sql, args![i(now_ms)], "expire").await
    }

    async fn charge_open(&self, scope: &str) -> Result<Vec<Expired>, BudgetError> {
        // Every scope of each reservation that holds `scope`: the tenant's
        // too, as its settle would have been.
        let sql = "SELECT id, scope, tokens, usd_cents FROM gateway_reservations \
                   WHERE id IN (SELECT id FROM gateway_reservations WHERE scope = $1) \
                   ORDER BY id, scope";
        charge_whole(&self.db, sql, args![scope], "charge open").await
    }

    /// On PostgreSQL the database's clock (several processes share it);
    /// on SQLite this process's, the only one using the file.
    async fn now_ms(&self) -> Result<u64, BudgetError> {
        if self.db.dialect() == Dialect::Sqlite {
            return Ok(crate::now_ms());
        }
        let sql = "SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT) AS now_ms";
        let r = self.db.query_opt(sql, args![]).await;
        let now = r.and_then(|r| u(&r.ok_or(DbError::NoRow)?, "now_ms"));
        now.map_err(err("read the database clock"))
    }
}

#[async_trait]
impl KeyStore for GatewayStore {
    async fn add_key(
        &self,
        hash: &str,
        caller: &Caller,
        expires_ms: u64,
    ) -> Result<(), BudgetError> {
        let sql =
            "INSERT INTO gateway_keys (hash, session, tenant, expires_ms) VALUES ($1, $2, $3, $4)";
        let tenant = caller.tenant.as_deref();
        let a = args![hash, &caller.session, tenant, i(expires_ms)];
        self.db.execute(sql, a).await.map_err(err("add key"))?;
        Ok(())
    }

    async fn caller(&self, hash: &str, now_ms: u64) -> Result<Option<Caller>, BudgetError> {
        let sql = "SELECT session, tenant FROM gateway_keys WHERE hash = $1 AND expires_ms > $2";
        let row = self.db.query_opt(sql, args![hash, i(now_ms)]).await;
        row.and_then(caller).map_err(err("read key"))
    }

    async fn bind_sandbox(&self, sandbox: &str, caller: &Caller) -> Result<(), BudgetError> {
        let sql =
            "INSERT INTO gateway_sandbox_bindings (sandbox, session, tenant) VALUES ($1, $2, $3)
             ON CONFLICT (sandbox) DO UPDATE SET session = $2, tenant = $3";
        let a = args![sandbox, &caller.session, caller.tenant.as_deref()];
        self.db.execute(sql, a).await.map_err(err("bind sandbox"))?;
        Ok(())
    }

    async fn unbind_sandbox(&self, sandbox: &str) -> Result<bool, BudgetError> {
        let sql = "DELETE FROM gateway_sandbox_bindings WHERE sandbox = $1";
        let n = self.db.execute(sql, args![sandbox]).await;
        Ok(n.map_err(err("unbind sandbox"))? == 1)
    }

    async fn caller_of_sandbox(&self, sandbox: &str) -> Result<Option<Caller>, BudgetError> {
        let sql = "SELECT session, tenant FROM gateway_sandbox_bindings WHERE sandbox = $1";
        let row = self.db.query_opt(sql, args![sandbox]).await;
        row.and_then(caller).map_err(err("read binding"))
    }
}
