//! Port previews: HTTP (and WebSocket) to a server inside a sandbox,
//! relayed over its agent channel, so the sandbox never gets a route to
//! the host. Two ways in:
//!
//! - `ANY /v1/sandboxes/{id}/ports/{port}/{path}` with the API key;
//! - `ANY /preview/{token}/{path}` with a signed, expiring token from
//!   `POST /v1/sandboxes/{id}/ports/{port}/preview-url`, no key: what a
//!   browser opens. Path-based: the page is served under
//!   `/preview/{token}/`, so relative links keep working. Served on the
//!   preview origin (hatcheryd's preview listener), never on the API's:
//!   a guest page there could install a service worker over the rounds
//!   pages and the terminal.
//!
//! Neither passes on a guest's `Service-Worker-Allowed`, and both refuse
//! a browser's fetch of a service worker script (`proxy.rs`).
//!
//! Paths are taken from the raw request URI, never decoded, so what the
//! guest server sees is exactly what the caller sent after the prefix.

use crate::error::ErrorBody;
use crate::extract::Body;
use crate::{ApiError, AppState};
use axum::extract::{OriginalUri, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use hatchery_core::proxy::Forward;
use hatchery_core::{now_ms, rfc3339, CoreError, PreviewError};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreatePreviewUrl {
    /// How long the URL works, in seconds: 1 to 86400, default 3600.
    #[serde(default)]
    pub ttl_seconds: Option<u64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct PreviewUrl {
    /// Absolute, on the preview origin: the daemon's `--preview-url` if
    /// set (its `*` replaced by `PORT-ID`), else `http://` + the host name
    /// of this request's `Host` + the preview listener's port.
    pub url: String,
    /// `/preview/{token}/`
    pub path: String,
    pub expires_at: String,
    pub sandbox_id: String,
    pub port: u16,
}

/// `1..=65535`, digits only.
fn parse_port(s: &str) -> Result<u16, ApiError> {
    s.parse::<u16>()
        .ok()
        .filter(|p| *p != 0 && s.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_port",
                format!("port must be a number from 1 to 65535, not {s:?}"),
            )
        })
}

/// `/v1/sandboxes/{id}/ports/{port}` and the rest, from the raw path.
fn split_ports_path(path: &str) -> Option<(&str, &str, &str)> {
    let rest = path.strip_prefix("/v1/sandboxes/")?;
    let (id, rest) = rest.split_once('/')?;
    let rest = rest.strip_prefix("ports/")?;
    let (port, rest) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    Some((id, port, rest))
}

/// `/preview/{token}` and the rest.
fn split_preview_path(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix("/preview/")?;
    Some(match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    })
}

/// What the guest server is asked for: the rest of the path (at least `/`)
/// and the query.
fn target(rest: &str, uri: &Uri) -> String {
    let path = if rest.is_empty() { "/" } else { rest };
    match uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_string(),
    }
}

async fn relay(
    st: &AppState,
    sandbox: &str,
    port: u16,
    req: Request,
    fwd: Forward,
) -> Result<Response, ApiError> {
    // Before a relay is opened: a worker script is refused, whatever
    // answers on the port.
    hatchery_core::proxy::refuse_service_worker(req.headers())?;
    let stream = st.manager.open_port(sandbox, port).await?;
    let resp = hatchery_core::proxy::forward(stream, req, &fwd).await?;
    Ok(resp.map(axum::body::Body::new))
}

