//! Budgets and reservations. Before a model call the gateway reserves its
//! worst case against every scope the call is charged to (the session and
//! its tenant) in one transaction that checks
//! `used + overage + live reservations + estimate <= limit` for each (the
//! overage: what upstreams reported above earlier calls' reservations,
//! never charged but spent); after the call it settles the actual usage,
//! at most the reservation, and drops the reservation. So recorded spend can
//! pass a limit only by what the calls already in flight under-estimated,
//! which is at most the largest single reservation (the estimate is an
//! upper bound, see `estimate.rs`). A reservation left by a crash expires
//! after its TTL and the janitor deletes it.

use async_trait::async_trait;

/// A reservation the janitor charged whole: its id, its scopes and what
/// was charged (nothing when it had been settled before).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expired {
    pub id: String,
    pub scopes: Vec<String>,
    pub charged: Amount,
}

impl Expired {
    /// The session the reservation was made for, from its scopes.
    pub fn caller(&self) -> Option<Caller> {
        let session = self
            .scopes
            .iter()
            .find_map(|s| s.strip_prefix("session:"))?;
        let tenant = self
            .scopes
            .iter()
            .find_map(|s| s.strip_prefix("tenant:"))
            .map(str::to_string);
        Some(Caller {
            session: session.to_string(),
            tenant,
        })
    }
}

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
    /// What upstreams reported above their calls' reservations: not
    /// charged (`used` stays within the bound), but spent all the same, so
    /// it counts against the limit when a call asks for room.
    #[serde(default)]
    pub overage_tokens: u64,
    #[serde(default)]
    pub overage_usd_cents: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum BudgetError {
    #[error("budget {scope} is exhausted: {unit} used {used} + reported above reservations {overage} + reserved {reserved} + this call's estimate {estimate} > limit {limit}")]
    Exhausted {
        scope: String,
        unit: &'static str,
        used: u64,
        overage: u64,
        reserved: u64,
        estimate: u64,
        limit: u64,
    },
    #[error("no budget for scope {0}")]
    UnknownScope(String),
    /// The database refused or failed a statement; `what` names what was
    /// being done.
    #[error("budget store: {what}: {source}")]
    Db {
        what: &'static str,
        #[source]
        source: hatchery_db::DbError,
    },
    /// Its migrations could not run (or the schema is newer than this build).
    #[error("budget store: {0}")]
    Schema(#[source] hatchery_db::MigrateError),
}

/// The store behind budgets (`store::GatewayStore`).
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
    /// [`Self::settle`] of a call whose upstream reported more than its
    /// reservation: `s.actual` (at most the reservation) is charged, and
    /// `s.overage` (the reported excess) is recorded against each scope in
    /// the same transaction, where [`Self::reserve`] counts it.
    async fn settle_call(&self, s: &Settlement) -> Result<bool, BudgetError>;
    /// Charges reservations whose TTL has passed their whole amount, as a
    /// settle would (once per reservation), and returns them. A call is
    /// settled well within its TTL unless the process serving it died, and
    /// its upstream may have billed it: freeing the reservation instead
    /// would give the budget room for spend that already happened.
    async fn expire(&self, now_ms: u64) -> Result<Vec<Expired>, BudgetError>;
    /// Charges every open reservation of `scope` its whole amount, on all
    /// its scopes, as [`Self::expire`] does, and returns them: a session
    /// ends with a call its process never settled (issue 36), and its
    /// final spend must count that call before it is reported. A late
    /// settle of one records nothing more.
    async fn charge_open(&self, scope: &str) -> Result<Vec<Expired>, BudgetError>;
    /// How many reservations of `scope` are open (calls in flight).
    async fn open_reservations(&self, scope: &str) -> Result<u64, BudgetError>;
    /// The clock reservations are stamped and expired by. A store shared
    /// by several processes answers with its own (the database's) clock,
    /// so that a process whose clock runs ahead cannot expire the others'
    /// reservations early (and let a budget be overspent by them).
    async fn now_ms(&self) -> Result<u64, BudgetError> {
        Ok(crate::now_ms())
    }
}

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

impl BudgetError {
    /// The database is not reachable now (retryable).
    pub fn unavailable(&self) -> bool {
        match self {
            BudgetError::Db { source, .. } => source.unavailable(),
            BudgetError::Schema(e) => e.unavailable(),
            _ => false,
        }
    }
}

/// Whether `estimate` fits in budget `b`, in every unit.
pub(crate) fn admits(b: &Budget, estimate: Amount) -> Result<(), BudgetError> {
    check(
        &b.scope,
        "tokens",
        b.limit_tokens,
        [b.used_tokens, b.overage_tokens, b.reserved_tokens],
        estimate.tokens,
    )?;
    check(
        &b.scope,
        "usd_cents",
        b.limit_usd_cents,
        [b.used_usd_cents, b.overage_usd_cents, b.reserved_usd_cents],
        estimate.usd_cents,
    )
}

/// The check of one unit: `used + overage + reserved + estimate <= limit`.
/// The overage counts: a scope an upstream's reports have spent (charged
/// or not) admits no more calls, else a tenant's other sessions would go
/// on calling an upstream that bills more than the gateway records.
fn check(
    scope: &str,
    unit: &'static str,
    limit: Option<u64>,
    [used, overage, reserved]: [u64; 3],
    estimate: u64,
) -> Result<(), BudgetError> {
    let held = used.saturating_add(overage).saturating_add(reserved);
    match limit {
        Some(limit) if held.saturating_add(estimate) > limit => Err(BudgetError::Exhausted {
            scope: scope.to_string(),
            unit,
            used,
            overage,
            reserved,
            estimate,
            limit,
        }),
        _ => Ok(()),
    }
}

/// A settle run inside another store's transaction (hatchery_db::Joined):
/// a session log commits the call's `model_call` event, the session's
/// spend and the settle together. Declines when the reservation was
/// settled before, which rolls the event back with it: a call is charged
/// and logged once. On the control role it travels with the event to the
/// session's owner, which runs it in its transaction (serialized; `fresh`
/// stays behind).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settlement {
    pub id: String,
    pub scopes: Vec<String>,
    pub actual: Amount,
    /// What the upstream reported above the reservation (not charged;
    /// counted against the scopes' limits by the next reservations).
    /// Absent in a settle posted by an older gateway: none.
    #[serde(default)]
    pub overage: Amount,
    /// Set once the settle committed: whether it recorded the spend.
    #[serde(skip)]
    pub fresh: bool,
}
