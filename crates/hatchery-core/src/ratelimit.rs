//! Log lines that a sandbox can trigger go through hatchery-serve's
//! limiter (one copy for every crate); re-exported under the name the
//! core's modules use.

pub use hatchery_serve::log_limit::{LogLimiter, Verdict};
