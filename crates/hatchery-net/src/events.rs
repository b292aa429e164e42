//! Egress events: the kernel logs each denied attempt (rate-limited per
//! slot in nftables) to `/dev/kmsg`; one thread reads those lines and turns
//! them into per-sandbox events.

use serde::Serialize;
use std::collections::VecDeque;
use std::io::Read;

/// Events kept per sandbox; older ones are dropped first.
pub const MAX_EVENTS: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EgressEvent {
    /// 1, 2, ... per sandbox, in the order the kernel log gave them: a
    /// reader that saw up to `n` knows what is new, and a gap past the
    /// oldest kept is how many were dropped from the ring before it read.
    pub seq: u64,
    pub time_ms: u64,
    /// `tcp`, `udp`, `icmp` or `other`.
    pub protocol: String,
    pub destination: String,
    pub port: Option<u16>,
}

/// A parsed log line: the slot's host interface and the attempt.
#[derive(Debug, PartialEq, Eq)]
pub struct Denied {
    pub host_if: String,
    pub protocol: String,
    pub destination: String,
    pub port: Option<u16>,
}

/// Parses one `/dev/kmsg` record carrying `tag` (see [`crate::nft::Table::log_prefix`]).
pub fn parse(record: &str, tag: &str) -> Option<Denied> {
    let msg = record.split_once(';')?.1;
    let rest = msg.strip_prefix(tag)?;
    let field = |k: &str| {
        rest.split_whitespace()
            .find_map(|w| w.strip_prefix(k).and_then(|v| v.strip_prefix('=')))
    };
    let proto = field("PROTO")?.to_ascii_lowercase();
    let protocol = match proto.as_str() {
        "tcp" | "udp" => proto.clone(),
        "icmp" | "icmpv6" => "icmp".into(),
        _ => "other".into(),
    };
    Some(Denied {
        host_if: field("IN")?.to_string(),
        destination: field("DST")?.to_string(),
        port: field("DPT").and_then(|p| p.parse().ok()),
        protocol,
    })
}

/// Reads kernel log records from now on, calling `sink` for ours. Runs
/// until the process exits.
pub fn follow_kmsg(tag: String, sink: impl Fn(Denied) + Send + 'static) -> std::io::Result<()> {
    use std::io::Seek;
    let mut f = std::fs::File::open("/dev/kmsg")?;
    // Only what happens from now on; older lines belong to earlier runs.
    f.seek(std::io::SeekFrom::End(0))?;
    std::thread::Builder::new()
        .name("egress-events".into())
        .spawn(move || {
            let mut buf = vec![0u8; 8192];
            loop {
                match f.read(&mut buf) {
                    Ok(0) => std::thread::sleep(std::time::Duration::from_millis(100)),
                    Ok(n) => {
                        if let Some(d) = parse(&String::from_utf8_lossy(&buf[..n]), &tag) {
                            sink(d);
                        }
                    }
                    // EPIPE: the ring overwrote records we had not read yet;
                    // the next read continues with the oldest still there.
                    Err(e) if e.raw_os_error() == Some(libc::EPIPE) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "egress event reader stopped");
                        return;
                    }
                }
            }
        })?;
    Ok(())
}

/// One sandbox's denied attempts: the last [`MAX_EVENTS`], and how many
/// were logged in all (the last one's `seq`).
#[derive(Debug, Default)]
pub struct Ring {
    pub events: VecDeque<EgressEvent>,
    pub logged: u64,
}

/// Numbers `e` and keeps it, dropping the oldest past [`MAX_EVENTS`].
pub fn push(r: &mut Ring, mut e: EgressEvent) {
    r.logged += 1;
    e.seq = r.logged;
    if r.events.len() >= MAX_EVENTS {
        r.events.pop_front();
    }
    r.events.push_back(e);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kernel_log_records() {
        let tag = "hxdeny:hy ";
        let tcp = "6,1234,99887766,-;hxdeny:hy IN=hxhy.3 OUT=eth0 MAC=aa SRC=10.231.0.14 DST=198.51.100.7 LEN=60 TOS=0x00 PREC=0x00 TTL=63 ID=1 DF PROTO=TCP SPT=40000 DPT=80 WINDOW=1 RES=0x00 SYN URGP=0 \n";
        assert_eq!(
            parse(tcp, tag),
            Some(Denied {
                host_if: "hxhy.3".into(),
                protocol: "tcp".into(),
                destination: "198.51.100.7".into(),
                port: Some(80),
            })
        );
        let icmp = "6,1,2,-;hxdeny:hy IN=hxhy.0 OUT= MAC=aa SRC=10.231.0.2 DST=10.231.0.1 LEN=84 PROTO=ICMP TYPE=8 CODE=0 ID=1 SEQ=1\n";
        let d = parse(icmp, tag).unwrap();
        assert_eq!((d.protocol.as_str(), d.port), ("icmp", None));
        assert_eq!(parse(tcp, "hxdeny:other "), None, "another daemon's line");
        assert_eq!(parse("6,1,2,-;eth0: link up\n", tag), None);
        let mut q = Ring::default();
        for i in 0..(MAX_EVENTS + 5) {
            push(
                &mut q,
                EgressEvent {
                    seq: 0,
                    time_ms: i as u64,
                    protocol: "tcp".into(),
                    destination: "x".into(),
                    port: None,
                },
            );
        }
        assert_eq!(q.events.len(), MAX_EVENTS);
        assert_eq!(q.events.front().unwrap().time_ms, 5);
        // Numbered from 1 in order: the oldest kept says 5 were dropped.
        assert_eq!(q.events.front().unwrap().seq, 6);
        assert_eq!(q.logged, (MAX_EVENTS + 5) as u64);
        assert_eq!(q.events.back().unwrap().seq, q.logged);
    }
}
