//! The tenant routes' OpenAPI fragment; hatchery-api merges it into the
//! daemon's document (and its snapshot, docs/openapi.json).

use crate::http::{self, ErrorBody, ErrorDetail, KeyList, TenantList};
use crate::model::{CreatedKey, Limits, NewTenant, Tenant, TenantKey, TenantPatch};
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    paths(
        http::create,
        http::list,
        http::read,
        http::update,
        http::remove,
        http::create_key,
        http::list_keys,
        http::revoke_key
    ),
    components(schemas(
        NewTenant,
        TenantPatch,
        Tenant,
        Limits,
        TenantKey,
        CreatedKey,
        TenantList,
        KeyList,
        ErrorBody,
        ErrorDetail
    ))
)]
pub struct TenantApiDoc;
