//! One rate-limited warning for every event that does not reach a
//! session's log: guest code can cause them in a loop (calls refused by
//! the thousand, a full queue), so at most a burst per window is logged,
//! then one line with the number suppressed. (The rule of hatchery-core's
//! `LogLimiter`, which this crate does not depend on; one key here.)

use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

const WINDOW: Duration = Duration::from_secs(10);
const BURST: u32 = 1;

#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Log,
    /// Log, and say how many were dropped since the last logged line.
    LogWithSuppressed(u64),
    Drop,
}

/// A fixed window: its start, lines logged in it, lines dropped since.
struct Limiter(Mutex<Option<(Instant, u32, u64)>>);

impl Limiter {
    fn check_at(&self, now: Instant, window: Duration, burst: u32) -> Verdict {
        let mut st = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let e = st.get_or_insert((now, 0, 0));
        if now.saturating_duration_since(e.0) >= window {
            let dropped = e.2;
            *e = (now, 1, 0);
            return match dropped {
                0 => Verdict::Log,
                n => Verdict::LogWithSuppressed(n),
            };
        }
        if e.1 < burst {
            e.1 += 1;
            Verdict::Log
        } else {
            e.2 += 1;
            Verdict::Drop
        }
    }
}

/// An event not written to `session`'s log; `why` says where it stopped.
pub(crate) fn not_written(session: Option<&str>, why: &str) {
    static LIMIT: OnceLock<Limiter> = OnceLock::new();
    let l = LIMIT.get_or_init(|| Limiter(Mutex::new(None)));
    let msg = "gateway event not written to the session log";
    match l.check_at(Instant::now(), WINDOW, BURST) {
        Verdict::Log => tracing::warn!(session, why, "{msg}"),
        Verdict::LogWithSuppressed(n) => tracing::warn!(suppressed = n, session, why, "{msg}"),
        Verdict::Drop => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_per_window_then_the_dropped_count() {
        let l = Limiter(Mutex::new(None));
        let w = Duration::from_secs(10);
        let t0 = Instant::now();
        assert_eq!(l.check_at(t0, w, 2), Verdict::Log);
        assert_eq!(l.check_at(t0, w, 2), Verdict::Log);
        assert_eq!(l.check_at(t0, w, 2), Verdict::Drop);
        assert_eq!(l.check_at(t0 + w / 2, w, 2), Verdict::Drop);
        let t1 = t0 + w;
        assert_eq!(l.check_at(t1, w, 2), Verdict::LogWithSuppressed(2));
        assert_eq!(l.check_at(t1, w, 2), Verdict::Log);
        assert_eq!(l.check_at(t1, w, 2), Verdict::Drop);
    }
}
