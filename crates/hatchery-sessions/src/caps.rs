//! What one session's agent output may store (docs/sessions.md, "Caps";
//! docs/threat-model.md, "3. What a session can store"). Every stdout
//! line of the agent becomes an event, so without a bound a loop of
//! `print("x" * 1_000_000)` fills the host's disk. The runner asks an
//! [`OutputGuard`] about each line before it is stored:
//!
//! * **blob size**: a long field keeps at most `max_blob_bytes` of its
//!   whole text as a blob (the rest is cut, `truncated` where the event
//!   has the flag);
//! * **bytes per session**: the agent's events (their stored JSON) and
//!   blobs count against `max_bytes`; the line that would go past it is
//!   not stored, one `output_capped {cap: "output_bytes"}` event is
//!   written instead, and every later line is dropped (counted in
//!   metrics);
//! * **lines per second**: a token bucket (`burst` lines, refilled at
//!   `lines_per_s`); a line without tokens is dropped, the first such
//!   drop of the session writes one `output_capped {cap: "output_rate"}`
//!   event, the rest are counted in metrics. Lines that wait for an ack
//!   are never rate-dropped: the agent cannot send the next before the
//!   runner answered, so they come at the runner's pace anyway, and
//!   dropping one would leave the agent waiting for good.
//!
//! The guard is rebuilt from the store's [`StorageUsage`] when the runner
//! (re)attaches, so a restart neither forgets what was stored nor writes
//! a second marker.

use crate::config::OutputCaps;
use crate::events::EventKind;
use crate::store::StorageUsage;
use std::time::Instant;

pub const CAP_BYTES: &str = "output_bytes";
pub const CAP_RATE: &str = "output_rate";
pub const CAP_BLOB: &str = "output_blob";
pub const CAP_APPROVALS: &str = "open_approvals";

/// What to do with one line of agent output.
#[derive(Debug, PartialEq)]
pub enum Verdict {
    /// Store its event (already cut to the blob cap); `blob_cut` says
    /// whether the cut happened.
    Keep { blob_cut: bool },
    /// Do not store it; write `marker` instead when there is one (the
    /// first time this cap bites in the session).
    Drop {
        cap: &'static str,
        marker: Option<EventKind>,
        bytes: u64,
    },
}

#[derive(Debug)]
pub struct OutputGuard {
    caps: OutputCaps,
    used: u64,
    bytes_capped: bool,
    rate_marked: bool,
    tokens: f64,
    last: Instant,
}

impl OutputGuard {
    pub fn new(caps: OutputCaps, usage: &StorageUsage, now: Instant) -> Self {
        OutputGuard {
            caps,
            used: usage.output_bytes(),
            bytes_capped: usage.capped.iter().any(|c| c == CAP_BYTES),
            rate_marked: usage.capped.iter().any(|c| c == CAP_RATE),
            tokens: caps.burst.max(1) as f64,
            last: now,
        }
    }

