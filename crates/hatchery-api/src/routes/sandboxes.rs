use crate::error::ErrorBody;
use crate::extract::Json;
use crate::models::{
    validate_env, validate_metadata, validate_ttl, CreateSandbox, PatchSandbox, Sandbox,
    SandboxList,
};
use crate::{scope, ApiError, AppState};
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::Extension;
use hatchery_core::CreateRequest;
use hatchery_templates::DEFAULT_TEMPLATE;
use hatchery_tenants::Principal;
use std::collections::BTreeMap;

#[utoipa::path(post, path = "/v1/sandboxes", request_body = CreateSandbox, tag = "sandboxes",
    responses((status = 201, body = Sandbox), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 429, body = ErrorBody, description = "tenant_limit: the tenant's live_sandboxes limit is reached"),
              (status = 503, body = ErrorBody, description = "capacity, or template_building: the template exists only as a build in progress (Retry-After says when to try again)")))]
pub async fn create(
    State(st): State<AppState>,
    principal: Option<Extension<Principal>>,
    Json(mut body): Json<CreateSandbox>,
) -> Result<(StatusCode, axum::Json<Sandbox>), ApiError> {
    let caps = &st.manager.caps;
    let ttl = validate_ttl(body.ttl_seconds, caps)?;
    let principal = principal.as_ref().map(|e| &e.0);
    scope::stamp(principal, &mut body.metadata);
    validate_metadata(&body.metadata, caps)?;
    validate_env(&body.env, caps)?;
    let req = CreateRequest {
        template: body
            .template
            .unwrap_or_else(|| DEFAULT_TEMPLATE.to_string()),
        ttl_seconds: Some(ttl),
        metadata: body.metadata,
        env: body.env,
        network: body.network.map(Into::into),
    };
    // Held until the sandbox exists (or failed): it counts as the
    // tenant's meanwhile.
    let _admitted = scope::admit(&st, principal, &req.metadata, 1).await?;
    let info = st.manager.create(req).await?;
    Ok((StatusCode::CREATED, axum::Json(info.into())))
}

/// Most lost sandboxes one `?state=lost` listing returns (`limit`).
pub const MAX_LOST_LISTED: usize = 1000;
/// What `?state=lost` returns without a `limit`.
pub const DEFAULT_LOST_LISTED: usize = 100;

/// `?metadata.KEY=VALUE`, repeatable; all must match. `?state=lost`
/// lists, instead of the live ones, the sandboxes stopped because their
/// host was lost (the latest first; `limit` 1..=1000, default 100).
#[utoipa::path(get, path = "/v1/sandboxes", tag = "sandboxes",
    params(("metadata.KEY" = Option<String>, Query, description = "filter on a metadata entry; repeatable"),
           ("state" = Option<String>, Query, description = "`live` (the default: starting and running) or `lost` (stopped because their host was lost, with `host`, `ended_at` and `end_reason`, the latest first)"),
           ("limit" = Option<u32>, Query, description = "with `state=lost`: at most this many, 1..=1000 (default 100)")),
    responses((status = 200, body = SandboxList), (status = 400, body = ErrorBody)))]
pub async fn list(
    State(st): State<AppState>,
    principal: Option<Extension<Principal>>,
    RawQuery(q): RawQuery,
) -> Result<axum::Json<SandboxList>, ApiError> {
    let (mut filter, lost) = list_query(q)?;
    scope::stamp(principal.as_ref().map(|e| &e.0), &mut filter);
    let sandboxes = match lost {
        None => st
            .manager
            .list(&filter)
            .await?
            .into_iter()
            .map(Into::into)
            .collect(),
        Some(limit) => st
            .manager
            .list_stopped(hatchery_store::HOST_LOST, &filter, limit)
            .await?
            .into_iter()
            .map(|(i, end)| Sandbox::lost(i, end))
            .collect(),
    };
    Ok(axum::Json(SandboxList { sandboxes }))
}

