//! The E2B protocol's backend over hatchery-core: [`ManagerBackend`]
//! implements `hatchery_e2b::Backend` with the manager's public API, and
//! E2B's resume claims with leases in the state store ([`claims`]).
//! Translation only, no behaviour of its own; hatchery-e2b (the protocol)
//! never sees hatchery-core, and this crate never sees HTTP beyond the
//! relayed port's request it hands to the core's proxy.
//!
//! Trusts its caller: hatchery-e2b has checked the API key and the
//! sandbox's access token before any call reaches here. It answers which
//! tenant a key is (hatchery-tenants) and admits every new sandbox that
//! records a tenant against that tenant's `live_sandboxes` limit.
//!
//! - [`error`]: the core's and the store's errors as E2B's failure kinds.
//! - [`translate`]: E2B's network, process and context shapes to the
//!   core's and back.
//! - [`claims`]: resume claims over the narrow [`claims::Leases`] seam.
//! - [`headers`]: E2B's header transforms as credential bindings of the
//!   egress proxy, over the [`headers::EgressHeaders`] seam.
//! - `pty`: a core terminal as E2B's `Pty`, driven by one task.

mod backend;
pub mod claims;
pub mod error;
pub mod headers;
mod pty;
pub mod translate;

#[cfg(test)]
mod backend_tests;

pub use backend::ManagerBackend;
pub use error::E2bBackendError;
