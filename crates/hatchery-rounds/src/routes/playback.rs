//! Playback of a session's room for reviewers (and the API key): the
//! timeline of its log and the document at any entry.

use crate::error::ErrorBody;
use crate::models::*;
use crate::{Caller, Rounds, RoundsError};
use axum::extract::{Path, Query, State};
use std::sync::Arc;

type St = State<Arc<Rounds>>;

/// Every entry of the session's room log: the seed, each update (when,
/// by whom, how large) and a marker at each Run and Submit.
#[utoipa::path(get, path = "/v1/rounds/{id}/sessions/{sid}/timeline", tag = "rounds",
    params(("id" = String, Path), ("sid" = String, Path)),
    responses((status = 200, body = Timeline), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn timeline(
    State(st): St,
    caller: Caller,
    Path((id, sid)): Path<(String, String)>,
) -> Result<axum::Json<Timeline>, RoundsError> {
    caller.require_reviewer(&id)?;
    Ok(axum::Json(st.timeline(&id, &sid).await?))
}

#[derive(serde::Deserialize, utoipa::IntoParams)]
pub struct At {
    /// A log entry's `idx`.
    pub at: u64,
}

/// The room's files right after log entry `at`, rebuilt from the stored
/// updates.
#[utoipa::path(get, path = "/v1/rounds/{id}/sessions/{sid}/document", tag = "rounds",
    params(("id" = String, Path), ("sid" = String, Path), At),
    responses((status = 200, body = DocumentAt), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn document(
    State(st): St,
    caller: Caller,
    Path((id, sid)): Path<(String, String)>,
    q: Result<Query<At>, axum::extract::rejection::QueryRejection>,
) -> Result<axum::Json<DocumentAt>, RoundsError> {
    caller.require_reviewer(&id)?;
    let Query(q) = q.map_err(|e| RoundsError::Invalid(e.body_text()))?;
    Ok(axum::Json(st.document_at(&id, &sid, q.at).await?))
}