/// Relays the request to `127.0.0.1:{port}` inside the sandbox. Also
/// served without `/{path}` (the guest gets `/`). The daemon's API key
/// (`Authorization`) is never passed on; `X-Forwarded-Host`, `-Proto` and
/// `-Prefix` are added, path-absolute `Location`s and cookie `Path`s of
/// the answer are put under this route's prefix. A GET with
/// `Upgrade: websocket` is relayed as a WebSocket: once the guest server
/// answers 101, bytes are spliced both ways until either side closes.
/// At most 64 relayed connections per sandbox at once (429 beyond).
/// This route is for programs holding the key, on the API's origin: the
/// answer gets `Content-Security-Policy: sandbox` besides the guest's own
/// headers, so a browser that ever rendered it would give it an opaque
/// origin (browsers open previews, on the preview origin). A request
/// with `Service-Worker` (a worker script fetch) is 403
/// `service_worker_refused`; `Service-Worker-Allowed` is never passed on.
#[utoipa::path(method(get, post, put, delete, patch, head, options),
    path = "/v1/sandboxes/{id}/ports/{port}/{path}", tag = "ports",
    params(("id" = String, Path), ("port" = u16, Path, minimum = 1, maximum = 65535, description = "1 to 65535"),
           ("path" = String, Path, description = "the rest of the path (and the query), sent to the guest server as is")),
    responses(
        (status = 101, description = "WebSocket: the guest server switched protocols; the connection is spliced to it"),
        (status = 200, description = "the guest server's answer, whatever its status, headers and body"),
        (status = 400, description = "port outside 1-65535", body = ErrorBody),
        (status = 403, description = "`service_worker_refused`: a service worker script fetch", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 429, description = "too many relayed connections open to this sandbox", body = ErrorBody),
        (status = 502, description = "`port_closed`: nothing listens on the port; `bad_gateway`: the guest server broke HTTP", body = ErrorBody),
        (status = 504, body = ErrorBody)))]
pub async fn proxy(
    State(st): State<AppState>,
    OriginalUri(uri): OriginalUri,
    req: Request,
) -> Result<Response, ApiError> {
    let (id, port, rest) = split_ports_path(uri.path())
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route"))?;
    let port_n = parse_port(port)?;
    let fwd = Forward {
        path_and_query: target(rest, &uri),
        prefix: format!("/v1/sandboxes/{id}/ports/{port}"),
        strip_authorization: true,
    };
    let mut resp = relay(&st, id, port_n, req, fwd).await?;
    // Appended, not inserted: every CSP a response carries is enforced,
    // so the guest's own stays in force too.
    resp.headers_mut().append(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("sandbox"),
    );
    Ok(resp)
}

/// A URL for a browser: `/preview/{token}/` on the preview origin (the
/// daemon's preview listener, or `--preview-url`; never the API's own
/// origin) serves this port of this sandbox without the API key until
/// `expires_at`. The token is an
/// HMAC-SHA256 over (sandbox, port, expiry) with a per-daemon secret;
/// nothing is stored. The body may be empty.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/ports/{port}/preview-url", tag = "ports",
    params(("id" = String, Path), ("port" = u16, Path, minimum = 1, maximum = 65535, description = "1 to 65535")),
    request_body(content = Option<CreatePreviewUrl>, description = "optional; an empty body takes the defaults"),
    responses((status = 200, body = PreviewUrl), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn preview_url(
    State(st): State<AppState>,
    OriginalUri(uri): OriginalUri,
    headers: HeaderMap,
    Body(body): Body,
) -> Result<axum::Json<PreviewUrl>, ApiError> {
    let (id, port, _) = split_ports_path(uri.path())
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route"))?;
    let port = parse_port(port)?;
    let req: CreatePreviewUrl = if body.iter().all(u8::is_ascii_whitespace) {
        CreatePreviewUrl::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_json", e.to_string()))?
    };
    let caps = &st.manager.caps;
    let ttl = hatchery_core::within(
        "ttl_seconds",
        req.ttl_seconds.unwrap_or(caps.default_preview_ttl_s),
        caps.max_preview_ttl_s,
    )?;
    let info = st.manager.get(id).await?;
    let expires_s = now_ms() / 1000 + ttl;
    let token = st.preview.mint(&info.id, port, expires_s);
    let path = format!("/preview/{token}/");
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let url = match st.preview_origin.base(host, &info.id, port) {
        Some(base) => format!("{base}{path}"),
        None => path.clone(),
    };
    Ok(axum::Json(PreviewUrl {
        url,
        path,
        expires_at: rfc3339(expires_s * 1000),
        sandbox_id: info.id,
        port,
    }))
}

/// The preview a token grants: the same relay as `/v1/.../ports/{port}/`,
/// without the API key. `/preview/{token}` redirects (308) to
/// `/preview/{token}/` so relative links resolve under the token.
/// A tampered, expired or foreign token is 403 `preview_denied`, checked
/// before anything about the sandbox is looked up. Served on the preview
/// origin only: on the API's listener this is a 308 to the same path
/// there. A service worker script fetch (`Service-Worker` header) is 403
/// `service_worker_refused`, and a guest's `Service-Worker-Allowed` is
/// dropped, so a preview page cannot install a worker, let alone one
/// above its own `/preview/{token}/`. With a wildcard `--preview-url`, a
/// token opened under another preview's host name is 403 `preview_denied`.
#[utoipa::path(method(get, post, put, delete, patch, head, options),
    path = "/preview/{token}/{path}", tag = "ports", security(()),
    params(("token" = String, Path, description = "from `preview-url`"),
           ("path" = String, Path, description = "the rest of the path (and the query), sent to the guest server as is")),
    responses(
        (status = 101, description = "WebSocket: the guest server switched protocols; the connection is spliced to it"),
        (status = 200, description = "the guest server's answer, whatever its status, headers and body"),
        (status = 308, description = "`/preview/{token}` without the trailing slash; or the request came to the API's origin: the same path on the preview origin", body = ErrorBody),
        (status = 403, description = "`preview_denied`: token tampered with, expired, or not for this host; `service_worker_refused`: a service worker script fetch", body = ErrorBody),
        (status = 404, description = "the sandbox the token was for is gone", body = ErrorBody),
        (status = 429, body = ErrorBody), (status = 502, body = ErrorBody), (status = 504, body = ErrorBody)))]
