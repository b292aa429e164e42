//! The sandbox side (`E2B_SANDBOX_URL`): one listener for every sandbox,
//! routed by the `E2b-Sandbox-Id` and `E2b-Sandbox-Port` headers the SDKs
//! send. Port 49983 is envd (processes, filesystem, `/files`, `/health`),
//! 49999 the code interpreter; any other port is relayed to whatever
//! listens on it inside the sandbox.
//!
//! Authentication: `X-Access-Token`, the `envdAccessToken` the control
//! plane handed out for that sandbox (an HMAC of its id under the API
//! key), or the API key itself as `X-API-KEY`.

use crate::state::Shared;
use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use std::sync::Arc;

pub const ENVD_PORT: u16 = 49983;
pub const INTERPRETER_PORT: u16 = 49999;

/// Who a sandbox request is for, set by [`route`] for the handlers.
#[derive(Debug, Clone)]
pub struct Target {
    /// The id E2B knows the sandbox by.
    pub e2b_id: String,
    /// The Hatchery sandbox serving it now.
    pub sandbox: String,
    pub port: u16,
    /// From `Authorization: Basic` (user name, empty password), if sent.
    pub user: Option<String>,
}

/// An error answered by the routing layer, as E2B's own proxy answers:
/// plain JSON `{"code": <status>, "message"}`; the SDKs map 502 with
/// "was not found" to "sandbox not running" and "port is not open" to
/// "unreachable".
pub fn plain_error(status: StatusCode, message: impl Into<String>) -> Response {
    (
        status,
        Json(json!({"code": status.as_u16(), "message": message.into()})),
    )
        .into_response()
}

/// The answer to a relayed port's traffic sent to the API's origin
/// instead of the preview origin at `base` (421 in E2B's shape). The
/// daemon hands this to `hatchery_serve::origin_guard`, which knows
/// nothing of E2B.
pub fn relayed_elsewhere(base: &str) -> Response {
    plain_error(
        StatusCode::MISDIRECTED_REQUEST,
        format!(
            "ports other than envd's and the interpreter's are relayed on the preview origin, not the API's: send this to {base}/e2b/sandbox"
        ),
    )
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// The user name of `Authorization: Basic base64(user:)`.
pub fn basic_user(h: &HeaderMap) -> Result<Option<String>, String> {
    let Some(v) = header(h, "authorization") else {
        return Ok(None);
    };
    let Some(b64) = v.strip_prefix("Basic ") else {
        return Ok(None);
    };
    use base64::Engine;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .map_err(|_| "malformed Basic authorization".to_string())?;
    let s = String::from_utf8(raw).map_err(|_| "malformed Basic authorization".to_string())?;
    let user = s.split(':').next().unwrap_or("").to_string();
    if user.is_empty() {
        return Ok(None);
    }
    if !valid_user(&user) {
        return Err(format!("invalid user name {user:?}"));
    }
    Ok(Some(user))
}

/// A user name as envd takes one: at most 32 of `[A-Za-z0-9_.-]`, not
/// starting with `-`.
pub fn valid_user(user: &str) -> bool {
    !user.is_empty()
        && user.len() <= 32
        && user
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
        && !user.starts_with('-')
}

/// Authenticates and routes one sandbox request: envd and interpreter
/// ports to `envd` (paths without the prefix), other ports to the relay.
pub async fn dispatch(s: Arc<Shared>, envd: axum::Router, req: Request) -> Response {
    let h = req.headers();
    let Some(id) = header(h, "e2b-sandbox-id").map(str::to_string) else {
        return plain_error(StatusCode::BAD_REQUEST, "missing E2b-Sandbox-Id header");
    };
    if id.is_empty()
        || id.len() > 64
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return plain_error(StatusCode::BAD_REQUEST, "malformed E2b-Sandbox-Id header");
    }
    let port = match header(h, "e2b-sandbox-port") {
        None => ENVD_PORT,
        Some(p) => match p.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => {
                return plain_error(
                    StatusCode::BAD_REQUEST,
                    "E2b-Sandbox-Port must be a port number (1-65535)",
                )
            }
        },
    };
    let token = header(h, "x-access-token");
    let token_ok = token.is_some_and(|t| s.check_token(&id, t));
    // An `X-API-Key`: the operator's reaches every sandbox, a tenant's
    // only its own; another tenant's sandbox answers as a missing one.
    let caller = match h.get("x-api-key") {
        Some(_) if !token_ok => crate::tenancy::caller(&s, h).await.ok().flatten(),
        _ => None,
    };
    let key_ok = match &caller {
        None => false,
        Some(c) => match crate::tenancy::owns_sandbox(&s, c, &id).await {
            Ok(true) => true,
            Ok(false) => {
                return plain_error(
                    StatusCode::BAD_GATEWAY,
                    format!("sandbox \"{id}\" was not found"),
                )
            }
            Err(e) => return e.into_response(),
        },
    };
    // The code interpreter's SDK sends no envd token to its /contexts
    // routes, only the sandbox's traffic token (E2B-Traffic-Access-Token,
    // from `trafficAccessToken` at create and connect): that token opens
    // those routes and nothing else. See docs/e2b.md.
    let contexts_ok = port == INTERPRETER_PORT
        && token.is_none()
        && crate::strip_prefix(req.uri().path()).starts_with("/contexts")
        && header(h, "e2b-traffic-access-token").is_some_and(|t| s.check_traffic_token(&id, t));
    if !token_ok && !key_ok && !contexts_ok {
        return plain_error(
            StatusCode::UNAUTHORIZED,
            "missing or wrong X-Access-Token for this sandbox",
        );
    }
    let user = match basic_user(h) {
        Ok(u) => u,
        Err(m) => return plain_error(StatusCode::BAD_REQUEST, m),
    };
    let live = match s.live(&id).await {
        Ok(Some(l)) => Some(l),
        _ => auto_resume(&s, &id).await,
    };
    let Some((sandbox, _)) = live else {
        let msg = if s.paused(&id).await.ok().flatten().is_some() {
            format!("sandbox \"{id}\" is paused (was not found running); connect to resume it")
        } else {
            format!("sandbox \"{id}\" was not found")
        };
        return plain_error(StatusCode::BAD_GATEWAY, msg);
    };
    let t = Target {
        e2b_id: id,
        sandbox,
        port,
        user,
    };
    if port != ENVD_PORT && port != INTERPRETER_PORT {
        return relay(&s, t, req).await;
    }
    let pq = crate::strip_prefix(
        req.uri()
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/"),
    );
    let Ok(uri) = pq.parse::<axum::http::Uri>() else {
        return plain_error(StatusCode::BAD_REQUEST, "malformed request target");
    };
    // A fresh request: the outer route's path parameters (kept in the
    // extensions) must not reach the inner routes' extractors.
    let (parts, body) = req.into_parts();
    let mut req = Request::new(body);
    *req.method_mut() = parts.method;
    *req.uri_mut() = uri;
    *req.version_mut() = parts.version;
    *req.headers_mut() = parts.headers;
    req.extensions_mut().insert(t);
    use tower::ServiceExt;
    match envd.oneshot(req).await {
        Ok(r) => r,
        Err(e) => match e {},
    }
}

