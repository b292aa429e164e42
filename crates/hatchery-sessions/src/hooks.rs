//! What the daemon plugs into a session's sandbox: the model gateway (the
//! sandbox is bound to the session it charges) and the egress proxy (the
//! sandbox's connections are checked against the session's pinned policy).
//! The runner calls [`SessionHooks`] at each point a sandbox starts or stops
//! serving a session; the daemon reports back what its gateway and proxy
//! saw through the `record_*` methods (host_reports.rs), which write
//! session events.

use crate::store::Session;
use async_trait::async_trait;
use std::collections::BTreeMap;

/// Why a hook could not set a sandbox up for its session. The plug-in's
/// own error, chain kept: the session fails `services_unavailable` with
/// the whole chain as its message, and this crate does not know the
/// plug-ins' error types.
pub type HookError = Box<dyn std::error::Error + Send + Sync + 'static>;

#[async_trait]
pub trait SessionHooks: Send + Sync + 'static {
    /// `sandbox` now serves `session`: after it was created, after a fork
    /// from an idle snapshot, and again when a restarted daemon re-attaches
    /// (so it must be idempotent). Called before the agent can make a call.
    /// An error fails the session (`services_unavailable`).
    async fn bind(&self, session: &Session, sandbox: &str) -> Result<(), HookError>;
    /// The sandbox is about to be deleted or was lost.
    async fn unbind(&self, session: &str, sandbox: &str);
    /// Waits (bounded) until the session's model calls in flight are
    /// settled, so that the spend reported when it ends includes them.
    /// Called after [`SessionHooks::unbind`]. Without a gateway nothing
    /// is metered in flight, so the default has nothing to wait for.
    async fn settle_calls(&self, _session: &str) {}
    /// Environment for the agent process (proxy settings, for one).
    fn agent_env(&self, session: &Session) -> BTreeMap<String, String>;
    /// True when the host meters model spend (the gateway): the agent's own
    /// usage reports are then ignored, since guest code could lie in them.
    fn meters_spend(&self) -> bool;
    /// The egress proxy's interception CA (PEM), installed into the
    /// sandbox's trust store before the agent starts; none when the proxy
    /// injects no credentials. Never a private key.
    fn guest_ca(&self) -> Option<String> {
        None
    }
    /// What the session's pinned policy says of re-run message `n` (of
    /// `kind`), which after a resume asks for `asked`, something else than
    /// before it (crate::replay). Without a policy store: end the session.
    async fn replay_diverged(
        &self,
        _session: &Session,
        _n: u64,
        _kind: &str,
        _asked: &str,
    ) -> Result<crate::replay::Verdict, HookError> {
        Ok(crate::replay::Verdict::Fail { rule: None })
    }
    /// Variables the session's pinned policy names for its credentials,
    /// each with a placeholder value (never the secret). An error fails
    /// the session (`services_unavailable`).
    async fn placeholder_env(
        &self,
        _session: &Session,
    ) -> Result<BTreeMap<String, String>, HookError> {
        Ok(BTreeMap::new())
    }
}

/// Nothing plugged in: the agent reaches whatever host service its model
/// URL names, and its own usage reports count as spend.
pub struct NoHooks;

#[async_trait]
impl SessionHooks for NoHooks {
    async fn bind(&self, _: &Session, _: &str) -> Result<(), HookError> {
        Ok(())
    }
    async fn unbind(&self, _: &str, _: &str) {}
    fn agent_env(&self, _: &Session) -> BTreeMap<String, String> {
        BTreeMap::new()
    }
    fn meters_spend(&self) -> bool {
        false
    }
}
