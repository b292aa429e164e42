//! An S3-compatible object store as an anchoring sink (docs/operations.md,
//! "Anchoring"): each anchoring round is a new object, never an
//! overwrite, so a bucket with object lock / retention keeps every head
//! the daemon ever anchored out of its reach. Requests are signed with
//! `rusty-s3` (SigV4, presigned) and sent with hatchery-tls's exchange
//! (the one the broker uses), over TLS verified against the system's
//! bundle or the operator's CA file, or plain http:// to a loopback
//! address.

pub mod credentials;
pub mod location;
pub mod store;

pub use credentials::CredentialsError;
pub use location::{LocationError, S3Location};
pub use store::S3Store;

/// Why talking to the object store failed.
#[derive(Debug, thiserror::Error)]
pub enum S3Error {
    #[error("S3 credentials")]
    Credentials(#[from] CredentialsError),
    #[error("S3 bucket {bucket:?} at {endpoint}")]
    Bucket {
        bucket: String,
        endpoint: String,
        #[source]
        source: rusty_s3::BucketError,
    },
    #[error("S3 object key {key:?}")]
    Key {
        key: String,
        #[source]
        source: url::ParseError,
    },
    #[error("S3 {op} {key:?}")]
    Http {
        op: &'static str,
        key: String,
        #[source]
        source: hatchery_tls::http::HttpError,
    },
    #[error("S3 {op} {key:?} took over {within:?}")]
    Timeout {
        op: &'static str,
        key: String,
        within: std::time::Duration,
    },
    /// The store refused (an S3 error code, e.g. NoSuchBucket, AccessDenied).
    #[error("S3 {op} {key:?}: the store answered {status} {code}: {message}")]
    Refused {
        op: &'static str,
        key: String,
        status: u16,
        code: String,
        message: String,
    },
    /// A write-once put found the key taken (`If-None-Match: *`): never
    /// expected, since keys carry a per-process nonce and a counter.
    #[error("S3 put {key:?}: the object exists already (not overwritten)")]
    Exists { key: String },
    #[error("S3 list {prefix:?}: the answer")]
    List {
        prefix: String,
        #[source]
        /// quick-xml's error (rusty-s3 does not re-export its type).
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("S3 anchor object {key:?} line {line}")]
    Line {
        key: String,
        line: usize,
        #[source]
        source: serde_json::Error,
    },
    #[error("S3 anchor object {key:?} is not UTF-8")]
    Utf8 {
        key: String,
        #[source]
        source: std::str::Utf8Error,
    },
    #[error("S3 list {prefix:?}: more than {max} objects")]
    TooMany { prefix: String, max: usize },
    #[error("TLS trust for the object store")]
    Trust(#[source] hatchery_tls::TrustError),
}
