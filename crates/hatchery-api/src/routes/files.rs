use crate::error::ErrorBody;
use crate::extract::{Body, Query};
use crate::models::{FileEntry, FileList, PathQuery};
use crate::{ApiError, AppState};
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;

#[utoipa::path(put, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path), ("path" = String, Query, description = "absolute path in the sandbox")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 204), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 413, body = ErrorBody)))]
pub async fn write(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
    Body(body): Body,
) -> Result<StatusCode, ApiError> {
    st.manager.write_file(&id, &q.path, &body).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path), ("path" = String, Query)),
    responses((status = 200, content_type = "application/octet-stream", body = Vec<u8>),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody)))]
pub async fn read(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
) -> Result<impl IntoResponse, ApiError> {
    let data = st.manager.read_file(&id, &q.path).await?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], data))
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/list", tag = "files",
    params(("id" = String, Path), ("path" = String, Query)),
    responses((status = 200, body = FileList), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn list(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
) -> Result<axum::Json<FileList>, ApiError> {
    let entries = st.manager.list_files(&id, &q.path).await?;
    let entries = entries
        .into_iter()
        .map(|e| FileEntry {
            name: e.name,
            kind: e.kind,
            size: e.size,
            mode: e.mode,
            mtime: e.mtime,
        })
        .collect();
    Ok(axum::Json(FileList {
        path: q.path,
        entries,
    }))
}

#[utoipa::path(delete, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path), ("path" = String, Query)),
    responses((status = 204), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn remove(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
) -> Result<StatusCode, ApiError> {
    st.manager.remove_file(&id, &q.path).await?;
    Ok(StatusCode::NO_CONTENT)
}
