//! The rounds pages (`web/rounds/`, bundled into `web/rounds/dist/` by
//! `make rounds-pages-build`), embedded at compile time and served without
//! authentication: they hold nothing secret, and act only with the
//! capability token in their URL fragment. CodeMirror is inside `room.js`;
//! the terminal is the daemon's own `/terminal/terminal.js`.

use crate::RoundsError;
use axum::extract::Path;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};

const ROOM_HTML: &[u8] = include_bytes!("../../../web/rounds/dist/room.html");
const REVIEW_HTML: &[u8] = include_bytes!("../../../web/rounds/dist/review.html");
const ROOM_JS: &[u8] = include_bytes!("../../../web/rounds/dist/room.js");
const REVIEW_JS: &[u8] = include_bytes!("../../../web/rounds/dist/review.js");
const ROUNDS_CSS: &[u8] = include_bytes!("../../../web/rounds/dist/rounds.css");

/// Scripts and styles from this origin only (CodeMirror and xterm.js add
/// `<style>` elements, hence inline styles); connections back here only.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
                   connect-src 'self'; img-src 'self' data:; font-src 'self'; base-uri 'none'; form-action 'none'; \
                   frame-ancestors 'none'";

fn asset(body: &'static [u8], content_type: &'static str) -> Response {
    let mut r = (StatusCode::OK, body).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // nosniff, no-referrer (the token is in the fragment, which is never
    // sent; no-referrer keeps even the path and query here), no framing,
    // and an opener policy that cuts any other origin's window handle.
    hatchery_serve::origin::page_headers(h, CSP);
    r
}

pub async fn room() -> Response {
    asset(ROOM_HTML, "text/html; charset=utf-8")
}

pub async fn review() -> Response {
    asset(REVIEW_HTML, "text/html; charset=utf-8")
}

pub async fn room_redirect() -> Redirect {
    Redirect::permanent("/rounds/room/")
}

pub async fn review_redirect() -> Redirect {
    Redirect::permanent("/rounds/review/")
}

pub async fn file(Path(name): Path<String>) -> Result<Response, RoundsError> {
    let (body, ct) = match name.as_str() {
        "room.js" => (ROOM_JS, "text/javascript; charset=utf-8"),
        "review.js" => (REVIEW_JS, "text/javascript; charset=utf-8"),
        "rounds.css" => (ROUNDS_CSS, "text/css; charset=utf-8"),
        _ => return Err(RoundsError::NotFound(format!("asset {name}"))),
    };
    Ok(asset(body, ct))
}
