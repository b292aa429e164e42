//! What a tenant key reaches. A tenant's sandboxes and snapshots carry
//! `metadata.tenant` = its id, set by the API from the key (never from
//! the body); a sandbox or snapshot of another tenant answers exactly as
//! a missing one does (404 `sandbox_not_found`/`snapshot_not_found`), so a
//! key cannot learn what others have. `/v1/policies` is scoped by its own
//! handlers (hatchery-policy: a tenant's own policies and the built-in
//! ones), `/v1/secrets` too (hatchery-secrets: a tenant's own secrets),
//! `/v1/sessions` and `/v1/rounds` by their routers' own key checks.
//! Routes not scoped (templates other than reading the list or one of
//! them, so a build's events too; the broker's operator routes, metrics,
//! tenants) answer 403 `forbidden` to a tenant key.
//!
//! Also [`ManagerUsage`]: a tenant's live sandboxes as the manager counts
//! them, for hatchery-tenants' admission gate and delete check.

use crate::{ApiError, AppState};
use axum::http::{Method, StatusCode};
use hatchery_core::{CoreError, Manager};
use hatchery_tenants::{AdmitError, Principal, StoreError, Usage, UsageError};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The metadata key that names a sandbox's or snapshot's tenant.
pub const TENANT_KEY: &str = "tenant";

fn owned(metadata: &BTreeMap<String, String>, tenant: &str) -> bool {
    metadata.get(TENANT_KEY).map(String::as_str) == Some(tenant)
}

fn forbidden() -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "forbidden",
        "this route is not available to tenant keys",
    )
}

/// What a tenant's request is for, by its path.
#[derive(Debug, PartialEq, Eq)]
enum Target<'a> {
    /// A create or list, or a policy: the handler scopes it.
    Handler,
    Sandbox(&'a str),
    Snapshot(&'a str),
    /// Shared by every caller (reading templates, the API's document).
    Open,
    Forbidden,
}

fn target<'a>(method: &Method, path: &'a str) -> Target<'a> {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match parts.as_slice() {
        ["v1", "sandboxes"] | ["v1", "snapshots"] => Target::Handler,
        ["v1", "policies", ..] => Target::Handler,
        // Each key's own secrets: the handlers read and write only the
        // caller's (hatchery-secrets http.rs).
        ["v1", "secrets"] | ["v1", "secrets", _] => Target::Handler,
        ["v1", "sandboxes", id, ..] => Target::Sandbox(id),
        // A warm pool holds the host's memory: the operator's to size.
        ["v1", "snapshots", _, "pool"] => Target::Forbidden,
        ["v1", "snapshots", id, ..] => Target::Snapshot(id),
        // The list and one template's view only: builds and their logs
        // are the operator's (a build's output may name hosts, paths and
        // registries; issue 36 audit).
        ["v1", "templates"] | ["v1", "templates", _] if method == Method::GET => Target::Open,
        ["openapi.json"] => Target::Open,
        _ => Target::Forbidden,
    }
}

/// Refuses a tenant's request for anything not its own, before the
/// handler runs. `path` is the request's whole path.
pub(crate) async fn check(
    st: &AppState,
    tenant: &str,
    method: &Method,
    path: &str,
) -> Result<(), ApiError> {
    match target(method, path) {
        Target::Handler | Target::Open => Ok(()),
        Target::Sandbox(id) => {
            let sandbox = st.manager.get(id).await;
            if sandbox.is_ok_and(|s| owned(&s.metadata, tenant)) {
                Ok(())
            } else {
                Err(CoreError::SandboxNotFound(id.to_string()).into())
            }
        }
        Target::Snapshot(id) => {
            let snap = st.manager.get_snapshot(id).await;
            if snap.is_ok_and(|s| owned(&s.metadata, tenant)) {
                Ok(())
            } else {
                Err(CoreError::SnapshotNotFound(id.to_string()).into())
            }
        }
        Target::Forbidden => Err(forbidden()),
    }
}

