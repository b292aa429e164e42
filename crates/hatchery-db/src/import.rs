//! Upgrade in place: a data dir from before the one database kept each
//! product in a SQLite file of its own (`policies.db`, `rounds.db`, ...).
//! On first start each product copies its old file into the one database
//! (SQLite `ATTACH`, then `INSERT ... SELECT` in one transaction with a
//! record of the import), so it happens once, entirely or not at all, and
//! a second start finds the record and does nothing. The old file is only
//! read, and left where it was for the operator to remove.
//!
//! The old file must be at the schema of the release just before this one
//! (each product's old store migrated its file at every start, so a daemon
//! of that release that ran once has). On PostgreSQL there is nothing to
//! import: the products' tables were already in the one database, and
//! their migrations rename them in place.

use crate::{Db, DbError};
use std::path::Path;

/// One product's copy from its old file, attached as `old`.
pub struct Import {
    /// The old file's name in the data dir.
    pub file: &'static str,
    /// Statements that copy it, e.g.
    /// `INSERT INTO policy_versions SELECT ... FROM old.policy_versions`.
    pub copy: &'static [&'static str],
}

/// One [`Import::copy`] statement, its columns named once:
/// `copy_table!("round_sessions", "sessions", "id, state")` is
/// `INSERT INTO round_sessions (id, state) SELECT id, state FROM
/// old.sessions`. `or ignore` first skips rows already there; a last
/// literal is appended (an `ON CONFLICT` clause).
#[macro_export]
macro_rules! copy_table {
    (or ignore $to:literal, $from:literal, $cols:literal) => {
        concat!("INSERT OR IGNORE", $crate::copy_table!(@rest $to, $from, $cols, ""))
    };
    ($to:literal, $from:literal, $cols:literal $(, $tail:literal)?) => {
        concat!("INSERT", $crate::copy_table!(@rest $to, $from, $cols, "" $(, " ", $tail)?))
    };
    (@rest $to:literal, $from:literal, $cols:literal, $($tail:literal),*) => {
        concat!(" INTO ", $to, " (", $cols, ") SELECT ", $cols, " FROM old.", $from $(, $tail)*)
    };
}

/// What [`Db::import_sqlite`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Imported {
    /// Copied now, in one transaction.
    Now,
    /// A previous start copied it.
    Before,
    /// No old file (a new data dir, or PostgreSQL).
    Nothing,
}

const RECORD: &str = "CREATE TABLE IF NOT EXISTS hatchery_imports (
    file TEXT PRIMARY KEY,
    imported_at_ms INTEGER NOT NULL
)";

impl Db {
    /// Copies `data_dir/<import.file>` into this database once. Run it
    /// after the product's migrations.
    pub async fn import_sqlite(
        &self,
        data_dir: &Path,
        import: &Import,
    ) -> Result<Imported, DbError> {
        let old = data_dir.join(import.file);
        let Some(db) = self.sqlite_db() else {
            return Ok(Imported::Nothing);
        };
        if !tokio::fs::try_exists(&old).await.unwrap_or(false) {
            return Ok(Imported::Nothing);
        }
        let mut conn = db.conn(true).await?;
        let file = import.file;
        let copy = import.copy;
        conn.run(move |c| {
            c.execute_batch(RECORD)?;
            let done: i64 = c.query_row(
                "SELECT count(*) FROM hatchery_imports WHERE file = ?1",
                [file],
                |r| r.get(0),
            )?;
            if done > 0 {
                return Ok(Imported::Before);
            }
            c.execute(
                "ATTACH DATABASE ?1 AS old",
                [old.to_string_lossy().as_ref()],
            )?;
            let copied = (|| -> Result<(), DbError> {
                let tx = c.unchecked_transaction()?;
                for s in copy {
                    tx.execute_batch(s)?;
                }
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_millis() as i64)
                    .unwrap_or(0);
                tx.execute(
                    "INSERT INTO hatchery_imports (file, imported_at_ms) VALUES (?1, ?2)",
                    rusqlite::params![file, now],
                )?;
                tx.commit()?;
                Ok(())
            })();
            let detached = c.execute_batch("DETACH DATABASE old");
            copied?;
            detached?;
            tracing::info!(file, "imported into the one database");
            Ok(Imported::Now)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn copy_table_names_the_columns_once() {
        assert_eq!(
            crate::copy_table!("t", "old_t", "a, b"),
            "INSERT INTO t (a, b) SELECT a, b FROM old.old_t"
        );
        assert_eq!(
            crate::copy_table!(or ignore "t", "t", "a"),
            "INSERT OR IGNORE INTO t (a) SELECT a FROM old.t"
        );
        assert_eq!(
            crate::copy_table!("t", "t", "a", "WHERE true"),
            "INSERT INTO t (a) SELECT a FROM old.t WHERE true"
        );
    }
}
