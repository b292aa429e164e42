//! The guards that keep a daemon's two listeners apart: the API's
//! (`--listen`: the API, the rounds pages, the terminal) never serves what
//! a guest server answers, and the preview listener (`--preview-listen`)
//! serves nothing else. See [`crate::origin`] for why.
//!
//! - [`api_guard`] sits in front of everything on the API listener: a
//!   request for guest content is served there only when another daemon
//!   of the deployment forwards it from its preview listener (it carries
//!   the daemon key, which no browser has); anything else is sent to the
//!   preview origin (308 for a preview URL; for a relayed E2B port, the
//!   answer the daemon injects as [`Origins::relayed_elsewhere`], so this
//!   crate needs nothing of the E2B protocol's).
//! - [`preview_only`] sits in front of everything on the preview
//!   listener: guest content only, and under a wildcard `--preview-url`
//!   only on the preview's own host name.
//!
//! Trusts the daemon key it is given and the headers' own bytes; a preview
//! token is read only to name its host (its owner verifies it).

use crate::headers::{daemon_key_ok, DAEMON_KEY_HEADER};
use crate::origin::{is_guest_content, PreviewOrigin};
use crate::preview_token::grant_unverified;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::net::SocketAddr;
use std::sync::Arc;

/// `--preview-listen`, or the API's address with the next port (the API
/// on an ephemeral port, 0, gets an ephemeral preview port too).
pub fn preview_addr(listen: SocketAddr, preview_listen: Option<SocketAddr>) -> Option<SocketAddr> {
    if let Some(a) = preview_listen {
        return Some(a);
    }
    let port = match listen.port() {
        0 => 0,
        p => p.checked_add(1)?,
    };
    Some(SocketAddr::new(listen.ip(), port))
}

/// The answer to a relayed E2B port's traffic asked of the API's origin,
/// given the preview origin's base URL (`hatchery_e2b::sandbox::relayed_elsewhere`
/// in the daemon: 421 in E2B's error shape).
pub type RelayedElsewhere = fn(base: &str) -> Response;

#[derive(Clone)]
pub struct Origins {
    pub preview: PreviewOrigin,
    /// The deployment's daemon key.
    pub daemon_key: Arc<str>,
    pub relayed_elsewhere: RelayedElsewhere,
}

/// What the API listener does with a request before routing it.
#[derive(Debug, PartialEq, Eq)]
enum ApiDecision {
    /// Not guest content: the API, pages, E2B's envd.
    Serve,
    /// Guest content forwarded by a daemon's preview listener: served,
    /// with the daemon key removed first.
    ServeForwarded,
    /// Guest content from anyone else: sent to the preview origin.
    Refuse,
}

fn api_decision(o: &Origins, req: &Request) -> ApiDecision {
    if !is_guest_content(req.uri().path(), req.headers()) {
        ApiDecision::Serve
    } else if daemon_key_ok(req.headers(), &o.daemon_key) {
        ApiDecision::ServeForwarded
    } else {
        ApiDecision::Refuse
    }
}

pub async fn api_guard(State(o): State<Arc<Origins>>, mut req: Request, next: Next) -> Response {
    match api_decision(&o, &req) {
        ApiDecision::Serve => next.run(req).await,
        ApiDecision::ServeForwarded => {
            req.headers_mut().remove(DAEMON_KEY_HEADER);
            next.run(req).await
        }
        ApiDecision::Refuse => elsewhere(&o, &req),
    }
}

/// The answer to guest content asked of the API's origin.
fn elsewhere(origins: &Origins, req: &Request) -> Response {
    let o = &origins.preview;
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok());
    let path = req.uri().path();
    if path.starts_with("/e2b/") {
        let base = o
            .base(host, "", 0)
            .unwrap_or_else(|| "the preview listener".into());
        return (origins.relayed_elsewhere)(&base);
    }
    let token = path
        .strip_prefix("/preview/")
        .map(|r| r.split('/').next().unwrap_or(""));
    let grant = token.and_then(grant_unverified);
    let (sandbox, port) = grant.clone().unwrap_or_default();
    let base = match (o.is_wildcard(), &grant) {
        // The preview host name comes from the token; none, no host.
        (true, None) => None,
        _ => o.base(host, &sandbox, port),
    };
    let Some(base) = base else {
        return error(
            StatusCode::MISDIRECTED_REQUEST,
            "preview_elsewhere",
            "previews are served on the preview origin (the daemon's --preview-listen or --preview-url), not the API's",
        );
    };
    let target = match req.uri().query() {
        Some(q) => format!("{base}{path}?{q}"),
        None => format!("{base}{path}"),
    };
    let mut r = error(
        StatusCode::PERMANENT_REDIRECT,
        "preview_elsewhere",
        &format!("previews are served on {base}, not on the API's origin"),
    );
    if let Ok(v) = HeaderValue::from_str(&target) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

