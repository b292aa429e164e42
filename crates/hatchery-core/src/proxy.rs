//! HTTP over relayed connections, both ways:
//!
//! - [`forward`]: a caller's request (port preview or the API's
//!   `/ports/{port}/` route) to a server inside the guest, over a
//!   [`RelayStream`]; path-absolute redirects and cookie paths are put
//!   under the public prefix so the page keeps working there;
//! - [`exchange`]: one request on an upstream HTTP/1.1 connection, used
//!   for that and by host services (`host_services.rs`).
//!
//! Both splice the raw bytes after a protocol upgrade (WebSocket) that both
//! sides agreed to. Hop-by-hop headers are never passed through.
//!
//! [`forward`] also keeps a guest page from installing a service worker
//! through the relay ([`refuse_service_worker`], [`strip_guest_headers`]):
//! a worker registered on a relayed origin answers every later request
//! under its scope, including other sandboxes' previews (threat-model.md,
//! "Security review findings (issue 31)").

use crate::relay::RelayStream;
use crate::CoreError;
use hatchery_serve::headers::{is_upgrade, strip_hop_by_hop};
use hyper::body::{Body, Incoming};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Request, Response, StatusCode, Version};
use hyper_util::rt::TokioIo;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How a caller's request is put to the guest's server.
#[derive(Debug, Clone)]
pub struct Forward {
    /// Origin-form target for the guest: path and query, starting with `/`.
    pub path_and_query: String,
    /// Public path the guest's `/` is served under (no trailing slash).
    pub prefix: String,
    /// Drop the caller's `Authorization`: on the API route it is the
    /// daemon's key, which the guest must never see.
    pub strip_authorization: bool,
}

/// Sends `req` to the guest's server over `io` and returns its response,
/// headers adjusted for `opts.prefix`.
pub async fn forward<B>(
    io: RelayStream,
    mut req: Request<B>,
    opts: &Forward,
) -> Result<Response<Incoming>, CoreError>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    refuse_service_worker(req.headers())?;
    *req.uri_mut() = opts
        .path_and_query
        .parse()
        .map_err(|e| CoreError::Invalid(format!("request target: {e}")))?;
    let h = req.headers_mut();
    if opts.strip_authorization {
        h.remove(header::AUTHORIZATION);
    }
    // Daemons prove themselves to each other with it when one forwards a
    // preview to the owner; the owner removes it, and so does this, in
    // case any path reaches here with it still on.
    h.remove(hatchery_serve::headers::DAEMON_KEY_HEADER);
    if let Some(host) = h.get(header::HOST).cloned() {
        h.insert("x-forwarded-host", host);
    }
    h.insert("x-forwarded-proto", HeaderValue::from_static("http"));
    if let Ok(v) = HeaderValue::from_str(&opts.prefix) {
        h.insert("x-forwarded-prefix", v);
    }
    let (mut sender, conn) = http1::Builder::new()
        .handshake(TokioIo::new(io))
        .await
        .map_err(bad_gateway)?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "relayed HTTP connection ended");
        }
    });
    let mut resp = exchange(&mut sender, req).await?;
    strip_guest_headers(resp.headers_mut());
    rewrite_for_prefix(resp.headers_mut(), &opts.prefix);
    Ok(resp)
}

/// The request header a browser sends, and only sends, when it fetches a
/// service worker's script (`Service-Worker: script`, Service Workers
/// spec, "Update"). Refusing it means no page served through a relay can
/// register a worker at all, whatever scope it asks for.
const SERVICE_WORKER: &str = "service-worker";
/// Lets a worker take a scope above its script's directory; the only way
/// a script under `/preview/{token}/` could claim `/`.
const SERVICE_WORKER_ALLOWED: &str = "service-worker-allowed";

/// Refuses a browser's fetch of a service worker script (any
/// `Service-Worker` header: browsers send only `script`).
pub fn refuse_service_worker(h: &HeaderMap) -> Result<(), CoreError> {
    if h.contains_key(SERVICE_WORKER) {
        return Err(CoreError::ServiceWorkerRefused);
    }
    Ok(())
}

/// Removes what a guest server must not decide for the origin it is
/// served on: `Service-Worker-Allowed` (a worker's scope beyond its own
/// directory).
pub fn strip_guest_headers(h: &mut HeaderMap) {
    h.remove(SERVICE_WORKER_ALLOWED);
}

/// One request on `sender`. If it asks for an upgrade and the server
/// agrees (101), the two upgraded connections are spliced in the
/// background once the caller has sent the 101 on.
pub async fn exchange<B>(
    sender: &mut SendRequest<B>,
    req: Request<B>,
) -> Result<Response<Incoming>, CoreError>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    exchange_pinned(sender, req, None).await
}

