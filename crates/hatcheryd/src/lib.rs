//! Daemon assembly: the `hatcheryd` binary (`hatchery serve` execs it).

mod control_role;
mod error;
mod host_role;
mod key;
mod listeners;
mod rounds;
mod state_db;
mod tenant_keys;

pub use error::DaemonError;
pub use hatchery_config::DaemonArgs;

/// Runs the daemon in its role until SIGTERM. The role's needs (a shared
/// database, ...) were checked with the rest of the configuration
/// (hatchery-config's rules.rs) before this.
pub async fn run(args: DaemonArgs) -> Result<(), DaemonError> {
    hatchery_core::lease::set_host_lease_ttl_ms(args.host_lease_ttl * 1000)?;
    if args.role.runs_sandboxes() {
        host_role::run(args).await
    } else {
        control_role::run(args).await
    }
}

/// Structured logs via `tracing`; `RUST_LOG` filters (default `info`).
pub fn init_logging(json: bool) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        b.json().init();
    } else {
        b.init();
    }
}
