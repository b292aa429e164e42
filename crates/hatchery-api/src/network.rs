//! Wire types of the network policy API, converted to and from the typed
//! policy that `hatchery-net` enforces.

use hatchery_core::{EgressEvent, NetworkPolicy as Policy};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What happens to traffic that no rule matches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum EgressMode {
    #[default]
    Deny,
    Allow,
}

/// One destination: exactly one of `cidr` (IPv4) and `host`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "203.0.113.0/24")]
    pub cidr: Option<String>,
    /// Resolved on the host when the policy is applied; the addresses
    /// found are what is allowed or denied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "pypi.org")]
    pub host: Option<String>,
    /// TCP and UDP destination ports (1..=65535). Empty or absent: every
    /// port and protocol, ICMP included.
    #[serde(default)]
    pub ports: Vec<u16>,
}

/// Egress policy of a sandbox. Always blocked, whatever the policy:
/// 169.254.0.0/16, 10/8, 172.16/12, 192.168/16, 100.64/10, 127/8, 0/8,
/// multicast and reserved ranges, the host itself, other sandboxes, and
/// all IPv6. Then `deny` rules, then `allow` rules, then `egress`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkPolicy {
    #[serde(default)]
    pub egress: EgressMode,
    #[serde(default)]
    pub allow: Vec<NetworkRule>,
    #[serde(default)]
    pub deny: Vec<NetworkRule>,
}

fn rule_in(r: NetworkRule) -> hatchery_net::Rule {
    hatchery_net::Rule {
        cidr: r.cidr,
        host: r.host,
        ports: r.ports,
    }
}

fn rule_out(r: hatchery_net::Rule) -> NetworkRule {
    NetworkRule {
        cidr: r.cidr,
        host: r.host,
        ports: r.ports,
    }
}

impl From<NetworkPolicy> for Policy {
    fn from(p: NetworkPolicy) -> Policy {
        Policy {
            egress: match p.egress {
                EgressMode::Deny => hatchery_net::Egress::Deny,
                EgressMode::Allow => hatchery_net::Egress::Allow,
            },
            allow: p.allow.into_iter().map(rule_in).collect(),
            deny: p.deny.into_iter().map(rule_in).collect(),
        }
    }
}

impl From<Policy> for NetworkPolicy {
    fn from(p: Policy) -> NetworkPolicy {
        NetworkPolicy {
            egress: match p.egress {
                hatchery_net::Egress::Deny => EgressMode::Deny,
                hatchery_net::Egress::Allow => EgressMode::Allow,
            },
            allow: p.allow.into_iter().map(rule_out).collect(),
            deny: p.deny.into_iter().map(rule_out).collect(),
        }
    }
}

/// A denied connection attempt.
#[derive(Debug, Serialize, ToSchema)]
pub struct EgressEventBody {
    /// 1, 2, ... per sandbox in the order logged: `events` holds the last
    /// 256, so the first one's `seq` minus 1 is how many were dropped
    /// from the list (never from enforcement).
    pub seq: u64,
    /// RFC 3339.
    pub time: String,
    /// `tcp`, `udp`, `icmp` or `other`.
    pub protocol: String,
    pub destination: String,
    pub port: Option<u16>,
}

impl From<EgressEvent> for EgressEventBody {
    fn from(e: EgressEvent) -> Self {
        EgressEventBody {
            seq: e.seq,
            time: hatchery_core::rfc3339(e.time_ms),
            protocol: e.protocol,
            destination: e.destination,
            port: e.port,
        }
    }
}

/// Oldest first; the last 256 per sandbox are kept. Attempts are logged at
/// most 20 per second per sandbox (burst 40); the rest are still blocked.
#[derive(Debug, Serialize, ToSchema)]
pub struct EgressEventList {
    pub events: Vec<EgressEventBody>,
    /// Every new connection the sandbox's policy refused since it got its
    /// network slot, logged or not (the slot's nftables counter): exact,
    /// where `events` is rate-limited. Absent when networking is off or
    /// the slot has no counter (made by an older daemon).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub denied_total: Option<u64>,
}
