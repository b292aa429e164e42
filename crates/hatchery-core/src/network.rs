//! Sandboxes and their network slots: a slot is claimed before the runtime
//! starts the sandbox, follows it through policy updates, and is given back
//! only after the runtime has destroyed the sandbox (so no guest ever sees
//! a slot that is being scrubbed).

use crate::agent_client::AgentClient;
use crate::{CoreError, Manager};
use hatchery_net::{EgressEvent, NetError, Pins, Policy};
use std::path::PathBuf;
use std::sync::Arc;

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, NetError> + Send + 'static,
) -> Result<T, CoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| CoreError::Internal(e.to_string()))?
        .map_err(Into::into)
}

impl Manager {
    pub fn network_enabled(&self) -> bool {
        self.net.is_some()
    }

    fn net(&self) -> Result<&Arc<hatchery_net::Network>, CoreError> {
        self.net.as_ref().ok_or_else(|| {
            CoreError::Conflict(
                "networking is off on this daemon (started with --network off)".into(),
            )
        })
    }

    /// Checks a requested policy before anything is spent on it.
    pub fn check_policy(&self, p: &Policy) -> Result<(), CoreError> {
        if *p == Policy::deny_all() && self.net.is_none() {
            return Ok(());
        }
        p.validate(self.caps.net_limits)?;
        self.net().map(|_| ())
    }

    /// Gives sandbox `id` a slot enforcing `policy`; the namespace to start
    /// it in, or `None` when networking is off.
    pub(crate) async fn claim_slot(
        &self,
        id: &str,
        policy: &Policy,
    ) -> Result<Option<PathBuf>, CoreError> {
        let Some(net) = self.net.clone() else {
            self.check_policy(policy)?;
            return Ok(None);
        };
        let (owner, p) = (id.to_string(), policy.clone());
        let lease = blocking(move || net.claim(&owner, &p)).await?;
        let json = serde_json::to_string(policy).unwrap_or_default();
        if let Err(e) = self
            .store
            .set_net(&self.fence, id, lease.index, &json, false)
            .await
        {
            self.release_slot(id).await;
            return Err(e.into());
        }
        Ok(Some(lease.netns))
    }

    /// Scrubs and returns `id`'s slot. Only once its sandbox is gone.
    pub(crate) async fn release_slot(&self, id: &str) {
        let Some(net) = self.net.clone() else { return };
        let owner = id.to_string();
        let _ = tokio::task::spawn_blocking(move || net.release(&owner)).await;
        if let Err(e) = self.store.clear_net(&self.fence, id).await {
            tracing::warn!(sandbox = %id, error = %e, "forgetting a network slot failed");
        }
    }

    pub async fn network_policy(&self, id: &str) -> Result<Policy, CoreError> {
        self.live_get(id).await?;
        Ok(self
            .net
            .as_ref()
            .and_then(|n| n.policy(id))
            .unwrap_or_default())
    }

    /// Applies `policy` to a running sandbox; enforced for new and open
    /// connections when this returns.
    pub async fn set_network_policy(&self, id: &str, policy: Policy) -> Result<Policy, CoreError> {
        let live = self.live_get(id).await?;
        let had_hosts = self.net.as_ref().is_some_and(|n| !n.pins(id).is_empty());
        self.set_slot_policy(id, &policy).await?;
        if had_hosts || policy.has_hosts() {
            self.write_pins(id, &live.client).await?;
        }
        Ok(policy)
    }

    /// Writes the addresses the policy's host names were pinned to into the
    /// guest's `/etc/hosts`, so those names resolve without any DNS. Only a
    /// convenience: the guest may edit the file, but what it can reach is
    /// decided by the pinned addresses on the host.
    pub(crate) async fn write_pins(&self, id: &str, client: &AgentClient) -> Result<(), CoreError> {
        let Some(net) = &self.net else { return Ok(()) };
        let current = crate::files::read(client, "/etc/hosts", 1 << 20)
            .await
            .unwrap_or_default();
        let current = String::from_utf8_lossy(&current);
        let next = hosts_with_pins(&current, &net.pins(id));
        if next != current {
            crate::files::write(client, "/etc/hosts", next.as_bytes()).await?;
        }
        Ok(())
    }

    pub(crate) async fn set_slot_policy(&self, id: &str, policy: &Policy) -> Result<(), CoreError> {
        self.check_policy(policy)?;
        let net = Arc::clone(self.net()?);
        let (owner, p) = (id.to_string(), policy.clone());
        blocking(move || net.set_policy(&owner, &p)).await?;
        let json = serde_json::to_string(policy).unwrap_or_default();
        // Slot, policy and the event in one transaction.
        self.store
            .set_net(&self.fence, id, self.slot_of(id)?, &json, true)
            .await?;
        Ok(())
    }

