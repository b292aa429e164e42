//! The daemon's nftables table, as scripts applied atomically by one
//! `nft -f -` each.
//!
//! Layout (table `inet hatchery_<prefix>`):
//! - `forward`: packets from a slot's host veth jump to that slot's chain
//!   through the `slots` verdict map; unknown slots are dropped (fail
//!   closed). Packets *to* a slot pass only as replies.
//! - `input`: a sandbox may not talk to the host itself (any of its
//!   addresses, so also the daemon's port): denied and logged.
//! - `s<i>`: the slot's compiled policy. Evaluated for every packet, not
//!   only new connections, so removing an allow cuts open connections.
//! - `d<i>`: the slot's deny action: the named counter `c<i>` of refused
//!   new connections (exact, where the log is not), a rate-limited kernel
//!   log line (turned into egress events), then TCP reset or ICMP
//!   admin-prohibited, so the guest fails fast instead of hanging.
//! - `postrouting`: allowed traffic is masqueraded behind the host.

use crate::policy::{Compiled, ALWAYS_BLOCKED};
use crate::{Cidr, Egress, NetError, SlotAddrs};

/// Kernel log prefix of denied attempts; the slot is in the `IN=` field.
pub const LOG_TAG: &str = "hxdeny";

#[derive(Debug, Clone)]
pub struct Table {
    pub name: String,
    prefix: String,
    range: Cidr,
    /// Drop forwarded traffic that is not ours: set when the daemon had to
    /// turn IPv4 forwarding on, so the host does not start routing for
    /// anyone else.
    guard_forward: bool,
}

impl Table {
    pub fn new(prefix: &str, range: Cidr, guard_forward: bool) -> Table {
        Table {
            name: format!("hatchery_{prefix}"),
            prefix: prefix.to_string(),
            range,
            guard_forward,
        }
    }

    fn t(&self) -> String {
        format!("inet {}", self.name)
    }

    fn if_glob(&self) -> String {
        format!("\"{}*\"", crate::addr::host_if_prefix(&self.prefix))
    }

    pub fn log_prefix(&self) -> String {
        format!("{LOG_TAG}:{} ", self.prefix)
    }

    /// Replaces the whole table in one transaction; `slots` get their
    /// chains and policies in the same transaction, so there is no moment
    /// when a live slot is unfiltered.
    pub fn rebuild_script(&self, slots: &[(SlotAddrs, SlotRules)]) -> String {
        let t = self.t();
        let g = self.if_glob();
        let mut s = format!("add table {t}\ndelete table {t}\nadd table {t}\n");
        let mut blocked: Vec<String> = ALWAYS_BLOCKED.iter().map(|c| c.to_string()).collect();
        blocked.push(self.range.to_string());
        s += &format!(
            "add set {t} blocked {{ type ipv4_addr ; flags interval ; auto-merge ; elements = {{ {} }} ; }}\n",
            blocked.join(", ")
        );
        s += &format!("add map {t} slots {{ type ifname : verdict ; }}\n");
        s += &format!("add map {t} slots_in {{ type ifname : verdict ; }}\n");
        s += &format!(
            "add chain {t} forward {{ type filter hook forward priority 0 ; policy accept ; }}\n"
        );
        s += &format!("add rule {t} forward iifname vmap @slots\n");
        s += &format!("add rule {t} forward iifname {g} drop\n");
        s += &format!("add rule {t} forward oifname {g} ct state established,related accept\n");
        s += &format!("add rule {t} forward oifname {g} drop\n");
        if self.guard_forward {
            // Not "everything but ours": another daemon's table must not
            // cut this one's slots, nor this one theirs.
            let any = format!("\"{}*\"", crate::addr::HOST_IF_MARK);
            s += &format!("add rule {t} forward iifname != {any} oifname != {any} drop\n");
        }
        s += &format!(
            "add chain {t} input {{ type filter hook input priority 0 ; policy accept ; }}\n"
        );
        s += &format!("add rule {t} input iifname vmap @slots_in\n");
        s += &format!("add rule {t} input iifname {g} drop\n");
        s += &format!(
            "add chain {t} postrouting {{ type nat hook postrouting priority 100 ; policy accept ; }}\n"
        );
        s += &format!(
            "add rule {t} postrouting ip saddr {} oifname != {g} masquerade\n",
            self.range
        );
        for (slot, rules) in slots {
            s += &self.add_slot_script(slot, rules);
        }
        s
    }

    pub fn delete_script(&self) -> String {
        format!("add table {t}\ndelete table {t}\n", t = self.t())
    }

