//! Where the control role sends a create (a sandbox, a snapshot's fork, a
//! session). Among live hosts with room, in this order:
//!
//! 1. a host with a warm checkpoint of the template (it restores one in
//!    milliseconds; another host would bake it first, which takes seconds);
//!    for a fork of a shared snapshot, a host with forks of it parked in
//!    its warm pool (a claim takes 1-2 ms; a restore about 200); for a
//!    session from an environment, the same for the snapshot of the
//!    environment's current version (a pooled start is about 150 ms, a
//!    restore about 350);
//!    then, for a snapshot only one host's disk holds (no shared
//!    snapshot store), that host: elsewhere the fork would be served
//!    across hosts; a shared snapshot costs the same restore on every
//!    host, so the rules below decide;
//! 2. the host running the fewest live sandboxes of the same tenant (the
//!    create's `metadata.tenant`), so one tenant's work is spread and the
//!    loss of a host takes only part of it;
//! 3. the most free capacity, then the host id (ties alternate as counts
//!    change rather than by chance).
//!
//! The body is only read here, never changed: the chosen host validates it
//! as any create.

use crate::HostSlot;
use std::collections::BTreeMap;

/// The metadata key that names a tenant.
pub const TENANT_KEY: &str = "tenant";

/// How a host's heartbeat names a snapshot whose warm pool has forks
/// parked there (hatchery-core's pool key).
pub fn snapshot_key(snapshot: &str) -> String {
    format!("snapshot:{snapshot}")
}

/// What placement takes from a create's JSON body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Want {
    /// The template, or for a fork the snapshot's [`snapshot_key`]: the
    /// warm entry that makes a host first.
    pub template: String,
    pub tenant: Option<String>,
    /// The one host whose disk holds the snapshot a session starts from
    /// (set by the control role for an environment's host-local snapshot).
    pub holder: Option<String>,
}

impl Want {
    /// From a create's body (Hatchery's `template`, or E2B's `templateID`);
    /// a body that is not JSON (the host will refuse it) or has no template
    /// asks for `default_template`.
    pub fn of_body(body: &[u8], default_template: &str) -> Want {
        let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
        let template = v["template"]
            .as_str()
            .or_else(|| v["templateID"].as_str())
            .filter(|t| !t.is_empty())
            .unwrap_or(default_template)
            .to_string();
        let tenant = v["metadata"][TENANT_KEY]
            .as_str()
            .filter(|t| !t.is_empty())
            .map(str::to_string);
        Want {
            template,
            tenant,
            holder: None,
        }
    }
}

/// The environment a session's create body starts from (`environment_id`),
/// if any; an empty one is no environment (the host refuses it).
pub fn environment_of(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    v["environment_id"]
        .as_str()
        .filter(|e| !e.is_empty())
        .map(str::to_string)
}

