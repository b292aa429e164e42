//! Refusals of the sandbox's nftables policy (connections that did not go
//! through the proxy) into the same counts as the proxy's.
//!
//! The daemon logs each refused attempt the kernel reports and keeps the
//! last 256 per sandbox, numbered 1, 2, ... (`seq`). The egress writer
//! reads that list for every bound sandbox each tick and once more when
//! the sandbox is released; what is new is what lies past the last `seq`
//! it counted. A gap (the list moved on by more than 256 between two
//! reads) is counted too, under no destination, so the sum of the
//! `nftables` counts is every attempt the daemon logged. What the kernel
//! did not log (its log is rate-limited per sandbox) is not in it:
//! docs/sessions.md, "Egress".

use super::coalesce::{Dest, Sample, Source};
use crate::sandbox::KernelDenial;

/// Reason of the attempts counted in a gap.
pub const DROPPED: &str =
    "refused by the sandbox's network policy; dropped from the daemon's list before it was read";

/// What to count from `list` (the daemon's current list, oldest first)
/// when everything up to `seen` was counted already: each new attempt,
/// and one entry for a gap. Returns the new `seen`.
pub fn fold(seen: u64, list: &[KernelDenial]) -> (u64, Vec<(Dest, Sample, u64)>) {
    let mut out = vec![];
    let mut last = seen;
    for d in list.iter().filter(|d| d.seq > seen) {
        if d.seq > last + 1 {
            out.push((
                Dest {
                    source: Source::Nftables,
                    host: None,
                    port: None,
                    status: 0,
                },
                Sample {
                    ip: None,
                    rule_id: None,
                    reason: DROPPED.into(),
                },
                d.seq - last - 1,
            ));
        }
        last = d.seq;
        out.push((
            Dest {
                source: Source::Nftables,
                host: Some(d.destination.clone()),
                port: d.port,
                status: 0,
            },
            Sample {
                ip: Some(d.destination.clone()),
                rule_id: None,
                reason: format!("refused by the sandbox's network policy ({})", d.protocol),
            },
            1,
        ));
    }
    (last, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(seqs: std::ops::RangeInclusive<u64>) -> Vec<KernelDenial> {
        seqs.map(|seq| KernelDenial {
            seq,
            protocol: "tcp".into(),
            destination: "10.0.0.1".into(),
            port: Some(9),
        })
        .collect()
    }

    fn total(v: &[(Dest, Sample, u64)]) -> u64 {
        v.iter().map(|x| x.2).sum()
    }

    #[test]
    fn only_what_is_new_is_counted() {
        let (seen, v) = fold(0, &list(1..=3));
        assert_eq!((seen, total(&v), v.len()), (3, 3, 3));
        let d = &v[0];
        assert_eq!(d.0.source, Source::Nftables);
        assert_eq!((d.0.host.as_deref(), d.0.port), (Some("10.0.0.1"), Some(9)));
        assert!(d.1.reason.contains("(tcp)"), "{}", d.1.reason);
        // The same list again: nothing.
        assert_eq!(fold(3, &list(1..=3)), (3, vec![]));
        // Two more.
        let (seen, v) = fold(3, &list(1..=5));
        assert_eq!((seen, total(&v)), (5, 2));
        // An empty list (the sandbox's slot was scrubbed) keeps the cursor.
        assert_eq!(fold(5, &[]), (5, vec![]));
    }

    #[test]
    fn a_gap_is_counted_under_no_destination() {
        // Read up to 10; the daemon logged up to 600 and keeps 345..=600.
        let (seen, v) = fold(10, &list(345..=600));
        assert_eq!(seen, 600);
        assert_eq!(total(&v), 590, "every attempt logged since 10");
        let gaps: Vec<_> = v.iter().filter(|x| x.0.host.is_none()).collect();
        assert_eq!(gaps.len(), 1);
        assert_eq!((gaps[0].2, gaps[0].1.reason.as_str()), (334, DROPPED));
    }
}
