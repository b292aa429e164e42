//! Errors of the environments: what the API answers, and why a build
//! failed.

use crate::repo::RepoError;
use crate::sandbox::SandboxError;
use crate::validate::ValidationError;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    #[error(transparent)]
    Validation(#[from] ValidationError),
    #[error("{0}")]
    Invalid(String),
    #[error("environment {0} not found")]
    NotFound(String),
    #[error("template {0:?} not found")]
    UnknownTemplate(String),
    /// A build of it is running, or sessions use it.
    #[error("{0}")]
    Conflict(String),
    #[error("{0} environments exist; the cap is reached")]
    TooMany(u64),
    /// The environment has no built version yet (a session asked for it).
    #[error("environment {0} has no built version; build it first")]
    NotBuilt(String),
    #[error("sandboxes")]
    Sandbox(#[source] SandboxError),
    #[error("repository fetch")]
    Fetch(#[source] RepoError),
    /// The set-up script failed: the build made no version.
    #[error("set-up exited with {exit_code}: {output}")]
    SetupFailed { exit_code: i32, output: String },
    /// The database cannot be reached (a `DbError` or a `MigrateError`).
    #[error("the store is unavailable")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("environment store")]
    Db(#[source] hatchery_db::DbError),
    #[error("environment store schema")]
    Schema(#[source] hatchery_db::MigrateError),
    #[error("stored environment data")]
    Data(#[source] serde_json::Error),
}

impl From<hatchery_db::DbError> for EnvError {
    fn from(e: hatchery_db::DbError) -> Self {
        if e.unavailable() {
            EnvError::Unavailable(Box::new(e))
        } else {
            EnvError::Db(e)
        }
    }
}

impl From<hatchery_db::MigrateError> for EnvError {
    fn from(e: hatchery_db::MigrateError) -> Self {
        if e.unavailable() {
            EnvError::Unavailable(Box::new(e))
        } else {
            EnvError::Schema(e)
        }
    }
}

impl From<SandboxError> for EnvError {
    fn from(e: SandboxError) -> Self {
        match e {
            SandboxError::InvalidNetwork(m) => EnvError::Invalid(format!("setup_allow: {m}")),
            SandboxError::TemplateNotFound(t) => EnvError::UnknownTemplate(t),
            e => EnvError::Sandbox(e),
        }
    }
}

impl EnvError {
    /// The code of a failed build, for its `error` event and `last_error`.
    pub fn build_code(&self) -> &'static str {
        match self {
            EnvError::SetupFailed { .. } => "setup_failed",
            EnvError::Fetch(_) => "repo_fetch_failed",
            EnvError::Invalid(_) => "invalid_request",
            EnvError::UnknownTemplate(_) => "template_not_found",
            EnvError::Sandbox(SandboxError::StoreFull(_)) => "snapshot_store_full",
            _ => "build_failed",
        }
    }

    fn status_code(&self) -> (StatusCode, &'static str) {
        use StatusCode as S;
        match self {
            EnvError::Validation(ValidationError::Repo(_)) => (S::BAD_REQUEST, "invalid_repo"),
            EnvError::Validation(_) | EnvError::Invalid(_) => (S::BAD_REQUEST, "invalid_request"),
            EnvError::NotFound(_) => (S::NOT_FOUND, "environment_not_found"),
            EnvError::UnknownTemplate(_) => (S::NOT_FOUND, "template_not_found"),
            EnvError::Conflict(_) => (S::CONFLICT, "environment_conflict"),
            EnvError::TooMany(_) => (S::CONFLICT, "too_many_environments"),
            EnvError::NotBuilt(_) => (S::CONFLICT, "environment_not_built"),
            EnvError::Sandbox(SandboxError::Capacity(_)) => (S::SERVICE_UNAVAILABLE, "capacity"),
            EnvError::Sandbox(SandboxError::StoreFull(_)) => {
                (S::INSUFFICIENT_STORAGE, "snapshot_store_full")
            }
            EnvError::Sandbox(_) => (S::BAD_GATEWAY, "sandbox_error"),
            EnvError::Fetch(_) => (S::BAD_GATEWAY, "repo_fetch_failed"),
            EnvError::SetupFailed { .. } => (S::UNPROCESSABLE_ENTITY, "setup_failed"),
            EnvError::Unavailable(_) => (S::SERVICE_UNAVAILABLE, "store_unavailable"),
            EnvError::Db(_) | EnvError::Schema(_) | EnvError::Data(_) => {
                (S::INTERNAL_SERVER_ERROR, "internal")
            }
        }
    }

    /// The message with its causes (a fetch's git error, a sandbox's).
    pub fn full_message(&self) -> String {
        hatchery_serve::error_text::with_causes(self)
    }
}

impl IntoResponse for EnvError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_code();
        let message = if status == StatusCode::INTERNAL_SERVER_ERROR {
            let rid = crate::ids::new_id("req");
            tracing::error!(request_id = %rid, error = %self.full_message(), "environments request failed");
            format!("internal error (request id {rid})")
        } else {
            self.full_message()
        };
        let retry = status == StatusCode::SERVICE_UNAVAILABLE;
        hatchery_serve::json_error::respond(status, code, message, retry)
    }
}