/// A paused sandbox created with `autoResume` is resumed by a request to
/// it, as E2B's edge does, with the timeout it was created with; `None` if
/// it is not such a sandbox or the resume failed (the caller answers 502).
async fn auto_resume(s: &Shared, id: &str) -> Option<(String, crate::backend::SandboxView)> {
    let p = s.paused(id).await.ok().flatten()?;
    if !p.view.lifecycle.auto_resume {
        return None;
    }
    let ttl = match p.view.lifecycle.timeout_s {
        0 => crate::control::DEFAULT_TIMEOUT_S,
        t => t,
    };
    use crate::pause_resume::Resumed;
    match crate::pause_resume::resume_paused(s, id, ttl).await {
        Ok(Resumed::Restored(v) | Resumed::AlreadyRunning(v)) => Some((v.id.clone(), v)),
        Err(e) => {
            // Another request may be resuming it right now: take its result.
            tracing::debug!(sandbox = %id, error = %e.message, "e2b auto-resume");
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            s.live(id).await.ok().flatten()
        }
    }
}

/// Any other port: relayed over Hatchery's port relay as is.
async fn relay(s: &Shared, t: Target, mut req: Request) -> Response {
    let pq = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let pq = crate::strip_prefix(&pq);
    let h = req.headers_mut();
    for k in [
        "x-access-token",
        "x-api-key",
        "e2b-sandbox-id",
        "e2b-sandbox-port",
    ] {
        h.remove(k);
    }
    match s.backend.proxy_port(&t.sandbox, t.port, req, pq).await {
        Ok(r) => r,
        Err(e) if e.kind == crate::backend::FailKind::PortClosed => plain_error(
            StatusCode::BAD_GATEWAY,
            format!("The sandbox is running but port is not open: nothing listens on port {} in sandbox \"{}\"", t.port, t.e2b_id),
        ),
        Err(e) => crate::api_error::ApiError::from(e).into_response(),
    }
}

/// Routes that exist on one port only answer 404 on the other, as a
/// server there would.
pub fn wrong_port(t: &Target) -> Response {
    plain_error(
        StatusCode::NOT_FOUND,
        format!("no such route on port {}", t.port),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn basic_user_parsing() {
        let mut h = HeaderMap::new();
        assert_eq!(basic_user(&h), Ok(None));
        h.insert("authorization", HeaderValue::from_static("Basic dXNlcjo=")); // user:
        assert_eq!(basic_user(&h), Ok(Some("user".into())));
        h.insert("authorization", HeaderValue::from_static("Basic cm9vdDo=")); // root:
        assert_eq!(basic_user(&h), Ok(Some("root".into())));
        h.insert("authorization", HeaderValue::from_static("Basic !!!"));
        assert!(basic_user(&h).is_err());
        h.insert("authorization", HeaderValue::from_static("Basic YSBiOg==")); // "a b:"
        assert!(basic_user(&h).is_err());
    }

    #[tokio::test]
    async fn a_relayed_port_on_the_api_origin_is_told_where_to_go() {
        let r = relayed_elsewhere("http://h:7424");
        assert_eq!(r.status(), StatusCode::MISDIRECTED_REQUEST);
        let body = axum::body::to_bytes(r.into_body(), 4096).await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["code"], 421);
        assert!(v["message"]
            .as_str()
            .unwrap()
            .contains("http://h:7424/e2b/sandbox"));
    }
}
