//! What a model gateway saw of a session's calls, as one type: the
//! in-process gateway hands it to [`Sessions::record_model_event`]
//! directly; a gateway in another process (the control role's, on many
//! hosts) posts it to `POST /v1/sessions/{id}/model-events`, which the
//! control plane forwards to the session's owning host so that the event
//! is written under that host's epoch like every other one.

use crate::api_state::ApiState;
use crate::error::SessionError;
use crate::events::EventKind;
use crate::extract::Json;
use crate::service::Sessions;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;

/// Longest model name, refusal code, scope and message accepted.
pub const MAX_MODEL: usize = 256;
pub const MAX_CODE: usize = 64;
pub const MAX_SCOPE: usize = 256;
pub const MAX_MESSAGE: usize = 4096;

/// One observation of the model gateway.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ModelEvent {
    /// A call about to reach the upstream, its worst case reserved: its
    /// intent, written only while the session is unfinished (otherwise
    /// 400 `session_ended`, and the gateway refuses the call).
    Requested {
        /// `openai` or `anthropic`.
        api: String,
        model: String,
        /// The call's reservation id (1 to 64 of A-Z a-z 0-9 - _).
        reservation: String,
        tokens: u64,
        usd_cents: u64,
    },
    /// A settled call: what it cost is added to the session's spend.
    Called {
        /// `openai` or `anthropic`.
        api: String,
        model: String,
        #[serde(default)]
        input_tokens: Option<u64>,
        #[serde(default)]
        output_tokens: Option<u64>,
        tokens: u64,
        usd_cents: u64,
        /// The gateway's settle of the call's reservation, committed with
        /// the event and the spend in this host's transaction (the control
        /// role's gateway; issue 32). Opaque here; the daemon's gateway
        /// code reads it. When the reservation was settled before, nothing
        /// is written.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schema(value_type = Option<Object>)]
        joined: Option<serde_json::Value>,
    },
    /// A call refused before it reached the upstream.
    Refused {
        api: String,
        code: String,
        message: String,
    },
    /// A call whose process died before it settled, charged its whole
    /// reservation by the gateway's janitor: added to the session's spend.
    Expired {
        reservation: String,
        tokens: u64,
        usd_cents: u64,
    },
    /// A call that did not fit in the budget: the session ends `failed`.
    Exhausted { scope: String, message: String },
}

impl ModelEvent {
    pub fn validate(&self) -> Result<(), SessionError> {
        let check = |what: &str, v: &str, max: usize| {
            if v.is_empty() || v.len() > max {
                Err(SessionError::bad(
                    "invalid_request",
                    format!("{what} must be 1 to {max} bytes"),
                ))
            } else {
                Ok(())
            }
        };
        let api = |a: &str| match a {
            "openai" | "anthropic" => Ok(()),
            _ => Err(SessionError::bad(
                "invalid_request",
                format!("api must be openai or anthropic, not {a:?}"),
            )),
        };
        match self {
            ModelEvent::Requested {
                api: a,
                model,
                reservation,
                ..
            } => {
                api(a)?;
                check("model", model, MAX_MODEL)?;
                check_reservation(reservation)
            }
            ModelEvent::Expired { reservation, .. } => check_reservation(reservation),
            ModelEvent::Called { api: a, model, .. } => {
                api(a)?;
                check("model", model, MAX_MODEL)
            }
            ModelEvent::Refused {
                api: a,
                code,
                message,
            } => {
                api(a)?;
                check("code", code, MAX_CODE)?;
                check("message", message, MAX_MESSAGE)
            }
            ModelEvent::Exhausted { scope, message } => {
                check("scope", scope, MAX_SCOPE)?;
                check("message", message, MAX_MESSAGE)
            }
        }
    }
}

impl Sessions {
    /// Writes what the gateway saw into the session's log (and, for a
    /// settled call, its spend). With a delivery key (the control role's
    /// gateway sends one per event, the same on every retry), an event
    /// sent again is written once, whichever owner gets it.
    pub async fn record_model_event(
        self: &Arc<Self>,
        id: &str,
        e: ModelEvent,
        key: Option<&str>,
    ) -> Result<(), SessionError> {
        self.record_model_event_joined(id, e, key, &mut hatchery_db::Alone)
            .await
    }

