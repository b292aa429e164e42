//! The hiring team's routes (API key): rounds, invitations, reviewer links.

use crate::error::ErrorBody;
use crate::extract::{Json, OptJson};
use crate::ids::{now_ms, rfc3339};
use crate::limits::*;
use crate::models::*;
use crate::store::Scope;
use crate::{Caller, Rounds, RoundsError};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use std::sync::Arc;

type St = State<Arc<Rounds>>;

/// Creates a round and prepares its snapshot (setup commands included)
/// before answering.
#[utoipa::path(post, path = "/v1/rounds", tag = "rounds", request_body = CreateRound,
    responses((status = 201, body = Round), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody, description = "template_not_found"),
              (status = 409, body = ErrorBody, description = "template_version_gone, setup_failed"), (status = 413, body = ErrorBody)))]
pub async fn create(
    State(st): St,
    caller: Caller,
    Json(body): Json<CreateRound>,
) -> Result<(StatusCode, axum::Json<Round>), RoundsError> {
    caller.require_key()?;
    Ok((
        StatusCode::CREATED,
        axum::Json(st.create_round(body, caller.tenant()).await?),
    ))
}

#[utoipa::path(get, path = "/v1/rounds", tag = "rounds", responses((status = 200, body = RoundList)))]
pub async fn list(State(st): St, caller: Caller) -> Result<axum::Json<RoundList>, RoundsError> {
    caller.require_key()?;
    Ok(axum::Json(RoundList {
        rounds: st.list_rounds(caller.tenant()).await?,
    }))
}

/// The API key or a reviewer token of this round.
#[utoipa::path(get, path = "/v1/rounds/{id}", tag = "rounds", params(("id" = String, Path)),
    responses((status = 200, body = Round), (status = 404, body = ErrorBody)))]
pub async fn get(
    State(st): St,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<axum::Json<Round>, RoundsError> {
    caller.require_reviewer(&id)?;
    Ok(axum::Json(crate::round_ops::view(&st.round(&id).await?)?))
}

/// No new sessions; running ones carry on.
#[utoipa::path(post, path = "/v1/rounds/{id}/archive", tag = "rounds", params(("id" = String, Path)),
    responses((status = 200, body = Round), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn archive(
    State(st): St,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<axum::Json<Round>, RoundsError> {
    caller.require_key()?;
    Ok(axum::Json(st.archive_round(&id).await?))
}

/// Invites a candidate: their sandbox, token and room link.
#[utoipa::path(post, path = "/v1/rounds/{id}/sessions", tag = "rounds", params(("id" = String, Path)), request_body = CreateSession,
    responses((status = 201, body = SessionCreated), (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody, description = "round_not_ready, template_version_gone")))]
pub async fn invite(
    State(st): St,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
    Json(body): Json<CreateSession>,
) -> Result<(StatusCode, axum::Json<SessionCreated>), RoundsError> {
    caller.require_key()?;
    let s = st.create_session(&id, body, super::host(&headers)).await?;
    Ok((StatusCode::CREATED, axum::Json(s)))
}

/// A reviewer link: read this round's sessions, reports and replays.
#[utoipa::path(post, path = "/v1/rounds/{id}/reviewer-tokens", tag = "rounds", params(("id" = String, Path)),
    request_body = CreateReviewerToken, responses((status = 201, body = ReviewerToken), (status = 404, body = ErrorBody)))]
pub async fn reviewer_token(
    State(st): St,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
    OptJson(body): OptJson<CreateReviewerToken>,
) -> Result<(StatusCode, axum::Json<ReviewerToken>), RoundsError> {
    round_link(
        &st,
        &caller,
        &headers,
        &id,
        body.ttl_seconds,
        Scope::Reviewer,
    )
    .await
}

/// A new token of `scope` (reviewer or interviewer) for round `id` (API
/// key only), and the link to its page: the review page, or the room as
/// an interviewer.
pub(super) async fn round_link(
    st: &Rounds,
    caller: &Caller,
    headers: &HeaderMap,
    id: &str,
    ttl_seconds: Option<u64>,
    scope: Scope,
) -> Result<(StatusCode, axum::Json<ReviewerToken>), RoundsError> {
    caller.require_key()?;
    let r = st.round(id).await?;
    let ttl = within(
        "ttl_seconds",
        ttl_seconds.unwrap_or(DEFAULT_REVIEWER_TOKEN_S),
        1,
        MAX_REVIEWER_TOKEN_S,
    )?;
    let token = crate::tokens::mint();
    let rec = crate::tokens::record(&token, scope, &r.id, None, now_ms(), ttl);
    st.store.insert_token(&rec).await?;
    let page = match scope {
        Scope::Interviewer => format!("room/?round={}&role=interviewer", r.id),
        _ => format!("review/?round={}", r.id),
    };
    let url = format!(
        "{}/rounds/{page}#{token}",
        st.base_url(super::host(headers))
    );
    Ok((
        StatusCode::CREATED,
        axum::Json(ReviewerToken {
            token,
            expires_at: rfc3339(rec.expires_at_ms),
            url,
        }),
    ))
}
