//! The tool broker (hatchery-broker's `embed`): its settings from the
//! configuration, and the `broker` host service every sandbox reaches at
//! 127.0.0.1:GUEST_PORT.

use hatchery_config::DaemonArgs;
use std::path::Path;

pub fn settings<'a>(
    args: &'a DaemonArgs,
    (data, db): (&'a Path, &'a hatchery_db::Db),
    (api_key, daemon_key): (&'a str, &'a str),
    registry: &'a prometheus::Registry,
) -> hatchery_broker::embed::Settings<'a> {
    hatchery_broker::embed::Settings {
        broker: &args.broker,
        max_open_approvals: args.sessions.max_open_approvals,
        listen: args.listen,
        api_key,
        daemon_key,
        host_id: &args.host_id,
        data,
        db,
        registry,
    }
}

/// The host service, registered before sandboxes are re-adopted.
pub fn host_service(args: &DaemonArgs, data: &Path) -> Option<hatchery_core::HostService> {
    (args.broker.guest_port != 0).then(|| hatchery_core::HostService {
        name: "broker".into(),
        guest_port: args.broker.guest_port,
        addr: hatchery_core::HostAddr::Unix(hatchery_broker::embed::socket_path(data)),
        identity: hatchery_core::Identity::HttpHeader,
    })
}