    /// [`Self::record_model_event`] with a write of the gateway's that
    /// commits with the event (hatchery_db::Joined): the settle of a
    /// `called` event's reservation, so that the call's spend in the
    /// session, its event, its delivery key and its charge to the budget
    /// are one commit.
    pub async fn record_model_event_joined(
        self: &Arc<Self>,
        id: &str,
        e: ModelEvent,
        key: Option<&str>,
        joined: &mut dyn hatchery_db::Joined,
    ) -> Result<(), SessionError> {
        if !crate::ids::valid("ses", id) {
            return Err(SessionError::NotFound(id.to_string()));
        }
        e.validate()?;
        if let Some(k) = key {
            check_delivery_key(k)?;
        }
        match e {
            ModelEvent::Requested {
                api,
                model,
                reservation,
                tokens,
                usd_cents,
            } => {
                let intent = EventKind::ModelCallIntent {
                    api,
                    model,
                    reservation,
                    reserved_tokens: tokens,
                    reserved_usd_cents: usd_cents,
                };
                if !self.record_model_intent(id, intent, key).await? {
                    return Err(SessionError::bad(
                        "session_ended",
                        format!("session {id} has ended: its model calls are refused"),
                    ));
                }
            }
            ModelEvent::Called {
                api,
                model,
                input_tokens,
                output_tokens,
                tokens,
                usd_cents,
                joined: _,
            } => {
                let call = EventKind::ModelCall {
                    api,
                    model,
                    input_tokens,
                    output_tokens,
                    tokens,
                    usd_cents,
                };
                self.record_model_call(id, call, (tokens, usd_cents), key, joined)
                    .await?
            }
            ModelEvent::Expired {
                reservation,
                tokens,
                usd_cents,
            } => {
                // Once per reservation, whoever delivers it and however often.
                let key = key
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("{reservation}_expired"));
                let call = EventKind::ModelCallExpired {
                    reservation,
                    tokens,
                    usd_cents,
                };
                self.record_model_call(id, call, (tokens, usd_cents), Some(&key), joined)
                    .await?
            }
            ModelEvent::Refused { api, code, message } => {
                self.record_model_refused(id, &api, &code, &message, key, joined)
                    .await?
            }
            ModelEvent::Exhausted { scope, message } => {
                self.record_budget_exhausted(id, &scope, &message, key, joined)
                    .await?
            }
        }
        Ok(())
    }
}

#[utoipa::path(post, path = "/v1/sessions/{id}/model-events", tag = "sessions",
    description = "Records what a model gateway in another process saw of the session's calls (the control role's gateway on many hosts; docs/gateway.md). A settled call adds to the session's spend; `exhausted` ends the session `failed`. Written whatever the session's state: a call settled just after the agent finished was still spent. Only the deployment's daemons post here: besides the API key, the request carries the daemon key (`X-Hatchery-Daemon-Key`), a secret kept in the state database that clients never hold.",
    params(("Idempotency-Key" = String, Header, description = "The event's delivery id, 1 to 64 of A-Z a-z 0-9 - _: the same on every retry, so an event sent again (to this host or to the session's next owner) is written once")),
    request_body = ModelEvent,
    responses((status = 204, description = "recorded"), (status = 400, body = crate::error::ErrorBody),
              (status = 401, description = "no API key, or no daemon key (`X-Hatchery-Daemon-Key`)", body = crate::error::ErrorBody),
              (status = 404, body = crate::error::ErrorBody), (status = 409, body = crate::error::ErrorBody),
              (status = 503, body = crate::error::ErrorBody)))]
