//! The secrets routes' OpenAPI fragment; hatchery-api merges it into the
//! daemon's document (and its snapshot, docs/openapi.json).

use crate::http::{self, CreateSecret, SecretList};
use crate::store::SecretInfo;
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    paths(http::create, http::list, http::remove),
    components(schemas(CreateSecret, SecretInfo, SecretList))
)]
pub struct SecretsApiDoc;
