//! The policy routes' OpenAPI fragment; hatchery-api merges it into the
//! daemon's document (and its snapshot, docs/openapi.json).

use crate::document::*;
use crate::http::{self, ErrorBody, ErrorDetail, PolicyList};
use crate::store::{PolicySummary, StoredPolicy};
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    paths(
        http::create,
        http::add_version,
        http::list,
        http::latest,
        http::version
    ),
    components(schemas(
        PolicyDocument,
        Rule,
        crate::credential::CredentialBinding,
        crate::credential::Injection,
        crate::credential::Scheme,
        Effect,
        Match,
        ArgCondition,
        NumberCondition,
        Op,
        StoredPolicy,
        PolicySummary,
        PolicyList,
        ErrorBody,
        ErrorDetail
    ))
)]
pub struct PolicyApiDoc;