/// The principal's view of a request's metadata: a tenant's own id is
/// set (whatever the body said), the operator's is left as given.
pub(crate) fn stamp(principal: Option<&Principal>, metadata: &mut BTreeMap<String, String>) {
    if let Some(t) = principal.and_then(Principal::tenant) {
        metadata.insert(TENANT_KEY.to_string(), t.to_string());
    }
}

/// Which tenant a create or fork with `metadata` (already [`stamp`]ed)
/// is admitted against: a tenant key's own, or the tenant the operator
/// names in `metadata.tenant` (such a sandbox counts as that tenant's, so
/// it passes the same limit; the rounds' sandboxes are made this way).
/// `true` when the name came from a tenant key (a tenant deleted since is
/// then a dead key); the operator's name may be a plain label.
fn admitted_as<'a>(
    principal: Option<&'a Principal>,
    metadata: &'a BTreeMap<String, String>,
) -> Option<(&'a str, bool)> {
    match principal.and_then(Principal::tenant) {
        Some(t) => Some((t, true)),
        None => metadata.get(TENANT_KEY).map(|t| (t.as_str(), false)),
    }
}

/// Admits `n` new sandboxes recording `metadata` against the live-sandbox
/// limit of the tenant they record ([`admitted_as`]; a sandbox recording
/// none is not limited): 429 `tenant_limit` naming the limit when there
/// is no room.
pub(crate) async fn admit(
    st: &AppState,
    principal: Option<&Principal>,
    metadata: &BTreeMap<String, String>,
    n: u64,
) -> Result<Option<hatchery_tenants::Admission>, ApiError> {
    let Some((tenant, by_key)) = admitted_as(principal, metadata) else {
        return Ok(None);
    };
    match st.tenants.admit_sandboxes(tenant, n).await {
        Ok(a) => Ok(Some(a)),
        Err(e @ AdmitError::Limit { .. }) => {
            tracing::info!(%tenant, error = %e, "create refused: tenant limit");
            Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "tenant_limit",
                e.to_string(),
            ))
        }
        // The operator's label that names no tenant: not limited, as
        // E2B's creates (hatchery-e2b-backend) treat it.
        Err(AdmitError::Store(hatchery_tenants::StoreError::NotFound(_))) if !by_key => Ok(None),
        // A key of a tenant deleted since it was cached.
        Err(AdmitError::Store(hatchery_tenants::StoreError::NotFound(_))) => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or wrong API key",
        )),
        Err(AdmitError::Store(e)) => Err(store_failed(e)),
        Err(AdmitError::Usage(e)) => {
            let request_id = crate::error::new_request_id();
            tracing::error!(%request_id, error = %hatchery_serve::error_text::with_causes(&e), "counting a tenant's sandboxes failed");
            Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                format!("internal error (request id {request_id})"),
            ))
        }
    }
}

/// A tenant's live sandboxes, as this daemon's manager lists them (from
/// the store: on many hosts, every host's).
pub struct ManagerUsage(pub Arc<Manager>);

#[async_trait::async_trait]
impl hatchery_tenants::LiveUsage for ManagerUsage {
    async fn usage(&self, tenant: &str) -> Result<Usage, UsageError> {
        let filter = BTreeMap::from([(TENANT_KEY.to_string(), tenant.to_string())]);
        let live = self.0.list(&filter).await.map_err(|e| UsageError {
            tenant: tenant.into(),
            source: Box::new(e),
        })?;
        Ok(Usage {
            live_sandboxes: live.len() as u64,
            // Sessions are counted by hatchery-sessions' own LiveUsage
            // (the daemon adds the two up).
            live_sessions: 0,
        })
    }
}

