//! The model gateway split across roles (docs/gateway.md, "On many
//! hosts"). On a host, the gateway socket sandboxes reach relays each model
//! call to the control role's gateway, so the host holds no upstream key:
//! the path goes under `/v1/model-gateway`, whatever key the guest sent is
//! dropped, and the host's API key, the deployment's daemon key and the
//! sandbox id the host-service relay attached (which guest code cannot
//! forge) go with it. On the control role, those routes take only requests
//! carrying all three: the API key alone, which every client holds, would
//! let a client charge calls to any session.

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hatchery_gateway::calls::SANDBOX_HEADER;
use hatchery_gateway::errors::CallError;
use hatchery_gateway::usage::Flavor;
use hatchery_serve::headers::{daemon_key_ok, DAEMON_KEY_HEADER};
use std::sync::Arc;

/// Where the control role serves the model routes.
pub const PREFIX: &str = "/v1/model-gateway";

#[derive(Clone)]
pub struct Relay {
    /// `http://host:port` of the control plane.
    pub control: String,
    pub api_key: String,
    pub daemon_key: String,
    /// This host's id (marks the request as forwarded by it).
    pub me: String,
    /// How long the control plane may take to start answering (its
    /// gateway's upstream timeout plus margin): a paused or cut-off control
    /// plane would otherwise hold the guest's call, and one of the
    /// sandbox's 64 host-service connections, until the guest gave up.
    pub answer_within: std::time::Duration,
}

/// What the relay adds to the upstream timeout: the control role's own
/// work (the key check, a reservation in the database) before it calls the
/// upstream.
pub const CONTROL_MARGIN: std::time::Duration = std::time::Duration::from_secs(30);

fn flavor(path: &str) -> Option<Flavor> {
    match path {
        "/v1/chat/completions" => Some(Flavor::OpenAi),
        "/v1/messages" => Some(Flavor::Anthropic),
        _ => None,
    }
}

/// The request as it goes to the control plane (with its protocol, for
/// the shape of an error), or why it does not.
fn rewrite(r: &Relay, mut req: Request) -> Result<(Flavor, Request), (Flavor, CallError)> {
    let path = req.uri().path().to_string();
    let Some(f) = flavor(&path) else {
        return Err((
            Flavor::OpenAi,
            CallError::BadRequest(format!("no model route {path}")),
        ));
    };
    if req.method() != Method::POST {
        return Err((f, CallError::BadRequest("model calls are POSTs".into())));
    }
    // Set by this daemon's host-service relay on every request from a
    // sandbox; without it the call is nobody's.
    if !req.headers().contains_key(SANDBOX_HEADER) {
        return Err((f, CallError::UnboundSandbox));
    }
    sign(r, req.headers_mut()).map_err(|e| (f, CallError::GatewayUnreachable(e)))?;
    let to: Uri = format!("{PREFIX}{path}")
        .parse()
        .map_err(|e: axum::http::uri::InvalidUri| (f, CallError::BadRequest(e.to_string())))?;
    *req.uri_mut() = to;
    Ok((f, req))
}

/// What a relay to the control role puts on a request from a sandbox, in
/// place of any key the guest sent: the host's API key and the
/// deployment's daemon key (the sandbox id the host-service relay set
/// stays).
pub fn sign(r: &Relay, h: &mut axum::http::HeaderMap) -> Result<(), String> {
    h.remove("x-api-key");
    let auth =
        HeaderValue::from_str(&format!("Bearer {}", r.api_key)).map_err(|e| e.to_string())?;
    h.insert(header::AUTHORIZATION, auth);
    let daemon = HeaderValue::from_str(&r.daemon_key).map_err(|e| e.to_string())?;
    h.insert(DAEMON_KEY_HEADER, daemon);
    Ok(())
}

async fn relay(State(r): State<Arc<Relay>>, req: Request) -> Response {
    let (f, req) = match rewrite(&r, req) {
        Ok(x) => x,
        Err((f, e)) => return e.into_response(f),
    };
    let sent = hatchery_route::forward::forward("control", &r.control, &r.me, req);
    match tokio::time::timeout(r.answer_within, sent).await {
        Ok(Ok(resp)) => resp,
        Err(_) => {
            tracing::warn!(within = ?r.answer_within, "the control role's gateway did not answer in time");
            CallError::GatewayUnreachable(format!(
                "the control plane did not answer within {} s",
                r.answer_within.as_secs()
            ))
            .into_response(f)
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "model call not relayed to the control role's gateway");
            CallError::GatewayUnreachable("the control plane did not answer".into())
                .into_response(f)
        }
    }
}

/// The host's gateway socket: every request is relayed (or refused).
pub fn router(r: Relay) -> axum::Router {
    axum::Router::new().fallback(relay).with_state(Arc::new(r))
}

/// What the control role's model routes want of a caller.
#[derive(Clone)]
pub struct HostKeys {
    pub api_key: Arc<str>,
    pub daemon_key: Arc<str>,
}

fn from_a_host(h: &axum::http::HeaderMap, k: &HostKeys) -> bool {
    hatchery_serve::headers::api_key_ok(h, &k.api_key)
        && daemon_key_ok(h, &k.daemon_key)
        && h.contains_key(SANDBOX_HEADER)
}