    fn slot_of(&self, id: &str) -> Result<u32, CoreError> {
        self.net()?
            .lease_of(id)
            .map(|l| l.index)
            .ok_or_else(|| CoreError::Internal(format!("{id} has no network slot")))
    }

    pub async fn network_events(&self, id: &str) -> Result<Vec<EgressEvent>, CoreError> {
        self.live_get(id).await?;
        Ok(self.net.as_ref().map(|n| n.events(id)).unwrap_or_default())
    }

    /// Every new connection `id`'s slot refused, logged or not (its
    /// nftables counter; one `nft` run, off the async threads).
    pub async fn network_denied_total(&self, id: &str) -> Result<Option<u64>, CoreError> {
        self.live_get(id).await?;
        let Some(net) = self.net.clone() else {
            return Ok(None);
        };
        let id = id.to_string();
        Ok(tokio::task::spawn_blocking(move || net.denied_total(&id))
            .await
            .unwrap_or(None))
    }

    /// At start: keeps the slots of `adopted` sandboxes (with their stored
    /// policies) and destroys every other slot of ours on the host.
    pub(crate) async fn reclaim_slots(
        &self,
        adopted: &std::collections::HashSet<String>,
    ) -> Result<(), CoreError> {
        let Some(net) = &self.net else { return Ok(()) };
        let mut keep = Vec::new();
        for n in self.store.all_net(self.host_id()).await? {
            if adopted.contains(&n.sandbox_id) {
                let policy = serde_json::from_str(&n.policy).unwrap_or_default();
                keep.push((n.slot, n.sandbox_id, policy));
            } else {
                self.store.clear_net(&self.fence, &n.sandbox_id).await?;
            }
        }
        for lost in net.reclaim(keep)? {
            tracing::warn!(sandbox = %lost, "network slot of an adopted sandbox is gone");
            self.store.clear_net(&self.fence, &lost).await?;
        }
        net.spawn_filler();
        Ok(())
    }

    /// Last step of a graceful stop, after every sandbox is gone.
    pub fn shutdown_network(&self) {
        if let Some(net) = &self.net {
            net.shutdown();
        }
    }
}

const PINS_BEGIN: &str =
    "# hatchery: pinned by the egress policy (edits here change nothing it allows)";
const PINS_END: &str = "# hatchery: end";

/// `/etc/hosts` with Hatchery's block replaced by `pins` (or removed).
fn hosts_with_pins(current: &str, pins: &Pins) -> String {
    let mut out = String::new();
    let mut inside = false;
    for line in current.lines() {
        if line == PINS_BEGIN {
            inside = true;
        } else if line == PINS_END {
            inside = false;
        } else if !inside {
            out.push_str(line);
            out.push('\n');
        }
    }
    if !pins.is_empty() {
        out.push_str(PINS_BEGIN);
        out.push('\n');
        for (host, addrs) in pins {
            for a in addrs {
                out.push_str(&format!("{a} {host}\n"));
            }
        }
        out.push_str(PINS_END);
        out.push('\n');
    }
    out
}

/// The guest's `/etc/resolv.conf` until a template or the user sets one.
/// With egress denied by default, the host's resolver is unreachable, and
/// a query to it would hang for the resolver's full timeout; the guest's
/// own loopback refuses at once, so lookups fail in milliseconds.
pub(crate) const DEFAULT_RESOLV_CONF: &str =
    "# Hatchery: no DNS resolver is reachable unless the egress policy allows one.\n\
# Names in `host` rules are pinned in /etc/hosts. To use a resolver, allow it\n\
# (e.g. {\"cidr\":\"1.1.1.1\",\"ports\":[53]}) and put it here.\n\
nameserver 127.0.0.1\n\
options timeout:1 attempts:1\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_replace_only_their_block() {
        let base = "127.0.0.1 localhost\n";
        let pins: Pins = vec![("pypi.example".into(), vec!["198.51.100.7".parse().unwrap()])];
        let with = hosts_with_pins(base, &pins);
        assert!(with.starts_with(base));
        assert!(with.contains("198.51.100.7 pypi.example\n"));
        let guest_edit = format!("{with}10.0.0.1 mine\n");
        let again = hosts_with_pins(&guest_edit, &pins);
        assert_eq!(again.matches("pypi.example").count(), 1);
        assert!(again.contains("10.0.0.1 mine"));
        assert_eq!(
            hosts_with_pins(&again, &vec![]),
            format!("{base}10.0.0.1 mine\n")
        );
    }
}
