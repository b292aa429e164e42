//! envd's plain HTTP routes: `GET /health`, and `GET`/`POST /files` to
//! download and upload (multipart/form-data or application/octet-stream)
//! over Hatchery's files API. Uploads are owned by the requesting user.

use crate::backend::FailKind;
use crate::sandbox::{plain_error, Target};
use crate::state::Shared;
use crate::user;
use axum::body::Bytes;
use axum::extract::{FromRequest, Multipart, RawQuery, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

/// Files in one multipart upload.
pub const MAX_PARTS: usize = 64;
/// Multipart framing allowed beyond the file bytes themselves.
pub const MULTIPART_OVERHEAD: u64 = 1 << 20;

/// The daemon's `max_file_bytes`: what one uploaded file may hold, and so
/// what a compressed upload may expand to.
#[derive(Debug, Clone, Copy)]
pub struct UploadCap(pub u64);

/// Why a compressed upload body was refused.
#[derive(Debug, thiserror::Error)]
pub enum GzipError {
    #[error("unsupported Content-Encoding {0:?} (only gzip is accepted)")]
    Unsupported(String),
    #[error("the gzip body is malformed: {0}")]
    Malformed(#[source] std::io::Error),
    #[error("the upload expands to more than {0} bytes once decompressed")]
    TooLarge(u64),
}

impl GzipError {
    fn status(&self) -> StatusCode {
        match self {
            GzipError::Unsupported(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            GzipError::Malformed(_) => StatusCode::BAD_REQUEST,
            GzipError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
        }
    }
}

/// Decompresses a gzip body (several members, as `gzip` concatenates
/// them), reading at most `cap` + 1 bytes of output: a body that expands
/// past `cap` is refused without being inflated further.
pub fn gunzip_capped(body: &[u8], cap: u64) -> Result<Vec<u8>, GzipError> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(body)
        .take(cap.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(GzipError::Malformed)?;
    if out.len() as u64 > cap {
        return Err(GzipError::TooLarge(cap));
    }
    Ok(out)
}

/// The request with a gzip body replaced by its decompressed bytes (and
/// its `Content-Encoding` removed); other requests unchanged. The
/// compressed body is bounded by the route's body limit, the output by
/// `cap` (plus the multipart framing when the body is multipart).
async fn decode_body(req: Request, cap: u64, multipart: bool) -> Result<Request, Response> {
    let Some(enc) = req.headers().get(header::CONTENT_ENCODING) else {
        return Ok(req);
    };
    let enc = enc.to_str().unwrap_or("").trim().to_ascii_lowercase();
    match enc.as_str() {
        "identity" | "" => return Ok(req),
        "gzip" | "x-gzip" => {}
        _ => {
            let e = GzipError::Unsupported(enc);
            return Err(plain_error(e.status(), e.to_string()));
        }
    }
    let (mut parts, body) = req.into_parts();
    let compressed = match Bytes::from_request(Request::from_parts(parts.clone(), body), &()).await
    {
        Ok(b) => b,
        Err(e) => return Err(plain_error(e.status(), e.body_text())),
    };
    let cap = if multipart {
        cap.saturating_add(MULTIPART_OVERHEAD)
    } else {
        cap
    };
    let plain = tokio::task::spawn_blocking(move || gunzip_capped(&compressed, cap))
        .await
        .map_err(|_| plain_error(StatusCode::INTERNAL_SERVER_ERROR, "decompression failed"))?
        .map_err(|e| plain_error(e.status(), e.to_string()))?;
    parts.headers.remove(header::CONTENT_ENCODING);
    parts.headers.remove(header::CONTENT_LENGTH);
    Ok(Request::from_parts(parts, axum::body::Body::from(plain)))
}

pub async fn health(Extension(t): Extension<Target>) -> Response {
    if t.port != crate::sandbox::ENVD_PORT {
        return crate::sandbox::wrong_port(&t);
    }
    StatusCode::NO_CONTENT.into_response()
}

fn error(e: crate::backend::BackendError) -> Response {
    let status = match e.kind {
        FailKind::FileNotFound => StatusCode::NOT_FOUND,
        FailKind::Invalid | FailKind::WrongType => StatusCode::BAD_REQUEST,
        FailKind::PermissionDenied => StatusCode::UNAUTHORIZED,
        FailKind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        FailKind::NoSpace => StatusCode::INSUFFICIENT_STORAGE,
        FailKind::Conflict => StatusCode::BAD_REQUEST,
        FailKind::SandboxNotFound | FailKind::NotRunning => StatusCode::BAD_GATEWAY,
        _ => return crate::api_error::ApiError::from(e).into_response(),
    };
    plain_error(status, e.message)
}

struct Query {
    path: Option<String>,
    user: Option<String>,
    signature: Option<String>,
    expiration: Option<String>,
}

fn query(q: Option<&str>) -> Result<Query, Box<Response>> {
    let mut out = Query {
        path: None,
        user: None,
        signature: None,
        expiration: None,
    };
    for part in q.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = part.split_once('=').unwrap_or((part, ""));
        let v = crate::query::pct_decode(v)
            .map_err(|e| Box::new(plain_error(StatusCode::BAD_REQUEST, e.to_string())))?;
        match k {
            "path" => out.path = Some(v),
            "username" if v.is_empty() => {}
            "username" => {
                if !crate::sandbox::valid_user(&v) {
                    return Err(Box::new(plain_error(
                        StatusCode::BAD_REQUEST,
                        format!("invalid user name {v:?}"),
                    )));
                }
                out.user = Some(v)
            }
            // Checked by the signed route (`signed_download`/`_upload`);
            // a request with the access token needs none.
            "signature" => out.signature = Some(v),
            "signature_expiration" => out.expiration = Some(v),
            _ => {}
        }
    }
    Ok(out)
}

/// A signed URL's operation, as the SDKs sign it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignedOp {
    Read,
    Write,
}

impl SignedOp {
    fn as_str(self) -> &'static str {
        match self {
            SignedOp::Read => "read",
            SignedOp::Write => "write",
        }
    }
}

