//! Network isolation for sandboxes, enforced entirely on the host.
//!
//! Each sandbox with network gets a *slot*: its own network namespace and a
//! veth pair carrying a /30 out of the daemon's slot range. Slots are made
//! ahead of time ([`pool`]), scrubbed and reused after delete, and
//! reclaimed after a crash. What a slot may reach is a [`Policy`], compiled
//! into one nftables chain per slot ([`nft`]) inside one table per daemon.
//! Denied connection attempts are logged by the kernel and turned into
//! per-sandbox [`events`].
//!
//! Nothing here trusts the guest: names in policies are resolved on the
//! host and pinned as addresses ([`resolve`]), so a guest's `/etc/hosts`
//! or DNS cannot widen what it may reach.

mod addr;
mod cmd;
pub mod events;
pub mod nft;
mod plumbing;
pub mod policy;
pub mod pool;
pub mod resolve;

pub use addr::{Cidr, SlotAddrs};
pub use events::EgressEvent;
pub use policy::{Egress, Policy, PolicyLimits, Rule};
pub use pool::{Network, NetworkConfig, Pins, SlotLease};

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("invalid network policy: {0}")]
    Invalid(String),
    #[error("cannot resolve host {0}: {1}")]
    Resolve(String, String),
    #[error("no free network slot ({0} in use)")]
    Exhausted(usize),
    #[error("{0}")]
    Busy(String),
    #[error("host network command failed: {0}")]
    Command(String),
    #[error("network i/o: {0}")]
    Io(#[from] std::io::Error),
}