/// [`exchange`], with one header set by the relay itself. It is inserted
/// after the hop-by-hop headers are stripped: a caller that names it in
/// its `Connection` header could otherwise have it removed, and whatever
/// value the caller sent for it is replaced by exactly one, the relay's.
pub async fn exchange_pinned<B>(
    sender: &mut SendRequest<B>,
    mut req: Request<B>,
    pin: Option<(&'static str, HeaderValue)>,
) -> Result<Response<Incoming>, CoreError>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let downstream = is_upgrade(req.headers()).then(|| hyper::upgrade::on(&mut req));
    let upgrade = req.headers().get(header::UPGRADE).cloned();
    let h = req.headers_mut();
    strip_hop_by_hop(h);
    if let (Some(u), true) = (upgrade, downstream.is_some()) {
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        h.insert(header::UPGRADE, u);
    }
    if let Some((name, value)) = pin {
        h.remove(name);
        h.insert(name, value);
    }
    if h.get(header::HOST).is_none() {
        // An HTTP/2 caller names the host in the URI only.
        if let Some(v) = req
            .uri()
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        {
            req.headers_mut().insert(header::HOST, v);
        }
    }
    *req.version_mut() = Version::HTTP_11;
    sender.ready().await.map_err(bad_gateway)?;
    let mut resp = sender.send_request(req).await.map_err(bad_gateway)?;
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some(down) = downstream else {
            return Err(CoreError::BadGateway(
                "101 Switching Protocols to a request that asked for no upgrade".into(),
            ));
        };
        hatchery_serve::splice::splice_upgrade(down, &mut resp);
    } else {
        strip_hop_by_hop(resp.headers_mut());
    }
    Ok(resp)
}

fn bad_gateway(e: hyper::Error) -> CoreError {
    CoreError::BadGateway(e.to_string())
}

/// A page served under `prefix` redirects and sets cookies as if it were
/// at `/`: path-absolute `Location`s and cookie `Path`s get the prefix.
fn rewrite_for_prefix(h: &mut HeaderMap, prefix: &str) {
    if let Some(loc) = h.get(header::LOCATION).and_then(|v| v.to_str().ok()) {
        if loc.starts_with('/') && !loc.starts_with("//") {
            if let Ok(v) = HeaderValue::from_str(&format!("{prefix}{loc}")) {
                h.insert(header::LOCATION, v);
            }
        }
    }
    let cookies: Vec<HeaderValue> = h
        .get_all(header::SET_COOKIE)
        .iter()
        .map(|v| match v.to_str() {
            Ok(s) => HeaderValue::from_str(&cookie_under(s, prefix)).unwrap_or_else(|_| v.clone()),
            Err(_) => v.clone(),
        })
        .collect();
    if !cookies.is_empty() {
        h.remove(header::SET_COOKIE);
        for c in cookies {
            h.append(header::SET_COOKIE, c);
        }
    }
}

fn cookie_under(cookie: &str, prefix: &str) -> String {
    cookie
        .split(';')
        .map(|part| {
            let t = part.trim_start();
            match t.get(..5) {
                Some(k) if k.eq_ignore_ascii_case("path=") && t[5..].starts_with('/') => {
                    format!(" Path={prefix}{}", &t[5..])
                }
                _ => part.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join(";")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirects_and_cookie_paths_move_under_the_prefix() {
        let mut h = HeaderMap::new();
        h.insert(header::LOCATION, "/sub/".parse().unwrap());
        h.append(header::SET_COOKIE, "a=1; Path=/; HttpOnly".parse().unwrap());
        h.append(header::SET_COOKIE, "b=2".parse().unwrap());
        rewrite_for_prefix(&mut h, "/preview/tok");
        assert_eq!(h[header::LOCATION], "/preview/tok/sub/");
        let c: Vec<_> = h.get_all(header::SET_COOKIE).iter().collect();
        assert_eq!(c[0], "a=1; Path=/preview/tok/; HttpOnly");
        assert_eq!(c[1], "b=2");
        let mut h = HeaderMap::new();
        h.insert(header::LOCATION, "//elsewhere/x".parse().unwrap());
        rewrite_for_prefix(&mut h, "/p");
        assert_eq!(h[header::LOCATION], "//elsewhere/x");
    }

    #[test]
    fn service_worker_scripts_are_refused_and_their_scope_header_dropped() {
        let mut h = HeaderMap::new();
        assert!(refuse_service_worker(&h).is_ok());
        h.insert("accept", "*/*".parse().unwrap());
        assert!(refuse_service_worker(&h).is_ok());
        for v in ["script", "Script", "anything"] {
            let mut h = HeaderMap::new();
            h.insert("Service-Worker", v.parse().unwrap());
            assert!(
                matches!(
                    refuse_service_worker(&h),
                    Err(CoreError::ServiceWorkerRefused)
                ),
                "{v}"
            );
        }
        let mut h = HeaderMap::new();
        h.insert("Service-Worker-Allowed", "/".parse().unwrap());
        h.append("service-worker-allowed", "/x/".parse().unwrap());
        h.insert(header::CONTENT_TYPE, "text/javascript".parse().unwrap());
        strip_guest_headers(&mut h);
        assert!(!h.contains_key("service-worker-allowed"));
        assert_eq!(h[header::CONTENT_TYPE], "text/javascript");
    }
}
