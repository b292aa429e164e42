//! Opens the state store `--db` names (default: DATA_DIR/state.db). A
//! PostgreSQL that is not up yet is retried with backoff for a while, each
//! attempt logged, before the daemon gives up with the last error.

use crate::DaemonError;
use hatchery_config::DaemonArgs;
use hatchery_db::retry_while_unreachable;
use hatchery_store::{Store, StoreError};
use std::path::Path;
use std::sync::Arc;

/// The deployment's one database: `--db` (a `postgres://` URL or a SQLite
/// path), by default DATA_DIR/hatchery.db. Products moved onto it keep
/// their state here; the others still open their own files
/// (docs/architecture.md). Waits for a PostgreSQL that is not up yet.
pub async fn open_db(args: &DaemonArgs, data: &Path) -> Result<hatchery_db::Db, DaemonError> {
    let err = |what: &str| {
        let what = what.to_owned();
        move |source| DaemonError::Db { what, source }
    };
    let db = match (args.shared_db(), &args.db) {
        (Some(dsn), _) => hatchery_db::Db::postgres(dsn, args.db_pool).map_err(err("address"))?,
        (None, file) => {
            let file = file
                .as_ref()
                .map(|f| std::path::PathBuf::from(f.strip_prefix("sqlite://").unwrap_or(f)))
                .unwrap_or_else(|| data.join(hatchery_db::DB_FILE));
            hatchery_db::Db::sqlite(&file)
                .await
                .map_err(err(&file.display().to_string()))?
        }
    };
    retry_while_unreachable(
        "database",
        || db.query("SELECT 1", hatchery_db::args![]),
        hatchery_db::DbError::unavailable,
    )
    .await
    .map_err(err("connect"))?;
    tracing::info!(db = %db.describe(), "database open");
    Ok(db)
}

/// The state store in `db`; a single-host data dir of the previous
/// release has its DATA_DIR/state.db imported once.
pub async fn open(
    args: &DaemonArgs,
    db: &hatchery_db::Db,
    data: &Path,
) -> Result<Arc<dyn Store>, DaemonError> {
    let s = retry_while_unreachable(
        "state",
        || hatchery_store::open(db.clone()),
        |e| matches!(e, StoreError::Unavailable(_)),
    )
    .await
    .map_err(|e| DaemonError::Core(e.into()))?;
    import(db, data, &hatchery_store::IMPORT).await?;
    tracing::info!(db = %db.describe(), backend = s.backend(), host = %args.host_id, "state store open");
    Ok(s)
}

/// Imports a product's file of the previous release into `db`, once.
pub async fn import(
    db: &hatchery_db::Db,
    data: &Path,
    what: &hatchery_db::Import,
) -> Result<(), DaemonError> {
    db.import_sqlite(data, what)
        .await
        .map(|_| ())
        .map_err(|source| DaemonError::Db {
            what: format!("importing {}", what.file),
            source,
        })
}

/// The policy store, in the deployment's one database (every host reads
/// the same policies on PostgreSQL, so a session finds its pinned version
/// wherever it runs). A single-host data dir of the previous release has
/// its DATA_DIR/policies.db imported once.
pub async fn open_policies(
    db: &hatchery_db::Db,
    data: &Path,
) -> Result<Arc<dyn hatchery_policy::PolicyStore>, DaemonError> {
    use hatchery_policy::{DbPolicyStore, StoreError as PolicyError};
    let s = retry_while_unreachable(
        "policies",
        || DbPolicyStore::open(db.clone()),
        |e| matches!(e, PolicyError::Unavailable(_)),
    )
    .await?;
    import(db, data, &hatchery_policy::store::IMPORT).await?;
    Ok(Arc::new(s))
}

/// The tenants and their keys, in the deployment's one database (on
/// PostgreSQL every host resolves the same keys).
pub async fn open_tenants(
    db: &hatchery_db::Db,
) -> Result<Arc<dyn hatchery_tenants::TenantStore>, DaemonError> {
    use hatchery_tenants::{DbTenantStore, StoreError as TenantError};
    let s = retry_while_unreachable(
        "tenants",
        || DbTenantStore::open(db.clone()),
        |e| matches!(e, TenantError::Unavailable(_)),
    )
    .await?;
    Ok(Arc::new(s))
}