/// In front of the control role's routes for hosts' relays (the model
/// gateway's and the broker's).
pub async fn hosts_only(State(k): State<Arc<HostKeys>>, req: Request, next: Next) -> Response {
    if !from_a_host(req.headers(), &k) {
        let body = serde_json::json!({"error": {"code": "unauthorized",
            "message": "this route takes calls relayed by hosts (API key, daemon key and sandbox id)"}});
        return (StatusCode::UNAUTHORIZED, axum::Json(body)).into_response();
    }
    next.run(req).await
}

/// The control role's model routes, under [`PREFIX`], for hosts' relays.
pub fn control_routes(model_routes: axum::Router, keys: HostKeys) -> axum::Router {
    axum::Router::new().nest(
        PREFIX,
        model_routes.layer(axum::middleware::from_fn_with_state(
            Arc::new(keys),
            hosts_only,
        )),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;

    fn relay_cfg() -> Relay {
        Relay {
            control: "http://127.0.0.1:1".into(),
            api_key: "hx_k".into(),
            daemon_key: "hxd_d".into(),
            me: "h1".into(),
            answer_within: std::time::Duration::from_secs(5),
        }
    }

    fn req(method: &str, path: &str, headers: &[(&str, &str)]) -> Request {
        let mut b = Request::builder().method(method).uri(path);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(Body::empty()).unwrap()
    }

    async fn json_body(resp: Response) -> serde_json::Value {
        let b = axum::body::to_bytes(resp.into_body(), 1 << 16)
            .await
            .unwrap();
        serde_json::from_slice(&b).unwrap()
    }

    /// The guest's own key never leaves the host; the host's key and the
    /// relay's sandbox id do, on the prefixed path.
    #[test]
    fn the_guests_key_is_replaced_by_the_hosts() {
        let (f, r) = rewrite(
            &relay_cfg(),
            req(
                "POST",
                "/v1/chat/completions",
                &[
                    ("authorization", "Bearer guest-secret"),
                    ("x-api-key", "guest-secret"),
                    (SANDBOX_HEADER, "sbx_1"),
                ],
            ),
        )
        .unwrap();
        assert_eq!(f, Flavor::OpenAi);
        assert_eq!(r.uri().path(), "/v1/model-gateway/v1/chat/completions");
        assert_eq!(r.headers()["authorization"], "Bearer hx_k");
        assert!(!r.headers().contains_key("x-api-key"));
        assert_eq!(r.headers()[SANDBOX_HEADER], "sbx_1");
        assert_eq!(r.headers()[DAEMON_KEY_HEADER], "hxd_d");
    }

    #[test]
    fn only_model_calls_from_a_sandbox_are_relayed() {
        for (m, p, h) in [
            ("POST", "/admin/keys", vec![(SANDBOX_HEADER, "sbx_1")]),
            ("GET", "/v1/messages", vec![(SANDBOX_HEADER, "sbx_1")]),
            ("POST", "/v1/messages", vec![]),
        ] {
            assert!(rewrite(&relay_cfg(), req(m, p, &h)).is_err(), "{m} {p}");
        }
    }

    /// The control side answers 401 without the API key, the daemon key
    /// or a sandbox id, before the gateway sees the call: a client holding
    /// only the API key cannot charge a call to a session.
    #[tokio::test]
    async fn the_control_routes_want_a_hosts_keys_and_a_sandbox() {
        use tower::ServiceExt;
        let inner =
            axum::Router::new().route("/v1/messages", axum::routing::post(|| async { "reached" }));
        let app = control_routes(
            inner,
            HostKeys {
                api_key: "hx_k".into(),
                daemon_key: "hxd_d".into(),
            },
        );
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
            let resp = app
                .clone()
                .oneshot(req("POST", "/v1/model-gateway/v1/messages", &h))
                .await
                .unwrap();
            assert_eq!(resp.status(), want, "{h:?}");
        }
    }

    /// A control plane that does not answer: the guest gets its protocol's
    /// error shape, not a hang.
    #[tokio::test]
    async fn an_unreachable_control_plane_is_a_502_in_the_protocols_shape() {
        use tower::ServiceExt;
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = closed.local_addr().unwrap();
        drop(closed);
        let app = router(Relay {
            control: format!("http://{addr}"),
            ..relay_cfg()
        });
        let resp = app
            .oneshot(req("POST", "/v1/messages", &[(SANDBOX_HEADER, "sbx_1")]))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
        let v = json_body(resp).await;
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "api_error");
    }

    /// A control plane that takes the connection and never answers (paused,
    /// or its upstream stuck) gets the guest a 502 at the bound, not a hang.
    #[tokio::test]
    async fn a_control_plane_that_never_answers_is_a_502_at_the_bound() {
        use tower::ServiceExt;
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = silent.local_addr().unwrap();
        let held = tokio::spawn(async move {
            let mut conns = Vec::new();
            while let Ok((c, _)) = silent.accept().await {
                conns.push(c);
            }
        });
        let app = router(Relay {
            control: format!("http://{addr}"),
            answer_within: std::time::Duration::from_millis(300),
            ..relay_cfg()
        });
        // Without the bound the call would never end: fail instead.
        let resp = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            app.oneshot(req(
                "POST",
                "/v1/chat/completions",
                &[(SANDBOX_HEADER, "sbx_1")],
            )),
        )
        .await
        .expect("the relay waited past its bound")
        .unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
        let v = json_body(resp).await;
        assert_eq!(v["error"]["code"], "gateway_unreachable", "{v}");
        held.abort();
    }
}
