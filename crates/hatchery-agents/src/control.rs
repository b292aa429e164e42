//! The agent platform's parts on the control role (`--role control`): the
//! model gateway and the tool broker for every host's sandboxes, their
//! events posted to each session's owning host.

pub use crate::gateway::start_control as gateway;

use crate::AgentsError;
use hatchery_config::DaemonArgs;
use hatchery_sessions::owner_post::OwnerPost;
use std::sync::Arc;

/// The tool broker for all hosts, when `--broker-for-hosts` asks for it.
pub async fn broker(
    args: &DaemonArgs,
    (data, db): (&std::path::Path, &hatchery_db::Db),
    keys: (&str, &str),
    registry: &prometheus::Registry,
    (sessions, policies): (
        Arc<dyn hatchery_sessions::store::SessionStore>,
        Arc<dyn hatchery_policy::PolicyStore>,
    ),
    post: OwnerPost,
) -> Result<Option<axum::Router>, AgentsError> {
    if !args.broker.for_hosts {
        return Ok(None);
    }
    let s = crate::broker::settings(args, (data, db), keys, registry);
    Ok(Some(
        hatchery_broker::embed::start_control(&s, sessions, post, policies).await?,
    ))
}
