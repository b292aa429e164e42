//! A JSON extractor whose rejections speak the API's error format.

use crate::RoundsError;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

pub struct Json<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Json<T> {
    type Rejection = RoundsError;
    async fn from_request(req: Request, state: &S) -> Result<Self, RoundsError> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(Json(v)),
            Err(JsonRejection::BytesRejection(b))
                if b.status() == StatusCode::PAYLOAD_TOO_LARGE =>
            {
                Err(RoundsError::TooLarge(format!(
                    "request body over {} bytes",
                    crate::limits::MAX_BODY
                )))
            }
            Err(JsonRejection::MissingJsonContentType(_)) => Err(RoundsError::Invalid(
                "expected Content-Type: application/json".into(),
            )),
            Err(e) => Err(RoundsError::Invalid(e.body_text())),
        }
    }
}

/// An optional JSON body: empty means the default.
pub struct OptJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Default> FromRequest<S> for OptJson<T> {
    type Rejection = RoundsError;
    async fn from_request(req: Request, state: &S) -> Result<Self, RoundsError> {
        let body = bytes::Bytes::from_request(req, state).await.map_err(|b| {
            if b.status() == StatusCode::PAYLOAD_TOO_LARGE {
                RoundsError::TooLarge("request body too large".into())
            } else {
                RoundsError::Invalid(b.body_text())
            }
        })?;
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptJson(T::default()));
        }
        serde_json::from_slice(&body)
            .map(OptJson)
            .map_err(|e| RoundsError::Invalid(format!("invalid JSON body: {e}")))
    }
}
