//! The browser terminal (`web/terminal/`, bundled into `web/terminal/dist/`
//! by `make terminal-build`), embedded at compile time and served at
//! `/terminal/` without authentication: it holds nothing secret, and the
//! page only connects with a terminal token it is given in its URL
//! fragment. No CDN: xterm.js is inside `terminal.js`.

use crate::ApiError;
use axum::extract::Path;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};

const INDEX_HTML: &[u8] = include_bytes!("../../../../web/terminal/dist/index.html");
const PAGE_JS: &[u8] = include_bytes!("../../../../web/terminal/dist/page.js");
const PAGE_CSS: &[u8] = include_bytes!("../../../../web/terminal/dist/page.css");
const TERMINAL_JS: &[u8] = include_bytes!("../../../../web/terminal/dist/terminal.js");
const TERMINAL_CSS: &[u8] = include_bytes!("../../../../web/terminal/dist/terminal.css");

/// Scripts and styles from here only (xterm.js adds `<style>` elements of
/// its own, hence inline styles), and connections back to this daemon.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
                   connect-src 'self'; img-src 'self' data:; font-src 'self'; base-uri 'none'; form-action 'none'; \
                   frame-ancestors 'none'";

fn asset_response(body: &'static [u8], content_type: &'static str) -> Response {
    let mut r = (StatusCode::OK, body).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // nosniff, no-referrer (the token is in the fragment, which is never
    // sent; no-referrer keeps even the path and query here), no framing,
    // and an opener policy that cuts any other origin's window handle.
    hatchery_serve::origin::page_headers(h, CSP);
    r
}

pub async fn redirect() -> Redirect {
    Redirect::permanent("/terminal/")
}

pub async fn index() -> Response {
    asset_response(INDEX_HTML, "text/html; charset=utf-8")
}

pub async fn asset(Path(file): Path<String>) -> Result<Response, ApiError> {
    let (body, ct) = match file.as_str() {
        "index.html" => (INDEX_HTML, "text/html; charset=utf-8"),
        "page.js" => (PAGE_JS, "text/javascript; charset=utf-8"),
        "page.css" => (PAGE_CSS, "text/css; charset=utf-8"),
        "terminal.js" => (TERMINAL_JS, "text/javascript; charset=utf-8"),
        "terminal.css" => (TERMINAL_CSS, "text/css; charset=utf-8"),
        _ => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                "no such file",
            ))
        }
    };
    Ok(asset_response(body, ct))
}