    /// Creates the slot's chains and map entries with `rules`.
    pub fn add_slot_script(&self, slot: &SlotAddrs, rules: &SlotRules) -> String {
        let t = self.t();
        let i = slot.index;
        let mut s = format!("add counter {t} c{i}\nadd chain {t} s{i}\nadd chain {t} d{i}\n");
        s += &self.deny_chain(slot);
        s += &self.policy_chain(slot, rules);
        s += &format!(
            "add element {t} slots {{ \"{h}\" : jump s{i} }}\nadd element {t} slots_in {{ \"{h}\" : jump d{i} }}\n",
            h = slot.host_if
        );
        s
    }

    /// Swaps the slot's policy atomically.
    pub fn set_policy_script(&self, slot: &SlotAddrs, rules: &SlotRules) -> String {
        self.policy_chain(slot, rules)
    }

    /// A released slot back to default deny, its refusal counter at 0 for
    /// its next owner.
    pub fn scrub_script(&self, slot: &SlotAddrs) -> String {
        format!(
            "{}reset counter {} c{}\n",
            self.policy_chain(slot, &SlotRules::default()),
            self.t(),
            slot.index
        )
    }

    /// `nft` arguments that print slot `i`'s refusal counter as JSON
    /// (read by [`parse_counter`]).
    pub fn counter_args(&self, i: u32) -> Vec<String> {
        vec![
            "-j".into(),
            "list".into(),
            "counter".into(),
            "inet".into(),
            self.name.clone(),
            format!("c{i}"),
        ]
    }

    pub fn remove_slot_script(&self, slot: &SlotAddrs) -> String {
        let t = self.t();
        let i = slot.index;
        format!(
            "delete element {t} slots {{ \"{h}\" }}\ndelete element {t} slots_in {{ \"{h}\" }}\nflush chain {t} s{i}\nflush chain {t} d{i}\ndelete chain {t} s{i}\ndelete chain {t} d{i}\ndelete counter {t} c{i}\n",
            h = slot.host_if
        )
    }

    fn deny_chain(&self, slot: &SlotAddrs) -> String {
        let t = self.t();
        let i = slot.index;
        format!(
            "flush chain {t} d{i}\n\
             add rule {t} d{i} ct state new counter name \"c{i}\" limit rate 20/second burst 40 packets log prefix \"{p}\" level info\n\
             add rule {t} d{i} meta l4proto tcp reject with tcp reset\n\
             add rule {t} d{i} reject with icmpx admin-prohibited\n",
            p = self.log_prefix()
        )
    }

    fn policy_chain(&self, slot: &SlotAddrs, rules: &SlotRules) -> String {
        let t = self.t();
        let i = slot.index;
        let mut s = format!("flush chain {t} s{i}\n");
        // Anti-spoofing: only the slot's own address may send.
        s += &format!(
            "add rule {t} s{i} ip saddr != {} jump d{i}\n",
            slot.guest_ip
        );
        s += &format!("add rule {t} s{i} meta nfproto ipv6 jump d{i}\n");
        s += &format!("add rule {t} s{i} ip daddr @blocked jump d{i}\n");
        for r in &rules.deny {
            s += &rule_line(&t, i, r, &format!("jump d{i}"));
        }
        for r in &rules.allow {
            s += &rule_line(&t, i, r, "accept");
        }
        if rules.egress == Egress::Allow {
            s += &format!("add rule {t} s{i} accept\n");
        }
        s += &format!("add rule {t} s{i} jump d{i}\n");
        s
    }
}

fn rule_line(t: &str, i: u32, r: &Compiled, verdict: &str) -> String {
    if r.nets.is_empty() {
        return String::new();
    }
    let nets: Vec<String> = r.nets.iter().map(|c| c.to_string()).collect();
    let dst = format!("ip daddr {{ {} }}", nets.join(", "));
    if r.ports.is_empty() {
        return format!("add rule {t} s{i} {dst} {verdict}\n");
    }
    let ports: Vec<String> = r.ports.iter().map(|p| p.to_string()).collect();
    format!(
        "add rule {t} s{i} {dst} meta l4proto {{ tcp, udp }} th dport {{ {} }} {verdict}\n",
        ports.join(", ")
    )
}

/// A policy with host names resolved: what one slot's chain is built from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlotRules {
    pub egress: Egress,
    pub allow: Vec<Compiled>,
    pub deny: Vec<Compiled>,
}

/// The packet count of `nft -j list counter` output: the slot's refused
/// new connections since it was last scrubbed.
pub fn parse_counter(json: &str) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    v.get("nftables")?
        .as_array()?
        .iter()
        .find_map(|o| o.get("counter")?.get("packets")?.as_u64())
}

/// How many times a script nft reports as interrupted is run.
const INTERRUPTED_TRIES: usize = 3;

