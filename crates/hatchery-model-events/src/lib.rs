//! The model gateway's observations into session logs: the glue between
//! hatchery-gateway (which produces [`GatewayEvent`]s) and
//! hatchery-sessions (whose log records them). One conversion
//! ([`convert::model_event`]) and two sinks: a gateway beside its sessions
//! (one host, or `all`) writes to the local sessions service
//! ([`queue::QueuedEvents::local`]); the control role's gateway posts each
//! event to the session's owning host (`POST /v1/sessions/{id}/model-events`,
//! [`remote::RemoteSink`]), so that it is written under that host's epoch
//! like every other event.
//!
//! Delivery is exactly once: each event gets a delivery key when first
//! posted and keeps it on every retry, and the owner writes it with the
//! key in one transaction (SessionStore::append_once, in the shared
//! database), writing nothing for a key it has seen. So the control plane
//! retries any post that may not have been written (no connection, a
//! broken or unanswered one, a lost owner not yet replaced, a 409 from a
//! former owner) until its deadline; a doubled `model_call` would double
//! the spend, a lost one would under-count it.
//!
//! What it trusts: the gateway's events (its own process's); a settle
//! posted by the control role is read back on the owner only when it is
//! charged to the session it was posted to ([`settle_decoder`]).
//!
//! [`GatewayEvent`]: hatchery_gateway::events::GatewayEvent

pub mod call_policy;
pub mod convert;
pub mod lanes;
mod log_limit;
pub mod queue;
pub mod remote;
pub mod settle_decoder;
pub mod sink;

pub use call_policy::PinnedPolicy;
pub use convert::model_event;
pub use lanes::Lanes;
pub use queue::QueuedEvents;
pub use remote::{outcomes, RemoteSink};
pub use settle_decoder::SettleDecoder;
pub use sink::{EventSink, LocalSink, SessionLog};