    /// Bytes counted so far.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Decides on one line's event; on `Keep`, `kind` has been cut to the
    /// blob cap and its stored size counted.
    pub fn check(&mut self, kind: &mut EventKind, wants_ack: bool, now: Instant) -> Verdict {
        let raw = crate::events::stored_bytes(kind, self.caps.max_blob_bytes);
        if self.bytes_capped {
            return Verdict::Drop {
                cap: CAP_BYTES,
                marker: None,
                bytes: raw,
            };
        }
        if !wants_ack {
            let dt = now.saturating_duration_since(self.last).as_secs_f64();
            self.last = now;
            self.tokens = (self.tokens + dt * self.caps.lines_per_s as f64)
                .min(self.caps.burst.max(1) as f64);
            if self.tokens < 1.0 {
                let marker = (!self.rate_marked).then(|| {
                    self.rate_marked = true;
                    EventKind::OutputCapped {
                        cap: CAP_RATE.into(),
                        limit: self.caps.lines_per_s,
                        message: format!(
                            "the agent printed more than {} lines at once or {} a second; lines over the rate are dropped (counted in hatchery_sessions_output_dropped_lines_total)",
                            self.caps.burst, self.caps.lines_per_s
                        ),
                    }
                });
                return Verdict::Drop {
                    cap: CAP_RATE,
                    marker,
                    bytes: raw,
                };
            }
            self.tokens -= 1.0;
        }
        let blob_cut = crate::events::cap_blobs(kind, self.caps.max_blob_bytes);
        let size = crate::events::stored_bytes(kind, self.caps.max_blob_bytes);
        if self.used.saturating_add(size) > self.caps.max_bytes {
            self.bytes_capped = true;
            return Verdict::Drop {
                cap: CAP_BYTES,
                marker: Some(EventKind::OutputCapped {
                    cap: CAP_BYTES.into(),
                    limit: self.caps.max_bytes,
                    message: format!(
                        "the agent's output reached the session's cap of {} stored bytes ({} stored); the rest of its output is dropped",
                        self.caps.max_bytes, self.used
                    ),
                }),
                bytes: raw,
            };
        }
        self.used += size;
        Verdict::Keep { blob_cut }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn out(n: usize) -> EventKind {
        EventKind::AgentOutput {
            text: "x".repeat(n),
            text_ref: None,
        }
    }

    fn caps(max_bytes: u64) -> OutputCaps {
        OutputCaps {
            max_bytes,
            lines_per_s: 10,
            burst: 100,
            max_blob_bytes: 8192,
        }
    }

    #[test]
    fn the_byte_cap_passes_n_and_refuses_n_plus_one_with_one_marker() {
        let t = Instant::now();
        let one = crate::events::stored_bytes(&out(10), 8192);
        // Exactly five lines fit.
        let mut g = OutputGuard::new(caps(one * 5), &StorageUsage::default(), t);
        for _ in 0..5 {
            assert_eq!(
                g.check(&mut out(10), false, t),
                Verdict::Keep { blob_cut: false }
            );
        }
        assert_eq!(g.used(), one * 5);
        // The sixth is refused, with the marker; every later one silently.
        match g.check(&mut out(10), false, t) {
            Verdict::Drop {
                cap: CAP_BYTES,
                marker: Some(EventKind::OutputCapped { cap, .. }),
                ..
            } => assert_eq!(cap, CAP_BYTES),
            v => panic!("{v:?}"),
        }
        for _ in 0..3 {
            assert!(matches!(
                g.check(&mut out(1), true, t),
                Verdict::Drop {
                    cap: CAP_BYTES,
                    marker: None,
                    ..
                }
            ));
        }
        // A restart that finds the marker in the log writes no second one.
        let u = StorageUsage {
            agent_event_bytes: one * 5,
            capped: vec![CAP_BYTES.into()],
            ..Default::default()
        };
        let mut g = OutputGuard::new(caps(one * 5), &u, t);
        assert!(matches!(
            g.check(&mut out(10), false, t),
            Verdict::Drop { marker: None, .. }
        ));
        // One that finds the bytes but no marker (died between): the next
        // line over writes it.
        let u = StorageUsage {
            agent_event_bytes: one * 5,
            ..Default::default()
        };
        let mut g = OutputGuard::new(caps(one * 5), &u, t);
        assert!(matches!(
            g.check(&mut out(10), false, t),
            Verdict::Drop {
                marker: Some(_),
                ..
            }
        ));
    }

    #[test]
    fn the_rate_passes_the_burst_then_drops_with_one_marker_and_refills() {
        let t = Instant::now();
        let mut g = OutputGuard::new(caps(u64::MAX), &StorageUsage::default(), t);
        for _ in 0..100 {
            assert!(matches!(
                g.check(&mut out(1), false, t),
                Verdict::Keep { .. }
            ));
        }
        assert!(matches!(
            g.check(&mut out(1), false, t),
            Verdict::Drop {
                cap: CAP_RATE,
                marker: Some(_),
                ..
            }
        ));
        assert!(matches!(
            g.check(&mut out(1), false, t),
            Verdict::Drop {
                cap: CAP_RATE,
                marker: None,
                ..
            }
        ));
        // A line that waits for its ack is never rate-dropped.
        assert!(matches!(
            g.check(&mut out(1), true, t),
            Verdict::Keep { .. }
        ));
        // 10 a second: after 1 s, 10 more pass and the 11th is dropped.
        let t1 = t + Duration::from_secs(1);
        for _ in 0..10 {
            assert!(matches!(
                g.check(&mut out(1), false, t1),
                Verdict::Keep { .. }
            ));
        }
        assert!(matches!(
            g.check(&mut out(1), false, t1),
            Verdict::Drop {
                cap: CAP_RATE,
                marker: None,
                ..
            }
        ));
    }

    #[test]
    fn the_blob_cap_keeps_exactly_n_bytes() {
        let t = Instant::now();
        let mut g = OutputGuard::new(caps(u64::MAX), &StorageUsage::default(), t);
        let mut k = out(8192);
        assert_eq!(g.check(&mut k, false, t), Verdict::Keep { blob_cut: false });
        let mut k = out(8193);
        assert_eq!(g.check(&mut k, false, t), Verdict::Keep { blob_cut: true });
        match k {
            EventKind::AgentOutput { text, .. } => assert_eq!(text.len(), 8192),
            _ => unreachable!(),
        }
        // A field with a truncated flag says so.
        let mut k = EventKind::CommandRun {
            call_id: "c".into(),
            command: "yes".into(),
            exit_code: 0,
            duration_ms: 1,
            output: "y".repeat(10_000),
            output_ref: None,
            truncated: false,
        };
        g.check(&mut k, true, t);
        assert!(
            matches!(k, EventKind::CommandRun { truncated: true, ref output, .. } if output.len() == 8192)
        );
    }
}
