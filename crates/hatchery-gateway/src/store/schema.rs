//! The gateway's tables (`gateway_budgets`, `gateway_reservations`,
//! `gateway_settlements`, `gateway_keys`, `gateway_sandbox_bindings`), one
//! numbered migration set on both databases, and the ways an older
//! deployment's rows get into them.

use hatchery_db::{Db, DbError, Import, Migrations, Step};

macro_rules! tables {
    () => {
        "CREATE TABLE IF NOT EXISTS gateway_budgets (
            scope TEXT PRIMARY KEY,
            limit_tokens BIGINT,
            limit_usd_cents BIGINT,
            used_tokens BIGINT NOT NULL DEFAULT 0,
            used_usd_cents BIGINT NOT NULL DEFAULT 0
        );
        CREATE TABLE IF NOT EXISTS gateway_reservations (
            id TEXT NOT NULL,
            scope TEXT NOT NULL,
            tokens BIGINT NOT NULL,
            usd_cents BIGINT NOT NULL,
            expires_ms BIGINT NOT NULL,
            PRIMARY KEY (id, scope)
        );
        CREATE INDEX IF NOT EXISTS gateway_reservations_scope ON gateway_reservations(scope);
        CREATE INDEX IF NOT EXISTS gateway_reservations_expiry ON gateway_reservations(expires_ms);
        CREATE TABLE IF NOT EXISTS gateway_settlements (
            id TEXT PRIMARY KEY,
            tokens BIGINT NOT NULL,
            usd_cents BIGINT NOT NULL
        );
        -- What a caller presents instead of the upstream key, stored as
        -- SHA-256, each naming the session (and tenant) it charges.
        CREATE TABLE IF NOT EXISTS gateway_keys (
            hash TEXT PRIMARY KEY,
            session TEXT NOT NULL,
            tenant TEXT,
            expires_ms BIGINT NOT NULL
        );
        -- Sandboxes bound to a caller: calls through the daemon's relay
        -- carry the sandbox id (set by the host, never by the guest).
        CREATE TABLE IF NOT EXISTS gateway_sandbox_bindings (
            sandbox TEXT PRIMARY KEY,
            session TEXT NOT NULL,
            tenant TEXT
        );"
    };
}

/// Append only. On PostgreSQL the previous release kept these tables
/// unprefixed (`budgets`, `keys`, ...) in the shared database: the first
/// step renames them, so that a database it made keeps its budgets, spend
/// and keys, then creates whatever is not there (all of it on a new
/// database).
pub const MIGRATIONS: Migrations = Migrations {
    product: "gateway",
    steps: &[
        Step::Each {
            sqlite: tables!(),
            postgres: concat!(
                "ALTER TABLE IF EXISTS budgets RENAME TO gateway_budgets;
            ALTER TABLE IF EXISTS reservations RENAME TO gateway_reservations;
            ALTER TABLE IF EXISTS settlements RENAME TO gateway_settlements;
            ALTER TABLE IF EXISTS keys RENAME TO gateway_keys;
            ALTER TABLE IF EXISTS sandbox_bindings RENAME TO gateway_sandbox_bindings;
            ALTER INDEX IF EXISTS reservations_scope RENAME TO gateway_reservations_scope;
            ALTER INDEX IF EXISTS reservations_expiry RENAME TO gateway_reservations_expiry;
            ",
                tables!()
            ),
        },
        // What upstreams reported above their calls' reservations (never
        // charged, see settle.rs), per scope: a scope whose used + overage no
        // longer fits its limit takes no more reservations (issue 36), so
        // an upstream that over-reports is not called on for ever.
        Step::Both(
            "ALTER TABLE gateway_budgets ADD COLUMN overage_tokens BIGINT NOT NULL DEFAULT 0;
        ALTER TABLE gateway_budgets ADD COLUMN overage_usd_cents BIGINT NOT NULL DEFAULT 0;",
        ),
    ],
};

/// The previous release's SQLite file (DATA_DIR/gateway.db in the daemon),
/// at its last migration (3).
pub const IMPORT: Import = Import {
    file: "gateway.db",
    copy: &[
        "INSERT INTO gateway_budgets (scope, limit_tokens, limit_usd_cents, used_tokens, used_usd_cents)
         SELECT scope, limit_tokens, limit_usd_cents, used_tokens, used_usd_cents FROM old.budgets",
        "INSERT INTO gateway_reservations (id, scope, tokens, usd_cents, expires_ms)
         SELECT id, scope, tokens, usd_cents, expires_ms FROM old.reservations",
        "INSERT INTO gateway_settlements (id, tokens, usd_cents)
         SELECT id, tokens, usd_cents FROM old.settlements",
        "INSERT INTO gateway_keys (hash, session, tenant, expires_ms)
         SELECT hash, session, tenant, expires_ms FROM old.keys",
        "INSERT INTO gateway_sandbox_bindings (sandbox, session, tenant)
         SELECT sandbox, session, tenant FROM old.sandbox_bindings",
    ],
};

const OLD_TABLES: [&str; 5] = [
    "budgets",
    "reservations",
    "settlements",
    "keys",
    "sandbox_bindings",
];

/// The standalone `hatchery-gateway` given the previous release's SQLite
/// file itself as `--db`: its old tables are copied into the new ones and
/// dropped, in one transaction, after the migrations. Nothing to do on
/// PostgreSQL (renamed by the migration) or on a file without them.
pub async fn adopt_old_tables(db: &Db) -> Result<bool, DbError> {
    if db.dialect() == hatchery_db::Dialect::Postgres {
        return Ok(false);
    }
    let mut tx = db.begin().await?;
    let old = tx
        .query_opt(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'budgets'",
            hatchery_db::args![],
        )
        .await?;
    if old.is_none() {
        return Ok(false);
    }
    for copy in IMPORT.copy {
        tx.execute(&copy.replace("FROM old.", "FROM "), hatchery_db::args![])
            .await?;
    }
    for t in OLD_TABLES {
        tx.batch(&format!("DROP TABLE {t}")).await?;
    }
    tx.commit().await?;
    Ok(true)
}