/// Why a signed URL was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    // The messages are envd's own.
    #[error("missing signature query parameter")]
    Missing,
    #[error("signature_expiration must be a Unix time in seconds")]
    BadExpiration,
    #[error("signature is already expired")]
    Expired,
    #[error("invalid signature")]
    Invalid,
}

impl SignatureError {
    fn status(&self) -> StatusCode {
        match self {
            SignatureError::BadExpiration => StatusCode::BAD_REQUEST,
            _ => StatusCode::UNAUTHORIZED,
        }
    }
}

/// E2B's v1 URL signature: `v1_` and the unpadded base64 of
/// SHA-256(`path:op:user:token[:expiration]`), `user` empty for the
/// default user. Only the sandbox's access token makes it.
pub fn url_signature(
    path: &str,
    op: SignedOp,
    user: &str,
    token: &str,
    expiration: Option<&str>,
) -> String {
    use base64::Engine;
    use sha2::Digest;
    let raw = match expiration {
        None => format!("{path}:{}:{user}:{token}", op.as_str()),
        Some(e) => format!("{path}:{}:{user}:{token}:{e}", op.as_str()),
    };
    let digest = sha2::Sha256::digest(raw.as_bytes());
    format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
    )
}

/// The E2B id (among `ids`) whose access token signed this URL, after the
/// expiry is checked against `now_s`. The URL carries no sandbox id (the
/// SDKs build `http://HOST:PORT/files?...` from `E2B_SANDBOX_URL`), so
/// each candidate's signature is computed and compared in constant time.
fn signer<'a>(
    token_of: impl Fn(&str) -> String,
    q: &Query,
    op: SignedOp,
    ids: impl IntoIterator<Item = &'a str>,
    now_s: u64,
) -> Result<&'a str, SignatureError> {
    let sig = q.signature.as_deref().ok_or(SignatureError::Missing)?;
    let expires = match q.expiration.as_deref() {
        Some(e) => Some(
            e.parse::<i64>()
                .map_err(|_| SignatureError::BadExpiration)?,
        ),
        None => None,
    };
    // As envd: the signature first, then its expiry.
    let path = q.path.as_deref().unwrap_or("");
    let user = q.user.as_deref().unwrap_or("");
    let mut found = None;
    for id in ids {
        let want = url_signature(path, op, user, &token_of(id), q.expiration.as_deref());
        if hatchery_serve::headers::constant_time_eq(want.as_bytes(), sig.as_bytes())
            && found.is_none()
        {
            found = Some(id);
        }
    }
    let found = found.ok_or(SignatureError::Invalid)?;
    if expires.is_some_and(|at| at < now_s as i64) {
        return Err(SignatureError::Expired);
    }
    Ok(found)
}

