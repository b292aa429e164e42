//! Tenants: who may use a deployment, with what limits, through which
//! keys. A tenant (`ten_…`) carries optional limits (tokens, USD cents,
//! concurrent sessions, live sandboxes, wall-clock seconds); its API keys
//! (`htk_…`) are shown once when made and kept only as a SHA-256 hash
//! with a short prefix for display, so a database dump holds no usable
//! key. A bearer key resolves to a [`Principal`]: the operator (the
//! deployment's `HATCHERY_API_KEY`, checked by the caller) or one tenant.
//!
//! What it trusts: the deployment's one database (hatchery-db) and the
//! caller's word that a request carries the operator key; it checks
//! tenant keys itself. It decides who is calling and whether a tenant has
//! room; the API crate enforces scoping with that answer.
//!
//! - [`model`]: tenants, limits, keys, and the validated requests with
//!   their caps.
//! - [`store`]: [`TenantStore`] over hatchery-db (SQLite or PostgreSQL),
//!   numbered migrations, [`store::conformance`] its contract.
//! - [`keys`]: making, hashing and recognising keys.
//! - [`service`]: [`Tenants`]: key resolution with a small cache that a
//!   revoke empties, and the per-tenant admission gate for creates.
//! - [`http`]: `/v1/tenants` (operator only); [`openapi`]: its document.

pub mod http;
pub mod keys;
pub mod metadata;
pub mod model;
pub mod openapi;
pub mod service;
pub mod store;

pub use model::{Limits, NewTenant, Tenant, TenantKey, TenantPatch, ValidationError};
pub use service::{
    Admission, AdmitError, DeleteError, LiveUsage, Principal, SumUsage, Tenants, Usage, UsageError,
};
pub use store::{DbTenantStore, StoreError, TenantStore};
