//! The sessions part of the OpenAPI document; `tests/openapi_snapshot.rs`
//! pins it to `docs/openapi-sessions.json`.

use crate::error::{ErrorBody, ErrorDetail};
use crate::events::{Actor, Event, EventKind, ToolCallInfo};
use crate::models::*;
use crate::routes;
use crate::state::SessionState;
use crate::store::{AgentSpec, Approval};
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Hatchery sessions API",
        version = "1",
        description = "Agent sessions: a coding agent on a repository, in a sandbox."
    ),
    paths(
        routes::create,
        routes::list,
        routes::get_one,
        routes::cancel,
        routes::message,
        routes::approve,
        routes::events,
        routes::blob,
        crate::policy_move::move_policy,
        crate::model_events::post_model_event,
        crate::broker_events::post_broker_events,
        crate::environment_routes::create,
        crate::environment_routes::list,
        crate::environment_routes::get_one,
        crate::environment_routes::delete,
        crate::environment_routes::build
    ),
    components(schemas(
        CreateSessionBody,
        BudgetBody,
        AgentBody,
        CreatedSession,
        SessionView,
        SessionList,
        Spend,
        StorageView,
        EventPage,
        Event,
        EventKind,
        Actor,
        ToolCallInfo,
        SessionState,
        Approval,
        AgentSpec,
        MessageBody,
        MessageAccepted,
        ApprovalBody,
        ApprovalDecided,
        ErrorBody,
        ErrorDetail,
        crate::policy_move::MovePolicyBody,
        crate::model_events::ModelEvent,
        crate::broker_events::BrokerEvents,
        crate::broker_events::ApprovalRequest,
        crate::broker_events::BrokerEventsWritten,
        crate::environments::models::CreateEnvironment,
        crate::environments::models::EnvSpec,
        crate::environments::models::EnvVersion,
        crate::environments::models::BuildReason,
        crate::environments::models::EnvironmentView,
        crate::environments::models::EnvironmentList,
        crate::store::EnvPin
    ))
)]
pub struct SessionsDoc;

pub fn json() -> String {
    SessionsDoc::openapi().to_pretty_json().unwrap_or_default()
}
