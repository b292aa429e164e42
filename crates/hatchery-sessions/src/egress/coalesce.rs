//! Egress refusals counted per session and destination, so that a guest
//! refusing itself in a loop writes a handful of `egress_denied` events,
//! each carrying how many attempts it stands for, and never loses one.
//!
//! A destination's first refusal opens a window and is handed out at
//! once (count 1, or what came before the writer ran); what the window
//! counts after that is handed out when it ends, and a new window opens if
//! it counted any, so a destination refused without pause costs one event
//! per interval. A window that ends with nothing counted is forgotten.
//! Everything a session counted is handed out when its sandbox is released
//! ([`Coalescer::drain_session`]). Time is a parameter: the tests drive it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// One `egress_denied` event per destination per this long, by default
/// (`--egress-denied-interval`).
pub const INTERVAL: Duration = Duration::from_secs(10);
/// Distinct destinations counted apart per session; refusals to more are
/// counted together under [`OTHERS`] (a guest naming a new host each time
/// would otherwise write an event per attempt).
pub const MAX_DESTINATIONS: usize = 256;
/// The host under which refusals over [`MAX_DESTINATIONS`] are counted (no
/// request the proxy parses can name it).
pub const OTHERS: &str = "*";

/// Who refused: the egress proxy, or the kernel (the sandbox's nftables
/// policy, for connections that did not go through the proxy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    Proxy,
    Nftables,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Proxy => "proxy",
            Source::Nftables => "nftables",
        }
    }
}

/// What refusals are counted by: who refused, where the guest tried to
/// go, and the status it was answered (0 for the kernel's refusals).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Dest {
    pub source: Source,
    pub host: Option<String>,
    pub port: Option<u16>,
    pub status: u16,
}

/// The first refusal of a window, standing for the others in the event.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub ip: Option<String>,
    pub rule_id: Option<String>,
    pub reason: String,
}

/// One `egress_denied` event to write.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub session: String,
    pub dest: Dest,
    pub sample: Sample,
    pub count: u64,
}

#[derive(Debug)]
struct Window {
    opened: Instant,
    /// Counted and not handed out yet.
    pending: u64,
    /// This destination's first refusal was handed out (later ones wait
    /// for the window's end).
    announced: bool,
    sample: Sample,
}

#[derive(Debug)]
pub struct Coalescer {
    interval: Duration,
    max_destinations: usize,
    sessions: HashMap<String, HashMap<Dest, Window>>,
}

impl Coalescer {
    pub fn new(interval: Duration, max_destinations: usize) -> Coalescer {
        Coalescer {
            interval,
            max_destinations,
            sessions: HashMap::new(),
        }
    }

    /// Counts `n` refusals; true when a batch is due at once (the first of
    /// a new window: the writer should wake).
    pub fn add(&mut self, session: &str, dest: Dest, sample: Sample, n: u64, now: Instant) -> bool {
        let per = match self.sessions.get_mut(session) {
            Some(p) => p,
            None => self.sessions.entry(session.to_string()).or_default(),
        };
        let (dest, sample) = if per.contains_key(&dest) || per.len() < self.max_destinations {
            (dest, sample)
        } else {
            let reason = format!(
                "refusals to more than {} destinations in one interval, counted together (the first: {})",
                self.max_destinations, sample.reason
            );
            let others = Dest {
                source: dest.source,
                host: Some(OTHERS.into()),
                port: None,
                status: dest.status,
            };
            (others, Sample { reason, ..sample })
        };
        let w = per.entry(dest).or_insert(Window {
            opened: now,
            pending: 0,
            announced: false,
            sample,
        });
        let first = !w.announced && w.pending == 0;
        w.pending += n;
        first
    }

    /// The batches due at `now` (see the module's comment).
    pub fn due(&mut self, now: Instant) -> Vec<Batch> {
        let mut out = vec![];
        let interval = self.interval;
        self.sessions.retain(|session, per| {
            per.retain(|dest, w| {
                let ended = now.saturating_duration_since(w.opened) >= interval;
                if w.pending > 0 && (!w.announced || ended) {
                    out.push(Batch {
                        session: session.clone(),
                        dest: dest.clone(),
                        sample: w.sample.clone(),
                        count: std::mem::take(&mut w.pending),
                    });
                    if w.announced {
                        w.opened = now;
                    }
                    w.announced = true;
                    return true;
                }
                !ended
            });
            !per.is_empty()
        });
        out
    }

    /// Everything `session` counted and not handed out, now; its windows
    /// are forgotten.
    pub fn drain_session(&mut self, session: &str) -> Vec<Batch> {
        let Some(per) = self.sessions.remove(session) else {
            return vec![];
        };
        per.into_iter()
            .filter(|(_, w)| w.pending > 0)
            .map(|(dest, w)| Batch {
                session: session.to_string(),
                dest,
                sample: w.sample,
                count: w.pending,
            })
            .collect()
    }

    /// A batch that could not be written is counted again, to be handed
    /// out at its window's end.
    pub fn put_back(&mut self, b: Batch, now: Instant) {
        self.add(&b.session, b.dest.clone(), b.sample, b.count, now);
        if let Some(w) = self
            .sessions
            .get_mut(&b.session)
            .and_then(|p| p.get_mut(&b.dest))
        {
            w.announced = true;
        }
    }

