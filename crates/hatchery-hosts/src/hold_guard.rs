//! A host's own refusal of new work while the operator holds it
//! (cordoned, draining): the control plane places nothing there, and this
//! answers the creates that reach the host directly (a single-host `all`
//! role, a client talking to a host) with 503 `host_cordoned` or
//! `host_draining`. Everything else (its existing sandboxes) is served,
//! and so is a new sandbox for a session this host already runs (its
//! runner creates or forks one, through this API, when the session starts
//! or resumes): that is existing work, not new placement.

use async_trait::async_trait;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hatchery_store::{HostHold, Store};
use std::sync::Arc;

/// Largest create body read to find its session (the API's own JSON
/// limit); a larger one is refused as held.
const MAX_BODY: usize = 2 << 20;
/// The metadata key a session's runner puts on its sandboxes
/// (hatchery-sessions runner.rs).
pub const SESSION_KEY: &str = "hatchery_session";

/// Contract: whether `session` is an unfinished session this host runs.
#[async_trait]
pub trait RunsSession: Send + Sync {
    async fn runs_session(&self, session: &str) -> bool;
}

#[async_trait]
impl RunsSession for Arc<dyn hatchery_sessions::store::SessionStore> {
    async fn runs_session(&self, session: &str) -> bool {
        // `unfinished` is this host's own (the store was opened for it).
        match self.unfinished().await {
            Ok(v) => v.iter().any(|s| s.id == session),
            Err(e) => {
                tracing::warn!(error = %e, "hold guard: sessions not read");
                false
            }
        }
    }
}

#[derive(Clone)]
pub struct HoldGuard {
    pub store: Arc<dyn Store>,
    /// This host's id.
    pub me: String,
    /// This host's sessions; `None`: no create is let through.
    pub sessions: Option<Arc<dyn RunsSession>>,
}

/// The session a create's body names in its metadata, if any.
fn session_of(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    v["metadata"][SESSION_KEY].as_str().map(str::to_string)
}

/// A request that creates a sandbox or a session here.
pub fn is_create(method: &Method, path: &str) -> bool {
    if method != Method::POST {
        return false;
    }
    matches!(path, "/v1/sandboxes" | "/e2b/sandboxes" | "/v1/sessions")
        || path
            .strip_prefix("/v1/snapshots/")
            .and_then(|r| r.strip_suffix("/fork"))
            .is_some_and(|id| !id.is_empty() && !id.contains('/'))
}

pub async fn refuse_when_held(State(g): State<HoldGuard>, req: Request, next: Next) -> Response {
    if !is_create(req.method(), req.uri().path()) {
        return next.run(req).await;
    }
    // A store that does not answer refuses nothing here: the create
    // itself then fails on it with its own error.
    let hold = match g.store.list_hosts().await {
        Ok(hosts) => hosts
            .into_iter()
            .find(|h| h.id == g.me)
            // Told to stop: refused as a drained host is.
            .map(|h| {
                if h.stopping {
                    HostHold::Draining
                } else {
                    h.hold
                }
            })
            .unwrap_or(HostHold::None),
        Err(_) => HostHold::None,
    };
    if hold == HostHold::None {
        return next.run(req).await;
    }
    let req = match (&g.sessions, req.uri().path()) {
        // A session's own sandbox: only sandbox creates and forks carry one.
        (Some(sessions), path) if path != "/v1/sessions" => {
            let (parts, body) = req.into_parts();
            let Ok(bytes) = axum::body::to_bytes(body, MAX_BODY).await else {
                return refused(&g.me, hold);
            };
            if let Some(s) = session_of(&bytes) {
                if sessions.runs_session(&s).await {
                    tracing::info!(host = %g.me, hold = %hold, session = %s, "held host: a sandbox for a session it runs");
                    return next
                        .run(Request::from_parts(parts, Body::from(bytes)))
                        .await;
                }
            }
            Request::from_parts(parts, Body::from(bytes))
        }
        _ => req,
    };
    tracing::info!(host = %g.me, hold = %hold, path = req.uri().path(), "create refused: host held");
    refused(&g.me, hold)
}