fn error(status: StatusCode, code: &str, message: &str) -> Response {
    (
        status,
        axum::Json(serde_json::json!({"error": {"code": code, "message": message}})),
    )
        .into_response()
}

/// What the preview listener does with a request before routing it.
#[derive(Debug, PartialEq, Eq)]
enum PreviewDecision {
    Serve,
    /// Not guest content: the API and pages are not on this origin.
    NotHere,
    /// A preview token opened under another preview's host name.
    WrongHost,
}

fn preview_decision(o: &PreviewOrigin, req: &Request) -> PreviewDecision {
    let path = req.uri().path();
    if !is_guest_content(path, req.headers()) {
        return PreviewDecision::NotHere;
    }
    if let Some(rest) = path.strip_prefix("/preview/") {
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|v| v.to_str().ok());
        let token = rest.split('/').next().unwrap_or("");
        // An unreadable token names no host; the owner refuses it (403)
        // either way.
        if let Some((sandbox, port)) = grant_unverified(token) {
            if !o.host_matches(host, &sandbox, port) {
                return PreviewDecision::WrongHost;
            }
        }
    }
    PreviewDecision::Serve
}

pub async fn preview_only(State(o): State<Arc<Origins>>, mut req: Request, next: Next) -> Response {
    match preview_decision(&o.preview, &req) {
        PreviewDecision::Serve => {
            // A client's own value is never passed on: forwarding sets
            // the real one, a local relay needs none.
            req.headers_mut().remove(DAEMON_KEY_HEADER);
            next.run(req).await
        }
        PreviewDecision::NotHere => error(
            StatusCode::NOT_FOUND,
            "not_found",
            "this is the preview origin: it serves /preview/{token}/ and E2B's relayed ports only; the API and Hatchery's pages are on the API's listener",
        ),
        PreviewDecision::WrongHost => error(
            StatusCode::FORBIDDEN,
            "preview_denied",
            "this preview link is served on its own host name, not this one",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;

    fn req(path: &str, headers: &[(&str, &str)]) -> Request {
        let mut b = Request::builder().uri(path);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(Body::empty()).unwrap()
    }

    fn token(sandbox: &str, port: u16) -> String {
        use crate::preview_token::{body, encode, MAC_LEN};
        encode(body(port, u64::MAX, sandbox), &[1; MAC_LEN])
    }

    /// Stands in for the E2B protocol's answer: says which base it got.
    fn fake_relayed_elsewhere(base: &str) -> Response {
        (
            StatusCode::MISDIRECTED_REQUEST,
            format!("e2b: go to {base}"),
        )
            .into_response()
    }

    fn origins(public: Option<&str>) -> Origins {
        Origins {
            preview: PreviewOrigin::new(public, 7424),
            daemon_key: "hxd_secret".into(),
            relayed_elsewhere: fake_relayed_elsewhere,
        }
    }

    #[test]
    fn the_preview_port_follows_the_api_port() {
        let a: SocketAddr = "127.0.0.1:7423".parse().unwrap();
        assert_eq!(
            preview_addr(a, None),
            Some("127.0.0.1:7424".parse().unwrap())
        );
        let z: SocketAddr = "0.0.0.0:0".parse().unwrap();
        assert_eq!(preview_addr(z, None), Some(z));
        let top: SocketAddr = "127.0.0.1:65535".parse().unwrap();
        assert_eq!(preview_addr(top, None), None);
        let given: SocketAddr = "10.0.0.1:9000".parse().unwrap();
        assert_eq!(preview_addr(a, Some(given)), Some(given));
    }

    #[test]
    fn the_api_listener_serves_guest_content_only_to_a_daemon() {
        let o = origins(None);
        let t = format!("/preview/{}/index.html", token("sbx_a", 8000));
        assert_eq!(
            api_decision(&o, &req("/v1/sandboxes", &[])),
            ApiDecision::Serve
        );
        assert_eq!(
            api_decision(&o, &req("/rounds/review/", &[])),
            ApiDecision::Serve
        );
        assert_eq!(
            api_decision(&o, &req("/v1/sandboxes/sbx_a/ports/8000/", &[])),
            ApiDecision::Serve
        );
        assert_eq!(api_decision(&o, &req(&t, &[])), ApiDecision::Refuse);
        assert_eq!(
            api_decision(&o, &req(&t, &[(DAEMON_KEY_HEADER, "guess")])),
            ApiDecision::Refuse
        );
        assert_eq!(
            api_decision(&o, &req(&t, &[(DAEMON_KEY_HEADER, "hxd_secret")])),
            ApiDecision::ServeForwarded
        );
        let e2b = |p: &'static str| req("/e2b/sandbox/", &[("e2b-sandbox-port", p)]);
        assert_eq!(api_decision(&o, &e2b("49983")), ApiDecision::Serve);
        assert_eq!(api_decision(&o, &e2b("8000")), ApiDecision::Refuse);
        // No daemon key loaded matches nothing, not even an empty header.
        let none = Origins {
            daemon_key: "".into(),
            ..origins(None)
        };
        assert_eq!(
            api_decision(&none, &req(&t, &[(DAEMON_KEY_HEADER, "")])),
            ApiDecision::Refuse
        );
    }

    #[tokio::test]
    async fn a_preview_asked_of_the_api_is_sent_to_the_preview_origin() {
        let o = origins(None);
        let tok = token("sbx_a", 8000);
        let r = elsewhere(
            &o,
            &req(&format!("/preview/{tok}/x?y=1"), &[("host", "box:7423")]),
        );
        assert_eq!(r.status(), StatusCode::PERMANENT_REDIRECT);
        assert_eq!(
            r.headers()[header::LOCATION],
            format!("http://box:7424/preview/{tok}/x?y=1").as_str()
        );
        let r = elsewhere(&o, &req(&format!("/preview/{tok}/"), &[]));
        assert_eq!(r.status(), StatusCode::MISDIRECTED_REQUEST);
        let w = origins(Some("https://*.p.example"));
        let r = elsewhere(&w, &req(&format!("/preview/{tok}/"), &[]));
        assert_eq!(
            r.headers()[header::LOCATION],
            format!("https://8000-a.p.example/preview/{tok}/").as_str()
        );
        let r = elsewhere(&w, &req("/preview/garbage/", &[]));
        assert_eq!(r.status(), StatusCode::MISDIRECTED_REQUEST);
        // A relayed E2B port gets the injected answer, given the
        // preview origin's base for the host the client reached.
        let r = elsewhere(
            &o,
            &req(
                "/e2b/sandbox/",
                &[("e2b-sandbox-port", "8000"), ("host", "h:1")],
            ),
        );
        assert_eq!(r.status(), StatusCode::MISDIRECTED_REQUEST);
        let body = axum::body::to_bytes(r.into_body(), 4096).await.unwrap();
        assert_eq!(&body[..], b"e2b: go to http://h:7424");
        let r = elsewhere(&o, &req("/e2b/sandbox/", &[("e2b-sandbox-port", "8000")]));
        let body = axum::body::to_bytes(r.into_body(), 4096).await.unwrap();
        assert_eq!(&body[..], b"e2b: go to the preview listener");
    }

    #[test]
    fn the_preview_listener_serves_guest_content_only() {
        let o = PreviewOrigin::new(None, 7424);
        let t = format!("/preview/{}/", token("sbx_a", 8000));
        assert_eq!(preview_decision(&o, &req(&t, &[])), PreviewDecision::Serve);
        for p in [
            "/v1/sandboxes",
            "/rounds/review/",
            "/terminal/",
            "/healthz",
            "/e2b/sandboxes",
        ] {
            assert_eq!(
                preview_decision(&o, &req(p, &[])),
                PreviewDecision::NotHere,
                "{p}"
            );
        }
        let envd = req("/e2b/sandbox/files", &[("e2b-sandbox-port", "49983")]);
        assert_eq!(preview_decision(&o, &envd), PreviewDecision::NotHere);
        let relayed = req("/e2b/sandbox/", &[("e2b-sandbox-port", "3000")]);
        assert_eq!(preview_decision(&o, &relayed), PreviewDecision::Serve);

        let w = PreviewOrigin::new(Some("http://*.preview.test:7424"), 7424);
        let own = [("host", "8000-a.preview.test:7424")];
        assert_eq!(preview_decision(&w, &req(&t, &own)), PreviewDecision::Serve);
        let other = [("host", "8000-b.preview.test:7424")];
        assert_eq!(
            preview_decision(&w, &req(&t, &other)),
            PreviewDecision::WrongHost
        );
        assert_eq!(
            preview_decision(&w, &req(&t, &[])),
            PreviewDecision::WrongHost
        );
    }
}
