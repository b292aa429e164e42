//! The Connect protocol (connectrpc.com/docs/protocol) with the JSON codec,
//! over HTTP/1.1: what the E2B SDKs speak to envd.
//!
//! - Unary: `POST /pkg.Service/Method`, `Content-Type: application/json`,
//!   the message as the body; errors are a non-200 status with
//!   `{"code": "...", "message": "..."}`.
//! - Streams: `Content-Type: application/connect+json`; every message is an
//!   envelope (1 flag byte, a 4-byte big-endian length, the JSON). The
//!   server ends with an end-of-stream envelope (flag `0x02`) holding `{}`
//!   or `{"error": {...}}`, always under HTTP 200.

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::{BufMut, Bytes, BytesMut};
use futures::Stream;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::time::Duration;

/// Largest request message accepted (a 1 MiB stdin write is about 1.4 MB
/// as base64 JSON); a bigger envelope or body is `resource_exhausted`.
pub const MAX_MESSAGE_BYTES: usize = 2 << 20;

const FLAG_COMPRESSED: u8 = 0x01;
const FLAG_END_STREAM: u8 = 0x02;

/// Connect's error codes (the gRPC set, by name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Canceled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    Unauthenticated,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Aborted => "aborted",
            Code::OutOfRange => "out_of_range",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// The HTTP status of a unary error with this code (the protocol's table).
    pub fn http_status(self) -> StatusCode {
        match self {
            Code::Canceled => StatusCode::from_u16(499).expect("valid status"),
            Code::Unknown | Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
                StatusCode::BAD_REQUEST
            }
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        }
    }
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("{}: {message}", code.as_str())]
pub struct ConnectError {
    pub code: Code,
    pub message: String,
}

impl ConnectError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        ConnectError {
            code,
            message: message.into(),
        }
    }

    /// The error in the form the call's framing needs.
    pub fn into_response_for(self, framing: Framing) -> Response {
        match framing {
            Framing::Unary => self.into_response(),
            Framing::Stream => stream_error(self),
        }
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({"code": self.code.as_str(), "message": self.message})
    }
}

impl From<crate::backend::BackendError> for ConnectError {
    fn from(e: crate::backend::BackendError) -> Self {
        use crate::backend::FailKind as K;
        let code = match e.kind {
            K::SandboxNotFound => {
                return ConnectError::new(
                    Code::Unavailable,
                    format!("sandbox {} was not found", e.message),
                )
            }
            K::TemplateNotFound
            | K::SnapshotNotFound
            | K::FileNotFound
            | K::ProcessNotFound
            | K::ContextNotFound => Code::NotFound,
            K::Invalid | K::WrongType => Code::InvalidArgument,
            K::Conflict => Code::FailedPrecondition,
            K::PermissionDenied => Code::PermissionDenied,
            K::TooLarge | K::NoSpace | K::TooMany | K::Capacity => Code::ResourceExhausted,
            K::NotRunning | K::PortClosed | K::Unresponsive | K::TemplateBuilding => {
                Code::Unavailable
            }
            K::Internal => Code::Internal,
        };
        ConnectError::new(code, e.message)
    }
}

impl IntoResponse for ConnectError {
    /// The unary form of an error.
    fn into_response(self) -> Response {
        let mut r = (self.code.http_status(), axum::Json(self.json())).into_response();
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        r
    }
}

/// How a request was framed, from its content type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    Unary,
    Stream,
}

pub fn framing(headers: &HeaderMap) -> Result<Framing, ConnectError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    match ct.as_str() {
        "application/json" => Ok(Framing::Unary),
        "application/connect+json" => Ok(Framing::Stream),
        "application/proto" | "application/connect+proto" => Err(ConnectError::new(
            Code::Unimplemented,
            "only the JSON codec is supported (application/json, application/connect+json)",
        )),
        _ => Err(ConnectError::new(
            Code::InvalidArgument,
            format!("unsupported content type {ct:?}"),
        )),
    }
}