/// Applies `script` in one `nft -f` (one transaction: all or nothing).
/// nft answers `Interrupted system call` when a netlink dump it needed was
/// changed under it by another process's update (two daemons stopping at
/// once did it: a slot's scrub failed and the slot was destroyed); since
/// nothing of a failed transaction is applied, the script is run again.
pub fn apply(script: &str) -> Result<(), NetError> {
    let mut tries = 0;
    loop {
        tries += 1;
        match crate::cmd::run_script("nft", &["-f", "-"], script) {
            Err(e) if tries < INTERRUPTED_TRIES && interrupted(&e) => continue,
            r => return r,
        }
    }
}

fn interrupted(e: &NetError) -> bool {
    matches!(e, NetError::Command(m) if m.contains("Interrupted system call"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_interrupted_run_is_tried_again() {
        let eintr =
            "nft -f -: /dev/stdin:6:1-34: Error: Could not process rule: Interrupted system call";
        assert!(interrupted(&NetError::Command(eintr.into())));
        let other = "nft -f -: Error: No such file or directory";
        assert!(!interrupted(&NetError::Command(other.into())));
    }

    fn table() -> (Table, SlotAddrs) {
        let range: Cidr = "10.231.0.0/16".parse().unwrap();
        (
            Table::new("hy", range, true),
            SlotAddrs::new("hy", range, 3),
        )
    }

    #[test]
    fn deny_comes_before_allow_and_blocked_before_both() {
        let (t, slot) = table();
        let rules = SlotRules {
            egress: Egress::Allow,
            allow: vec![Compiled {
                nets: vec!["198.51.100.0/24".parse().unwrap()],
                ports: vec![443],
            }],
            deny: vec![Compiled {
                nets: vec!["198.51.100.7/32".parse().unwrap()],
                ports: vec![],
            }],
        };
        let s = t.set_policy_script(&slot, &rules);
        let pos = |needle: &str| s.find(needle).unwrap_or_else(|| panic!("{needle} in {s}"));
        assert!(pos("@blocked") < pos("198.51.100.7/32 } jump d3"));
        assert!(pos("198.51.100.7/32 } jump d3") < pos("th dport { 443 } accept"));
        assert!(pos("th dport { 443 } accept") < pos("s3 accept\n"));
        assert!(s.ends_with("add rule inet hatchery_hy s3 jump d3\n"));
        assert!(s.contains("ip saddr != 10.231.0.14 jump d3"));
    }

    #[test]
    fn default_deny_has_no_accept() {
        let (t, slot) = table();
        let s = t.set_policy_script(&slot, &SlotRules::default());
        assert!(!s.contains("accept"), "{s}");
        let full = t.rebuild_script(&[(slot, SlotRules::default())]);
        assert!(full.starts_with("add table inet hatchery_hy\ndelete table"));
        assert!(full.contains("169.254.0.0/16") && full.contains("10.231.0.0/16"));
        assert!(full.contains("\"hxhy.3\" : jump s3"), "{full}");
        assert!(full.contains("iifname \"hxhy.*\" drop"), "{full}");
        assert!(
            full.contains("forward iifname != \"hx*\" oifname != \"hx*\" drop\n"),
            "guard spares every daemon's slots"
        );
    }

    /// Every refused new connection is counted before the log's rate
    /// limit; the counter goes with the slot and is zeroed when the slot
    /// is scrubbed for its next owner.
    #[test]
    fn refusals_are_counted_before_the_log_limit() {
        let (t, slot) = table();
        let add = t.add_slot_script(&slot, &SlotRules::default());
        assert!(
            add.starts_with("add counter inet hatchery_hy c3\n"),
            "{add}"
        );
        let deny = add
            .lines()
            .find(|l| l.contains(" d3 ct state new"))
            .unwrap();
        let (counter, limit) = (
            deny.find("counter name").unwrap(),
            deny.find("limit rate").unwrap(),
        );
        assert!(counter < limit, "{deny}");
        assert!(t
            .remove_slot_script(&slot)
            .ends_with("delete counter inet hatchery_hy c3\n"));
        let scrub = t.scrub_script(&slot);
        assert!(
            !scrub.contains("accept") && scrub.ends_with("reset counter inet hatchery_hy c3\n")
        );
        assert_eq!(
            t.counter_args(3).join(" "),
            "-j list counter inet hatchery_hy c3"
        );
    }

    #[test]
    fn the_counter_is_read_from_nft_json() {
        let out = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "json_schema_version": 1}},
            {"counter": {"family": "inet", "name": "c3", "table": "hatchery_hy", "handle": 1,
            "packets": 10040, "bytes": 602400}}]}"#;
        assert_eq!(parse_counter(out), Some(10040));
        assert_eq!(parse_counter(r#"{"nftables": []}"#), None);
        assert_eq!(parse_counter("Error: No such file or directory"), None);
    }
}
