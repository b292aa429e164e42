//! E2B's snapshot API over Hatchery's snapshots: `create_snapshot`
//! (`POST /sandboxes/{id}/snapshots`), `list_snapshots` (`GET
//! /snapshots`), `delete_snapshot` (`DELETE /templates/{id}`, E2B's
//! snapshots being templates) and `Sandbox.create(snapshot_id)` (a create
//! whose template is a snapshot, see [`resolve`]).
//!
//! A snapshot's id is the Hatchery snapshot's (`snap_...`), so snapshots
//! taken through Hatchery's own API are listed and usable too; a name given
//! at creation is kept in the snapshot's metadata and also creates from
//! it. Pause records and forks' temporary snapshots are not E2B snapshots
//! and are never shown or accepted here.

use crate::api_error::{ApiError, ApiResult, Body};
use crate::backend::{Caller, FailKind, SandboxView, TENANT_KEY};
use crate::query::{form_pairs, MAX_PAGE};
use crate::state::{Shared, FORK_KEY, PAUSED_KEY, SNAPSHOT_NAME_KEY, SNAPSHOT_OF_KEY};
use crate::template_alias::template_alias;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Longest snapshot name (E2B's template aliases are short too).
pub const MAX_NAME: usize = 128;

/// One E2B snapshot: its id, and what it was taken from.
struct Snap {
    id: String,
    view: SandboxView,
}

impl Snap {
    fn name(&self) -> Option<&str> {
        self.view
            .metadata
            .get(SNAPSHOT_NAME_KEY)
            .map(String::as_str)
    }

    /// The E2B id of the sandbox it was taken from (a snapshot taken with
    /// Hatchery's API names the Hatchery sandbox).
    fn source(&self) -> &str {
        self.view
            .metadata
            .get(SNAPSHOT_OF_KEY)
            .unwrap_or(&self.view.id)
    }

    fn json(&self) -> Value {
        json!({"snapshotID": self.id, "names": self.name().into_iter().collect::<Vec<_>>()})
    }
}

/// Every snapshot the caller may see, newest first (a tenant's: those
/// that record its tenant).
async fn all(s: &Shared, caller: &Caller) -> ApiResult<Vec<Snap>> {
    let mut filter = BTreeMap::new();
    crate::tenancy::stamp(caller, &mut filter);
    let mut out: Vec<Snap> = s
        .backend
        .find_snapshots(filter)
        .await?
        .into_iter()
        .filter(|(_, v)| !v.metadata.contains_key(PAUSED_KEY) && !v.metadata.contains_key(FORK_KEY))
        .map(|(id, view)| Snap { id, view })
        .collect();
    out.sort_by(|a, b| (b.view.created_at_ms, &b.id).cmp(&(a.view.created_at_ms, &a.id)));
    Ok(out)
}

/// The snapshot a template name stands for, if it is one: a snapshot id,
/// or the name given to one (the newest of that name, as E2B assigns a
/// name's new builds to the same template).
pub async fn resolve(s: &Shared, caller: &Caller, template: &str) -> ApiResult<Option<String>> {
    if template.is_empty() || template.len() > MAX_NAME {
        return Ok(None);
    }
    let all = all(s, caller).await?;
    let found = all
        .iter()
        .find(|x| x.id == template)
        .or_else(|| all.iter().find(|x| x.name() == Some(template)));
    Ok(found.map(|x| x.id.clone()))
}

#[derive(Deserialize, Default)]
pub struct NewSnapshot {
    name: Option<String>,
}

fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= MAX_NAME
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:/".contains(&b))
}

