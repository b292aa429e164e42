//! The hosts API's OpenAPI document (`tests/openapi_snapshot.rs` pins it
//! to docs/openapi-hosts.json).

use crate::api;
use crate::api_error::{ErrorBody, ErrorDetail};
use crate::readiness::{Check, Readiness};
use crate::view::{Host, HostList};
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Hatchery hosts API",
        version = "1",
        description = "The hosts sharing one state store: list, cordon, drain; and every role's readiness."
    ),
    paths(
        api::list,
        api::get_one,
        api::cordon,
        api::uncordon,
        api::drain,
        crate::readiness::readyz
    ),
    components(schemas(Host, HostList, ErrorBody, ErrorDetail, Readiness, Check))
)]
pub struct HostsApiDoc;

pub fn json() -> String {
    HostsApiDoc::openapi()
        .to_pretty_json()
        .unwrap_or_else(|_| "{}".into())
}
