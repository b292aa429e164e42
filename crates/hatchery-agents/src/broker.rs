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

#[cfg(test)]
mod tests {
    use super::*;

    fn args(argv: &[&str]) -> DaemonArgs {
        let argv = std::iter::once("hatcheryd").chain(argv.iter().copied());
        match hatchery_config::parse(argv.map(Into::into).collect()).unwrap() {
            hatchery_config::Invocation::Run(a) => *a,
            _ => panic!("not a run"),
        }
    }

    #[test]
    fn the_broker_socket_is_a_host_service_unless_its_port_is_0() {
        let data = Path::new("/var/lib/hatchery");
        assert!(host_service(&args(&["--broker-guest-port", "0"]), data).is_none());
        let svc = host_service(&args(&["--broker-guest-port", "7070"]), data).unwrap();
        assert_eq!((svc.name.as_str(), svc.guest_port), ("broker", 7070));
        assert!(matches!(svc.identity, hatchery_core::Identity::HttpHeader));
        match svc.addr {
            hatchery_core::HostAddr::Unix(p) => assert!(p.starts_with(data), "{p:?}"),
            other => panic!("not a socket in the data dir: {other:?}"),
        }
    }
}
