//! Tenant keys on E2B's protocol. A tenant's key (sent as `X-API-Key`, as
//! the SDKs send any key) sees and acts only on the sandboxes, paused
//! sandboxes and snapshots whose metadata names its tenant
//! ([`TENANT_KEY`]); anything else answers exactly as a missing one does
//! (E2B's 404), so a key cannot learn what others have. What it creates
//! records its tenant whatever the body says; counting that against the
//! tenant's live-sandbox limit is the backend's (it admits every sandbox
//! that records a tenant, see hatchery-e2b-backend).
//!
//! The operator's key is checked first (constant time); a tenant key is
//! resolved by the backend. The [`Caller`] goes into the request's
//! extensions for the handlers that list or create.

use crate::api_error::{ApiError, ApiResult};
use crate::backend::{Caller, TENANT_KEY};
use crate::state::Shared;
use axum::http::{HeaderMap, Method, StatusCode};
use std::collections::BTreeMap;

/// The key a request presents: `X-API-Key`, else a Bearer token.
fn presented(h: &HeaderMap) -> Option<&str> {
    h.get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .or_else(|| {
            h.get(axum::http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
        })
}

/// Who sent `h`: `None` when its key is nobody's.
pub async fn caller(s: &Shared, h: &HeaderMap) -> ApiResult<Option<Caller>> {
    if hatchery_serve::headers::api_key_ok(h, s.backend.api_key()) {
        return Ok(Some(Caller::Operator));
    }
    let Some(key) = presented(h).filter(|k| !k.is_empty()) else {
        return Ok(None);
    };
    Ok(s.backend.tenant_of_key(key).await?.map(Caller::Tenant))
}

/// Whether metadata (a sandbox's, a pause record's or a snapshot's) is
/// the caller's: the operator's is everything.
pub fn owns(caller: &Caller, metadata: &BTreeMap<String, String>) -> bool {
    match caller.tenant() {
        None => true,
        Some(t) => metadata.get(TENANT_KEY).map(String::as_str) == Some(t),
    }
}

/// The caller's view of new metadata: a tenant's id is set over whatever
/// was sent; the operator's is left as given.
pub fn stamp(caller: &Caller, metadata: &mut BTreeMap<String, String>) {
    if let Some(t) = caller.tenant() {
        metadata.insert(TENANT_KEY.to_string(), t.to_string());
    }
}

/// The E2B sandbox id a control-plane path acts on, if any (paths as the
/// control router sees them, with or without its `/e2b` prefix).
fn sandbox_of(path: &str) -> Option<&str> {
    let path = path.strip_prefix(crate::API_PREFIX).unwrap_or(path);
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match parts.as_slice() {
        ["sandboxes", id, ..] | ["v2", "sandboxes", id, ..] if !id.is_empty() => Some(id),
        _ => None,
    }
}

/// Whether E2B sandbox `id`, running or paused, is the caller's. A
/// running one is looked for first (as the handlers do).
pub async fn owns_sandbox(s: &Shared, caller: &Caller, id: &str) -> ApiResult<bool> {
    if caller.tenant().is_none() {
        return Ok(true);
    }
    if let Some((_, v)) = s.live(id).await? {
        return Ok(owns(caller, &v.metadata));
    }
    Ok(s.paused(id)
        .await?
        .is_some_and(|p| owns(caller, &p.view.metadata)))
}

/// Refuses a tenant's control-plane request for a sandbox not its own
/// (404, as a missing one), before the handler runs. Lists, creates and
/// snapshots are narrowed by their handlers.
pub async fn check(s: &Shared, caller: &Caller, _method: &Method, path: &str) -> ApiResult<()> {
    let Some(id) = sandbox_of(path) else {
        return Ok(());
    };
    if owns_sandbox(s, caller, id).await? {
        Ok(())
    } else {
        Err(ApiError::not_found(id))
    }
}

pub(crate) fn unauthorized() -> ApiError {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "missing or wrong API key (X-API-KEY)",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_paths_name_their_sandbox() {
        for (path, want) in [
            ("/sandboxes/abc", Some("abc")),
            ("/e2b/sandboxes/abc/pause", Some("abc")),
            ("/v2/sandboxes/abc/connect", Some("abc")),
            ("/sandboxes", None),
            ("/v2/sandboxes", None),
            ("/sandboxes/", None),
            ("/snapshots", None),
            ("/templates/snap_x", None),
            ("/templates/aliases/base", None),
        ] {
            assert_eq!(sandbox_of(path), want, "{path}");
        }
    }

    #[test]
    fn a_tenant_owns_what_names_it_and_stamps_over_the_body() {
        let me = Caller::Tenant("ten_me".into());
        let mut m = BTreeMap::from([(TENANT_KEY.to_string(), "ten_other".to_string())]);
        assert!(!owns(&me, &m));
        assert!(owns(&Caller::Operator, &m));
        stamp(&me, &mut m);
        assert!(owns(&me, &m));
        assert!(!owns(&me, &BTreeMap::new()));
        let mut op = BTreeMap::from([(TENANT_KEY.to_string(), "ten_x".to_string())]);
        stamp(&Caller::Operator, &mut op);
        assert_eq!(
            op[TENANT_KEY], "ten_x",
            "the operator's metadata is left as given"
        );
    }

    #[test]
    fn only_an_x_api_key_or_a_bearer_is_a_presented_key() {
        let mut h = HeaderMap::new();
        assert_eq!(presented(&h), None);
        h.insert("authorization", "Basic abc".parse().unwrap());
        assert_eq!(presented(&h), None);
        h.insert("authorization", "Bearer htk_1".parse().unwrap());
        assert_eq!(presented(&h), Some("htk_1"));
        h.insert("x-api-key", "htk_2".parse().unwrap());
        assert_eq!(presented(&h), Some("htk_2"));
    }
}
