//! The interviewer's routes beside the room's WebSocket: their token
//! (made with the API key), the private notes on a session, and the
//! pairing switch. None of these take a candidate token.

use crate::error::ErrorBody;
use crate::extract::{Json, OptJson};
use crate::ids::{now_ms, rfc3339};
use crate::limits::*;
use crate::models::*;
use crate::store::{NotesRecord, Scope};
use crate::{Caller, Rounds, RoundsError};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use std::sync::Arc;

type St = State<Arc<Rounds>>;

/// An interviewer token for one round (API key only): opens the live
/// room of any of the round's sessions (watching; typing while pairing is
/// on), keeps notes. Not a reviewer token: no reports, no hidden tests.
#[utoipa::path(post, path = "/v1/rounds/{id}/interviewer-tokens", tag = "rounds",
    params(("id" = String, Path)), request_body = CreateReviewerToken,
    responses((status = 201, body = ReviewerToken), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn interviewer_token(
    State(st): St,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
    OptJson(body): OptJson<CreateReviewerToken>,
) -> Result<(StatusCode, axum::Json<ReviewerToken>), RoundsError> {
    super::admin::round_link(
        &st,
        &caller,
        &headers,
        &id,
        body.ttl_seconds,
        Scope::Interviewer,
    )
    .await
}

/// Interviewers and the API key write notes; reviewers of the round
/// read them too. A candidate token never reaches them.
fn may_read_notes(caller: &Caller, round_id: &str) -> Result<(), RoundsError> {
    match caller {
        Caller::Reviewer(_) => caller.require_reviewer(round_id),
        _ => caller.require_interviewer(round_id),
    }
}

fn author(caller: &Caller) -> String {
    match caller {
        Caller::Interviewer(t) => format!("interviewer:{}", &t.hash[..12]),
        _ => "api_key".into(),
    }
}

/// The interviewers' private notes on a session.
#[utoipa::path(get, path = "/v1/rounds/{id}/sessions/{sid}/notes", tag = "rounds",
    params(("id" = String, Path), ("sid" = String, Path)),
    responses((status = 200, body = Notes), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn get_notes(
    State(st): St,
    caller: Caller,
    Path((id, sid)): Path<(String, String)>,
) -> Result<axum::Json<Notes>, RoundsError> {
    may_read_notes(&caller, &id)?;
    let (_, s) = st.session(&id, &sid).await?;
    let n = st.store.get_notes(&s.id).await?;
    Ok(axum::Json(match n {
        Some(n) => Notes {
            text: n.text,
            author: n.author,
            updated_at: Some(rfc3339(n.updated_at_ms)),
        },
        None => Notes {
            text: String::new(),
            author: String::new(),
            updated_at: None,
        },
    }))
}

/// Replaces the notes (at most 64 KiB).
#[utoipa::path(put, path = "/v1/rounds/{id}/sessions/{sid}/notes", tag = "rounds",
    params(("id" = String, Path), ("sid" = String, Path)), request_body = NotesBody,
    responses((status = 200, body = Notes), (status = 403, body = ErrorBody), (status = 413, body = ErrorBody)))]
pub async fn put_notes(
    State(st): St,
    caller: Caller,
    Path((id, sid)): Path<(String, String)>,
    Json(body): Json<NotesBody>,
) -> Result<axum::Json<Notes>, RoundsError> {
    caller.require_interviewer(&id)?;
    if body.text.len() > MAX_NOTES_BYTES {
        return Err(RoundsError::TooLarge(format!(
            "notes: {} bytes, at most {MAX_NOTES_BYTES}",
            body.text.len()
        )));
    }
    let (_, s) = st.session(&id, &sid).await?;
    let rec = NotesRecord {
        session_id: s.id,
        text: body.text,
        author: author(&caller),
        updated_at_ms: now_ms(),
    };
    st.store.put_notes(&rec).await?;
    Ok(axum::Json(Notes {
        text: rec.text,
        author: rec.author,
        updated_at: Some(rfc3339(rec.updated_at_ms)),
    }))
}

/// The pairing switch: `true` lets interviewers type in the room, `false`
/// (the default) keeps them watching. Everyone in the room is told.
#[utoipa::path(post, path = "/v1/rounds/{id}/sessions/{sid}/room/pairing", tag = "rounds",
    params(("id" = String, Path), ("sid" = String, Path)), request_body = Pairing,
    responses((status = 200, body = Pairing), (status = 403, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn pairing(
    State(st): St,
    caller: Caller,
    Path((id, sid)): Path<(String, String)>,
    Json(body): Json<Pairing>,
) -> Result<axum::Json<Pairing>, RoundsError> {
    caller.require_interviewer(&id)?;
    let (_, s) = st.session(&id, &sid).await?;
    if !s.state.has_sandbox() {
        return Err(crate::state::refusal(s.state, "pair"));
    }
    let room = st
        .room(&s, true)
        .await?
        .ok_or_else(|| RoundsError::Internal("a seeded room is missing".into()))?;
    room.set_pairing(body.pairing);
    Ok(axum::Json(Pairing {
        pairing: room.pairing(),
    }))
}
