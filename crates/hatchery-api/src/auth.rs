use crate::{ApiError, AppState};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;
use hatchery_tenants::Principal;

/// Bearer-key check for everything but /healthz: the deployment's key is
/// the operator; a tenant's key (hatchery-tenants) is that tenant, and
/// reaches only what [`crate::scope`] lets it. The caller's
/// [`Principal`] goes into the request's extensions for the handlers.
/// The operator comparison does not stop at the first differing byte, so
/// timing does not leak the key; a tenant key is looked up by its hash.
pub async fn require_key(
    State(st): State<AppState>,
    mut req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let given = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    let principal =
        if hatchery_serve::headers::constant_time_eq(given.as_bytes(), st.api_key.as_bytes()) {
            Principal::Operator
        } else {
            match st.tenants.resolve(given).await {
                Ok(Some(p)) => p,
                Ok(None) => return Err(unauthorized()),
                Err(e) => return Err(crate::scope::store_failed(e)),
            }
        };
    if let Principal::Tenant(t) = &principal {
        crate::scope::check(&st, t, req.method(), req.uri().path()).await?;
    }
    req.extensions_mut().insert(principal);
    Ok(next.run(req).await)
}

fn unauthorized() -> ApiError {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "missing or wrong API key",
    )
}