/// The list's query: its metadata filter, and `Some(limit)` for
/// `state=lost`. Anything else is a 400.
fn list_query(q: Option<String>) -> Result<(BTreeMap<String, String>, Option<usize>), ApiError> {
    let bad = |m: String| ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", m);
    let mut rest = Vec::new();
    let (mut lost, mut limit) = (false, None);
    for (k, v) in serde_urlencoded_pairs(q.as_deref().unwrap_or("")).map_err(bad)? {
        match k.as_str() {
            "state" => match v.as_str() {
                "live" => lost = false,
                "lost" => lost = true,
                _ => return Err(bad(format!("state={v}: use `live` or `lost`"))),
            },
            "limit" => match v.parse::<usize>() {
                Ok(n) if (1..=MAX_LOST_LISTED).contains(&n) => limit = Some(n),
                _ => return Err(bad(format!("limit={v}: use 1..={MAX_LOST_LISTED}"))),
            },
            _ => rest.push((k, v)),
        }
    }
    if limit.is_some() && !lost {
        return Err(bad("limit applies to state=lost only".into()));
    }
    let rest = serde_urlencoded_encode(&rest);
    let filter = metadata_filter((!rest.is_empty()).then_some(rest))?;
    Ok((filter, lost.then(|| limit.unwrap_or(DEFAULT_LOST_LISTED))))
}

/// `pairs` as a query string again (for [`metadata_filter`]).
fn serde_urlencoded_encode(pairs: &[(String, String)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", pct(k), pct(v)))
        .collect::<Vec<_>>()
        .join("&")
}

fn pct(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `metadata.KEY=VALUE` pairs of a query string; anything else is a 400.
pub fn metadata_filter(q: Option<String>) -> Result<BTreeMap<String, String>, ApiError> {
    let mut filter = BTreeMap::new();
    if let Some(q) = q {
        let pairs: Vec<(String, String)> = serde_urlencoded_pairs(&q)
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", e))?;
        for (k, v) in pairs {
            match k.strip_prefix("metadata.") {
                Some(key) if !key.is_empty() => {
                    filter.insert(key.to_string(), v);
                }
                _ => {
                    return Err(ApiError::new(
                        StatusCode::BAD_REQUEST,
                        "invalid_query",
                        format!("unknown parameter {k}"),
                    ))
                }
            }
        }
    }
    Ok(filter)
}

fn serde_urlencoded_pairs(q: &str) -> Result<Vec<(String, String)>, String> {
    axum::extract::Query::<Vec<(String, String)>>::try_from_uri(
        &format!("/?{q}")
            .parse()
            .map_err(|e: axum::http::uri::InvalidUri| e.to_string())?,
    )
    .map(|q| q.0)
    .map_err(|e| e.body_text())
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}", tag = "sandboxes", params(("id" = String, Path)),
    responses((status = 200, body = Sandbox), (status = 404, body = ErrorBody)))]
pub async fn get(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<axum::Json<Sandbox>, ApiError> {
    Ok(axum::Json(st.manager.get(&id).await?.into()))
}

/// Idempotent: 204 whether or not the sandbox still exists. Teardown
/// happens in the background and completes within seconds.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}", tag = "sandboxes", params(("id" = String, Path)),
    responses((status = 204)))]
pub async fn delete(State(st): State<AppState>, Path(id): Path<String>) -> StatusCode {
    st.manager.delete(&id).await;
    StatusCode::NO_CONTENT
}

#[utoipa::path(patch, path = "/v1/sandboxes/{id}", tag = "sandboxes", params(("id" = String, Path)),
    request_body = PatchSandbox,
    responses((status = 200, body = Sandbox), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn patch(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Json(body): Json<PatchSandbox>,
) -> Result<axum::Json<Sandbox>, ApiError> {
    let ttl = validate_ttl(Some(body.ttl_seconds), &st.manager.caps)?;
    Ok(axum::Json(st.manager.set_ttl(&id, ttl).await?.into()))
}

#[cfg(test)]
mod list_query_tests {
    use super::*;

    fn q(s: &str) -> Result<(BTreeMap<String, String>, Option<usize>), ApiError> {
        list_query(Some(s.to_string()))
    }

    #[test]
    fn state_and_limit_are_checked_and_metadata_kept() {
        let (m, lost) = q("state=lost&metadata.a%20b=x%26y&limit=5").unwrap();
        assert_eq!((m["a b"].as_str(), lost), ("x&y", Some(5)));
        assert_eq!(q("state=lost").unwrap().1, Some(DEFAULT_LOST_LISTED));
        assert_eq!(q("state=live&metadata.k=v").unwrap().1, None);
        assert_eq!(list_query(None).unwrap(), (BTreeMap::new(), None));
        for bad in [
            "state=gone",
            "state=lost&limit=0",
            "state=lost&limit=1001",
            "limit=5",
            "colour=red",
        ] {
            assert!(q(bad).is_err(), "{bad}");
        }
        assert!(q(&format!("state=lost&limit={MAX_LOST_LISTED}")).is_ok());
    }
}
