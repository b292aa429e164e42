//! Secrets for credential injection at the egress proxy (issue 39): a
//! value goes in through `/v1/secrets` and never comes back out of the
//! API; it is sealed (ChaCha20-Poly1305) with a key kept in a file outside
//! the database, so a copy of the database alone reveals nothing. The
//! egress proxy reads a value through [`Secrets::reveal`] when it adds it
//! to a request; nothing else does.
//!
//! - [`key`]: the key file (made at first start, 0600, refused if looser).
//! - [`seal`]: sealing and opening one value (the name is bound in).
//! - [`store`]: the table (`secrets`) in the deployment's one database;
//!   each secret is the operator's or one tenant's.
//! - [`http`]: `/v1/secrets` (the operator's key and tenants' keys, each
//!   on its own secrets); [`openapi`]: its document.
//!
//! docs/policy.md, "Credentials", describes the model.

pub mod conformance;
pub mod http;
pub mod key;
pub mod openapi;
pub mod seal;
pub mod store;

pub use key::{KeyError, SecretKey};
pub use store::{Listing, Owner, SecretInfo, Secrets, StoreError, MAX_SECRETS, MAX_VALUE_BYTES};