fn refused(me: &str, hold: HostHold) -> Response {
    let code = format!("host_{}", hold.as_str());
    let message = format!(
        "host {me} is {}: it takes no new sandboxes or sessions (POST /v1/hosts/{me}:uncordon ends it)",
        hold.as_str(),
    );
    let body = serde_json::json!({"error": {"code": code, "message": message}});
    let mut resp = (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
    resp.headers_mut()
        .insert("retry-after", HeaderValue::from_static("30"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Method;

    #[test]
    fn creates_are_the_posts_that_start_something() {
        for p in [
            "/v1/sandboxes",
            "/e2b/sandboxes",
            "/v1/sessions",
            "/v1/snapshots/snap_1/fork",
        ] {
            assert!(is_create(&Method::POST, p), "{p}");
        }
        for p in [
            "/v1/sandboxes/sbx_1/exec",
            "/v1/snapshots//fork",
            "/v1/snapshots/a/b/fork",
            "/v1/hosts",
        ] {
            assert!(!is_create(&Method::POST, p), "{p}");
        }
        assert!(!is_create(&Method::GET, "/v1/sandboxes"));
    }
}

#[cfg(test)]
mod guard_tests {
    use super::*;
    use hatchery_store::{host_resource, Fence};
    use tower::ServiceExt;

    /// Runs `ses_mine` only.
    struct Mine;
    #[async_trait]
    impl RunsSession for Mine {
        async fn runs_session(&self, session: &str) -> bool {
            session == "ses_mine"
        }
    }

    async fn status(app: &axum::Router, path: &str, body: &str) -> (u16, String) {
        let req = Request::builder()
            .method("POST")
            .uri(path)
            .body(Body::from(body.to_string()))
            .unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        let st = resp.status().as_u16();
        let b = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        (st, String::from_utf8_lossy(&b).into())
    }

    #[tokio::test]
    async fn a_held_host_refuses_new_work_but_not_its_sessions_sandboxes() {
        let dir = tempfile::tempdir().unwrap();
        let db = hatchery_db::Db::sqlite(&dir.path().join("h.db"))
            .await
            .unwrap();
        let store: Arc<dyn Store> = Arc::new(hatchery_store::DbStore::open(db).await.unwrap());
        let f = Fence::of(
            &store
                .take_lease(&host_resource("me"), "me", 60_000)
                .await
                .unwrap(),
        );
        store
            .register_host(&f, "127.0.0.1:1", 4, "t")
            .await
            .unwrap();
        // The handler echoes the body it got, so a re-built body is checked.
        let app = axum::Router::new()
            .route(
                "/v1/sandboxes",
                axum::routing::post(|b: String| async move { b }),
            )
            .route("/v1/sessions", axum::routing::post(|| async { "created" }))
            .layer(axum::middleware::from_fn_with_state(
                HoldGuard {
                    store: store.clone(),
                    me: "me".into(),
                    sessions: Some(Arc::new(Mine)),
                },
                refuse_when_held,
            ));
        let mine = r#"{"metadata":{"hatchery_session":"ses_mine"}}"#;
        let other = r#"{"metadata":{"hatchery_session":"ses_other"}}"#;
        assert_eq!(status(&app, "/v1/sandboxes", "{}").await.0, 200);
        store
            .hold_host("me", &[HostHold::None], HostHold::Cordoned)
            .await
            .unwrap();
        let (st, body) = status(&app, "/v1/sandboxes", "{}").await;
        assert_eq!(st, 503);
        assert!(body.contains("host_cordoned"), "{body}");
        assert_eq!(
            status(&app, "/v1/sandboxes", mine).await,
            (200, mine.to_string())
        );
        assert_eq!(status(&app, "/v1/sandboxes", other).await.0, 503);
        assert_eq!(status(&app, "/v1/sessions", mine).await.0, 503);
        store
            .hold_host("me", &[HostHold::Cordoned], HostHold::Draining)
            .await
            .unwrap();
        let (st, body) = status(&app, "/v1/sandboxes", "not json").await;
        assert_eq!(st, 503);
        assert!(body.contains("host_draining"), "{body}");
        store
            .hold_host("me", &HostHold::sources(HostHold::None), HostHold::None)
            .await
            .unwrap();
        assert_eq!(
            status(&app, "/v1/sessions", "{}").await,
            (200, "created".to_string())
        );
    }
}
