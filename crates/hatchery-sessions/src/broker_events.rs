//! What a tool broker in another process writes into a session's log.
//! On many hosts the broker runs on the control role (docs/sessions.md, "On
//! many hosts"), away from the session's owning host; it posts its
//! `broker_*` events (and the approvals its calls open) to
//! `POST /v1/sessions/{id}/broker-events`, which the control plane's
//! routing sends to the owner, so that each is written under the owner's
//! epoch like every other event. Each post carries a delivery key: one sent
//! again (its answer was lost, or it reaches the session's next owner) is
//! written once.

use crate::api_state::ApiState;
use crate::error::SessionError;
use crate::events::EventKind;
use crate::extract::Json;
use crate::service::Sessions;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;

/// Most events one post carries (the broker writes at most three at once:
/// a call, its plan or result).
pub const MAX_BROKER_EVENTS: usize = 4;
/// Longest approval id, action and details accepted.
pub const MAX_APPROVAL_ID: usize = 64;
pub const MAX_ACTION: usize = 256;
pub const MAX_DETAILS: usize = 16 << 10;

/// An approval a broker call waits for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalRequest {
    pub approval_id: String,
    /// The tool the call wants.
    pub action: String,
    /// Its arguments, as shown to the approver.
    pub details: String,
}

/// One post of a remote broker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BrokerEvents {
    /// `broker_call`, `broker_effect_started`, `broker_result` or
    /// `broker_call_resolved` events, written in one transaction.
    #[serde(default)]
    pub events: Vec<EventKind>,
    /// Opened after the events (the session moves to `waiting_approval`).
    #[serde(default)]
    pub approval: Option<ApprovalRequest>,
    /// The broker's own rows that commit with the events, in the owner's
    /// transaction (its call record: issue 32's one commit across
    /// products). Opaque here; the daemon's broker code reads it. When it
    /// declines (the call moved on meanwhile), nothing is written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub joined: Option<serde_json::Value>,
}

/// What was written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BrokerEventsWritten {
    /// The seqs of the events, in order; empty when the delivery key had
    /// been seen (they were written by an earlier post).
    pub seqs: Vec<u64>,
    /// The delivery key had been seen: nothing was written now.
    pub repeat: bool,
    /// The post's `joined` write declined: nothing was written.
    #[serde(default)]
    pub declined: bool,
}

/// A decoded `joined` write, and whether it declined: a `None` from the
/// store is either a seen key or a declined write, and the poster must
/// know which.
struct Tracked {
    inner: Box<dyn hatchery_db::Joined>,
    declined: bool,
}

#[async_trait::async_trait]
impl hatchery_db::Joined for Tracked {
    async fn write(
        &mut self,
        tx: &mut hatchery_db::Tx,
        seqs: &[u64],
    ) -> Result<bool, hatchery_db::DbError> {
        let ok = self.inner.write(tx, seqs).await?;
        self.declined = !ok;
        Ok(ok)
    }
}

impl BrokerEvents {
    pub fn validate(&self) -> Result<(), SessionError> {
        let bad = |m: String| Err(SessionError::bad("invalid_request", m));
        if self.events.len() > MAX_BROKER_EVENTS {
            return bad(format!("at most {MAX_BROKER_EVENTS} events per post"));
        }
        if self.events.is_empty() && self.approval.is_none() {
            return bad("nothing to write: no events and no approval".into());
        }
        if self.events.is_empty() && self.joined.is_some() {
            return bad("a joined write needs the events it commits with".into());
        }
        for e in &self.events {
            if !matches!(
                e,
                EventKind::BrokerCall { .. }
                    | EventKind::BrokerEffectStarted { .. }
                    | EventKind::BrokerResult { .. }
                    | EventKind::BrokerCallResolved { .. }
            ) {
                return bad(format!(
                    "only broker events are posted here, not {}",
                    e.type_name()
                ));
            }
        }
        if let Some(a) = &self.approval {
            let id_ok = a.approval_id.len() <= MAX_APPROVAL_ID
                && a.approval_id
                    .strip_prefix("apr_")
                    .is_some_and(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_alphanumeric()));
            if !id_ok {
                return bad(format!(
                    "approval_id must be apr_ and letters or digits, at most {MAX_APPROVAL_ID} bytes"
                ));
            }
            if a.action.is_empty() || a.action.len() > MAX_ACTION {
                return bad(format!("action must be 1 to {MAX_ACTION} bytes"));
            }
            if a.details.len() > MAX_DETAILS {
                return bad(format!("details must be at most {MAX_DETAILS} bytes"));
            }
        }
        Ok(())
    }
}