pub async fn preview(
    State(st): State<AppState>,
    OriginalUri(uri): OriginalUri,
    req: Request,
) -> Result<Response, ApiError> {
    let denied =
        |e: PreviewError| ApiError::new(StatusCode::FORBIDDEN, "preview_denied", e.to_string());
    let (token, rest) = split_preview_path(uri.path()).ok_or(denied(PreviewError::Invalid))?;
    let grant = st.preview.verify(token, now_ms() / 1000).map_err(denied)?;
    if rest.is_empty() {
        let to = match uri.query() {
            Some(q) => format!("/preview/{token}/?{q}"),
            None => format!("/preview/{token}/"),
        };
        let loc = HeaderValue::from_str(&to).map_err(|e| ApiError::bad_request(e.to_string()))?;
        return Ok((StatusCode::PERMANENT_REDIRECT, [(header::LOCATION, loc)]).into_response());
    }
    // A caller who sends the daemon's key here too must not hand it to the
    // guest.
    let strip_authorization = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.strip_prefix("Bearer ") == Some(&*st.api_key));
    let fwd = Forward {
        path_and_query: target(rest, &uri),
        prefix: format!("/preview/{token}"),
        strip_authorization,
    };
    match relay(&st, &grant.sandbox_id, grant.port, req, fwd).await {
        // Valid token, sandbox gone or stopped: say so, the holder was
        // granted it.
        Err(e) if e.code == "sandbox_not_running" => {
            Err(ApiError::from(CoreError::SandboxNotFound(grant.sandbox_id)))
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_paths_split_raw() {
        assert_eq!(
            split_ports_path("/v1/sandboxes/sbx_a/ports/8000/x/%2F?y"),
            Some(("sbx_a", "8000", "/x/%2F?y"))
        );
        assert_eq!(
            split_ports_path("/v1/sandboxes/sbx_a/ports/8000"),
            Some(("sbx_a", "8000", ""))
        );
        assert_eq!(
            split_preview_path("/preview/tok/a/b"),
            Some(("tok", "/a/b"))
        );
        assert_eq!(split_preview_path("/preview/tok"), Some(("tok", "")));
    }

    #[test]
    fn ports_outside_the_range_are_refused() {
        for bad in ["0", "65536", "-1", "+80", "80a", "", "99999999999"] {
            assert!(parse_port(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_port("65535").unwrap(), 65535);
        assert_eq!(parse_port("1").unwrap(), 1);
    }
}