/// The tenant store failed while resolving a key: 503 when it is only
/// unreachable, otherwise 500 with the cause in the log.
pub(crate) fn store_failed(e: StoreError) -> ApiError {
    if let StoreError::Unavailable(_) = e {
        tracing::warn!(error = %hatchery_serve::error_text::with_causes(&e), "tenant store unavailable");
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            "the tenant store is not reachable; retry shortly",
        );
    }
    let request_id = crate::error::new_request_id();
    tracing::error!(%request_id, error = %hatchery_serve::error_text::with_causes(&e), "tenant store failed");
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        format!("internal error (request id {request_id})"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_reaches_its_sandboxes_snapshots_and_templates_only() {
        let (get, post) = (Method::GET, Method::POST);
        let cases = [
            (&post, "/v1/sandboxes", Target::Handler),
            (&get, "/v1/snapshots", Target::Handler),
            (&post, "/v1/sandboxes/sbx_a/exec", Target::Sandbox("sbx_a")),
            (&get, "/v1/sandboxes/sbx_a", Target::Sandbox("sbx_a")),
            (
                &post,
                "/v1/sandboxes/sbx_a/ports/80/x",
                Target::Sandbox("sbx_a"),
            ),
            (
                &post,
                "/v1/snapshots/snap_a/fork",
                Target::Snapshot("snap_a"),
            ),
            (&Method::PUT, "/v1/snapshots/snap_a/pool", Target::Forbidden),
            (&get, "/v1/templates", Target::Open),
            (&get, "/v1/templates/base", Target::Open),
            (&get, "/v1/templates/base/builds", Target::Forbidden),
            (&get, "/v1/templates/base/builds/bld_a", Target::Forbidden),
            (
                &get,
                "/v1/templates/base/builds/bld_a/events",
                Target::Forbidden,
            ),
            (&get, "/openapi.json", Target::Open),
            (&post, "/v1/templates", Target::Forbidden),
            (&Method::DELETE, "/v1/templates/base", Target::Forbidden),
            (&get, "/v1/tenants", Target::Forbidden),
            (&get, "/v1/policies", Target::Handler),
            (&post, "/v1/policies/pol_a/versions", Target::Handler),
            (&get, "/v1/secrets", Target::Handler),
            (&Method::DELETE, "/v1/secrets/GH_TOKEN", Target::Handler),
            (&get, "/v1/secrets/GH_TOKEN/x", Target::Forbidden),
            (&get, "/metrics", Target::Forbidden),
            (&get, "/v1/broker/calls", Target::Forbidden),
        ];
        for (m, path, want) in cases {
            assert_eq!(target(m, path), want, "{m} {path}");
        }
    }

    #[test]
    fn a_tenant_s_id_is_stamped_over_whatever_was_sent() {
        let mut m = BTreeMap::from([("tenant".to_string(), "ten_other".to_string())]);
        stamp(Some(&Principal::Tenant("ten_me".into())), &mut m);
        assert_eq!(m["tenant"], "ten_me");
        stamp(Some(&Principal::Operator), &mut m);
        stamp(None, &mut m);
        assert_eq!(
            m["tenant"], "ten_me",
            "the operator's metadata is left as given"
        );
        assert!(owned(&m, "ten_me") && !owned(&m, "ten_other"));
        assert!(!owned(&BTreeMap::new(), "ten_me"));
    }

    #[test]
    fn a_create_is_admitted_as_the_key_s_tenant_or_the_one_the_operator_names() {
        let me = Principal::Tenant("ten_me".into());
        let named = BTreeMap::from([("tenant".to_string(), "ten_b".to_string())]);
        let none = BTreeMap::new();
        // A tenant key: its own (stamp has already overwritten the body).
        assert_eq!(admitted_as(Some(&me), &none), Some(("ten_me", true)));
        // The operator naming a tenant (how rounds make a tenant's
        // sandboxes): that tenant's limit, a name that may be a label.
        let op = Principal::Operator;
        assert_eq!(admitted_as(Some(&op), &named), Some(("ten_b", false)));
        assert_eq!(admitted_as(None, &named), Some(("ten_b", false)));
        assert_eq!(admitted_as(Some(&op), &none), None);
    }
}
