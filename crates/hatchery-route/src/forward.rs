//! A reverse proxy to another host's API: one HTTP/1.1 connection per
//! request, bodies streamed both ways, and a WebSocket upgrade (the pty)
//! spliced once both ends agreed to it. Hop-by-hop headers never pass.

use crate::{RouteError, FORWARDED_BY};
use axum::body::Body;
use axum::extract::Request;
use axum::http::header::{self, HeaderValue};
use axum::http::{StatusCode, Uri, Version};
use axum::response::Response;
use hatchery_serve::headers::{is_upgrade, strip_hop_by_hop};
use hyper_util::rt::TokioIo;
use std::time::Duration;

/// A host that does not accept a connection within this is unreachable.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Sends `req` to `base` (`http://host:port`) with its path and query,
/// marked as forwarded by `me`. Connection failures are
/// [`RouteError::Unreachable`]; whatever the owner answers is passed on.
pub async fn forward(
    host: &str,
    base: &str,
    me: &str,
    req: Request,
) -> Result<Response, RouteError> {
    try_forward(host, base, me, req)
        .await
        .map_err(ForwardFailure::into_error)
}

/// Why [`try_forward`] got no answer: for a caller that may retry only
/// what cannot have reached the owner (a write that must not be applied
/// twice).
#[derive(Debug)]
pub enum ForwardFailure {
    /// No byte of the request left: no connection, no handshake.
    NotSent(RouteError),
    /// The connection failed after the request was handed to it: the
    /// owner may have acted on it.
    MaybeSent(RouteError),
}

impl ForwardFailure {
    pub fn into_error(self) -> RouteError {
        match self {
            ForwardFailure::NotSent(e) | ForwardFailure::MaybeSent(e) => e,
        }
    }
}

/// [`forward`], telling a request that never left from one that may have.
pub async fn try_forward(
    host: &str,
    base: &str,
    me: &str,
    mut req: Request,
) -> Result<Response, ForwardFailure> {
    let unreachable = |cause: String| {
        ForwardFailure::NotSent(RouteError::Unreachable {
            host: host.to_string(),
            cause,
        })
    };
    let maybe_sent = |cause: String| {
        ForwardFailure::MaybeSent(RouteError::Unreachable {
            host: host.to_string(),
            cause,
        })
    };
    let authority = base
        .strip_prefix("http://")
        .ok_or_else(|| unreachable(format!("{base}: only http:// host URLs are supported")))?
        .trim_end_matches('/')
        .to_string();
    let pq = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    *req.uri_mut() = pq
        .parse::<Uri>()
        .map_err(|e| ForwardFailure::NotSent(RouteError::Body(format!("request target: {e}"))))?;
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(&authority))
        .await
        .map_err(|_| unreachable(format!("connect to {authority} timed out")))?
        .map_err(|e| unreachable(format!("connect to {authority}: {e}")))?;
    let _ = stream.set_nodelay(true);
    let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
        .handshake(TokioIo::new(stream))
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "forwarded connection ended");
        }
    });

    let downstream = is_upgrade(req.headers()).then(|| hyper::upgrade::on(&mut req));
    let upgrade = req.headers().get(header::UPGRADE).cloned();
    let h = req.headers_mut();
    strip_hop_by_hop(h);
    if let (Some(u), true) = (upgrade, downstream.is_some()) {
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        h.insert(header::UPGRADE, u);
    }
    if let Ok(v) = HeaderValue::from_str(&authority) {
        h.insert(header::HOST, v);
    }
    if let Ok(v) = HeaderValue::from_str(me) {
        h.insert(FORWARDED_BY, v);
    }
    *req.version_mut() = Version::HTTP_11;
    sender
        .ready()
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    let mut resp = sender
        .send_request(req)
        .await
        .map_err(|e| maybe_sent(e.to_string()))?;
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some(down) = downstream else {
            return Err(maybe_sent(
                "101 Switching Protocols to a request that asked for no upgrade".into(),
            ));
        };
        hatchery_serve::splice::splice_upgrade(down, &mut resp);
    } else {
        strip_hop_by_hop(resp.headers_mut());
    }
    Ok(resp.map(Body::new))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderMap;

    #[test]
    fn hop_by_hop_headers_go() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-a"),
        );
        h.insert("x-a", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("5"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key(header::AUTHORIZATION));
    }

    #[tokio::test]
    async fn a_closed_port_is_unreachable() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        drop(l);
        let req = Request::builder()
            .uri("/v1/sandboxes/x")
            .body(Body::empty())
            .unwrap();
        let e = forward("h1", &format!("http://{addr}"), "h2", req)
            .await
            .unwrap_err();
        assert!(matches!(e, RouteError::Unreachable { .. }), "{e}");
        assert_eq!(e.status(), StatusCode::SERVICE_UNAVAILABLE);
        let req = Request::builder()
            .uri("/v1/sandboxes/x")
            .body(Body::empty())
            .unwrap();
        let f = try_forward("h1", &format!("http://{addr}"), "h2", req).await;
        assert!(matches!(f, Err(ForwardFailure::NotSent(_))), "{f:?}");
    }

    /// An owner that takes the request and drops the connection without
    /// answering may have acted on it: not a failure to retry blindly.
    #[tokio::test]
    async fn a_connection_dropped_after_the_request_may_have_been_sent() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut c, _) = l.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = tokio::io::AsyncReadExt::read(&mut c, &mut buf).await;
            drop(c);
        });
        let req = Request::builder()
            .method("POST")
            .uri("/v1/sessions/ses_x/model-events")
            .body(Body::from("{}"))
            .unwrap();
        let f = try_forward("h1", &format!("http://{addr}"), "h2", req).await;
        assert!(matches!(f, Err(ForwardFailure::MaybeSent(_))), "{f:?}");
    }
}