pub async fn post_model_event(
    State(st): State<ApiState>,
    Path(id): Path<String>,
    headers: axum::http::HeaderMap,
    Json(e): Json<ModelEvent>,
) -> Result<StatusCode, SessionError> {
    let key = delivery_key(&headers)?;
    match &e {
        ModelEvent::Called {
            joined: Some(w), ..
        } => {
            let mut settle = st.sessions.decode_joined(
                crate::broker_hooks::JoinedFrom::Gateway,
                &id,
                w.clone(),
            )?;
            st.sessions
                .record_model_event_joined(&id, e, Some(key), &mut *settle)
                .await?
        }
        _ => st.sessions.record_model_event(&id, e, Some(key)).await?,
    }
    Ok(StatusCode::NO_CONTENT)
}

/// A post's delivery key, required (checked by the route's service).
pub(crate) fn delivery_key(headers: &axum::http::HeaderMap) -> Result<&str, SessionError> {
    headers
        .get(DELIVERY_HEADER)
        // Not text: "" fails check_delivery_key with its 400.
        .map(|v| v.to_str().unwrap_or_default())
        .ok_or_else(|| {
            SessionError::bad(
                "invalid_request",
                format!("{DELIVERY_HEADER} is required (one per post, the same on a retry)"),
            )
        })
}

/// The header a sender names an event's delivery with.
pub const DELIVERY_HEADER: &str = "idempotency-key";
/// Longest delivery key, in bytes.
pub const MAX_DELIVERY_KEY: usize = 64;

/// A reservation id is a delivery key by shape; its error names it.
fn check_reservation(r: &str) -> Result<(), SessionError> {
    check_delivery_key(r).map_err(|_| {
        SessionError::bad(
            "invalid_request",
            format!("reservation must be 1 to {MAX_DELIVERY_KEY} of A-Z a-z 0-9 - _"),
        )
    })
}

pub(crate) fn check_delivery_key(k: &str) -> Result<(), SessionError> {
    let ok = !k.is_empty()
        && k.len() <= MAX_DELIVERY_KEY
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        return Ok(());
    }
    Err(SessionError::bad(
        "invalid_request",
        format!("{DELIVERY_HEADER} must be 1 to {MAX_DELIVERY_KEY} of A-Z a-z 0-9 - _"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wire_shape_is_tagged_by_kind() {
        let e: ModelEvent = serde_json::from_str(
            r#"{"kind":"called","api":"openai","model":"m","tokens":3,"usd_cents":1}"#,
        )
        .unwrap();
        assert_eq!(
            e,
            ModelEvent::Called {
                api: "openai".into(),
                model: "m".into(),
                input_tokens: None,
                output_tokens: None,
                tokens: 3,
                usd_cents: 1,
                joined: None,
            }
        );
        assert!(serde_json::from_str::<ModelEvent>(
            r#"{"kind":"exhausted","scope":"s","message":"m","extra":1}"#
        )
        .is_err());
    }

    #[test]
    fn fields_are_checked_at_their_caps() {
        let refused = |api: &str, code: String, message: String| ModelEvent::Refused {
            api: api.into(),
            code,
            message,
        };
        assert!(
            refused("openai", "c".repeat(MAX_CODE), "m".repeat(MAX_MESSAGE))
                .validate()
                .is_ok()
        );
        for bad in [
            refused("openai", "c".repeat(MAX_CODE + 1), "m".into()),
            refused("openai", "c".into(), "m".repeat(MAX_MESSAGE + 1)),
            refused("openai", String::new(), "m".into()),
            refused("grok", "c".into(), "m".into()),
            ModelEvent::Exhausted {
                scope: "s".repeat(MAX_SCOPE + 1),
                message: "m".into(),
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn delivery_keys_are_checked_at_their_cap() {
        assert!(check_delivery_key(&"k".repeat(MAX_DELIVERY_KEY)).is_ok());
        assert!(check_delivery_key("gw_0123abcdef-_Z").is_ok());
        for bad in [
            String::new(),
            "k".repeat(MAX_DELIVERY_KEY + 1),
            "a b".into(),
            "a/b".into(),
            "é".into(),
        ] {
            assert!(check_delivery_key(&bad).is_err(), "{bad:?}");
        }
    }
}
