//! Host-side name resolution for `host` rules. The addresses found here are
//! what the slot's nftables chain allows, so whatever the guest believes a
//! name means (its own `/etc/hosts`, its own DNS) cannot widen the policy.

use crate::NetError;
use std::collections::HashMap;
use std::net::{Ipv4Addr, ToSocketAddrs};
use std::path::Path;

/// Most addresses one name may pin; a name resolving to more is truncated
/// (round-robin DNS gives a different subset each time anyway).
const MAX_ADDRS: usize = 16;

#[derive(Debug, Default, Clone)]
pub struct Resolver {
    /// Fixed answers, in `/etc/hosts` format, consulted first. Operators use
    /// it to pin internal mirrors; tests use it to name their own netns hosts.
    overrides: HashMap<String, Vec<Ipv4Addr>>,
}

impl Resolver {
    pub fn with_overrides(path: Option<&Path>) -> Result<Resolver, NetError> {
        let mut r = Resolver::default();
        if let Some(p) = path {
            for line in std::fs::read_to_string(p)?.lines() {
                let line = line.split('#').next().unwrap_or("");
                let mut words = line.split_whitespace();
                let Some(Ok(ip)) = words.next().map(str::parse::<Ipv4Addr>) else {
                    continue;
                };
                for name in words {
                    r.overrides
                        .entry(name.to_ascii_lowercase())
                        .or_default()
                        .push(ip);
                }
            }
        }
        Ok(r)
    }

    /// IPv4 addresses of `host`. Blocking (getaddrinfo); call off the async
    /// executor.
    pub fn resolve(&self, host: &str) -> Result<Vec<Ipv4Addr>, NetError> {
        if let Some(a) = self.overrides.get(&host.to_ascii_lowercase()) {
            return Ok(a.clone());
        }
        let mut out: Vec<Ipv4Addr> = (host, 0)
            .to_socket_addrs()
            .map_err(|e| NetError::Resolve(host.into(), e.to_string()))?
            .filter_map(|a| match a.ip() {
                std::net::IpAddr::V4(v4) => Some(v4),
                std::net::IpAddr::V6(_) => None,
            })
            .collect();
        out.sort();
        out.dedup();
        out.truncate(MAX_ADDRS);
        if out.is_empty() {
            return Err(NetError::Resolve(host.into(), "no IPv4 address".into()));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_file_wins() {
        let dir = std::env::temp_dir().join(format!("hx-resolve-{}", std::process::id()));
        std::fs::write(
            &dir,
            "# test\n198.51.100.7 pypi.example Mirror.example\n::1 v6only.example\n",
        )
        .unwrap();
        let r = Resolver::with_overrides(Some(&dir)).unwrap();
        std::fs::remove_file(&dir).unwrap();
        let want = vec!["198.51.100.7".parse::<Ipv4Addr>().unwrap()];
        assert_eq!(r.resolve("pypi.example").unwrap(), want);
        assert_eq!(r.resolve("mirror.example").unwrap(), want);
        assert!(r.resolve("v6only.example.invalid").is_err());
        assert_eq!(
            r.resolve("localhost").unwrap(),
            vec![Ipv4Addr::LOCALHOST],
            "falls back to the system resolver"
        );
    }
}