#[cfg(test)]
mod forwarding_tests {
    use super::*;
    use axum::http::HeaderMap;
    use axum::routing::post;

    /// A real owner on loopback: the body arrives whole, the path and
    /// query are kept, the caller's key passes, and the request is marked.
    #[tokio::test]
    async fn forwards_body_path_and_headers() {
        let app = axum::Router::new().route(
            "/v1/sandboxes/{id}/exec",
            post(
                |axum::extract::Path(id): axum::extract::Path<String>,
                 uri: Uri,
                 h: HeaderMap,
                 body: Body| async move {
                    // Counted as it streams: no extractor's size limit.
                    let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
                    format!(
                        "{id} {} {} {} {}",
                        uri.query().unwrap_or(""),
                        h.get(FORWARDED_BY)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or(""),
                        h.get(header::AUTHORIZATION)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or(""),
                        body.len()
                    )
                },
            ),
        );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
        let big = vec![b'x'; 3 << 20];
        let req = Request::builder()
            .method("POST")
            .uri("http://ignored/v1/sandboxes/sb1/exec?a=1")
            .header(header::AUTHORIZATION, "Bearer k")
            .header(header::CONNECTION, "keep-alive")
            .body(Body::from(big))
            .unwrap();
        let resp = forward("h1", &format!("http://{addr}"), "h2", req)
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let b = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        assert_eq!(
            &b[..],
            format!("sb1 a=1 h2 Bearer k {}", 3 << 20).as_bytes()
        );
    }
}

/// How often a forwarded request that has no answer yet checks that its
/// host still heartbeats.
pub const WATCH_EVERY: Duration = Duration::from_secs(2);

/// [`forward`] to the owner of `what`, given up with 503 `host_lost` if
/// the owner stops heartbeating before its answer starts. A paused (or
/// hung) host still accepts connections, its kernel does that, but never
/// answers; without this the request would wait for as long as the host
/// stays paused. Once the answer's head arrived its body streams as
/// long as it runs.
pub async fn forward_watched(
    dir: &dyn crate::Directory,
    host: &str,
    base: &str,
    me: &str,
    what: &str,
    req: Request,
) -> Result<Response, RouteError> {
    let fwd = forward(host, base, me, req);
    tokio::pin!(fwd);
    loop {
        tokio::select! {
            r = &mut fwd => return r,
            _ = tokio::time::sleep(WATCH_EVERY) => {
                let lost = dir
                    .hosts()
                    .await
                    .map(|hs| hs.iter().any(|h| h.id == host && !h.alive))
                    .unwrap_or(false);
                if lost {
                    tracing::warn!(host = %host, what = %what, "host stopped heartbeating before it answered a forwarded request");
                    return Err(RouteError::HostLost {
                        host: host.to_string(),
                        what: what.to_string(),
                    });
                }
            }
        }
    }
}
