//! `hatchery audit verify --db FILE|URL [CHAIN]`: recomputes hash chains
//! and names the first bad seq of each chain (docs/policy.md, "Audit").
//! Reads the session event logs of a deployment's database (its SQLite
//! file `DATA_DIR/hatchery.db`, with no daemon running, or the
//! `postgres://` database many hosts share), read-only; or a SQLite file
//! with hatchery-audit's own `audit_events` layout (a standalone audit
//! log, or a `sessions.db` from before the one database). Anchored heads
//! come from an anchor file (`--anchors`) or the object store the daemon
//! anchors to (`--anchors-s3-url`).

use clap::{Args, Subcommand};
use std::path::PathBuf;

/// Exit status when a chain does not verify (1 is for errors, 2 for
/// usage errors, as clap answers them).
pub const EXIT_TAMPERED: i32 = 3;

#[derive(Subcommand)]
pub enum AuditCmd {
    /// Verify every chain (or one); exit 0 if all verify, 3 if one does not.
    Verify(VerifyArgs),
}

#[derive(Args)]
pub struct VerifyArgs {
    /// The audit database: a SQLite file (`DATA_DIR/hatchery.db`), or the
    /// `postgres://` URL of the database the daemons keep their sessions
    /// in.
    #[arg(long)]
    db: String,
    /// Only this chain (a session id, or `global`).
    chain: Option<String>,
    /// An anchor file: each anchored head must still be in its chain.
    #[arg(long)]
    anchors: Option<PathBuf>,
    /// The object store the daemon anchors to (its `audit.anchor_s3_url`,
    /// `https://host[:port]/BUCKET[/PREFIX]`): every object under
    /// PREFIX/all/ is read, and each head in them must still be in its
    /// chain (with `--anchors`, both sets count).
    #[arg(long, requires = "anchors_s3_credentials_file")]
    anchors_s3_url: Option<String>,
    /// The bucket's region.
    #[arg(long, default_value = "us-east-1")]
    anchors_s3_region: String,
    /// The bucket's read key, in the AWS credentials-file form
    /// (`aws_access_key_id = ...`, `aws_secret_access_key = ...`).
    #[arg(long, requires = "anchors_s3_url")]
    anchors_s3_credentials_file: Option<PathBuf>,
    /// A PEM bundle the store's certificate is verified against instead
    /// of the system's (the daemon's `audit.anchor_s3_ca_file`).
    #[arg(long, requires = "anchors_s3_url")]
    anchors_s3_ca_file: Option<PathBuf>,
    /// One JSON report per chain instead of text.
    #[arg(long)]
    json: bool,
}

/// Where the chains are read from.
enum Source {
    /// A file in hatchery-audit's `audit_events` layout.
    AuditLog(hatchery_audit::SqliteAuditLog),
    /// The session tables of a deployment's database.
    Sessions(
        tokio::runtime::Runtime,
        hatchery_sessions_schema::AuditReader,
    ),
}

impl Source {
    fn open(db: &str) -> anyhow::Result<Source> {
        if !hatchery_db::is_postgres(db) {
            let path = PathBuf::from(db);
            if !path.exists() {
                anyhow::bail!("{db}: no such file");
            }
            let log = hatchery_audit::SqliteAuditLog::open_read_only(&path)?;
            let layout: i64 = log.connection().query_row(
                "SELECT count(*) FROM sqlite_master WHERE name = 'audit_events'",
                [],
                |r| r.get(0),
            )?;
            if layout > 0 {
                return Ok(Source::AuditLog(log));
            }
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        // Read only: no migration (and on PostgreSQL the server refuses
        // any write).
        let reader = rt.block_on(hatchery_sessions_schema::AuditReader::open(db))?;
        Ok(Source::Sessions(rt, reader))
    }

    fn chains(&self) -> anyhow::Result<Vec<String>> {
        Ok(match self {
            Source::AuditLog(log) => log.chains()?,
            Source::Sessions(rt, s) => rt.block_on(s.chains())?,
        })
    }

    fn verify(
        &self,
        chain: &str,
        anchors: &[hatchery_audit::Head],
    ) -> anyhow::Result<hatchery_audit::Report> {
        Ok(match self {
            Source::AuditLog(log) => log.verify_chain(chain, anchors)?,
            Source::Sessions(rt, s) => rt.block_on(s.verify(chain, anchors))?,
        })
    }
}

/// Why the object store's anchors could not be read.
#[derive(Debug, thiserror::Error)]
pub enum S3AnchorsError {
    #[error("--anchors-s3-url")]
    Url(#[from] hatchery_audit::s3::LocationError),
    #[error("reading the anchors from the object store")]
    Store(#[from] hatchery_audit::s3::S3Error),
    #[error("a runtime for the object store's requests")]
    Runtime(#[source] std::io::Error),
}

/// Every head anchored in the object store at `url`, in key (time) order.
fn read_s3_anchors(
    url: &str,
    region: &str,
    credentials_file: &std::path::Path,
    ca_file: Option<&std::path::Path>,
) -> Result<Vec<hatchery_audit::Head>, S3AnchorsError> {
    let loc = hatchery_audit::s3::S3Location::parse(url)?;
    let mut store = hatchery_audit::s3::S3Store::new(loc, region, credentials_file.into())?;
    if let Some(ca) = ca_file {
        store = store.with_ca_file(ca.into());
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(S3AnchorsError::Runtime)?;
    Ok(rt.block_on(store.read_anchors())?)
}

pub fn run(cmd: AuditCmd) -> anyhow::Result<i32> {
    let AuditCmd::Verify(a) = cmd;
    let mut anchors = match &a.anchors {
        Some(p) => hatchery_audit::read_anchors(p)?,
        None => Vec::new(),
    };
    if let (Some(url), Some(creds)) = (&a.anchors_s3_url, &a.anchors_s3_credentials_file) {
        anchors.extend(read_s3_anchors(
            url,
            &a.anchors_s3_region,
            creds,
            a.anchors_s3_ca_file.as_deref(),
        )?);
    }
    // The anchors first: a bad --anchors-s3-url is reported before the
    // database is opened, and every head read was anchored before the
    // chains are read (chains only grow, so each must be there).
    let log = Source::open(&a.db)?;
    let chains = match a.chain {
        Some(c) => vec![c],
        None => log.chains()?,
    };
    let mut bad = false;
    for chain in chains {
        let r = log.verify(&chain, &anchors)?;
        if a.json {
            println!("{}", serde_json::to_string(&r)?);
        } else {
            match &r.first_bad {
                None => println!(
                    "{chain}: ok, {} events, head {}",
                    r.verified,
                    r.head
                        .as_ref()
                        .map(|h| format!("seq {} {}", h.seq, h.hash))
                        .unwrap_or_else(|| "none (empty chain)".into())
                ),
                Some(b) => println!(
                    "{chain}: BAD at seq {}: {} ({} events verified before it)",
                    b.seq,
                    serde_json::to_value(&b.problem)?["reason"]
                        .as_str()
                        .unwrap_or("?"),
                    r.verified
                ),
            }
        }
        bad |= !r.ok();
    }
    Ok(if bad { EXIT_TAMPERED } else { 0 })
}
