use crate::{ApiError, AppState};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;

/// Bearer-key check for everything but /healthz. The comparison does not
/// stop at the first differing byte, so timing does not leak the key.
pub async fn require_key(
    State(st): State<AppState>,
    req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let given = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if !hatchery_serve::headers::constant_time_eq(given.as_bytes(), st.api_key.as_bytes()) {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or wrong API key",
        ));
    }
    Ok(next.run(req).await)
}
