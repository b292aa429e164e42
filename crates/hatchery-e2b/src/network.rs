//! E2B's egress options, at create (`allow_internet_access`, `network`)
//! and on `PUT /sandboxes/{id}/network`, checked at the edge into a typed
//! [`NetworkSpec`]: every entry parsed, the lists capped, and the options
//! Hatchery cannot honour refused by name, so a bad request is a 400
//! before anything is created.

use crate::api_error::{ApiError, ApiResult};
use crate::backend::{Dest, NetworkSpec};
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::net::Ipv4Addr;

/// Entries per list (`allowOut`, `denyOut`): the core's default rule cap
/// per list, so an accepted list is never refused further in.
pub const MAX_ENTRIES: usize = 64;
/// E2B's own cap on `dnsServers`.
pub const MAX_DNS_SERVERS: usize = 10;

#[derive(Deserialize, Default, Clone)]
#[serde(rename_all = "camelCase")]
pub struct NetworkBody {
    #[serde(default)]
    pub(crate) allow_out: Vec<String>,
    #[serde(default)]
    pub(crate) deny_out: Vec<String>,
    pub(crate) dns_servers: Option<Vec<String>>,
    /// Header transforms per host ([`header_rules`]).
    #[serde(default)]
    pub(crate) rules: Option<Value>,
    #[serde(rename = "allow_internet_access")]
    pub(crate) allow_internet_access: Option<bool>,
    #[serde(flatten)]
    pub(crate) rest: BTreeMap<String, Value>,
}

/// Options that need something Hatchery does not have are refused, not
/// silently dropped. `null`, `false` and empty values are fine.
pub(crate) fn refuse_unsupported(rest: &BTreeMap<String, Value>, what: &str) -> ApiResult<()> {
    for (k, v) in rest {
        let empty = match v {
            Value::Null | Value::Bool(false) => true,
            Value::Array(a) => a.is_empty(),
            Value::Object(o) => o.is_empty(),
            Value::String(s) => s.is_empty(),
            _ => false,
        };
        // allowPublicTraffic is what Hatchery does anyway (ports are
        // reached with the key only).
        let harmless = matches!(k.as_str(), "allowPublicTraffic");
        if !empty && !harmless {
            return Err(ApiError::bad(format!(
                "{what} option {k:?} is not supported by Hatchery (see docs/e2b.md)"
            )));
        }
    }
    Ok(())
}

/// `network.rules` on `PUT /sandboxes/{id}/network`: E2B replaces the
/// header transforms there. Hatchery stores a sandbox's header values
/// sealed at create and binds them once; changing them on a running
/// sandbox is refused by name (an update without `rules` keeps them).
pub(crate) fn refuse_rules_update(n: &NetworkBody) -> ApiResult<()> {
    let empty = match &n.rules {
        None | Some(Value::Null) => true,
        Some(Value::Object(o)) => o.is_empty(),
        Some(_) => false,
    };
    if empty {
        return Ok(());
    }
    Err(ApiError::bad(
        "network option \"rules\" (header transforms) cannot be changed on a running sandbox \
         by Hatchery: set them when the sandbox is created (see docs/e2b.md)",
    ))
}

/// The header transforms of a create's `network` (none when absent).
pub fn header_rules(n: Option<&NetworkBody>) -> ApiResult<Vec<crate::header_rules::HeaderRule>> {
    crate::header_rules::parse(n.and_then(|n| n.rules.as_ref()))
}

/// One `allowOut` / `denyOut` / `dnsServers` entry. `hosts`: whether a
/// host name is allowed here (E2B takes them in `allowOut` only).
fn parse_entry(field: &str, e: &str, hosts: bool) -> ApiResult<Dest> {
    let bad = |why: &str| ApiError::bad(format!("network.{field} entry {e:?} {why}"));
    if e.contains(':') {
        return Err(bad("is IPv6: Hatchery sandboxes have IPv4 egress only"));
    }
    let (a, prefix) = match e.split_once('/') {
        Some((a, p)) => match p.parse::<u8>() {
            Ok(n) if n <= 32 && p.bytes().all(|b| b.is_ascii_digit()) => (a, Some(n)),
            _ => return Err(bad("is not a valid CIDR block (prefix 0 to 32)")),
        },
        None => (e, None),
    };
    if let Ok(addr) = a.parse::<Ipv4Addr>() {
        return Ok(Dest::Net {
            addr,
            prefix: prefix.unwrap_or(32),
        });
    }
    if prefix.is_some() || a.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(bad("is not a valid IPv4 address or CIDR block"));
    }
    if !hosts {
        return Err(bad(
            "is a host name: E2B takes only CIDR blocks and IP addresses here",
        ));
    }
    if e.starts_with("*.") {
        return Err(bad(
            "is a wildcard: Hatchery resolves and pins each allowed host name, so it needs \
             exact names",
        ));
    }
    if !crate::host_name::is_dns_name(e) {
        return Err(bad("is not a valid host name, IPv4 address or CIDR block"));
    }
    Ok(Dest::Host(e.to_ascii_lowercase()))
}

