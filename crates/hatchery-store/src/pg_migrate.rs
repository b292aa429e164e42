//! One runner for the numbered PostgreSQL migrations of every crate that
//! keeps state in the shared database (this store, the sessions, the
//! policies, the gateway's budgets). Each set has its own record table
//! (one row per migration run) and its own advisory lock: two daemons
//! starting at once end up with one schema, a second run is a no-op, and a
//! database migrated by a newer build is refused rather than written to.

use deadpool_postgres::GenericClient;

/// A crate's migrations: append only, never edited once released.
pub struct PgMigrations {
    /// Named in logs and errors ("state", "sessions", ...).
    pub name: &'static str,
    /// The record table, a constant of the crate (never user input).
    pub table: &'static str,
    /// Any fixed number, distinct per set: serializes their runs.
    pub lock: i64,
    pub steps: &'static [&'static str],
}

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("{name} migrations: {what}: {message}")]
    Pg {
        name: &'static str,
        what: &'static str,
        message: String,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error("this database has no {name} schema (no daemon has run on it)")]
    Missing { name: &'static str },
    #[error("the {name} schema is at version {found}, newer than this build's {known}")]
    TooNew {
        name: &'static str,
        found: u64,
        known: u64,
    },
}

impl MigrateError {
    /// Whether the database was not there (retryable) rather than wrong.
    pub fn unavailable(&self) -> bool {
        matches!(self, MigrateError::Pg { source, .. } if crate::pg_unavailable(source))
    }
}

impl PgMigrations {
    fn err(&self, what: &'static str) -> impl FnOnce(tokio_postgres::Error) -> MigrateError {
        let name = self.name;
        move |source| MigrateError::Pg {
            name,
            what,
            message: crate::pg_message(&source),
            source,
        }
    }

    /// Runs the steps not yet recorded, in `tx` (the caller commits, and
    /// may do more in the same transaction). Returns how many ran.
    pub async fn run(&self, tx: &deadpool_postgres::Transaction<'_>) -> Result<u64, MigrateError> {
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&self.lock])
            .await
            .map_err(self.err("lock"))?;
        tx.batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {} (version INT NOT NULL)",
            self.table
        ))
        .await
        .map_err(self.err("record table"))?;
        let done = self.version(tx).await?;
        self.not_newer(done)?;
        let known = self.steps.len() as u64;
        let insert = format!("INSERT INTO {} (version) VALUES ($1)", self.table);
        for (n, step) in self.steps.iter().enumerate().skip(done as usize) {
            tx.batch_execute(step).await.map_err(self.err("step"))?;
            tx.execute(&insert, &[&((n + 1) as i32)])
                .await
                .map_err(self.err("record"))?;
            tracing::info!(
                store = self.name,
                version = n + 1,
                "postgres schema migrated"
            );
        }
        Ok(known - done)
    }

    /// For readers that must not migrate (`hatchery audit verify`): the
    /// recorded version, refusing a database where none ran and one
    /// migrated by a newer build. Writes nothing.
    pub async fn check(&self, c: &impl GenericClient) -> Result<u64, MigrateError> {
        let there: Option<String> = c
            .query_one("SELECT to_regclass($1)::text AS t", &[&self.table])
            .await
            .map_err(self.err("record table"))?
            .get("t");
        if there.is_none() {
            return Err(MigrateError::Missing { name: self.name });
        }
        let v = self.version(c).await?;
        self.not_newer(v)?;
        Ok(v)
    }

    fn not_newer(&self, found: u64) -> Result<(), MigrateError> {
        let known = self.steps.len() as u64;
        if found > known {
            return Err(MigrateError::TooNew {
                name: self.name,
                found,
                known,
            });
        }
        Ok(())
    }

    /// How many migrations the database has recorded.
    pub async fn version(&self, c: &impl GenericClient) -> Result<u64, MigrateError> {
        let n: i64 = c
            .query_one(&format!("SELECT count(*) AS n FROM {}", self.table), &[])
            .await
            .map_err(self.err("version"))?
            .get("n");
        Ok(n.max(0) as u64)
    }
}
