//! The state every sessions API handler gets. In its own module so that
//! the handlers outside routes.rs (model_events.rs, broker_events.rs,
//! policy_move.rs) take it without importing the router that registers
//! them.

use crate::service::Sessions;
use std::sync::Arc;

#[derive(Clone)]
pub struct ApiState {
    pub sessions: Arc<Sessions>,
    pub api_key: Arc<str>,
    /// The deployment's daemon key (hatchery_serve::headers): routes only
    /// other daemons call want it besides the API key.
    pub daemon_key: Arc<str>,
    /// Resolves tenant keys (`htk_…`); `None`: the API key alone is let in.
    pub tenants: Option<Arc<hatchery_tenants::Tenants>>,
}
