//! The live room's WebSocket: `GET /v1/rounds/{id}/sessions/{sid}/room`.
//! Everything is decided before the upgrade (a refusal is a plain JSON
//! 4xx, never an open socket): who the token is, that it may enter this
//! session's room, that the session has a sandbox, and that the room has
//! a place for one more connection.
//!
//! A browser cannot set `Authorization` on a WebSocket, so the token may
//! also come as the subprotocol `hatchery.token.<token>` offered beside
//! `hatchery.room`; the answer selects `hatchery.room` only, so the token
//! is never echoed.

use crate::ids::valid_id;
use crate::limits::MAX_ROOM_MESSAGE_BYTES;
use crate::room::{socket, Member};
use crate::state::refusal;
use crate::{Caller, Rounds, RoundsError};
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// The subprotocol the room speaks (Yjs sync and awareness, binary).
pub const PROTOCOL: &str = "hatchery.room";
const TOKEN_PROTOCOL: &str = "hatchery.token.";

/// The bearer token of a room request: `Authorization`, else the
/// `hatchery.token.` subprotocol.
fn token(h: &HeaderMap) -> String {
    if let Some(t) = h
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    {
        return t.to_string();
    }
    h.get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .find_map(|p| p.strip_prefix(TOKEN_PROTOCOL))
        .unwrap_or_default()
        .to_string()
}

/// Who may enter which room, and as what: the session's candidate and
/// the API key write; an interviewer of the round watches, and writes
/// while the room is in pairing mode. A reviewer token is refused.
pub(crate) fn member(
    caller: &Caller,
    round_id: &str,
    session_id: &str,
) -> Result<Member, RoundsError> {
    if let Caller::Interviewer(t) = caller {
        caller.require_interviewer(round_id)?;
        return Ok(Member {
            author: format!("interviewer:{}", &t.hash[..12]),
            key: t.hash.clone(),
            can_write: false,
            interviewer: true,
            expires_at_ms: t.expires_at_ms,
        });
    }
    caller.require_candidate(round_id, session_id)?;
    Ok(match caller {
        Caller::Candidate(t) => Member {
            author: "candidate".into(),
            key: t.hash.clone(),
            can_write: true,
            interviewer: false,
            expires_at_ms: t.expires_at_ms,
        },
        _ => Member {
            author: "api_key".into(),
            key: "api_key".into(),
            can_write: true,
            interviewer: false,
            expires_at_ms: u64::MAX,
        },
    })
}

/// Upgrades to the room's WebSocket (binary Yjs messages: sync step 1
/// and 2, updates, awareness). 401 for a missing, wrong or expired token,
/// 403 for one of another session or scope, 409 when the session has no
/// sandbox (ended, preparing), 429 `room_full`.
#[utoipa::path(get, path = "/v1/rounds/{id}/sessions/{sid}/room", tag = "rounds",
    params(("id" = String, Path), ("sid" = String, Path)),
    responses((status = 101, description = "WebSocket, subprotocol hatchery.room"),
              (status = 401, body = crate::error::ErrorBody), (status = 403, body = crate::error::ErrorBody),
              (status = 404, body = crate::error::ErrorBody), (status = 409, body = crate::error::ErrorBody),
              (status = 429, body = crate::error::ErrorBody)))]
pub async fn room(
    State(st): State<Arc<Rounds>>,
    Path((id, sid)): Path<(String, String)>,
    headers: HeaderMap,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, RoundsError> {
    let path = format!("/v1/rounds/{id}/sessions/{sid}/room");
    let caller = Caller::from_token(&st, &token(&headers), &path).await?;
    let who = member(&caller, &id, &sid)?;
    if !valid_id("ses", &sid) {
        return Err(RoundsError::NotFound(format!("session {sid}")));
    }
    let (_, mut s) = st.session(&id, &sid).await?;
    if !s.state.has_sandbox() {
        return Err(refusal(s.state, "open the room"));
    }
    let ws = match ws {
        Ok(ws) => ws,
        Err(rej) => return Ok(rej.into_response()),
    };
    if caller.is_candidate() {
        s.state = st.join(&s).await?;
    }
    let room = st
        .room(&s, true)
        .await?
        .ok_or_else(|| RoundsError::Internal("a seeded room is missing".into()))?;
    let slot = room.reserve(&who.key)?;
    let ws = ws
        .max_message_size(MAX_ROOM_MESSAGE_BYTES)
        .max_frame_size(MAX_ROOM_MESSAGE_BYTES)
        .protocols([PROTOCOL]);
    Ok(ws.on_upgrade(move |socket| socket::serve(st, slot, who, socket)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_from_header_or_subprotocol() {
        let mut h = HeaderMap::new();
        h.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            "hatchery.room, hatchery.token.hxr_abc".parse().unwrap(),
        );
        assert_eq!(token(&h), "hxr_abc");
        h.insert(header::AUTHORIZATION, "Bearer hxr_def".parse().unwrap());
        assert_eq!(token(&h), "hxr_def", "the header wins");
        assert_eq!(token(&HeaderMap::new()), "");
    }
}