/// The `Connect-Timeout-Ms` deadline, if the client set one.
pub fn timeout(headers: &HeaderMap) -> Result<Option<Duration>, ConnectError> {
    let Some(v) = headers.get("connect-timeout-ms") else {
        return Ok(None);
    };
    let ms: u64 = v
        .to_str()
        .ok()
        .filter(|s| !s.is_empty() && s.len() <= 10 && s.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| ConnectError::new(Code::InvalidArgument, "malformed Connect-Timeout-Ms"))?;
    Ok(Some(Duration::from_millis(ms)))
}

fn parse<T: DeserializeOwned>(json: &[u8]) -> Result<T, ConnectError> {
    // An empty unary body is the empty message.
    let json = if json.iter().all(u8::is_ascii_whitespace) {
        b"{}".as_slice()
    } else {
        json
    };
    serde_json::from_slice(json)
        .map_err(|e| ConnectError::new(Code::InvalidArgument, format!("malformed message: {e}")))
}

/// The single request message of a unary call or a server stream.
pub fn decode_request<T: DeserializeOwned>(
    framing: Framing,
    body: &[u8],
) -> Result<T, ConnectError> {
    if body.len() > MAX_MESSAGE_BYTES + 5 {
        return Err(ConnectError::new(
            Code::ResourceExhausted,
            format!("message over {MAX_MESSAGE_BYTES} bytes"),
        ));
    }
    match framing {
        Framing::Unary => parse(body),
        Framing::Stream => {
            let mut frames = Envelopes::default();
            frames.push(body);
            let first = frames.next_frame()?.ok_or_else(|| {
                ConnectError::new(Code::InvalidArgument, "no message in the request")
            })?;
            if first.0 & FLAG_END_STREAM != 0 {
                return Err(ConnectError::new(
                    Code::InvalidArgument,
                    "end-of-stream flag on a request message",
                ));
            }
            if frames.next_frame()?.is_some() || !frames.buf.is_empty() {
                return Err(ConnectError::new(
                    Code::InvalidArgument,
                    "a server stream takes exactly one request message",
                ));
            }
            parse(&first.1)
        }
    }
}

/// Splits a byte stream into envelopes, bounding each one's size.
#[derive(Default)]
pub struct Envelopes {
    buf: BytesMut,
}

impl Envelopes {
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next complete envelope, `None` if more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<(u8, Bytes)>, ConnectError> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let flags = self.buf[0];
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if flags & FLAG_COMPRESSED != 0 {
            return Err(ConnectError::new(
                Code::Unimplemented,
                "compressed messages are not supported",
            ));
        }
        if flags & !(FLAG_COMPRESSED | FLAG_END_STREAM) != 0 {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                format!("unknown envelope flags {flags:#04x}"),
            ));
        }
        if len > MAX_MESSAGE_BYTES {
            return Err(ConnectError::new(
                Code::ResourceExhausted,
                format!("message of {len} bytes is over the {MAX_MESSAGE_BYTES}-byte limit"),
            ));
        }
        if self.buf.len() < 5 + len {
            return Ok(None);
        }
        let mut frame = self.buf.split_to(5 + len);
        let msg = frame.split_off(5).freeze();
        Ok(Some((flags, msg)))
    }

    /// Bytes left over that do not make a whole envelope.
    pub fn leftover(&self) -> usize {
        self.buf.len()
    }
}

pub fn decode_message<T: DeserializeOwned>(msg: &[u8]) -> Result<T, ConnectError> {
    parse(msg)
}

fn envelope(flags: u8, json: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + json.len());
    b.put_u8(flags);
    b.put_u32(json.len() as u32);
    b.put_slice(json);
    b.freeze()
}

/// One message of a server stream.
pub fn stream_message<T: Serialize>(msg: &T) -> Bytes {
    envelope(
        0,
        &serde_json::to_vec(msg).expect("generated messages serialize"),
    )
}

/// The end-of-stream envelope: success, or the error the stream ended with.
pub fn end_stream(err: Option<&ConnectError>) -> Bytes {
    let body = match err {
        None => serde_json::json!({}),
        Some(e) => serde_json::json!({"error": e.json()}),
    };
    envelope(FLAG_END_STREAM, body.to_string().as_bytes())
}

