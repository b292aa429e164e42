//! A small token bucket for log lines a candidate can cause (a sandbox
//! call failing during their Run): a burst, then a steady rate, with the
//! count of dropped lines carried by the next line that gets through.

use std::sync::Mutex;
use std::time::Instant;

pub struct LogLimit {
    inner: Mutex<(f64, Instant, u64)>,
    per_s: f64,
    burst: f64,
}

impl LogLimit {
    pub fn new(per_s: f64, burst: f64) -> Self {
        LogLimit {
            inner: Mutex::new((burst, Instant::now(), 0)),
            per_s,
            burst,
        }
    }

    /// `Some(lines dropped since the last one allowed)` if this one may go out.
    pub fn allow(&self) -> Option<u64> {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let (tokens, last, dropped) = &mut *g;
        *tokens = (*tokens + now.duration_since(*last).as_secs_f64() * self.per_s).min(self.burst);
        *last = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Some(std::mem::take(dropped))
        } else {
            *dropped += 1;
            None
        }
    }
}

/// Sandbox failures answered to callers: 5 per 10 s, burst 10.
pub static SANDBOX_ERRORS: std::sync::LazyLock<LogLimit> =
    std::sync::LazyLock::new(|| LogLimit::new(0.5, 10.0));

/// A shared database that is not reachable, answered 503: 5 per 10 s,
/// burst 10 (every request fails the same way while it is down).
pub static STORE_UNAVAILABLE: std::sync::LazyLock<LogLimit> =
    std::sync::LazyLock::new(|| LogLimit::new(0.5, 10.0));

/// Lines a candidate's Submit or Run leads to (captures, grader and fresh
/// Run failures): 10 per 10 s, burst 20.
pub static CANDIDATE_EVENTS: std::sync::LazyLock<LogLimit> =
    std::sync::LazyLock::new(|| LogLimit::new(1.0, 20.0));

#[cfg(test)]
mod tests {
    #[test]
    fn bursts_then_drops() {
        let l = super::LogLimit::new(0.0001, 3.0);
        assert_eq!((0..5).filter(|_| l.allow().is_some()).count(), 3);
        assert_eq!(l.allow(), None);
    }
}
