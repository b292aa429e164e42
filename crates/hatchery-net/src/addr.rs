//! Slot addressing: slot `i` owns the /30 at `base + 4i`; the host end of
//! its veth is `.1`, the guest end `.2`.

use crate::NetError;
use std::net::Ipv4Addr;
use std::str::FromStr;

/// An IPv4 network in CIDR form, normalised to its network address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub addr: Ipv4Addr,
    pub prefix: u8,
}

impl Cidr {
    pub fn new(addr: Ipv4Addr, prefix: u8) -> Cidr {
        let mask = if prefix == 0 {
            0
        } else {
            u32::MAX << (32 - prefix as u32)
        };
        Cidr {
            addr: Ipv4Addr::from(u32::from(addr) & mask),
            prefix,
        }
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        Cidr::new(ip, self.prefix).addr == self.addr
    }

    /// How many /30 slots fit.
    pub fn slot_capacity(&self) -> u32 {
        if self.prefix > 30 {
            0
        } else {
            1u32 << (30 - self.prefix as u32).min(31)
        }
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl FromStr for Cidr {
    type Err = NetError;

    fn from_str(s: &str) -> Result<Cidr, NetError> {
        let bad = || NetError::Invalid(format!("{s:?} is not an IPv4 address or CIDR"));
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, p.parse::<u8>().map_err(|_| bad())?),
            None => (s, 32),
        };
        if p > 32 {
            return Err(bad());
        }
        let addr = Ipv4Addr::from_str(a).map_err(|_| bad())?;
        Ok(Cidr::new(addr, p))
    }
}

/// Common start of every Hatchery host interface, whatever the daemon:
/// lets each daemon tell "some daemon's slot" from "not ours at all".
pub const HOST_IF_MARK: &str = "hx";

/// Start of the host interface names of one daemon's slots.
pub fn host_if_prefix(prefix: &str) -> String {
    format!("{HOST_IF_MARK}{prefix}.")
}

/// Names and addresses of one slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotAddrs {
    pub index: u32,
    pub netns: String,
    pub host_if: String,
    pub guest_if: String,
    pub host_ip: Ipv4Addr,
    pub guest_ip: Ipv4Addr,
}

impl SlotAddrs {
    /// Every daemon's host interfaces start with [`HOST_IF_MARK`], then the
    /// prefix, then a `.` that no prefix contains (so prefix `a` never
    /// matches prefix `ab`'s interfaces), then the index: within IFNAMSIZ
    /// (15) for prefixes of up to 5 letters and 16,384+ slots. The guest
    /// end lives in the slot's own namespace, so it can simply be `eth0`.
    pub fn new(prefix: &str, range: Cidr, index: u32) -> SlotAddrs {
        let base = u32::from(range.addr) + index * 4;
        SlotAddrs {
            index,
            netns: format!("{HOST_IF_MARK}{prefix}-{index}"),
            host_if: format!("{}{index}", host_if_prefix(prefix)),
            guest_if: "eth0".into(),
            host_ip: Ipv4Addr::from(base + 1),
            guest_ip: Ipv4Addr::from(base + 2),
        }
    }

    pub fn netns_path(&self) -> std::path::PathBuf {
        std::path::Path::new("/run/netns").join(&self.netns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_parsing_and_normalising() {
        let c: Cidr = "203.0.113.77/24".parse().unwrap();
        assert_eq!(c.to_string(), "203.0.113.0/24");
        assert!(c.contains("203.0.113.5".parse().unwrap()));
        assert!(!c.contains("203.0.114.5".parse().unwrap()));
        assert_eq!("1.2.3.4".parse::<Cidr>().unwrap().prefix, 32);
        for bad in ["1.2.3.4/33", "1.2.3", "::1/128", "x/8", "1.2.3.4/-1", ""] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
        assert_eq!(
            "0.0.0.0/0".parse::<Cidr>().unwrap().addr,
            Ipv4Addr::UNSPECIFIED
        );
    }

    #[test]
    fn slots_tile_the_range() {
        let r: Cidr = "10.231.0.0/16".parse().unwrap();
        assert_eq!(r.slot_capacity(), 16_384);
        let s = SlotAddrs::new("hy", r, 16_383);
        assert_eq!(s.host_ip, "10.231.255.253".parse::<Ipv4Addr>().unwrap());
        assert_eq!(s.guest_ip, "10.231.255.254".parse::<Ipv4Addr>().unwrap());
        assert_eq!(
            (s.host_if.as_str(), s.netns.as_str()),
            ("hxhy.16383", "hxhy-16383")
        );
        let long = SlotAddrs::new("abcde", r, 16_383);
        assert!(long.host_if.len() <= 15, "{}", long.host_if);
        let a = SlotAddrs::new("a", r, 1).host_if;
        assert!(
            !a.starts_with(&host_if_prefix("ab"))
                && !SlotAddrs::new("ab", r, 1)
                    .host_if
                    .starts_with(&host_if_prefix("a"))
        );
        assert_eq!(
            SlotAddrs::new("hy", r, 1).guest_ip,
            "10.231.0.6".parse::<Ipv4Addr>().unwrap()
        );
    }
}
