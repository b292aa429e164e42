//! E2B's shapes to the core's and back: network rules, processes, code
//! contexts, exec parameters. Pure functions, no I/O.

use hatchery_core::exec::ExecParams;
use hatchery_e2b::backend::{ContextView, Dest, FileEntry, NetworkSpec, ProcView};
use hatchery_net::policy::{Egress, Rule};
use std::collections::BTreeMap;
use std::time::Duration;

/// E2B's `network`, checked at the edge into addresses and host names,
/// as a core network policy.
pub fn policy(n: NetworkSpec) -> hatchery_net::Policy {
    let rule = |d: Dest| match d {
        Dest::Net { addr, prefix } => Rule {
            cidr: Some(format!("{addr}/{prefix}")),
            host: None,
            ports: vec![],
        },
        Dest::Host(h) => Rule {
            cidr: None,
            host: Some(h),
            ports: vec![],
        },
    };
    hatchery_net::Policy {
        egress: if n.allow_all {
            Egress::Allow
        } else {
            Egress::Deny
        },
        allow: n.allow.into_iter().map(rule).collect(),
        deny: n.deny.into_iter().map(rule).collect(),
    }
}

/// The agent's name for why a process ended (`exited`, `killed`, ...),
/// as its wire form.
fn end_reason_name(r: hatchery_agent_proto::EndReason) -> Option<String> {
    serde_json::to_value(r)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
}

pub fn proc_view(p: hatchery_agent_proto::ProcInfo) -> ProcView {
    ProcView {
        id: p.id,
        // The agent reports -1 for a process that never started.
        pid: p.pid.max(0) as u32,
        argv: p.argv,
        running: p.running,
        exit_code: p.exit_code,
        reason: p.reason.and_then(end_reason_name),
        stdin_open: p.stdin_open,
    }
}

/// Why a code cell ended; `exited` if the agent's reason has no name.
pub fn reason(r: hatchery_agent_proto::EndReason) -> String {
    end_reason_name(r).unwrap_or_else(|| "exited".into())
}

pub fn context_view(c: hatchery_agent_proto::ContextInfo) -> ContextView {
    ContextView {
        id: c.id,
        language: c.language,
        cwd: c.cwd,
    }
}

pub fn file_entry(e: hatchery_agent_proto::FileEntry) -> FileEntry {
    FileEntry {
        name: e.name,
        kind: e.kind,
        size: e.size,
        mode: e.mode,
        mtime: e.mtime,
    }
}

/// An exec as E2B runs it: in the guest's default directory, without CPU
/// limits of its own.
pub fn exec_params(
    argv: Vec<String>,
    env: BTreeMap<String, String>,
    stdin: Option<String>,
    timeout: Duration,
    max_output_bytes: u64,
) -> ExecParams {
    ExecParams {
        argv,
        cwd: None,
        env,
        stdin,
        timeout,
        max_output_bytes,
        cpu_limit_ms: None,
        cpu_basis: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_rules_keep_addresses_and_host_names_apart() {
        let p = policy(NetworkSpec {
            allow_all: false,
            allow: vec![
                Dest::Net {
                    addr: "10.1.2.3".parse().unwrap(),
                    prefix: 32,
                },
                Dest::Net {
                    addr: "192.168.0.0".parse().unwrap(),
                    prefix: 16,
                },
            ],
            deny: vec![Dest::Host("example.com".into())],
        });
        assert_eq!(p.egress, Egress::Deny);
        assert_eq!(p.allow[0].cidr.as_deref(), Some("10.1.2.3/32"));
        assert_eq!(p.allow[1].cidr.as_deref(), Some("192.168.0.0/16"));
        assert_eq!(p.deny[0].host.as_deref(), Some("example.com"));
        assert!(p.deny[0].cidr.is_none());
        let open = policy(NetworkSpec {
            allow_all: true,
            ..Default::default()
        });
        assert_eq!(open.egress, Egress::Allow);
        assert!(open.allow.is_empty() && open.deny.is_empty());
    }

    #[test]
    fn the_edge_cap_is_the_cores() {
        // An accepted E2B list must never be refused by the core's default.
        assert_eq!(
            hatchery_e2b::network::MAX_ENTRIES,
            hatchery_net::PolicyLimits::default().max_rules
        );
    }

    #[test]
    fn processes_and_cells_end_with_the_agents_reason_names() {
        use hatchery_agent_proto::{EndReason, ProcInfo};
        let p = proc_view(ProcInfo {
            id: "p1".into(),
            pid: -1,
            reason: Some(EndReason::OutputLimit),
            ..Default::default()
        });
        assert_eq!(p.pid, 0);
        assert_eq!(p.reason.as_deref(), Some("output_limit"));
        let running = proc_view(ProcInfo {
            pid: 42,
            running: true,
            ..Default::default()
        });
        assert_eq!((running.pid, running.reason), (42, None));
        assert_eq!(reason(EndReason::Timeout), "timeout");
        assert_eq!(reason(EndReason::Exited), "exited");
    }
}
