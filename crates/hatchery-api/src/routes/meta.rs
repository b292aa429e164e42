use crate::{ApiError, AppState};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;

#[utoipa::path(get, path = "/healthz", tag = "meta", security(()), responses((status = 200, description = "ok")))]
pub async fn healthz(State(st): State<AppState>) -> impl IntoResponse {
    axum::Json(
        serde_json::json!({"status": "ok", "runtime": st.manager.runtime().name(), "live": st.manager.live_count()}),
    )
}

#[utoipa::path(get, path = "/metrics", tag = "meta",
    responses((status = 200, content_type = "text/plain", description = "Prometheus text format")))]
pub async fn metrics(State(st): State<AppState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        st.manager.metrics.render(),
    )
}

pub async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route")
}

pub async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "method not allowed on this route",
    )
}