    /// Refusals counted and not handed out yet, in all.
    pub fn pending(&self) -> u64 {
        self.sessions
            .values()
            .flat_map(|p| p.values())
            .map(|w| w.pending)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dest(host: &str, port: u16) -> Dest {
        Dest {
            source: Source::Proxy,
            host: Some(host.into()),
            port: Some(port),
            status: 403,
        }
    }

    fn sample(reason: &str) -> Sample {
        Sample {
            ip: None,
            rule_id: None,
            reason: reason.into(),
        }
    }

    fn counts(b: &[Batch]) -> Vec<(String, u64)> {
        let mut v: Vec<_> = b
            .iter()
            .map(|b| (b.dest.host.clone().unwrap_or_default(), b.count))
            .collect();
        v.sort();
        v
    }

    /// A sustained flood of one destination: the first refusal at once,
    /// then one batch per interval, and the counts add up exactly.
    #[test]
    fn a_flood_is_one_batch_per_interval_and_adds_up() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(INTERVAL, MAX_DESTINATIONS);
        let mut written = vec![];
        let mut n = 0u64;
        // 10,000 refusals over 25 s, the writer running every second.
        for ms in 0..25_000u64 {
            let now = t0 + Duration::from_millis(ms);
            if ms % 5 < 2 {
                let wake = c.add("s1", dest("evil.example", 443), sample("no"), 1, now);
                assert_eq!(wake, n == 0, "only the very first wakes the writer");
                n += 1;
            }
            if ms % 1000 == 0 {
                written.extend(c.due(now));
            }
        }
        assert_eq!(n, 10_000);
        // The end: the last window closes at its interval and is forgotten
        // at the next.
        for s in 25..60 {
            written.extend(c.due(t0 + Duration::from_secs(s)));
        }
        assert_eq!(written.iter().map(|b| b.count).sum::<u64>(), 10_000);
        // At 0 s (1), 10 s, 20 s, 30 s.
        assert_eq!(written.len(), 4, "{:?}", counts(&written));
        assert_eq!(written[0].count, 1);
        assert_eq!(c.pending(), 0);
        assert!(c.sessions.is_empty(), "idle windows forgotten");
    }

    #[test]
    fn nothing_is_handed_out_twice_or_before_the_window_ends() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(INTERVAL, MAX_DESTINATIONS);
        assert!(c.add("s1", dest("a", 1), sample("first"), 1, t0));
        assert!(!c.add("s1", dest("a", 1), sample("second"), 1, t0));
        // Both counted before the writer ran: one batch of 2, with the
        // first refusal's reason.
        let b = c.due(t0);
        assert_eq!(b.len(), 1);
        assert_eq!((b[0].count, b[0].sample.reason.as_str()), (2, "first"));
        assert!(c.due(t0).is_empty());
        c.add(
            "s1",
            dest("a", 1),
            sample("third"),
            1,
            t0 + Duration::from_secs(1),
        );
        assert!(c.due(t0 + Duration::from_secs(9)).is_empty());
        assert_eq!(counts(&c.due(t0 + INTERVAL)), vec![("a".into(), 1)]);
        // A new window opened at 10 s; nothing in it: forgotten at 20 s,
        // and the next refusal is handed out at once again.
        assert!(c.due(t0 + 2 * INTERVAL).is_empty());
        assert!(c.sessions.is_empty());
        assert!(c.add("s1", dest("a", 1), sample("again"), 1, t0 + 2 * INTERVAL));
    }

    #[test]
    fn destinations_and_sessions_are_counted_apart() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(INTERVAL, MAX_DESTINATIONS);
        for _ in 0..3 {
            c.add("s1", dest("a", 443), sample("x"), 1, t0);
            c.add("s1", dest("a", 80), sample("x"), 1, t0);
            c.add("s2", dest("a", 443), sample("x"), 1, t0);
        }
        let mut b = c.due(t0);
        b.sort_by_key(|b| (b.session.clone(), b.dest.port));
        let got: Vec<_> = b
            .iter()
            .map(|b| (b.session.as_str(), b.dest.port, b.count))
            .collect();
        assert_eq!(
            got,
            vec![
                ("s1", Some(80), 3),
                ("s1", Some(443), 3),
                ("s2", Some(443), 3)
            ]
        );
    }

    #[test]
    fn over_the_destination_cap_refusals_are_counted_together() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(INTERVAL, 4);
        for i in 0..100 {
            c.add(
                "s1",
                dest(&format!("h{i}.example"), 443),
                sample("x"),
                1,
                t0,
            );
        }
        let b = c.due(t0);
        assert_eq!(b.len(), 5, "{:?}", counts(&b));
        let others: Vec<_> = b
            .iter()
            .filter(|b| b.dest.host.as_deref() == Some(OTHERS))
            .collect();
        assert_eq!(others.len(), 1);
        assert_eq!(others[0].count, 96);
        assert!(others[0].sample.reason.contains("more than 4 destinations"));
        assert_eq!(b.iter().map(|b| b.count).sum::<u64>(), 100);
    }

    #[test]
    fn a_session_drains_at_once_and_put_back_waits_for_the_window() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(INTERVAL, MAX_DESTINATIONS);
        c.add("s1", dest("a", 1), sample("x"), 1, t0);
        c.add("s2", dest("a", 1), sample("x"), 1, t0);
        c.due(t0);
        for _ in 0..7 {
            c.add(
                "s1",
                dest("a", 1),
                sample("x"),
                1,
                t0 + Duration::from_secs(1),
            );
        }
        // Released before the window ends: the 7 now, not at 10 s.
        assert_eq!(counts(&c.drain_session("s1")), vec![("a".into(), 7)]);
        assert!(c.drain_session("s1").is_empty());
        assert_eq!(c.sessions.len(), 1);
        // A failed write comes back and is handed out at the window's end,
        // not at once (the writer would spin on a failing store).
        let failed = Batch {
            session: "s3".into(),
            dest: dest("b", 2),
            sample: sample("x"),
            count: 5,
        };
        c.put_back(failed, t0);
        assert!(c.due(t0).is_empty());
        assert_eq!(counts(&c.due(t0 + INTERVAL)), vec![("b".into(), 5)]);
    }
}
