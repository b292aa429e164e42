//! One migration runner for every product, on both databases. Each
//! product has a numbered, append-only list of [`Step`]s; the one
//! `hatchery_migrations` table records `(product, version)` for each step
//! run. A run happens in one write transaction under one lock (the
//! PostgreSQL advisory lock of the table's name; SQLite's write lock), so
//! two daemons starting at once end up with one schema, a second run is a
//! no-op, a failed step leaves nothing half-applied, and a database
//! migrated by a newer build is refused rather than written to.

use crate::{Db, DbError, Dialect};

/// The record table.
pub const MIGRATIONS_TABLE: &str = "hatchery_migrations";

/// One migration: the same schema text on both databases (after the
/// dialect's rewrite of `BIGSERIAL PRIMARY KEY` and `BYTEA`), or one text
/// each where they differ (triggers, functions).
pub enum Step {
    Both(&'static str),
    Each {
        sqlite: &'static str,
        postgres: &'static str,
    },
}

impl Step {
    fn text(&self, d: Dialect) -> &'static str {
        match self {
            Step::Both(s) => s,
            Step::Each { sqlite, postgres } => d.pick(sqlite, postgres),
        }
    }
}

/// A product's migrations. Append only: a released step is never edited.
pub struct Migrations {
    /// The product's name, also its tables' prefix ("sandbox", "policy").
    pub product: &'static str,
    pub steps: &'static [Step],
}

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("{product} migrations: {what}")]
    Db {
        product: &'static str,
        what: String,
        #[source]
        source: DbError,
    },
    #[error("this database has no {product} schema (no daemon has run on it)")]
    Missing { product: &'static str },
    #[error("the {product} schema is at version {found}, newer than this build's {known}")]
    TooNew {
        product: &'static str,
        found: u64,
        known: u64,
    },
}

impl MigrateError {
    /// The database was not there (retryable) rather than wrong.
    pub fn unavailable(&self) -> bool {
        matches!(self, MigrateError::Db { source, .. } if source.unavailable())
    }
}

const RECORD: &str = "CREATE TABLE IF NOT EXISTS hatchery_migrations (
    product TEXT NOT NULL,
    version BIGINT NOT NULL,
    applied_at_ms BIGINT NOT NULL,
    PRIMARY KEY (product, version)
)";

impl Migrations {
    fn err(&self, what: impl Into<String>) -> impl FnOnce(DbError) -> MigrateError {
        let product = self.product;
        let what = what.into();
        move |source| MigrateError::Db {
            product,
            what,
            source,
        }
    }

    fn known(&self) -> u64 {
        self.steps.len() as u64
    }

    /// Runs the steps not yet recorded; returns how many ran.
    pub async fn run(&self, db: &Db) -> Result<u64, MigrateError> {
        let mut tx = db.begin().await.map_err(self.err("begin"))?;
        tx.lock(MIGRATIONS_TABLE).await.map_err(self.err("lock"))?;
        tx.batch(RECORD).await.map_err(self.err("record table"))?;
        let done = version(&mut tx, self.product)
            .await
            .map_err(self.err("version"))?;
        self.not_newer(done)?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        let d = tx.dialect();
        for (n, step) in self.steps.iter().enumerate().skip(done as usize) {
            let v = n as u64 + 1;
            tx.batch(step.text(d))
                .await
                .map_err(self.err(format!("step {v}")))?;
            tx.execute(
                "INSERT INTO hatchery_migrations (product, version, applied_at_ms) VALUES ($1, $2, $3)",
                crate::args![self.product, v, now],
            )
            .await
            .map_err(self.err("record"))?;
            tracing::info!(product = self.product, version = v, db = ?d, "schema migrated");
        }
        tx.commit().await.map_err(self.err("commit"))?;
        Ok(self.known() - done)
    }

    /// For readers that must not migrate (`hatchery audit verify`): the
    /// recorded version, refusing a database where none ran and one
    /// migrated by a newer build. Writes nothing.
    pub async fn check(&self, db: &Db) -> Result<u64, MigrateError> {
        let mut tx = db.read().await.map_err(self.err("begin"))?;
        let exists = tx.dialect().pick(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = $1",
            "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema() AND tablename = $1",
        );
        let n: i64 = tx
            .query_one(exists, crate::args![MIGRATIONS_TABLE])
            .await
            .and_then(|r| r.get(0))
            .map_err(self.err("record table"))?;
        let v = if n == 0 {
            0
        } else {
            version(&mut tx, self.product)
                .await
                .map_err(self.err("version"))?
        };
        if v == 0 {
            return Err(MigrateError::Missing {
                product: self.product,
            });
        }
        self.not_newer(v)?;
        Ok(v)
    }

    fn not_newer(&self, found: u64) -> Result<(), MigrateError> {
        if found > self.known() {
            return Err(MigrateError::TooNew {
                product: self.product,
                found,
                known: self.known(),
            });
        }
        Ok(())
    }
}

async fn version(tx: &mut crate::Tx, product: &str) -> Result<u64, DbError> {
    tx.query_one(
        "SELECT CAST(COALESCE(MAX(version), 0) AS BIGINT) FROM hatchery_migrations WHERE product = $1",
        crate::args![product],
    )
    .await?
    .get::<u64>(0)
}