/// The sandbox a signed `/files` request is for, as a [`Target`].
async fn signed_target(s: &Shared, q: &Query, op: SignedOp) -> Result<Target, Box<Response>> {
    let live = s
        .backend
        .list()
        .await
        .map_err(|e| Box::new(error(e)))?
        .into_iter()
        .map(|v| (crate::state::present(v.clone()).0, v.id))
        .collect::<Vec<_>>();
    let now_s = crate::now_ms() / 1000;
    let id = signer(
        |id| s.access_token(id),
        q,
        op,
        live.iter().map(|(e, _)| e.as_str()),
        now_s,
    )
    .map_err(|e| Box::new(plain_error(e.status(), e.to_string())))?;
    let sandbox = live
        .iter()
        .find(|(e, _)| e == id)
        .map(|(_, h)| h.clone())
        .unwrap_or_default();
    Ok(Target {
        e2b_id: id.to_string(),
        sandbox,
        port: crate::sandbox::ENVD_PORT,
        user: None,
    })
}

/// `GET /files?...&signature=` at the root: a signed download URL.
pub async fn signed_download(State(s): State<Arc<Shared>>, RawQuery(raw): RawQuery) -> Response {
    let q = match query(raw.as_deref()) {
        Ok(q) => q,
        Err(r) => return *r,
    };
    match signed_target(&s, &q, SignedOp::Read).await {
        Ok(t) => download_for(&s, &t, q).await,
        Err(r) => *r,
    }
}

/// `POST /files?...&signature=` at the root: a signed upload URL.
pub async fn signed_upload(
    State(s): State<Arc<Shared>>,
    Extension(cap): Extension<UploadCap>,
    RawQuery(raw): RawQuery,
    req: Request,
) -> Response {
    let q = match query(raw.as_deref()) {
        Ok(q) => q,
        Err(r) => return *r,
    };
    match signed_target(&s, &q, SignedOp::Write).await {
        Ok(t) => upload_for(&s, &t, cap, q, req).await,
        Err(r) => *r,
    }
}

fn who(t: &Target, q: &Query) -> String {
    q.user
        .clone()
        .unwrap_or_else(|| user::user_of(t).to_string())
}

pub async fn download(
    State(s): State<Arc<Shared>>,
    Extension(t): Extension<Target>,
    RawQuery(q): RawQuery,
) -> Response {
    if t.port != crate::sandbox::ENVD_PORT {
        return crate::sandbox::wrong_port(&t);
    }
    let q = match query(q.as_deref()) {
        Ok(q) => q,
        Err(r) => return *r,
    };
    download_for(&s, &t, q).await
}

async fn download_for(s: &Shared, t: &Target, q: Query) -> Response {
    let Some(p) = q
        .path
        .as_deref()
        .and_then(|p| user::resolve_path(&who(t, &q), p))
    else {
        return plain_error(StatusCode::BAD_REQUEST, "path is required");
    };
    match s.backend.read_file(&t.sandbox, &p).await {
        Ok(data) => {
            let name = p.rsplit('/').next().unwrap_or("file").replace('"', "");
            (
                StatusCode::OK,
                [
                    (header::CONTENT_TYPE, "application/octet-stream".to_string()),
                    (
                        header::CONTENT_DISPOSITION,
                        format!("attachment; filename=\"{name}\""),
                    ),
                ],
                data,
            )
                .into_response()
        }
        Err(e) => error(e),
    }
}