/// Placeable hosts (ready, not cordoned or draining) with room, best first for `want`. `tenant_live` counts the
/// tenant's live sandboxes per host (empty without a tenant).
pub fn rank(
    hosts: Vec<HostSlot>,
    want: &Want,
    tenant_live: &BTreeMap<String, u32>,
) -> Vec<HostSlot> {
    let mut ok: Vec<HostSlot> = hosts
        .into_iter()
        .filter(|h| h.placeable && h.free() > 0)
        .collect();
    ok.sort_by_key(|h| {
        (
            !h.warm.contains(&want.template),
            want.holder.as_ref().is_some_and(|x| *x != h.id),
            tenant_live.get(&h.id).copied().unwrap_or(0),
            std::cmp::Reverse(h.free()),
            h.id.clone(),
        )
    });
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(id: &str, cap: u32, live: u32, warm: &[&str]) -> HostSlot {
        HostSlot {
            id: id.into(),
            url: format!("http://{id}"),
            capacity: cap,
            live,
            alive: true,
            routed: true,
            placeable: true,
            warm: warm.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn ids(v: &[HostSlot]) -> Vec<&str> {
        v.iter().map(|h| h.id.as_str()).collect()
    }

    #[test]
    fn the_body_names_template_and_tenant() {
        let w = Want::of_body(
            br#"{"template":"node","metadata":{"tenant":"acme","x":"1"}}"#,
            "ci",
        );
        assert_eq!(
            w,
            Want {
                template: "node".into(),
                tenant: Some("acme".into()),
                holder: None,
            }
        );
        let w = Want::of_body(br#"{"ttl_seconds":5,"metadata":{"tenant":7}}"#, "ci");
        assert_eq!(
            w,
            Want {
                template: "ci".into(),
                tenant: None,
                holder: None,
            }
        );
        assert_eq!(Want::of_body(b"not json", "ci").template, "ci");
        let e2b = Want::of_body(br#"{"templateID":"node","metadata":{"tenant":"t"}}"#, "ci");
        assert_eq!(
            e2b,
            Want {
                template: "node".into(),
                tenant: Some("t".into()),
                holder: None,
            }
        );
        assert_eq!(Want::of_body(br#"{"template":""}"#, "ci").template, "ci");
    }

    #[test]
    fn a_snapshots_warm_pool_comes_before_free_room_and_the_tie() {
        let want = Want {
            template: snapshot_key("sn1"),
            tenant: None,
            holder: None,
        };
        let hosts = vec![
            slot("a", 10, 0, &["python", "snapshot:sn2"]),
            slot("b", 10, 5, &["snapshot:sn1"]),
        ];
        assert_eq!(
            ids(&rank(hosts.clone(), &want, &BTreeMap::new())),
            ["b", "a"]
        );
        let other = Want {
            template: snapshot_key("sn3"),
            tenant: None,
            holder: None,
        };
        assert_eq!(ids(&rank(hosts, &other, &BTreeMap::new())), ["a", "b"]);
    }

    #[test]
    fn a_session_names_its_environment() {
        assert_eq!(
            environment_of(br#"{"environment_id":"env_1","task":"t"}"#).as_deref(),
            Some("env_1")
        );
        assert_eq!(environment_of(br#"{"repo":"git://x","task":"t"}"#), None);
        assert_eq!(environment_of(br#"{"environment_id":""}"#), None);
        assert_eq!(environment_of(br#"{"environment_id":7}"#), None);
        assert_eq!(environment_of(b"not json"), None);
    }

    #[test]
    fn the_snapshots_holder_comes_after_a_warm_pool_and_before_free_room() {
        let hosts = vec![
            slot("a", 10, 0, &[]),
            slot("b", 10, 7, &[]),
            slot("c", 10, 9, &["snapshot:sn1"]),
        ];
        let mut want = Want {
            template: snapshot_key("sn1"),
            tenant: None,
            holder: Some("b".into()),
        };
        assert_eq!(
            ids(&rank(hosts.clone(), &want, &BTreeMap::new())),
            ["c", "b", "a"]
        );
        want.template = snapshot_key("sn2");
        assert_eq!(
            ids(&rank(hosts.clone(), &want, &BTreeMap::new())),
            ["b", "a", "c"]
        );
        // A shared snapshot (no holder): free room decides among the cold.
        want.holder = None;
        assert_eq!(ids(&rank(hosts, &want, &BTreeMap::new())), ["a", "b", "c"]);
    }

    #[test]
    fn a_warm_checkpoint_comes_before_free_room() {
        let want = Want {
            template: "node".into(),
            tenant: None,
            holder: None,
        };
        let hosts = vec![
            slot("a", 10, 0, &["code-interpreter"]),
            slot("b", 10, 8, &["code-interpreter", "node"]),
            slot("c", 10, 5, &[]),
        ];
        assert_eq!(ids(&rank(hosts, &want, &BTreeMap::new())), ["b", "a", "c"]);
    }

    #[test]
    fn a_tenant_is_spread_among_warm_hosts_before_free_room_counts() {
        let want = Want {
            template: "ci".into(),
            tenant: Some("acme".into()),
            holder: None,
        };
        let hosts = vec![
            slot("a", 10, 1, &["ci"]),
            slot("b", 10, 6, &["ci"]),
            slot("c", 10, 0, &[]),
        ];
        let tenant: BTreeMap<String, u32> = [("a".to_string(), 3), ("b".to_string(), 1)].into();
        assert_eq!(ids(&rank(hosts.clone(), &want, &tenant)), ["b", "a", "c"]);
        // Without the tenant's counts: the most free room among warm hosts.
        assert_eq!(ids(&rank(hosts, &want, &BTreeMap::new())), ["a", "b", "c"]);
    }

    #[test]
    fn full_and_lost_hosts_are_never_chosen() {
        let want = Want {
            template: "ci".into(),
            tenant: None,
            holder: None,
        };
        let mut lost = slot("lost", 10, 0, &["ci"]);
        (lost.alive, lost.routed, lost.placeable) = (false, false, false);
        // Alive and routed, but cordoned (or draining, or starting).
        let mut held = slot("held", 10, 0, &["ci"]);
        held.placeable = false;
        let hosts = vec![
            slot("full", 4, 4, &["ci"]),
            lost,
            held,
            slot("cold", 4, 3, &[]),
        ];
        assert_eq!(ids(&rank(hosts, &want, &BTreeMap::new())), ["cold"]);
    }
}
