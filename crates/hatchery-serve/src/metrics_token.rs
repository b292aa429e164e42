//! A scraper's own secret for `GET /metrics` (`--metrics-token-file`): a
//! Prometheus job holds it instead of the API key, which would give it
//! every sandbox. The token opens `/metrics` and nothing else (any other
//! request carrying it is judged as it would be without it: the API key
//! is still wanted); the API key keeps opening `/metrics` too.

use crate::headers::constant_time_eq;
use axum::extract::{Request, State};
use axum::http::{header, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Shortest token accepted: a guessable one would open the metrics.
pub const MIN_TOKEN_BYTES: usize = 16;
/// Longest token file read.
pub const MAX_TOKEN_BYTES: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum MetricsTokenError {
    #[error("metrics token file {0}: cannot be read")]
    Read(PathBuf, #[source] std::io::Error),
    #[error("metrics token file {path}: {bytes} bytes after trimming; it must hold {MIN_TOKEN_BYTES}..={MAX_TOKEN_BYTES} visible ASCII characters without spaces")]
    Bad { path: PathBuf, bytes: usize },
}

/// The token in `path`: its contents, surrounding whitespace trimmed.
pub fn load(path: &Path) -> Result<String, MetricsTokenError> {
    let raw = std::fs::read(path).map_err(|e| MetricsTokenError::Read(path.into(), e))?;
    let text = String::from_utf8_lossy(&raw);
    let t = text.trim();
    let ok = (MIN_TOKEN_BYTES..=MAX_TOKEN_BYTES).contains(&t.len())
        && t.bytes().all(|b| b.is_ascii_graphic());
    if !ok {
        return Err(MetricsTokenError::Bad {
            path: path.into(),
            bytes: t.len(),
        });
    }
    Ok(t.to_string())
}

/// What the layer needs: the token and how this daemon renders its
/// metrics.
#[derive(Clone)]
pub struct MetricsToken {
    pub token: Arc<str>,
    pub render: Arc<dyn Fn() -> String + Send + Sync>,
}

/// `GET /metrics` with `Authorization: Bearer <metrics token>` is answered
/// here; every other request goes on unchanged.
pub async fn answer(State(m): State<MetricsToken>, req: Request, next: Next) -> Response {
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let is_scrape = req.method() == Method::GET && req.uri().path() == "/metrics";
    match bearer {
        Some(b) if is_scrape && constant_time_eq(b.as_bytes(), m.token.as_bytes()) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            (m.render)(),
        )
            .into_response(),
        _ => next.run(req).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::StatusCode;
    use axum::routing::get;
    use tower_service::Service;

    async fn call(
        app: &mut axum::Router,
        method: Method,
        path: &str,
        auth: Option<&str>,
    ) -> (StatusCode, String) {
        let mut b = axum::http::Request::builder().method(method).uri(path);
        if let Some(a) = auth {
            b = b.header(header::AUTHORIZATION, format!("Bearer {a}"));
        }
        let resp = app.call(b.body(Body::empty()).unwrap()).await.unwrap();
        let status = resp.status();
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn the_token_opens_metrics_and_nothing_else() {
        let token = "m".repeat(MIN_TOKEN_BYTES);
        let m = MetricsToken {
            token: token.clone().into(),
            render: Arc::new(|| "up 1\n".to_string()),
        };
        // Behind it, every route wants the API key.
        let mut app = axum::Router::new()
            .route(
                "/metrics",
                get(|| async { (StatusCode::UNAUTHORIZED, "key wanted") })
                    .post(|| async { (StatusCode::UNAUTHORIZED, "key wanted") }),
            )
            .route(
                "/v1/sandboxes",
                get(|| async { (StatusCode::UNAUTHORIZED, "key wanted") }),
            )
            .layer(axum::middleware::from_fn_with_state(m, answer));
        assert_eq!(
            call(&mut app, Method::GET, "/metrics", Some(&token)).await,
            (StatusCode::OK, "up 1\n".into())
        );
        for (method, path, auth) in [
            (Method::GET, "/metrics", Some("wrong-token-wrong-token")),
            (Method::GET, "/metrics", None),
            (Method::POST, "/metrics", Some(token.as_str())),
            (Method::GET, "/v1/sandboxes", Some(token.as_str())),
        ] {
            let (s, _) = call(&mut app, method.clone(), path, auth).await;
            assert_eq!(s, StatusCode::UNAUTHORIZED, "{method} {path} {auth:?}");
        }
    }

    #[test]
    fn a_short_or_spaced_token_is_refused_at_load() {
        let d = std::env::temp_dir().join(format!("hx-mt-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let f = d.join("t");
        std::fs::write(&f, "short\n").unwrap();
        assert!(matches!(
            load(&f),
            Err(MetricsTokenError::Bad { bytes: 5, .. })
        ));
        std::fs::write(&f, "has a space in the middle of it").unwrap();
        assert!(load(&f).is_err());
        std::fs::write(&f, format!("  {}\n", "k".repeat(MIN_TOKEN_BYTES))).unwrap();
        assert_eq!(load(&f).unwrap(), "k".repeat(MIN_TOKEN_BYTES));
        assert!(matches!(
            load(&d.join("none")),
            Err(MetricsTokenError::Read(..))
        ));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
