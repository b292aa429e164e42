//! HTTP handlers of `/v1/rounds`. Each says which callers it accepts
//! (the API key, a candidate token, a reviewer token); the service below
//! does the work.

pub mod admin;
pub mod candidate;
pub mod interview;
pub mod playback;
pub mod review;
pub mod room;

use axum::http::HeaderMap;

pub(crate) fn host(h: &HeaderMap) -> Option<&str> {
    h.get(axum::http::header::HOST)
        .and_then(|v| v.to_str().ok())
}