/// Readies one upload's file before Hatchery's write fills it (as root,
/// in place, keeping owner and attributes), with the guest helper run as
/// the user the upload is for: missing parents and the file are created
/// as that user (so they own them, and a user who may not write there is
/// refused as in E2B); like envd's upload, the file is then chowned to
/// the user (a directory watch reports it as `chmod`: create, chmod,
/// write for a new file, as from envd; a file someone else owns keeps its
/// owner); and its metadata becomes exactly `meta` (none clears it).
/// Returns the metadata now on the file, which the upload reports.
async fn prepare(
    s: &Shared,
    t: &Target,
    who: &str,
    path: &str,
    meta: &BTreeMap<String, String>,
) -> Result<HashMap<String, String>, Box<Response>> {
    let mut target = t.clone();
    target.user = Some(who.to_string());
    let argv = crate::fs::helper_argv(
        &target,
        "prepare_upload",
        &json!({"path": path, "metadata": meta}),
    );
    let out = s
        .backend
        .exec(&t.sandbox, argv, None, Duration::from_secs(30))
        .await
        .map_err(|e| Box::new(error(e)))?;
    let v: Value = serde_json::from_slice(&out.stdout).map_err(|_| {
        let msg = String::from_utf8_lossy(&out.stderr)
            .trim()
            .chars()
            .take(300)
            .collect::<String>();
        Box::new(plain_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot write {path} as {who}: {msg}"),
        ))
    })?;
    if let Some(kind) = v["error"].as_str() {
        let status = match kind {
            "permission" => StatusCode::FORBIDDEN,
            "is_dir" | "not_dir" | "invalid" => StatusCode::BAD_REQUEST,
            "no_space" => StatusCode::INSUFFICIENT_STORAGE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let msg = v["message"].as_str().unwrap_or(kind);
        return Err(Box::new(plain_error(
            status,
            format!("cannot write {path} as {who}: {msg}"),
        )));
    }
    Ok(crate::fs::metadata_of(&v["metadata"]))
}

pub async fn upload(
    State(s): State<Arc<Shared>>,
    Extension(t): Extension<Target>,
    Extension(cap): Extension<UploadCap>,
    RawQuery(q): RawQuery,
    req: Request,
) -> Response {
    if t.port != crate::sandbox::ENVD_PORT {
        return crate::sandbox::wrong_port(&t);
    }
    let q = match query(q.as_deref()) {
        Ok(q) => q,
        Err(r) => return *r,
    };
    upload_for(&s, &t, cap, q, req).await
}

