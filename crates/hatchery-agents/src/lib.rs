//! The agent platform assembled (docs/sessions.md, docs/gateway.md,
//! docs/broker.md): sessions with their model gateway, egress proxy, tool
//! broker and environments, from the daemon's typed configuration.
//!
//! - On a host (`--role all` or `host`): [`start_host`] builds the
//!   sessions service over the daemon's own API (hatchery-client), starts
//!   the gateway and the egress proxy (or relays to the control role's),
//!   plugs them into the runner ([`hooks`]), registers their sockets as
//!   host services, and starts the broker.
//! - On the control role: [`control::gateway`] and [`control::broker`]
//!   serve every host's sandboxes, their events posted to each session's
//!   owner.
//!
//! hatcheryd only calls these; what each product does stays in its crate.

pub mod broker;
pub mod control;
pub mod e2b_headers;
mod error;
mod gateway;
pub mod hooks;
mod host;
mod sessions;

pub use error::AgentsError;
pub use hooks::open_secrets;
pub use host::{start_host, HostParts, OnHost};
pub use sessions::{open_environments, open_store};
