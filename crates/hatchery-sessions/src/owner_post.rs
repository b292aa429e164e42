//! Posts from the control role to the host that owns a session: the
//! gateway's model events and the broker's events. The owner is read from
//! the shared sessions store on every attempt (a session may move hosts
//! between two), every attempt carries the same delivery key
//! (`Idempotency-Key`; the owner writes a key once, and the key table is in
//! the shared database, so the next owner sees it too), and each attempt
//! says whether it is worth another.

use crate::model_events::DELIVERY_HEADER;
use crate::store::{SessionStore, StoreError};
use hatchery_route::forward::{try_forward, ForwardFailure};
use hatchery_route::Directory;
use hatchery_serve::headers::DAEMON_KEY_HEADER;
use std::sync::Arc;
use std::time::Duration;

/// A post the owner has not answered within this (a paused host's kernel
/// still accepts the connection) is tried again under the same delivery
/// key: the sender must not wait for as long as the host stays paused, and
/// the owner (or the next one) writes the post once.
pub const POST_TIMEOUT: Duration = Duration::from_secs(15);
/// Largest answer body read back (the broker's seqs).
const MAX_ANSWER: usize = 64 << 10;

/// Who owns a session now (the control role's sessions store), and
/// whether it has ended (an ended session is never taken over).
#[async_trait::async_trait]
pub trait SessionOwners: Send + Sync + 'static {
    async fn owner(&self, session: &str) -> Result<Option<(String, bool)>, StoreError>;
}

#[async_trait::async_trait]
impl SessionOwners for Arc<dyn SessionStore> {
    async fn owner(&self, session: &str) -> Result<Option<(String, bool)>, StoreError> {
        match self.get(session).await {
            Ok(s) => Ok(Some((s.host_id, s.state.is_terminal()))),
            Err(StoreError::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// What one attempt at a post came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Attempt {
    /// Written (or written before, under the same key): the answer's body.
    Delivered(Vec<u8>),
    /// Not written, or not known to be: try again under the same key.
    Retry(String),
    /// Given up: the owner refused it (the status), or there is no owner
    /// to come.
    Dropped(&'static str, String),
}

/// How the control role reaches sessions' owners.
pub struct OwnerPost {
    pub owners: Arc<dyn SessionOwners>,
    pub directory: Arc<dyn Directory>,
    pub me: String,
    pub api_key: String,
    /// The owners' daemon-only routes want it besides the API key.
    pub daemon_key: String,
}

impl OwnerPost {
    /// One `POST /v1/sessions/{session}/{route}` of `body` under `key`.
    pub async fn attempt(&self, session: &str, route: &str, key: &str, body: &[u8]) -> Attempt {
        let (host, ended) = match self.owners.owner(session).await {
            Ok(Some(h)) => h,
            Ok(None) => return Attempt::Dropped("unknown_session", session.into()),
            Err(e) => return Attempt::Retry(format!("sessions store: {e}")),
        };
        let slot = match self.directory.hosts().await {
            Ok(hs) => hs.into_iter().find(|h| h.id == host),
            Err(e) => return Attempt::Retry(format!("hosts: {e}")),
        };
        let Some(slot) = slot.filter(|h| h.alive) else {
            if ended {
                // Nobody takes an ended session over: no owner will come.
                return Attempt::Dropped("owner_lost", format!("{host} is lost"));
            }
            // Lost: its sessions are about to be taken over; the next
            // attempt finds the new owner.
            return Attempt::Retry(format!("owner {host} is not alive"));
        };
        let req = axum::http::Request::builder()
            .method("POST")
            .uri(format!("/v1/sessions/{session}/{route}"))
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {}", self.api_key))
            .header(DAEMON_KEY_HEADER, &self.daemon_key)
            .header(DELIVERY_HEADER, key)
            .body(axum::body::Body::from(body.to_vec()));
        let req = match req {
            Ok(r) => r,
            Err(e) => return Attempt::Dropped("invalid", e.to_string()),
        };
        let base = hatchery_route::base_url(&slot.url);
        let sent = async {
            let r = try_forward(&host, &base, &self.me, req).await?;
            let status = r.status();
            // A body cut off is an answer not heard: the same key again.
            let body = axum::body::to_bytes(r.into_body(), MAX_ANSWER)
                .await
                .map_err(|e| {
                    ForwardFailure::MaybeSent(hatchery_route::RouteError::Unreachable {
                        host: host.clone(),
                        cause: format!("reading the answer: {e}"),
                    })
                })?;
            Ok::<_, ForwardFailure>((status, body))
        };
        let Ok(answer) = tokio::time::timeout(POST_TIMEOUT, sent).await else {
            return Attempt::Retry(format!("{host} did not answer in time"));
        };
        match answer {
            Ok((s, body)) if s.is_success() => Attempt::Delivered(body.to_vec()),
            // The owner changed between the read and the post: this host
            // refuses to write a session it no longer owns; nothing was
            // written, so the new owner may.
            Ok((s, _)) if s == axum::http::StatusCode::CONFLICT => {
                Attempt::Retry(format!("{host} answered 409"))
            }
            // Its store is briefly down: nothing was written.
            Ok((s, _)) if s == axum::http::StatusCode::SERVICE_UNAVAILABLE => {
                Attempt::Retry(format!("{host} answered 503"))
            }
            // An intent for a session that ended: the call is refused.
            Ok((s, body)) if error_code(&body).as_deref() == Some("session_ended") => {
                Attempt::Dropped("session_ended", format!("{host} answered {s}"))
            }
            Ok((s, _)) => Attempt::Dropped("refused", format!("{host} answered {s}")),
            Err(ForwardFailure::NotSent(e)) => Attempt::Retry(e.to_string()),
            // It may have been written: the same key again is a no-op then.
            Err(ForwardFailure::MaybeSent(e)) => Attempt::Retry(format!("maybe sent: {e}")),
        }
    }
}

/// The `code` of an answer's JSON error body, if it has one.
fn error_code(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    Some(v.get("error")?.get("code")?.as_str()?.to_string())
}
