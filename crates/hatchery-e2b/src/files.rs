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
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

/// Files in one multipart upload.
pub const MAX_PARTS: usize = 64;

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
        _ => return crate::control::ApiError::from(e).into_response(),
    };
    plain_error(status, e.message)
}

struct Query {
    path: Option<String>,
    user: Option<String>,
}

fn query(q: Option<&str>) -> Result<Query, Box<Response>> {
    let mut out = Query {
        path: None,
        user: None,
    };
    for part in q.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = part.split_once('=').unwrap_or((part, ""));
        let v = crate::pct_decode(v)
            .ok_or_else(|| Box::new(plain_error(StatusCode::BAD_REQUEST, "malformed query")))?;
        match k {
            "path" => out.path = Some(v),
            "username" => out.user = Some(v),
            "signature" | "signature_expiration" => {
                return Err(Box::new(plain_error(
                    StatusCode::BAD_REQUEST,
                    "signed file URLs are not supported by Hatchery; send the access token",
                )))
            }
            _ => {}
        }
    }
    Ok(out)
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
    let Some(p) = q
        .path
        .as_deref()
        .and_then(|p| user::resolve_path(&who(&t, &q), p))
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

/// Creates the file (and missing parents) as the user it is written for,
/// so they own it, and so a user who may not write there is refused as in
/// E2B; Hatchery's write then fills it as root, keeping the owner. Nothing
/// to do for root, or a user the sandbox lacks (the write runs as root).
async fn prepare(s: &Shared, t: &Target, who: &str, path: &str) -> Result<(), Box<Response>> {
    if who == "root" {
        return Ok(());
    }
    let script = r#"d=$(dirname -- "$1"); mkdir -p -- "$d" && : >> "$1""#;
    let argv = user::wrap(
        who,
        Some("/"),
        vec![
            "/bin/sh".into(),
            "-c".into(),
            script.into(),
            "e2b".into(),
            path.into(),
        ],
    );
    match s
        .backend
        .exec(&t.sandbox, argv, None, Duration::from_secs(30))
        .await
    {
        Ok(o) if o.exit_code == 0 => Ok(()),
        Ok(o) => {
            let msg = String::from_utf8_lossy(&o.stderr)
                .trim()
                .chars()
                .take(300)
                .collect::<String>();
            Err(Box::new(plain_error(
                StatusCode::FORBIDDEN,
                format!("cannot write {path} as {who}: {msg}"),
            )))
        }
        Err(e) => Err(Box::new(error(e))),
    }
}

pub async fn upload(
    State(s): State<Arc<Shared>>,
    Extension(t): Extension<Target>,
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
    let who = who(&t, &q);
    let ct = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    if req.headers().get(header::CONTENT_ENCODING).is_some() {
        return plain_error(
            StatusCode::BAD_REQUEST,
            "compressed uploads (Content-Encoding) are not supported",
        );
    }
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
        if let Err(r) = prepare(&s, &t, &who, &abs).await {
            return *r;
        }
        if let Err(e) = s.backend.write_file(&t.sandbox, &abs, &data).await {
            return error(e);
        }
        let name = abs.rsplit('/').next().unwrap_or("").to_string();
        written.push(json!({"name": name, "type": "file", "path": abs}));
    }
    Json(written).into_response()
}
