//! Daemon assembly: the `hatcheryd` binary (`hatchery serve` execs it).

mod broker;
mod control_role;
mod gateway;
mod key;
mod rounds;
mod serve;
mod session_services;
mod sessions;
mod state_db;

pub use hatchery_config::DaemonArgs;
pub use serve::{run, DaemonError};

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
