//! The tool broker split across roles (docs/sessions.md, "The broker on
//! many hosts"). On a host started with `--broker-control-url`, the
//! `broker` host service sandboxes reach relays every request to the
//! control role's broker under [`PREFIX`] (the generic relay, its keys and
//! the control side's check are `hatchery_route::relay`): the host holds no
//! git credential or forge token and runs no broker. What is the broker's
//! own: its error shape, and that a relay failure tells the agent to ask
//! again with the same seq.

use crate::error::BrokerError;
use crate::Broker;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use hatchery_route::relay::{self, HostKeys, Relay, RelayError};
use std::sync::Arc;
use std::time::Duration;

/// Where the control role serves the broker's guest routes to hosts.
pub const PREFIX: &str = "/v1/broker-relay";
/// How long a host waits for the control role's answer: a call may push
/// a work tree (bounded by the broker's own git timeouts) after waiting up
/// to a minute for the session's owner. Past it the agent asks again with
/// the same seq and is answered from the call's record.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(300);

fn refusal(e: RelayError) -> Response {
    match e {
        RelayError::NoSandbox => BrokerError::UnknownSandbox(e.to_string()).into_response(),
        RelayError::Path(e) => BrokerError::BadRequest(e.to_string()).into_response(),
        RelayError::Keys(_) | RelayError::TimedOut(_) | RelayError::Unreachable(_) => {
            tracing::warn!(error = %e, "broker call not relayed to the control role");
            BrokerError::Unavailable(format!("{e}; ask again with the same seq")).into_response()
        }
    }
}

async fn relay_call(State(r): State<Arc<Relay>>, req: Request) -> Response {
    let req = match relay::rewrite(&r, PREFIX, req) {
        Ok(req) => req,
        Err(e) => return refusal(e),
    };
    relay::send(&r, req).await.unwrap_or_else(refusal)
}

/// The host's broker socket: every request relayed to `control`.
pub fn router(r: Relay) -> axum::Router {
    axum::Router::new()
        .fallback(relay_call)
        .with_state(Arc::new(r))
}

/// The control role's broker routes: the guest routes for hosts' relays,
/// under [`PREFIX`], and the operator's routes, which want the API key.
pub fn control_routes(b: Arc<Broker>, keys: HostKeys) -> axum::Router {
    let operator = crate::routes::operator_router(b.clone()).layer(
        axum::middleware::from_fn_with_state(keys.api_key.clone(), require_api_key),
    );
    relay::for_hosts(PREFIX, crate::routes::guest_router(b), keys).merge(operator)
}

async fn require_api_key(
    State(key): State<Arc<str>>,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    if !hatchery_serve::headers::api_key_ok(req.headers(), &key) {
        return BrokerError::Unauthorized.into_response();
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routes::IDENTITY_HEADER;
    use axum::body::Body;
    use axum::routing::any;
    use tower::ServiceExt;

    async fn json_of(resp: Response) -> serde_json::Value {
        let b = axum::body::to_bytes(resp.into_body(), 1 << 16)
            .await
            .unwrap();
        serde_json::from_slice(&b).unwrap()
    }

    /// A control plane that echoes what reached it.
    async fn echo_control() -> String {
        let app = axum::Router::new().route(
            "/{*path}",
            any(|req: Request| async move {
                let h = req.headers();
                let get = |k: &str| {
                    h.get(k)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_string()
                };
                axum::Json(serde_json::json!({
                    "path": req.uri().to_string(),
                    "auth": get("authorization"),
                    "daemon": get("x-hatchery-daemon-key"),
                    "sandbox": get(IDENTITY_HEADER),
                    "api_key": get("x-api-key"),
                }))
            }),
        );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(l, app).await });
        format!("http://{addr}")
    }

    fn relay_to(control: String, within: Duration) -> axum::Router {
        router(Relay {
            control,
            api_key: "hx_k".into(),
            daemon_key: "hxd_d".into(),
            me: "h1".into(),
            answer_within: within,
        })
    }

    #[tokio::test]
    async fn a_call_goes_to_the_control_role_with_the_hosts_keys() {
        let r = relay_to(echo_control().await, Duration::from_secs(5));
        let req = Request::builder()
            .method("POST")
            .uri("/v1/invoke?x=1")
            .header(IDENTITY_HEADER, "sbx_1")
            .header("authorization", "Bearer guest")
            .header("x-api-key", "guest")
            .header("x-hatchery-daemon-key", "guessed")
            .body(Body::from("{}"))
            .unwrap();
        let v = json_of(r.oneshot(req).await.unwrap()).await;
        assert_eq!(v["path"], "/v1/broker-relay/v1/invoke?x=1");
        assert_eq!(v["auth"], "Bearer hx_k");
        assert_eq!(v["daemon"], "hxd_d");
        assert_eq!(v["sandbox"], "sbx_1");
        assert_eq!(v["api_key"], "");
    }

    #[tokio::test]
    async fn without_a_sandbox_or_a_control_plane_nothing_is_relayed() {
        let r = relay_to(echo_control().await, Duration::from_secs(5));
        let req = Request::builder()
            .uri("/v1/tools")
            .body(Body::empty())
            .unwrap();
        let resp = r.oneshot(req).await.unwrap();
        assert_eq!(resp.status(), 403);
        // A control plane that accepts and never answers: 503, in time.
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let silent = format!("http://{}", l.local_addr().unwrap());
        let r = relay_to(silent, Duration::from_millis(300));
        let req = Request::builder()
            .uri("/v1/tools")
            .header(IDENTITY_HEADER, "sbx_1")
            .body(Body::empty())
            .unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(10), r.oneshot(req))
            .await
            .expect("the relay is bounded")
            .unwrap();
        assert_eq!(resp.status(), 503);
        assert_eq!(json_of(resp).await["error"]["code"], "unavailable");
        drop(l);
    }
}
