//! The model gateway split across roles (docs/gateway.md, "On many
//! hosts"). On a host, the gateway socket sandboxes reach relays each model
//! call to the control role's gateway under [`PREFIX`] (the generic relay,
//! its keys and the control side's check are `hatchery_route::relay`), so
//! the host holds no upstream key. What is the gateway's own: only model
//! calls are relayed, and a failed relay answers in the call's protocol.

use crate::errors::CallError;
use crate::usage::Flavor;
use axum::extract::{Request, State};
use axum::http::Method;
use axum::response::Response;
use hatchery_route::relay::{self, HostKeys, Relay, RelayError};
use std::sync::Arc;

/// Where the control role serves the model routes.
pub const PREFIX: &str = "/v1/model-gateway";

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
fn rewrite(r: &Relay, req: Request) -> Result<(Flavor, Request), (Flavor, CallError)> {
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
    relay::rewrite(r, PREFIX, req)
        .map(|req| (f, req))
        .map_err(|e| (f, call_error(e)))
}

fn call_error(e: RelayError) -> CallError {
    match e {
        // Set by the daemon's host-service relay on every request from a
        // sandbox; without it the call is nobody's.
        RelayError::NoSandbox => CallError::UnboundSandbox,
        RelayError::Path(e) => CallError::BadRequest(e.to_string()),
        RelayError::Keys(_) | RelayError::TimedOut(_) | RelayError::Unreachable(_) => {
            CallError::GatewayUnreachable(e.to_string())
        }
    }
}

async fn relay_call(State(r): State<Arc<Relay>>, req: Request) -> Response {
    let (f, req) = match rewrite(&r, req) {
        Ok(x) => x,
        Err((f, e)) => return e.into_response(f),
    };
    match relay::send(&r, req).await {
        Ok(resp) => resp,
        Err(e) => {
            tracing::warn!(error = %e, "model call not relayed to the control role's gateway");
            call_error(e).into_response(f)
        }
    }
}

/// The host's gateway socket: every request is relayed (or refused).
pub fn router(r: Relay) -> axum::Router {
    axum::Router::new()
        .fallback(relay_call)
        .with_state(Arc::new(r))
}

/// The control role's model routes, under [`PREFIX`], for hosts' relays.
pub fn control_routes(model_routes: axum::Router, keys: HostKeys) -> axum::Router {
    relay::for_hosts(PREFIX, model_routes, keys)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calls::SANDBOX_HEADER;
    use axum::body::Body;
    use axum::http::StatusCode;
    use tower::ServiceExt;

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

    #[test]
    fn a_model_call_goes_under_the_prefix_with_its_protocol() {
        let (f, r) = rewrite(
            &relay_cfg(),
            req("POST", "/v1/chat/completions", &[(SANDBOX_HEADER, "sbx_1")]),
        )
        .unwrap();
        assert_eq!(f, Flavor::OpenAi);
        assert_eq!(r.uri().path(), "/v1/model-gateway/v1/chat/completions");
        assert_eq!(r.headers()["authorization"], "Bearer hx_k");
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

    /// A control plane that does not answer: the guest gets its protocol's
    /// error shape, not a hang.
    #[tokio::test]
    async fn an_unreachable_control_plane_is_a_502_in_the_protocols_shape() {
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
