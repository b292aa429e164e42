//! The hosts API's errors, in the API's JSON error shape.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

#[derive(Debug, thiserror::Error)]
pub enum HostsApiError {
    #[error("missing or wrong API key")]
    Unauthorized,
    #[error("host id {0:?}: use 1 to 64 of a-z, 0-9 and '-', not starting with '-'")]
    BadId(String),
    #[error("POST /v1/hosts/{{id}} takes an action: {{id}}:cordon, {{id}}:uncordon or {{id}}:drain (got {0:?})")]
    BadAction(String),
    #[error("host {0} not found")]
    NotFound(String),
    #[error("the state store: {0}")]
    Store(#[source] hatchery_store::StoreError),
    #[error("the session store: {0}")]
    Sessions(#[source] hatchery_sessions::store::StoreError),
}

pub use hatchery_serve::json_error::{ErrorBody, ErrorDetail};

impl HostsApiError {
    pub fn code(&self) -> &'static str {
        match self {
            HostsApiError::Unauthorized => "unauthorized",
            HostsApiError::BadId(_) | HostsApiError::BadAction(_) => "invalid_request",
            HostsApiError::NotFound(_) => "host_not_found",
            HostsApiError::Store(_) | HostsApiError::Sessions(_) => "store_unavailable",
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            HostsApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            HostsApiError::BadId(_) | HostsApiError::BadAction(_) => StatusCode::BAD_REQUEST,
            HostsApiError::NotFound(_) => StatusCode::NOT_FOUND,
            HostsApiError::Store(_) | HostsApiError::Sessions(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

impl IntoResponse for HostsApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let message = match &self {
            // The store's own words stay in the log.
            HostsApiError::Store(_) | HostsApiError::Sessions(_) => {
                tracing::warn!(error = %self, "hosts API: store error");
                "the state store is unavailable; retry shortly".to_string()
            }
            e => e.to_string(),
        };
        hatchery_serve::json_error::respond(
            status,
            self.code(),
            message,
            status == StatusCode::SERVICE_UNAVAILABLE,
        )
    }
}
