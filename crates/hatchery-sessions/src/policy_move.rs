//! Moving a session to another version of its policy: the only way what a
//! session may reach changes after it was created (versions are pinned at
//! create; an edit of the policy alone changes nothing for it). The egress
//! proxy applies the new version to connections opened after the move.

use crate::api_state::ApiState;
use crate::error::SessionError;
use crate::events::{Actor, EventKind};
use crate::extract::Json;
use crate::models::SessionView;
use crate::service::Sessions;
use crate::state::SessionState;
use crate::store::Patch;
use axum::extract::{Path, State};
use serde::Deserialize;
use std::sync::Arc;
use utoipa::ToSchema;

#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MovePolicyBody {
    /// A version of the session's policy; default: the latest.
    #[serde(default)]
    pub version: Option<u32>,
}

#[utoipa::path(post, path = "/v1/sessions/{id}/policy", tag = "sessions",
    description = "Moves the session to another version of its policy (default: the latest). New egress connections are checked against it; open ones are not cut. Recorded as a `policy_moved` event.",
    request_body = MovePolicyBody,
    responses((status = 200, body = SessionView), (status = 400, body = crate::error::ErrorBody),
              (status = 404, body = crate::error::ErrorBody), (status = 409, body = crate::error::ErrorBody)))]
pub async fn move_policy(
    State(st): State<ApiState>,
    Path(id): Path<String>,
    Json(b): Json<MovePolicyBody>,
) -> Result<axum::Json<SessionView>, SessionError> {
    st.sessions.move_policy(&id, b.version).await?;
    Ok(axum::Json(st.sessions.view(&id).await?))
}

impl Sessions {
    pub async fn move_policy(
        self: &Arc<Self>,
        id: &str,
        version: Option<u32>,
    ) -> Result<(), SessionError> {
        if !crate::ids::valid("ses", id) {
            return Err(SessionError::NotFound(id.to_string()));
        }
        let s = self.core.store.get(id).await?;
        if s.state.is_terminal() {
            return Err(SessionError::Conflict(format!(
                "session {id} is {}",
                s.state
            )));
        }
        let latest = self
            .policies
            .resolve(&s.spec.policy_id)
            .await
            .ok_or_else(|| SessionError::UnknownPolicy(s.spec.policy_id.clone()))?;
        let to = version.unwrap_or(latest.version);
        // Versions are numbered 1, 2, ... without gaps.
        if to == 0 || to > latest.version {
            return Err(SessionError::bad(
                "invalid_request",
                format!(
                    "policy {} has versions 1 to {}; not {to}",
                    latest.id, latest.version
                ),
            ));
        }
        let live: Vec<SessionState> = SessionState::ALL
            .into_iter()
            .filter(|s| !s.is_terminal())
            .collect();
        let evs = self
            .core
            .store
            .append_if_state(
                id,
                &live,
                vec![(
                    Actor::User,
                    EventKind::PolicyMoved {
                        policy_id: latest.id.clone(),
                        from_version: s.spec.policy_version,
                        to_version: to,
                    },
                )],
                Patch {
                    policy_version: Some(to),
                    ..Default::default()
                },
            )
            .await?;
        self.core.bus.publish(id, &evs);
        // The sandbox serving it now gets the new version (the runner
        // binds with the stored session on every start and re-attach).
        let cur = self.core.store.get(id).await?;
        if let Some(sbx) = &cur.sandbox_id {
            if let Err(e) = self.core.hooks().bind(&cur, sbx).await {
                tracing::warn!(session = %id, error = %hatchery_serve::error_text::with_causes(&*e), "rebinding after a policy move failed");
            }
        }
        Ok(())
    }
}
