//! Refusals of the sandbox's nftables policy (connections that did not go
//! through the proxy) into the same counts as the proxy's.
//!
//! The daemon logs each refused attempt the kernel reports and keeps the
//! last 256 per sandbox, numbered 1, 2, ... (`seq`); the kernel's log is
//! rate-limited (20 a second per sandbox, burst 40), so the daemon also
//! reports the slot's nftables counter: every refused new connection,
//! logged or not (`total`). The egress writer reads both for every bound
//! sandbox each tick and once more when the sandbox is released:
//! - what is new in the list is what lies past the last `seq` it counted,
//!   each with its destination; a gap (the list moved on by more than 256
//!   between two reads) is counted under no destination ([`DROPPED`]);
//! - what the counter has beyond everything logged is counted under no
//!   destination as [`NOT_LOGGED`]. The counter read two ticks before is
//!   used, so an attempt whose log line the daemon had not read yet is
//!   not counted twice; on the last read (the sandbox is released) the
//!   current one.
//!
//! So the sum of the `nftables` counts is every refused attempt: exact,
//! from a daemon that counts (docs/sessions.md, "Egress").

use super::coalesce::{Dest, Sample, Source};
use crate::sandbox::KernelDenials;

/// Reason of the attempts counted in a gap.
pub const DROPPED: &str =
    "refused by the sandbox's network policy; dropped from the daemon's list before it was read";
/// Reason of the attempts the kernel refused without a log line.
pub const NOT_LOGGED: &str =
    "refused by the sandbox's network policy; not logged by the kernel (its log is rate-limited)";

/// Where the writer stands in one sandbox's refusals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cursor {
    /// The last `seq` counted.
    pub seen: u64,
    /// Attempts counted as [`NOT_LOGGED`] so far.
    unlogged: u64,
    /// The counter at the last two reads, newest first.
    totals: [Option<u64>; 2],
}

/// What to count from `d` (the daemon's current report) past `cur`: each
/// newly logged attempt, one entry for a gap, one for what the kernel did
/// not log. `last`: the sandbox is being released (no later read).
pub fn fold(cur: Cursor, d: &KernelDenials, last: bool) -> (Cursor, Vec<(Dest, Sample, u64)>) {
    let mut out = vec![];
    let mut next = cur;
    let none = Dest {
        source: Source::Nftables,
        host: None,
        port: None,
        status: 0,
    };
    let bare = |reason: &str| Sample {
        ip: None,
        rule_id: None,
        reason: reason.into(),
    };
    for e in d.list.iter().filter(|e| e.seq > cur.seen) {
        if e.seq > next.seen + 1 {
            out.push((none.clone(), bare(DROPPED), e.seq - next.seen - 1));
        }
        next.seen = e.seq;
        out.push((
            Dest {
                source: Source::Nftables,
                host: Some(e.destination.clone()),
                port: e.port,
                status: 0,
            },
            Sample {
                ip: Some(e.destination.clone()),
                rule_id: None,
                reason: format!("refused by the sandbox's network policy ({})", e.protocol),
            },
            1,
        ));
    }
    let basis = if last { d.total } else { cur.totals[1] };
    if let Some(b) = basis {
        let target = b.saturating_sub(next.seen);
        if target > next.unlogged {
            out.push((none, bare(NOT_LOGGED), target - next.unlogged));
            next.unlogged = target;
        }
    }
    next.totals = [d.total, cur.totals[0]];
    (next, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(seqs: std::ops::RangeInclusive<u64>) -> KernelDenials {
        KernelDenials {
            list: seqs
                .map(|seq| crate::sandbox::KernelDenial {
                    seq,
                    protocol: "tcp".into(),
                    destination: "10.0.0.1".into(),
                    port: Some(9),
                })
                .collect(),
            total: None,
        }
    }

    fn at(seen: u64) -> Cursor {
        Cursor {
            seen,
            ..Default::default()
        }
    }

    fn total(v: &[(Dest, Sample, u64)]) -> u64 {
        v.iter().map(|x| x.2).sum()
    }

    #[test]
    fn only_what_is_new_is_counted() {
        let (c, v) = fold(at(0), &list(1..=3), false);
        assert_eq!((c.seen, total(&v), v.len()), (3, 3, 3));
        let d = &v[0];
        assert_eq!(d.0.source, Source::Nftables);
        assert_eq!((d.0.host.as_deref(), d.0.port), (Some("10.0.0.1"), Some(9)));
        assert!(d.1.reason.contains("(tcp)"), "{}", d.1.reason);
        // The same list again: nothing.
        assert_eq!(fold(at(3), &list(1..=3), false), (at(3), vec![]));
        // Two more.
        let (c, v) = fold(at(3), &list(1..=5), false);
        assert_eq!((c.seen, total(&v)), (5, 2));
        // An empty list (the sandbox's slot was scrubbed) keeps the cursor.
        let empty = KernelDenials::default();
        assert_eq!(fold(at(5), &empty, false), (at(5), vec![]));
    }

    #[test]
    fn a_gap_is_counted_under_no_destination() {
        // Read up to 10; the daemon logged up to 600 and keeps 345..=600.
        let (c, v) = fold(at(10), &list(345..=600), false);
        assert_eq!(c.seen, 600);
        assert_eq!(total(&v), 590, "every attempt logged since 10");
        let gaps: Vec<_> = v.iter().filter(|x| x.0.host.is_none()).collect();
        assert_eq!(gaps.len(), 1);
        assert_eq!((gaps[0].2, gaps[0].1.reason.as_str()), (334, DROPPED));
    }

    /// The counter's excess over what was logged is counted once, from
    /// the read two ticks back (log lines may still be on their way), and
    /// from the current one on the last read: the sum is the counter.
    #[test]
    fn what_the_kernel_did_not_log_is_counted_from_its_counter() {
        let report = |seqs: std::ops::RangeInclusive<u64>, t: u64| KernelDenials {
            total: Some(t),
            ..list(seqs)
        };
        let mut sum = 0;
        // Tick 1: 40 logged, the counter says 1,000 (960 not logged, or
        // their lines not read yet): only the logged ones for now.
        let (c, v) = fold(at(0), &report(1..=40, 1_000), false);
        assert_eq!(total(&v), 40);
        sum += total(&v);
        // Tick 2: 20 more logged (lines read late); the counter at 3,000.
        let (c, v) = fold(c, &report(1..=60, 3_000), false);
        assert_eq!(total(&v), 20, "the read two ticks back is not there yet");
        sum += total(&v);
        // Tick 3: nothing new logged: 1,000 (tick 1's) - 60 not logged.
        let (c, v) = fold(c, &report(1..=60, 3_500), false);
        assert_eq!(total(&v), 940);
        assert!(v.iter().all(|x| x.1.reason == NOT_LOGGED));
        sum += total(&v);
        // Tick 4 re-reads the same: tick 2's 3,000 - 60 - 940 counted.
        let (c, v) = fold(c, &report(1..=60, 3_500), false);
        assert_eq!(total(&v), 2_000);
        sum += total(&v);
        // The last read: up to the current counter.
        let (_, v) = fold(c, &report(1..=61, 3_600), true);
        sum += total(&v);
        assert_eq!(sum, 3_600, "every refusal counted once");
    }
}