async fn upload_for(s: &Shared, t: &Target, cap: UploadCap, q: Query, req: Request) -> Response {
    let who = who(t, &q);
    // Checked before anything is read or written, as envd does.
    let meta = match crate::file_metadata::from_headers(req.headers()) {
        Ok(m) => m,
        Err(e) => return plain_error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let ct = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    let req = match decode_body(req, cap.0, ct.starts_with("multipart/form-data")).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    let mut files: Vec<(String, Bytes)> = vec![];
    if ct.starts_with("multipart/form-data") {
        let mut mp = match Multipart::from_request(req, &()).await {
            Ok(m) => m,
            Err(e) => return plain_error(StatusCode::BAD_REQUEST, e.body_text()),
        };
        loop {
            let field = match mp.next_field().await {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => return plain_error(e.status(), e.body_text()),
            };
            if files.len() >= MAX_PARTS {
                return plain_error(
                    StatusCode::BAD_REQUEST,
                    format!("at most {MAX_PARTS} files per upload"),
                );
            }
            let name = field.file_name().map(str::to_string);
            let data = match field.bytes().await {
                Ok(d) => d,
                Err(e) => return plain_error(e.status(), e.body_text()),
            };
            // With `path`, one file goes there; without it, each part's
            // file name is its path (E2B's multi-file write).
            let target = match (&q.path, name) {
                (Some(p), _) if files.is_empty() => p.clone(),
                (None, Some(n)) => n,
                (Some(_), _) => {
                    return plain_error(StatusCode::BAD_REQUEST, "one file per upload with ?path=")
                }
                (None, None) => return plain_error(StatusCode::BAD_REQUEST, "path is required"),
            };
            files.push((target, data));
        }
    } else {
        let Some(p) = q.path.clone() else {
            return plain_error(StatusCode::BAD_REQUEST, "path is required");
        };
        match Bytes::from_request(req, &()).await {
            Ok(b) if b.len() as u64 > cap.0 => {
                return plain_error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("the file is over {} bytes", cap.0),
                )
            }
            Ok(b) => files.push((p, b)),
            Err(e) => return plain_error(e.status(), e.body_text()),
        }
    }
    if files.is_empty() {
        return plain_error(StatusCode::BAD_REQUEST, "no file in the upload");
    }
    let mut written = vec![];
    for (p, data) in files {
        let Some(abs) = user::resolve_path(&who, &p) else {
            return plain_error(StatusCode::BAD_REQUEST, format!("invalid path {p:?}"));
        };
        let persisted = match prepare(s, t, &who, &abs, &meta).await {
            Ok(m) => m,
            Err(r) => return *r,
        };
        if let Err(e) = s.backend.write_file(&t.sandbox, &abs, &data).await {
            return error(e);
        }
        let name = abs.rsplit('/').next().unwrap_or("").to_string();
        let mut info = json!({"name": name, "type": "file", "path": abs});
        // As envd: what is on the file, and no key at all when nothing is
        // (a filesystem without attributes keeps none).
        if !persisted.is_empty() {
            info["metadata"] = json!(persisted);
        }
        written.push(info);
    }
    Json(written).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn gz(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn url_signature_matches_the_sdks() {
        // Vectors from e2b 2.63.0's `get_signature` (Python).
        assert_eq!(
            url_signature("/home/user/a b.txt", SignedOp::Read, "", "0123abcd", None),
            "v1_3PrmHdgTUXffBsfPQIxYfwO1E+nWt/NCtBDj7y7IaEI"
        );
        assert_eq!(
            url_signature("x.txt", SignedOp::Write, "root", "tok", Some("1700000060")),
            "v1_PD0dAdmT2jK8ceFpuWkALUtDZ+/2My0FJrPYqM6mJ9Y"
        );
    }

    fn signed(
        path: &str,
        op: SignedOp,
        user: Option<&str>,
        token: &str,
        exp: Option<u64>,
    ) -> Query {
        let exp = exp.map(|e| e.to_string());
        Query {
            path: Some(path.into()),
            user: user.map(str::to_string),
            signature: Some(url_signature(
                path,
                op,
                user.unwrap_or(""),
                token,
                exp.as_deref(),
            )),
            expiration: exp,
        }
    }

    #[test]
    fn signer_finds_the_sandbox_whose_token_signed() {
        let tok = |id: &str| format!("token-of-{id}");
        let ids = ["a", "b", "c"];
        let q = signed("f.txt", SignedOp::Read, None, "token-of-b", None);
        assert_eq!(signer(tok, &q, SignedOp::Read, ids, 100), Ok("b"));
        let q = signed(
            "f.txt",
            SignedOp::Write,
            Some("root"),
            "token-of-c",
            Some(200),
        );
        assert_eq!(signer(tok, &q, SignedOp::Write, ids, 100), Ok("c"));
        // Valid up to and including its expiry second.
        assert_eq!(signer(tok, &q, SignedOp::Write, ids, 200), Ok("c"));
    }

    #[test]
    fn signer_refuses_forged_expired_and_altered_urls() {
        let tok = |id: &str| format!("token-of-{id}");
        let ids = ["a", "b"];
        // Signed with a token no sandbox here has.
        let q = signed("f.txt", SignedOp::Read, None, "guess", None);
        assert_eq!(
            signer(tok, &q, SignedOp::Read, ids, 100),
            Err(SignatureError::Invalid)
        );
        // A read signature used to write.
        let q = signed("f.txt", SignedOp::Read, None, "token-of-a", None);
        assert_eq!(
            signer(tok, &q, SignedOp::Write, ids, 100),
            Err(SignatureError::Invalid)
        );
        // Another path, another user, an extended or dropped expiry.
        let mut q = signed("f.txt", SignedOp::Read, None, "token-of-a", Some(150));
        q.path = Some("g.txt".into());
        assert_eq!(
            signer(tok, &q, SignedOp::Read, ids, 100),
            Err(SignatureError::Invalid)
        );
        let mut q = signed("f.txt", SignedOp::Read, None, "token-of-a", Some(150));
        q.user = Some("root".into());
        assert_eq!(
            signer(tok, &q, SignedOp::Read, ids, 100),
            Err(SignatureError::Invalid)
        );
        let mut q = signed("f.txt", SignedOp::Read, None, "token-of-a", Some(150));
        q.expiration = Some("999999".into());
        assert_eq!(
            signer(tok, &q, SignedOp::Read, ids, 100),
            Err(SignatureError::Invalid)
        );
        let mut q = signed("f.txt", SignedOp::Read, None, "token-of-a", Some(150));
        q.expiration = None;
        assert_eq!(
            signer(tok, &q, SignedOp::Read, ids, 100),
            Err(SignatureError::Invalid)
        );
        // As envd: a forged signature is invalid before it is expired.
        let q = signed("f.txt", SignedOp::Read, None, "guess", Some(99));
        assert_eq!(
            signer(tok, &q, SignedOp::Read, ids, 100),
            Err(SignatureError::Invalid)
        );
        assert_eq!(
            SignatureError::BadExpiration.status(),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(SignatureError::Expired.status(), StatusCode::UNAUTHORIZED);
        // Expired, malformed expiry, no signature, no sandbox at all.
        let q = signed("f.txt", SignedOp::Read, None, "token-of-a", Some(99));
        assert_eq!(
            signer(tok, &q, SignedOp::Read, ids, 100),
            Err(SignatureError::Expired)
        );
        let mut q = signed("f.txt", SignedOp::Read, None, "token-of-a", None);
        q.expiration = Some("soon".into());
        assert_eq!(
            signer(tok, &q, SignedOp::Read, ids, 100),
            Err(SignatureError::BadExpiration)
        );
        q.signature = None;
        assert_eq!(
            signer(tok, &q, SignedOp::Read, ids, 100),
            Err(SignatureError::Missing)
        );
        let q = signed("f.txt", SignedOp::Read, None, "token-of-a", None);
        assert_eq!(
            signer(tok, &q, SignedOp::Read, [], 100),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn gunzip_round_trips_and_takes_concatenated_members() {
        let mut two = gz(b"hello ");
        two.extend(gz(b"world"));
        assert_eq!(gunzip_capped(&two, 100).unwrap(), b"hello world");
    }

    #[test]
    fn gunzip_cap_is_exact() {
        let data = vec![7u8; 1000];
        let z = gz(&data);
        assert_eq!(gunzip_capped(&z, 1000).unwrap().len(), 1000);
        assert!(matches!(
            gunzip_capped(&z, 999),
            Err(GzipError::TooLarge(999))
        ));
    }

    #[test]
    fn gunzip_bomb_stops_at_the_cap() {
        // 64 MiB of zeros compresses to about 64 KiB.
        let z = gz(&vec![0u8; 64 << 20]);
        assert!(z.len() < 1 << 20);
        let e = gunzip_capped(&z, 1 << 20).unwrap_err();
        assert!(matches!(e, GzipError::TooLarge(_)));
        assert_eq!(e.status(), StatusCode::PAYLOAD_TOO_LARGE);
    }

    #[test]
    fn gunzip_refuses_garbage() {
        let e = gunzip_capped(b"not gzip at all", 100).unwrap_err();
        assert!(matches!(e, GzipError::Malformed(_)));
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        let mut z = gz(b"truncated body here");
        z.truncate(z.len() - 6);
        assert!(matches!(
            gunzip_capped(&z, 100),
            Err(GzipError::Malformed(_))
        ));
    }
}
