//! Relays from a host to the control role, for products split across roles
//! (the model gateway's and the broker's: docs/gateway.md, "On many hosts";
//! docs/sessions.md, "The broker on many hosts").
//!
//! On a host, a product's socket that sandboxes reach forwards each request
//! to the control role under the product's prefix. Whatever key the guest
//! sent is dropped; the host's API key, the deployment's daemon key and the
//! sandbox id the host-service relay attached (which guest code cannot
//! forge) go with it. On the control role, those routes take only requests
//! carrying all three ([`for_hosts`]): the API key alone, which every
//! client holds, would let a client act as any sandbox.
//!
//! What a product answers when the relay fails (its own error shape) stays
//! in the product: [`send`] says why, typed.

use axum::extract::{Request, State};
use axum::http::header::InvalidHeaderValue;
use axum::http::uri::InvalidUri;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hatchery_serve::headers::{api_key_ok, daemon_key_ok, DAEMON_KEY_HEADER, SANDBOX_HEADER};
use std::sync::Arc;
use std::time::Duration;

/// Where and how a host relays to the control role.
#[derive(Clone)]
pub struct Relay {
    /// `http://host:port` of the control plane.
    pub control: String,
    pub api_key: String,
    pub daemon_key: String,
    /// This host's id (marks the request as forwarded by it).
    pub me: String,
    /// How long the control plane may take to start answering: a paused
    /// or cut-off control plane would otherwise hold the guest's call, and
    /// one of the sandbox's host-service connections, until the guest gave
    /// up.
    pub answer_within: Duration,
}

