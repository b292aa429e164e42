//! Special-purpose addresses the proxy never dials unless a rule allows
//! that exact range by CIDR or IP (not by a name that resolves to it).
//! IPv6 forms that carry an IPv4 address (mapped, compatible, NAT64, 6to4,
//! Teredo) are special as a whole: they are how a "public" IPv6 literal
//! reaches 127.0.0.1 or 169.254.169.254.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The name of the special range `ip` is in, or `None` for a public address.
pub fn special_range(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(a) => special_v4(a),
        IpAddr::V6(a) => special_v6(a),
    }
}

fn in4(a: Ipv4Addr, net: [u8; 4], len: u32) -> bool {
    let m = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    u32::from(a) & m == u32::from(Ipv4Addr::from(net)) & m
}

fn special_v4(a: Ipv4Addr) -> Option<&'static str> {
    const TABLE: &[([u8; 4], u32, &str)] = &[
        ([0, 0, 0, 0], 8, "this-network"),
        ([10, 0, 0, 0], 8, "private"),
        ([100, 64, 0, 0], 10, "cgnat"),
        ([127, 0, 0, 0], 8, "loopback"),
        ([169, 254, 0, 0], 16, "link-local"),
        ([172, 16, 0, 0], 12, "private"),
        ([192, 0, 0, 0], 24, "ietf-protocol"),
        ([192, 0, 2, 0], 24, "documentation"),
        ([192, 88, 99, 0], 24, "6to4-relay"),
        ([192, 168, 0, 0], 16, "private"),
        ([198, 18, 0, 0], 15, "benchmarking"),
        ([198, 51, 100, 0], 24, "documentation"),
        ([203, 0, 113, 0], 24, "documentation"),
        ([224, 0, 0, 0], 4, "multicast"),
        ([240, 0, 0, 0], 4, "reserved"),
    ];
    TABLE
        .iter()
        .find(|(net, len, _)| in4(a, *net, *len))
        .map(|(_, _, name)| *name)
}

fn in6(a: Ipv6Addr, net: u128, len: u32) -> bool {
    let m = if len == 0 {
        0
    } else {
        u128::MAX << (128 - len)
    };
    u128::from(a) & m == net & m
}

fn special_v6(a: Ipv6Addr) -> Option<&'static str> {
    let v = u128::from(a);
    if v == 0 {
        return Some("unspecified");
    }
    if v == 1 {
        return Some("loopback");
    }
    const TABLE: &[(u128, u32, &str)] = &[
        (0x0000_0000_0000_0000_0000_ffff_0000_0000, 96, "ipv4-mapped"),
        (
            0x0000_0000_0000_0000_0000_0000_0000_0000,
            96,
            "ipv4-compatible",
        ),
        (0x0064_ff9b_0000_0000_0000_0000_0000_0000, 96, "nat64"),
        (0x0064_ff9b_0001_0000_0000_0000_0000_0000, 48, "nat64"),
        (0x0100_0000_0000_0000_0000_0000_0000_0000, 64, "discard"),
        (0x2001_0000_0000_0000_0000_0000_0000_0000, 32, "teredo"),
        (
            0x2001_0db8_0000_0000_0000_0000_0000_0000,
            32,
            "documentation",
        ),
        (0x2002_0000_0000_0000_0000_0000_0000_0000, 16, "6to4"),
        (0xfc00_0000_0000_0000_0000_0000_0000_0000, 7, "private"),
        (0xfe80_0000_0000_0000_0000_0000_0000_0000, 10, "link-local"),
        (0xfec0_0000_0000_0000_0000_0000_0000_0000, 10, "site-local"),
        (0xff00_0000_0000_0000_0000_0000_0000_0000, 8, "multicast"),
    ];
    TABLE
        .iter()
        .find(|(net, len, _)| in6(a, *net, *len))
        .map(|(_, _, name)| *name)
}

#[cfg(test)]
mod tests {
    use super::special_range;

    #[test]
    fn ranges() {
        for (ip, want) in [
            ("127.0.0.1", Some("loopback")),
            ("127.255.0.9", Some("loopback")),
            ("10.1.2.3", Some("private")),
            ("172.31.255.255", Some("private")),
            ("172.32.0.1", None),
            ("192.168.1.1", Some("private")),
            ("169.254.169.254", Some("link-local")),
            ("100.64.0.1", Some("cgnat")),
            ("100.128.0.1", None),
            ("224.0.0.1", Some("multicast")),
            ("255.255.255.255", Some("reserved")),
            ("0.0.0.0", Some("this-network")),
            ("8.8.8.8", None),
            ("151.101.0.223", None),
            ("::1", Some("loopback")),
            ("::", Some("unspecified")),
            ("::ffff:127.0.0.1", Some("ipv4-mapped")),
            ("::ffff:8.8.8.8", Some("ipv4-mapped")),
            ("::127.0.0.1", Some("ipv4-compatible")),
            ("64:ff9b::a9fe:a9fe", Some("nat64")),
            ("64:ff9b:1::1", Some("nat64")),
            ("2002:7f00:1::", Some("6to4")),
            ("2001:0:4136:e378::1", Some("teredo")),
            ("fd00::1", Some("private")),
            ("fe80::1", Some("link-local")),
            ("ff02::1", Some("multicast")),
            ("2606:4700::1111", None),
            ("2001:4860::8888", None),
        ] {
            assert_eq!(special_range(ip.parse().unwrap()), want, "{ip}");
        }
    }
}