fn parse_list(field: &str, v: &[String], hosts: bool, cap: usize) -> ApiResult<Vec<Dest>> {
    if v.len() > cap {
        return Err(ApiError::bad(format!(
            "network.{field} has {} entries; at most {cap} are allowed",
            v.len()
        )));
    }
    v.iter().map(|e| parse_entry(field, e, hosts)).collect()
}

fn net_range(addr: Ipv4Addr, prefix: u8) -> (u32, u32) {
    let mask = if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix)
    };
    let lo = u32::from(addr) & mask;
    (lo, lo | !mask)
}

fn overlap(a: &Dest, b: &Dest) -> bool {
    match (a, b) {
        (
            Dest::Net {
                addr: a,
                prefix: pa,
            },
            Dest::Net {
                addr: b,
                prefix: pb,
            },
        ) => {
            let (a0, a1) = net_range(*a, *pa);
            let (b0, b1) = net_range(*b, *pb);
            a0 <= b1 && b0 <= a1
        }
        _ => false,
    }
}

/// The egress policy E2B's options ask for; `None`: none given (the
/// backend's default stays).
pub fn network_spec(
    allow_internet: Option<bool>,
    n: Option<&NetworkBody>,
) -> ApiResult<Option<NetworkSpec>> {
    let empty = NetworkBody::default();
    let n = n.unwrap_or(&empty);
    refuse_unsupported(&n.rest, "network")?;
    let mut allow = parse_list("allowOut", &n.allow_out, true, MAX_ENTRIES)?;
    let deny = parse_list("denyOut", &n.deny_out, false, MAX_ENTRIES)?;
    let dns = parse_list(
        "dnsServers",
        n.dns_servers.as_deref().unwrap_or_default(),
        false,
        MAX_DNS_SERVERS,
    )?;
    if let Some(d) = dns
        .iter()
        .find(|d| !matches!(d, Dest::Net { prefix: 32, .. }))
    {
        return Err(ApiError::bad(format!(
            "network.dnsServers entry \"{d}\" is not a single IPv4 address"
        )));
    }
    let allow_internet = allow_internet.or(n.allow_internet_access);
    if allow_internet.is_none() && allow.is_empty() && deny.is_empty() {
        return Ok(None);
    }
    // `allow_internet_access: false` is E2B's `denyOut: ["0.0.0.0/0"]`
    // (the SDKs' `all_traffic`), or any other /0.
    let deny_all = allow_internet == Some(false)
        || deny
            .iter()
            .any(|d| matches!(d, Dest::Net { prefix: 0, .. }));
    if deny_all {
        // With everything denied, the other deny entries add nothing, and
        // the allow list is what gets out (E2B's allow wins).
        if allow.iter().any(|d| matches!(d, Dest::Host(_))) {
            // E2B opens its DNS servers (8.8.8.8 unless told) when a host
            // is allowed; Hatchery resolves hosts itself, so only the
            // servers named here are opened.
            allow.extend(dns);
            // They become allow rules, under the same cap.
            if allow.len() > MAX_ENTRIES {
                return Err(ApiError::bad(format!(
                    "network.allowOut and network.dnsServers have {} entries together; at \
                     most {MAX_ENTRIES} are allowed",
                    allow.len()
                )));
            }
        }
        return Ok(Some(NetworkSpec {
            allow_all: false,
            allow,
            deny: vec![],
        }));
    }
    // Everything else is open: an allow entry matters only where a deny
    // entry covers it, and there E2B's allow wins, while a firewall that
    // checks deny first would not let it through. Refused rather than
    // answered differently.
    for a in &allow {
        if let Some(d) = deny.iter().find(|d| overlap(a, d)) {
            return Err(ApiError::bad(format!(
                "network.allowOut entry \"{a}\" overlaps network.denyOut entry \"{d}\": \
                 Hatchery applies such an exception only when all other traffic is denied \
                 (denyOut [\"0.0.0.0/0\"] or allow_internet_access false)"
            )));
        }
    }
    Ok(Some(NetworkSpec {
        allow_all: true,
        allow,
        deny,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(allow: &[&str], deny: &[&str]) -> NetworkBody {
        NetworkBody {
            allow_out: allow.iter().map(|s| s.to_string()).collect(),
            deny_out: deny.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    fn net(a: &str, prefix: u8) -> Dest {
        Dest::Net {
            addr: a.parse().unwrap(),
            prefix,
        }
    }

    fn msg(r: ApiResult<Option<NetworkSpec>>) -> String {
        match r {
            Err(e) => {
                assert_eq!(e.status, 400);
                e.message
            }
            Ok(s) => panic!("accepted: {s:?}"),
        }
    }

    #[test]
    fn nothing_given_keeps_the_default() {
        assert_eq!(network_spec(None, None).unwrap(), None);
        assert_eq!(
            network_spec(None, Some(&NetworkBody::default())).unwrap(),
            None
        );
    }

    #[test]
    fn internet_off_is_deny_all_with_the_allow_list_as_exceptions() {
        let off = network_spec(Some(false), None).unwrap().unwrap();
        assert!(!off.allow_all && off.allow.is_empty() && off.deny.is_empty());
        let s = network_spec(
            None,
            Some(&body(
                &["1.1.1.1/32", "pypi.example"],
                &["0.0.0.0/0", "8.8.8.8"],
            )),
        )
        .unwrap()
        .unwrap();
        assert!(!s.allow_all);
        assert_eq!(
            s.allow,
            vec![net("1.1.1.1", 32), Dest::Host("pypi.example".into())]
        );
        assert!(s.deny.is_empty());
        let s = network_spec(None, Some(&body(&["1.1.1.1"], &["10.0.0.0/0"])))
            .unwrap()
            .unwrap();
        assert!(!s.allow_all && s.deny.is_empty());
        // Inside the update body too.
        let mut b = body(&["1.1.1.1"], &[]);
        b.allow_internet_access = Some(false);
        let s = network_spec(None, Some(&b)).unwrap().unwrap();
        assert!(!s.allow_all);
        assert_eq!(s.allow, vec![net("1.1.1.1", 32)]);
    }

    #[test]
    fn deny_entries_alone_leave_the_rest_open() {
        let s = network_spec(None, Some(&body(&[], &["198.19.0.0/24", "203.0.113.9"])))
            .unwrap()
            .unwrap();
        assert!(s.allow_all);
        assert_eq!(s.deny, vec![net("198.19.0.0", 24), net("203.0.113.9", 32)]);
    }

    #[test]
    fn an_allow_inside_a_deny_needs_deny_all() {
        let m = msg(network_spec(
            None,
            Some(&body(&["198.19.0.6"], &["198.19.0.0/24"])),
        ));
        assert!(m.contains("overlaps") && m.contains("198.19.0.6/32"), "{m}");
        // Disjoint ones are fine, and so is a host (resolved later).
        let s = network_spec(
            None,
            Some(&body(&["198.19.1.6", "a.example"], &["198.19.0.0/24"])),
        )
        .unwrap()
        .unwrap();
        assert!(s.allow_all && s.allow.len() == 2);
    }

    #[test]
    fn bad_entries_are_refused_by_name() {
        for (allow, deny, want) in [
            (vec!["1.2.3.4/33"], vec![], "CIDR"),
            (vec!["1.2.3.4/x"], vec![], "CIDR"),
            (vec!["1.2.3"], vec![], "IPv4"),
            (vec!["300.1.1.1"], vec![], "IPv4"),
            (vec!["::1"], vec![], "IPv6"),
            (vec!["2001:db8::/32"], vec![], "IPv6"),
            (vec!["*.example.com"], vec![], "wildcard"),
            (vec!["bad_name.example"], vec![], "host name"),
            (vec![""], vec![], "not a valid"),
            (vec!["a..b"], vec![], "host name"),
            (vec![], vec!["example.com"], "host name"),
            (vec![], vec!["10.0.0.0/8/8"], "CIDR"),
        ] {
            let m = msg(network_spec(None, Some(&body(&allow, &deny))));
            assert!(m.contains(want), "{allow:?} {deny:?}: {m}");
            assert!(m.contains("network."), "{m}");
        }
    }

    #[test]
    fn lists_are_capped_at_the_boundary() {
        let at: Vec<String> = (0..MAX_ENTRIES).map(|i| format!("203.0.113.{i}")).collect();
        let over: Vec<String> = (0..=MAX_ENTRIES)
            .map(|i| format!("203.0.113.{i}"))
            .collect();
        for field in ["allowOut", "denyOut"] {
            let mk = |v: &Vec<String>| {
                let mut b = NetworkBody::default();
                if field == "allowOut" {
                    b.allow_out = v.clone();
                    b.allow_internet_access = Some(false);
                } else {
                    b.deny_out = v.clone();
                }
                b
            };
            assert!(network_spec(None, Some(&mk(&at))).is_ok());
            let m = msg(network_spec(None, Some(&mk(&over))));
            assert!(
                m.contains(&format!("network.{field} has 65 entries; at most 64")),
                "{m}"
            );
        }
        let mut b = body(&["pypi.example"], &["0.0.0.0/0"]);
        b.dns_servers = Some(
            (0..MAX_DNS_SERVERS)
                .map(|i| format!("192.0.2.{i}"))
                .collect(),
        );
        assert_eq!(
            network_spec(None, Some(&b)).unwrap().unwrap().allow.len(),
            11
        );
        b.dns_servers.as_mut().unwrap().push("192.0.2.99".into());
        assert!(msg(network_spec(None, Some(&b))).contains("dnsServers has 11"));
        let mut full = body(&[], &["0.0.0.0/0"]);
        full.allow_out = (0..MAX_ENTRIES - 1)
            .map(|i| format!("203.0.113.{i}"))
            .collect();
        full.allow_out.push("pypi.example".into());
        full.dns_servers = Some(vec!["192.0.2.1".into()]);
        let m = msg(network_spec(None, Some(&full)));
        assert!(m.contains("have 65 entries together"), "{m}");
        b.dns_servers = Some(vec!["192.0.2.0/24".into()]);
        assert!(msg(network_spec(None, Some(&b))).contains("single IPv4"));
    }

    #[test]
    fn dns_servers_open_only_with_an_allowed_host() {
        let mut b = body(&["1.1.1.1"], &["0.0.0.0/0"]);
        b.dns_servers = Some(vec!["192.0.2.53".into()]);
        let s = network_spec(None, Some(&b)).unwrap().unwrap();
        assert_eq!(s.allow, vec![net("1.1.1.1", 32)]);
        b.allow_out.push("pypi.example".into());
        let s = network_spec(None, Some(&b)).unwrap().unwrap();
        assert_eq!(s.allow.last(), Some(&net("192.0.2.53", 32)));
    }

    #[test]
    fn header_transforms_are_parsed_apart_and_other_options_refused_by_name() {
        let rules: NetworkBody = serde_json::from_value(serde_json::json!({
            "allowOut": ["api.example.com"],
            "rules": {"api.example.com": [{"transform": {"headers": {"Authorization": "Bearer x"}}}]}
        }))
        .unwrap();
        // The egress spec is the lists alone; the rules are their own.
        assert!(network_spec(None, Some(&rules)).unwrap().is_some());
        let r = header_rules(Some(&rules)).unwrap();
        assert_eq!(r[0].host, "api.example.com");
        // Not on an update.
        let m = refuse_rules_update(&rules).unwrap_err().message;
        assert!(
            m.contains("\"rules\" (header transforms) cannot be changed"),
            "{m}"
        );
        for (k, v) in [
            (
                "egressProxy",
                serde_json::json!({"address": "p.example:1080"}),
            ),
            ("maskRequestHost", serde_json::json!("${PORT}-x.example")),
            ("httpsPorts", serde_json::json!([3000])),
        ] {
            let b: NetworkBody = serde_json::from_value(serde_json::json!({ k: v })).unwrap();
            let m = msg(network_spec(None, Some(&b)));
            assert!(m.contains(&format!("{k:?} is not supported")), "{m}");
        }
        // Empty or null values, and allowPublicTraffic, are accepted.
        let ok: NetworkBody = serde_json::from_value(serde_json::json!({
            "rules": {}, "egressProxy": null, "httpsPorts": [], "allowPublicTraffic": false
        }))
        .unwrap();
        assert_eq!(network_spec(None, Some(&ok)).unwrap(), None);
        assert!(refuse_rules_update(&ok).is_ok());
        assert!(header_rules(Some(&ok)).unwrap().is_empty());
    }
}