/// Why a request was not relayed (or its answer not heard).
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("no sandbox identity on the request")]
    NoSandbox,
    #[error("the relay's keys are not usable as headers")]
    Keys(#[source] InvalidHeaderValue),
    #[error("the relayed path is not a URI")]
    Path(#[source] InvalidUri),
    #[error("the control plane did not answer within {} s", .0.as_secs())]
    TimedOut(Duration),
    #[error("the control plane did not answer")]
    Unreachable(#[source] crate::RouteError),
}

/// What a relay puts on a request from a sandbox, in place of any key the
/// guest sent: the host's API key and the deployment's daemon key (the
/// sandbox id the host-service relay set stays).
pub fn sign(r: &Relay, h: &mut HeaderMap) -> Result<(), RelayError> {
    h.remove("x-api-key");
    let auth = HeaderValue::from_str(&format!("Bearer {}", r.api_key)).map_err(RelayError::Keys)?;
    h.insert(header::AUTHORIZATION, auth);
    let daemon = HeaderValue::from_str(&r.daemon_key).map_err(RelayError::Keys)?;
    h.insert(DAEMON_KEY_HEADER, daemon);
    Ok(())
}

/// The request as it goes to the control plane: signed, under `prefix`.
/// A request without the sandbox id is nobody's and is not relayed.
pub fn rewrite(r: &Relay, prefix: &str, mut req: Request) -> Result<Request, RelayError> {
    if !req.headers().contains_key(SANDBOX_HEADER) {
        return Err(RelayError::NoSandbox);
    }
    sign(r, req.headers_mut())?;
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_default();
    let to: Uri = format!("{prefix}{path}")
        .parse()
        .map_err(RelayError::Path)?;
    *req.uri_mut() = to;
    Ok(req)
}

/// Relays `req` (already through [`rewrite`]) and bounds the wait for the
/// answer's head by `answer_within`.
pub async fn send(r: &Relay, req: Request) -> Result<Response, RelayError> {
    let sent = crate::forward::forward("control", &r.control, &r.me, req);
    match tokio::time::timeout(r.answer_within, sent).await {
        Ok(Ok(resp)) => Ok(resp),
        Ok(Err(e)) => Err(RelayError::Unreachable(e)),
        Err(_) => Err(RelayError::TimedOut(r.answer_within)),
    }
}

/// What the control role's routes for hosts' relays want of a caller.
#[derive(Clone)]
pub struct HostKeys {
    pub api_key: Arc<str>,
    pub daemon_key: Arc<str>,
}

fn from_a_host(h: &HeaderMap, k: &HostKeys) -> bool {
    api_key_ok(h, &k.api_key) && daemon_key_ok(h, &k.daemon_key) && h.contains_key(SANDBOX_HEADER)
}

async fn hosts_only(State(k): State<Arc<HostKeys>>, req: Request, next: Next) -> Response {
    if !from_a_host(req.headers(), &k) {
        let body = serde_json::json!({"error": {"code": "unauthorized",
            "message": "this route takes calls relayed by hosts (API key, daemon key and sandbox id)"}});
        return (StatusCode::UNAUTHORIZED, axum::Json(body)).into_response();
    }
    next.run(req).await
}

/// `routes` nested under `prefix` on the control role, for hosts' relays
/// only (answered 401 before the product sees the request otherwise).
pub fn for_hosts(prefix: &str, routes: axum::Router, keys: HostKeys) -> axum::Router {
    axum::Router::new().nest(
        prefix,
        routes.layer(axum::middleware::from_fn_with_state(
            Arc::new(keys),
            hosts_only,
        )),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use tower::ServiceExt;

    fn relay_cfg(control: String, within: Duration) -> Relay {
        Relay {
            control,
            api_key: "hx_k".into(),
            daemon_key: "hxd_d".into(),
            me: "h1".into(),
            answer_within: within,
        }
    }

    fn req(path: &str, headers: &[(&str, &str)]) -> Request {
        let mut b = Request::builder().method("POST").uri(path);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(Body::empty()).unwrap()
    }

    /// The guest's own keys never leave the host; the host's keys and the
    /// relay's sandbox id do, on the prefixed path with its query.
    #[test]
    fn the_guests_keys_are_replaced_by_the_hosts() {
        let r = relay_cfg("http://127.0.0.1:1".into(), Duration::from_secs(5));
        let out = rewrite(
            &r,
            "/v1/p",
            req(
                "/v1/call?x=1",
                &[
                    ("authorization", "Bearer guest-secret"),
                    ("x-api-key", "guest-secret"),
                    (DAEMON_KEY_HEADER, "guessed"),
                    (SANDBOX_HEADER, "sbx_1"),
                ],
            ),
        )
        .unwrap();
        assert_eq!(out.uri().to_string(), "/v1/p/v1/call?x=1");
        assert_eq!(out.headers()["authorization"], "Bearer hx_k");
        assert!(!out.headers().contains_key("x-api-key"));
        assert_eq!(out.headers()[SANDBOX_HEADER], "sbx_1");
        assert_eq!(out.headers()[DAEMON_KEY_HEADER], "hxd_d");
        let nobody = rewrite(&r, "/v1/p", req("/v1/call", &[]));
        assert!(matches!(nobody, Err(RelayError::NoSandbox)));
    }

    /// The control side answers 401 without the API key, the daemon key
    /// or a sandbox id, before the product sees the call: a client holding
    /// only the API key cannot act as a sandbox.
    #[tokio::test]
    async fn the_control_routes_want_a_hosts_keys_and_a_sandbox() {
        let inner = axum::Router::new().route("/v1/m", axum::routing::post(|| async { "reached" }));
        let keys = HostKeys {
            api_key: "hx_k".into(),
            daemon_key: "hxd_d".into(),
        };
        let app = for_hosts("/v1/p", inner, keys);
        let (key, bad_key) = (
            ("authorization", "Bearer hx_k"),
            ("authorization", "Bearer x"),
        );
        let (daemon, bad_daemon) = ((DAEMON_KEY_HEADER, "hxd_d"), (DAEMON_KEY_HEADER, "hx_k"));
        let sbx = (SANDBOX_HEADER, "sbx_1");
        for (h, want) in [
            (vec![sbx, daemon], StatusCode::UNAUTHORIZED),
            (vec![key, daemon], StatusCode::UNAUTHORIZED),
            (vec![key, sbx], StatusCode::UNAUTHORIZED),
            (vec![key, sbx, bad_daemon], StatusCode::UNAUTHORIZED),
            (vec![bad_key, sbx, daemon], StatusCode::UNAUTHORIZED),
            (vec![key, sbx, daemon], StatusCode::OK),
        ] {
            let resp = app.clone().oneshot(req("/v1/p/v1/m", &h)).await.unwrap();
            assert_eq!(resp.status(), want, "{h:?}");
        }
    }

    /// A closed port is Unreachable; a control plane that takes the
    /// connection and never answers is TimedOut at the bound, not a hang.
    #[tokio::test]
    async fn a_control_plane_that_is_gone_or_silent_is_told_in_time() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = closed.local_addr().unwrap();
        drop(closed);
        let r = relay_cfg(format!("http://{addr}"), Duration::from_secs(5));
        let e = send(&r, req("/x", &[])).await.unwrap_err();
        assert!(matches!(e, RelayError::Unreachable(_)), "{e:?}");

        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = silent.local_addr().unwrap();
        let held = tokio::spawn(async move {
            let mut conns = Vec::new();
            while let Ok((c, _)) = silent.accept().await {
                conns.push(c);
            }
        });
        let r = relay_cfg(format!("http://{addr}"), Duration::from_millis(300));
        let e = tokio::time::timeout(Duration::from_secs(10), send(&r, req("/x", &[])))
            .await
            .expect("the relay waited past its bound")
            .unwrap_err();
        assert!(matches!(e, RelayError::TimedOut(_)), "{e:?}");
        held.abort();
    }
}
