//! Creating, scrubbing and destroying a slot's namespace and veth pair with
//! `ip -batch`: two processes per operation whatever the slot count.

use crate::cmd::{output, run_script};
use crate::{NetError, SlotAddrs};

/// Makes the namespace, the veth pair and the guest end's address and
/// default route. The guest end gets no IPv6 link-local address.
pub fn create(s: &SlotAddrs) -> Result<(), NetError> {
    let host = format!(
        "netns add {ns}\n\
         link add {h} type veth peer name {g} netns {ns}\n\
         addr add {hip}/30 dev {h}\n\
         link set {h} up\n",
        ns = s.netns,
        h = s.host_if,
        g = s.guest_if,
        hip = s.host_ip,
    );
    if let Err(e) = run_script("ip", &["-batch", "-"], &host) {
        destroy(s);
        return Err(e);
    }
    if let Err(e) = configure_guest_end(s) {
        destroy(s);
        return Err(e);
    }
    // rp_filter on the host end drops spoofed sources before nftables sees
    // them; nftables checks the source again regardless.
    let _ = std::fs::write(
        format!("/proc/sys/net/ipv4/conf/{}/rp_filter", s.host_if),
        "1",
    );
    let _ = std::fs::write(
        format!("/proc/sys/net/ipv4/conf/{}/forwarding", s.host_if),
        "1",
    );
    Ok(())
}

/// Puts the guest end back to a fresh state. runsc's netstack takes the
/// interface's addresses and routes over (removing them from the host
/// kernel's view), so after a sandbox they must be laid down again.
pub fn configure_guest_end(s: &SlotAddrs) -> Result<(), NetError> {
    let guest = format!(
        "link set {g} addrgenmode none\n\
         addr flush dev {g}\n\
         addr add {gip}/30 dev {g}\n\
         link set {g} up\n\
         link set lo up\n\
         route replace default via {hip} dev {g}\n",
        g = s.guest_if,
        gip = s.guest_ip,
        hip = s.host_ip,
    );
    run_script("ip", &["-n", &s.netns, "-batch", "-"], &guest)
}

/// Forgets connection tracking state of the slot's address, so nothing of
/// a previous tenant's connections carries over to the next.
pub fn flush_conntrack(s: &SlotAddrs) {
    let ip = s.guest_ip.to_string();
    for dir in ["-s", "-d"] {
        // Exit status 1 means "no entries"; only a missing tool matters,
        // and the per-packet policy check covers that case.
        let _ = std::process::Command::new("conntrack")
            .args(["-D", dir, &ip])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// Removes the namespace and both veth ends. Idempotent; deleting the host
/// end takes the peer with it even if the namespace lingers.
pub fn destroy(s: &SlotAddrs) {
    let _ = run_script(
        "ip",
        &["-force", "-batch", "-"],
        &format!("link del {}\nnetns del {}\n", s.host_if, s.netns),
    );
}

/// Slot indexes with a namespace or host veth on this host for `prefix`.
pub fn existing(prefix: &str) -> Result<Vec<u32>, NetError> {
    let mut found = std::collections::BTreeSet::new();
    let ns_prefix = format!("{}{prefix}-", crate::addr::HOST_IF_MARK);
    if let Ok(rd) = std::fs::read_dir("/run/netns") {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(i) = name.strip_prefix(&ns_prefix).and_then(|n| n.parse().ok()) {
                found.insert(i);
            }
        }
    }
    let if_prefix = crate::addr::host_if_prefix(prefix);
    for line in output("ip", &["-o", "link", "show", "type", "veth"])?.lines() {
        // "12: hyh3@if2: <...>"
        let Some(name) = line.split(": ").nth(1) else {
            continue;
        };
        let name = name.split('@').next().unwrap_or("");
        if let Some(i) = name.strip_prefix(&if_prefix).and_then(|n| n.parse().ok()) {
            found.insert(i);
        }
    }
    Ok(found.into_iter().collect())
}