pub fn unary_response<T: Serialize>(msg: &T) -> Response {
    let body = serde_json::to_vec(msg).expect("generated messages serialize");
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

/// A server stream's response from a stream of envelopes that ends with
/// an end-of-stream one.
pub fn stream_response<S>(s: S) -> Response
where
    S: Stream<Item = Bytes> + Send + 'static,
{
    use futures::StreamExt;
    let body = Body::from_stream(s.map(Ok::<_, std::convert::Infallible>));
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/connect+json")],
        body,
    )
        .into_response()
}

/// [`stream_response`] whose connection is dropped instead of ending with
/// an end-of-stream envelope if `sever` is cut (the sandbox died).
pub fn severable_stream_response<S>(s: S, sever: crate::sever::Sever) -> Response
where
    S: Stream<Item = Bytes> + Send + 'static,
{
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/connect+json")],
        crate::sever::body(s, sever),
    )
        .into_response()
}

/// A stream that failed before its first message: 200 and just the
/// end-of-stream envelope, as the protocol has it.
pub fn stream_error(e: ConnectError) -> Response {
    stream_response(futures::stream::iter([end_stream(Some(&e))]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_round_trip_and_split_anywhere() {
        let a = stream_message(&serde_json::json!({"a": 1}));
        let b = end_stream(None);
        let all = [a.as_ref(), b.as_ref()].concat();
        for cut in 0..all.len() {
            let mut e = Envelopes::default();
            e.push(&all[..cut]);
            let mut got = vec![];
            while let Some(f) = e.next_frame().unwrap() {
                got.push(f);
            }
            e.push(&all[cut..]);
            while let Some(f) = e.next_frame().unwrap() {
                got.push(f);
            }
            assert_eq!(got.len(), 2, "cut at {cut}");
            assert_eq!(got[0], (0, Bytes::from_static(br#"{"a":1}"#)));
            assert_eq!(got[1], (2, Bytes::from_static(b"{}")));
            assert_eq!(e.leftover(), 0);
        }
    }

    #[test]
    fn oversized_compressed_and_unknown_flags_are_refused() {
        let mut e = Envelopes::default();
        e.push(&[0, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(e.next_frame().unwrap_err().code, Code::ResourceExhausted);
        let mut e = Envelopes::default();
        e.push(&[1, 0, 0, 0, 2, b'{', b'}']);
        assert_eq!(e.next_frame().unwrap_err().code, Code::Unimplemented);
        let mut e = Envelopes::default();
        e.push(&[0x80, 0, 0, 0, 2, b'{', b'}']);
        assert_eq!(e.next_frame().unwrap_err().code, Code::InvalidArgument);
    }

    #[test]
    fn stream_requests_need_exactly_one_whole_message() {
        let one = stream_message(&serde_json::json!({}));
        let v: serde_json::Value = decode_request(Framing::Stream, &one).unwrap();
        assert_eq!(v, serde_json::json!({}));
        let two = [one.as_ref(), one.as_ref()].concat();
        assert!(decode_request::<serde_json::Value>(Framing::Stream, &two).is_err());
        assert!(decode_request::<serde_json::Value>(Framing::Stream, &one[..4]).is_err());
        assert!(decode_request::<serde_json::Value>(Framing::Stream, b"{}").is_err());
        let end = end_stream(None);
        assert!(decode_request::<serde_json::Value>(Framing::Stream, &end).is_err());
    }

    #[test]
    fn end_stream_carries_the_error() {
        let e = ConnectError::new(Code::NotFound, "no such process");
        let f = end_stream(Some(&e));
        assert_eq!(f[0], 2);
        let v: serde_json::Value = serde_json::from_slice(&f[5..]).unwrap();
        assert_eq!(v["error"]["code"], "not_found");
        assert_eq!(v["error"]["message"], "no such process");
    }

    #[test]
    fn timeout_header_is_strict() {
        let mut h = HeaderMap::new();
        assert_eq!(timeout(&h).unwrap(), None);
        h.insert("connect-timeout-ms", HeaderValue::from_static("1500"));
        assert_eq!(timeout(&h).unwrap(), Some(Duration::from_millis(1500)));
        h.insert("connect-timeout-ms", HeaderValue::from_static("-1"));
        assert!(timeout(&h).is_err());
        h.insert(
            "connect-timeout-ms",
            HeaderValue::from_static("12345678901"),
        );
        assert!(timeout(&h).is_err());
    }
}