impl Sessions {
    /// Writes a remote broker's events under delivery key `key` (once per
    /// key, whichever owner gets it), then opens its approval (once per
    /// approval id).
    pub async fn record_broker_events(
        self: &Arc<Self>,
        id: &str,
        post: BrokerEvents,
        key: &str,
    ) -> Result<BrokerEventsWritten, SessionError> {
        if !crate::ids::valid("ses", id) {
            return Err(SessionError::NotFound(id.to_string()));
        }
        post.validate()?;
        crate::model_events::check_delivery_key(key)?;
        let mut out = BrokerEventsWritten {
            seqs: vec![],
            repeat: false,
            declined: false,
        };
        let mut joined = match post.joined {
            None => None,
            Some(w) => Some(Tracked {
                inner: self.decode_joined(crate::broker_hooks::JoinedFrom::Broker, id, w)?,
                declined: false,
            }),
        };
        let mut alone = hatchery_db::Alone;
        if !post.events.is_empty() {
            let written = self
                .append_delivered(
                    id,
                    Some(key),
                    post.events,
                    crate::store::Patch::default(),
                    match &mut joined {
                        Some(t) => t,
                        None => &mut alone,
                    },
                )
                .await?;
            match written {
                Some(evs) => out.seqs = evs.iter().map(|e| e.seq).collect(),
                None if joined.as_ref().is_some_and(|t| t.declined) => {
                    out.declined = true;
                    return Ok(out);
                }
                None => out.repeat = true,
            }
        }
        if let Some(a) = post.approval {
            self.open_approval(id, &a.approval_id, &a.action, &a.details)
                .await?;
        }
        Ok(out)
    }
}

#[utoipa::path(post, path = "/v1/sessions/{id}/broker-events", tag = "sessions",
    description = "Records what a tool broker in another process did for the session's calls (the control role's broker on many hosts; docs/sessions.md): its `broker_*` events, and the approval a call waits for (the session moves to `waiting_approval`). Only the deployment's daemons post here: besides the API key, the request carries the daemon key (`X-Hatchery-Daemon-Key`).",
    params(("Idempotency-Key" = String, Header, description = "The post's delivery id, 1 to 64 of A-Z a-z 0-9 - _: the same on every retry, so events sent again (to this host or to the session's next owner) are written once")),
    request_body = BrokerEvents,
    responses((status = 200, body = BrokerEventsWritten), (status = 400, body = crate::error::ErrorBody),
              (status = 401, description = "no API key, or no daemon key (`X-Hatchery-Daemon-Key`)", body = crate::error::ErrorBody),
              (status = 404, body = crate::error::ErrorBody), (status = 409, body = crate::error::ErrorBody),
              (status = 503, body = crate::error::ErrorBody)))]
pub async fn post_broker_events(
    State(st): State<ApiState>,
    Path(id): Path<String>,
    headers: axum::http::HeaderMap,
    Json(post): Json<BrokerEvents>,
) -> Result<axum::Json<BrokerEventsWritten>, SessionError> {
    let key = crate::model_events::delivery_key(&headers)?;
    Ok(axum::Json(
        st.sessions.record_broker_events(&id, post, key).await?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result() -> EventKind {
        EventKind::BrokerResult {
            call_seq: 1,
            tool: "noop".into(),
            status: "done".into(),
            output: "{}".into(),
        }
    }

    fn approval(id: &str, details: usize) -> Option<ApprovalRequest> {
        Some(ApprovalRequest {
            approval_id: id.into(),
            action: "git_push".into(),
            details: "d".repeat(details),
        })
    }

    #[test]
    fn only_broker_events_within_the_caps_are_taken() {
        let post = |events: Vec<EventKind>, approval| BrokerEvents {
            events,
            approval,
            joined: None,
        };
        assert!(post(vec![result(); MAX_BROKER_EVENTS], None)
            .validate()
            .is_ok());
        assert!(post(vec![], approval("apr_abc123", MAX_DETAILS))
            .validate()
            .is_ok());
        for bad in [
            post(vec![result(); MAX_BROKER_EVENTS + 1], None),
            post(vec![], None),
            post(
                vec![EventKind::Error {
                    code: "x".into(),
                    message: "forged".into(),
                }],
                None,
            ),
            post(vec![], approval("apr_abc123", MAX_DETAILS + 1)),
            post(vec![], approval("apr_", 1)),
            post(vec![], approval("apr_a/b", 1)),
            post(
                vec![],
                approval(&format!("apr_{}", "a".repeat(MAX_APPROVAL_ID)), 1),
            ),
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_wire_shape_refuses_unknown_fields() {
        let ok: BrokerEvents = serde_json::from_str(
            r#"{"events":[{"type":"broker_result","call_seq":1,"tool":"noop","status":"done","output":"{}"}]}"#,
        )
        .unwrap();
        assert_eq!(ok.events, vec![result()]);
        assert!(serde_json::from_str::<BrokerEvents>(r#"{"events":[],"spend":1}"#).is_err());
    }
}
