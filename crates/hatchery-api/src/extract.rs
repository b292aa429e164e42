//! Extractors whose rejections speak the API's JSON error format.

use crate::ApiError;
use axum::extract::rejection::{BytesRejection, JsonRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

pub struct Json<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Json<T> {
    type Rejection = ApiError;
    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(Json(v)),
            Err(JsonRejection::BytesRejection(b)) => Err(bytes_rejection(b)),
            Err(JsonRejection::MissingJsonContentType(_)) => Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "expected Content-Type: application/json",
            )),
            Err(e) => Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_json",
                e.body_text(),
            )),
        }
    }
}

pub struct Body(pub bytes::Bytes);

impl<S: Send + Sync> FromRequest<S> for Body {
    type Rejection = ApiError;
    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        bytes::Bytes::from_request(req, state)
            .await
            .map(Body)
            .map_err(bytes_rejection)
    }
}

fn bytes_rejection(b: BytesRejection) -> ApiError {
    if b.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            "request body over the size limit",
        )
    } else {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_body", b.body_text())
    }
}

pub struct Query<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        // axum (serde_urlencoded) decodes percent escapes lossily: `%ff`
        // would become U+FFFD and a file would be made under a name nobody
        // asked for. Refuse instead.
        if let Some(q) = parts.uri.query() {
            if let Some(key) = non_utf8_field(q) {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_query",
                    format!("query parameter {key:?} is not valid UTF-8 once percent-decoded"),
                ));
            }
        }
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| Query(q.0))
            .map_err(|e: QueryRejection| {
                ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", e.body_text())
            })
    }
}

/// Percent-decodes one `application/x-www-form-urlencoded` component
/// (`+` is a space) into raw bytes.
fn form_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    out
}

/// The first query field (name, lossily shown) whose name or value is not
/// UTF-8 after percent-decoding.
fn non_utf8_field(query: &str) -> Option<String> {
    for pair in query.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let (kb, vb) = (form_decode(k), form_decode(v));
        if std::str::from_utf8(&kb).is_err() || std::str::from_utf8(&vb).is_err() {
            return Some(String::from_utf8_lossy(&kb).into_owned());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::{form_decode, non_utf8_field};

    #[test]
    fn query_utf8() {
        assert_eq!(form_decode("a%20b+c%2"), b"a b c%2");
        assert_eq!(form_decode("%e2%82%ac"), "\u{20ac}".as_bytes());
        assert_eq!(non_utf8_field("path=/work/%e2%82%ac&x=1"), None);
        assert_eq!(non_utf8_field("path=/work/a%zz"), None);
        assert_eq!(non_utf8_field("path=/work/%ff%fe").as_deref(), Some("path"));
        assert_eq!(non_utf8_field("x=1&path=%C3").as_deref(), Some("path"));
    }
}