/// `create_snapshot`: a checkpoint of the running sandbox, which keeps
/// running (E2B pauses it meanwhile); 201 `{"snapshotID", "names"}`.
pub async fn create(
    State(s): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Body(b): Body<NewSnapshot>,
) -> ApiResult<Response> {
    let name = b.name.filter(|n| !n.is_empty());
    if let Some(n) = &name {
        if !valid_name(n) {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("snapshot name {n:?}: 1..{MAX_NAME} letters, digits and -_.:/"),
            ));
        }
        if s.backend.template_exists(template_alias(n)) {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("snapshot name {n:?} is a template's"),
            ));
        }
    }
    let Some((h, v)) = s.live(&id).await? else {
        return Err(match s.paused(&id).await? {
            Some(_) => ApiError::new(
                StatusCode::CONFLICT,
                format!("sandbox \"{id}\" is paused: resume it to take a snapshot"),
            ),
            None => ApiError::new(
                StatusCode::NOT_FOUND,
                format!("sandbox \"{id}\" was not found"),
            ),
        });
    };
    let mut meta = BTreeMap::from([(SNAPSHOT_OF_KEY.to_string(), id.clone())]);
    // A snapshot is its sandbox's tenant's (the caller's, for a tenant:
    // the route let only its own sandbox through).
    if let Some(t) = v.metadata.get(TENANT_KEY) {
        meta.insert(TENANT_KEY.into(), t.clone());
    }
    crate::tenancy::stamp(&caller, &mut meta);
    if let Some(n) = &name {
        meta.insert(SNAPSHOT_NAME_KEY.into(), n.clone());
    }
    let snap = s.backend.snapshot(&h, meta).await?;
    let body = json!({"snapshotID": snap, "names": name.into_iter().collect::<Vec<_>>()});
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// `list_snapshots`: `sandboxID`, `name` (the name or id, as E2B matches
/// it), `limit` (1..100, default 100) and `nextToken`; `X-Next-Token` when
/// there is more.
pub async fn list(
    State(s): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    RawQuery(q): RawQuery,
) -> ApiResult<Response> {
    let (mut source, mut name, mut limit, mut next) = (None, None, MAX_PAGE, None);
    for (k, v) in form_pairs(q.as_deref().unwrap_or(""))? {
        match k.as_str() {
            "sandboxID" => source = Some(v),
            "name" => name = Some(v),
            "limit" => {
                limit = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_PAGE).contains(n))
                    .ok_or_else(|| {
                        ApiError::new(
                            StatusCode::BAD_REQUEST,
                            format!("limit must be between 1 and {MAX_PAGE}"),
                        )
                    })?
            }
            "nextToken" => next = Some(v),
            _ => {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!("unsupported query parameter {k:?}"),
                ))
            }
        }
    }
    let all: Vec<Snap> = all(&s, &caller)
        .await?
        .into_iter()
        .filter(|x| source.as_ref().is_none_or(|src| x.source() == src))
        .filter(|x| {
            name.as_ref()
                .is_none_or(|n| x.id == *n || x.name() == Some(n.as_str()))
        })
        .collect();
    // The token is the last id of the page before (ids are unique; the
    // order is newest first).
    let start = match &next {
        None => 0,
        Some(tok) => all
            .iter()
            .position(|x| &x.id == tok)
            .map(|i| i + 1)
            .ok_or_else(|| ApiError::new(StatusCode::BAD_REQUEST, "unknown nextToken"))?,
    };
    let page: Vec<&Snap> = all.iter().skip(start).take(limit).collect();
    let more = start + page.len() < all.len();
    let mut r = Json(page.iter().map(|x| x.json()).collect::<Vec<_>>()).into_response();
    if more {
        if let Some(Ok(h)) = page.last().map(|x| HeaderValue::from_str(&x.id)) {
            r.headers_mut().insert("x-next-token", h);
        }
    }
    Ok(r)
}

/// `delete_snapshot`: 204, or 404 (the SDK's `false`) for anything that is
/// not an E2B-visible snapshot, templates included (they are managed with
/// Hatchery's `/v1/templates`).
pub async fn delete(
    State(s): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    // Another tenant's snapshot is not found, as a missing one.
    let Some(snap) = resolve(&s, &caller, &id).await? else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("snapshot '{id}' not found (only snapshots can be deleted here)"),
        ));
    };
    s.backend.delete_snapshot(&snap).await;
    // A delete that failed leaves it listed: report that rather than 204.
    if all(&s, &caller).await?.iter().any(|x| x.id == snap) {
        return Err(crate::backend::BackendError::new(
            FailKind::Internal,
            format!("snapshot {snap} could not be deleted"),
        )
        .into());
    }
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_short_and_plain() {
        assert!(valid_name("snap-1:v2"));
        assert!(valid_name("team/snap_a.b"));
        assert!(!valid_name(""));
        assert!(!valid_name("a b"));
        assert!(!valid_name(&"x".repeat(MAX_NAME + 1)));
    }
}
