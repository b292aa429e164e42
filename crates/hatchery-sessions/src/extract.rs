//! Extractors whose rejections are the API's JSON errors.

use crate::error::SessionError;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

pub struct Json<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Json<T> {
    type Rejection = SessionError;
    async fn from_request(req: Request, state: &S) -> Result<Self, SessionError> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(Json(v)),
            Err(JsonRejection::MissingJsonContentType(_)) => Err(SessionError::bad(
                "unsupported_media_type",
                "expected Content-Type: application/json",
            )),
            Err(JsonRejection::BytesRejection(b))
                if b.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE =>
            {
                Err(SessionError::bad(
                    "too_large",
                    "request body over the size limit",
                ))
            }
            Err(e) => Err(SessionError::bad("invalid_json", e.body_text())),
        }
    }
}

pub struct Query<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Query<T> {
    type Rejection = SessionError;
    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, SessionError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| Query(q.0))
            .map_err(|e: QueryRejection| SessionError::bad("invalid_query", e.body_text()))
    }
}
