//! Log lines that a sandbox can trigger (its guest misbehaving, its
//! commands timing out, its connections refused, a session's event queue
//! full) go through this, so a hostile guest cannot flood the daemon's
//! logs. A fixed window per key: at most `burst` lines per `window`, then
//! one line with the number suppressed. One copy for every crate.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Keys beyond which windows that have ended are forgotten: keys are
/// sandbox or session ids, which a guest cannot mint faster than the
/// daemon makes sandboxes, but a daemon lives long.
const MAX_KEYS: usize = 10_000;

pub struct LogLimiter {
    window: Duration,
    burst: u32,
    /// Per key: window start, lines logged in it, lines dropped since.
    state: Mutex<HashMap<String, (Instant, u32, u64)>>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Log,
    /// Log, and say how many were dropped since the last logged line.
    LogWithSuppressed(u64),
    Drop,
}

impl LogLimiter {
    pub fn new(window: Duration, burst: u32) -> Self {
        LogLimiter {
            window,
            burst,
            state: Mutex::new(HashMap::new()),
        }
    }

    pub fn check(&self, key: &str) -> Verdict {
        self.check_at(key, Instant::now())
    }

    fn check_at(&self, key: &str, now: Instant) -> Verdict {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.len() > MAX_KEYS {
            st.retain(|_, (start, _, _)| now.saturating_duration_since(*start) < self.window);
        }
        let e = st.entry(key.to_string()).or_insert((now, 0, 0));
        if now.saturating_duration_since(e.0) >= self.window {
            let dropped = e.2;
            *e = (now, 1, 0);
            return if dropped > 0 {
                Verdict::LogWithSuppressed(dropped)
            } else {
                Verdict::Log
            };
        }
        if e.1 < self.burst {
            e.1 += 1;
            Verdict::Log
        } else {
            e.2 += 1;
            Verdict::Drop
        }
    }
}

/// `tracing::warn!` through a [`LogLimiter`], keyed by `$key`.
#[macro_export]
macro_rules! limited_warn {
    ($limiter:expr, $key:expr, $($arg:tt)+) => {
        match $limiter.check($key) {
            $crate::log_limit::Verdict::Log => tracing::warn!($($arg)+),
            $crate::log_limit::Verdict::LogWithSuppressed(n) => {
                tracing::warn!(suppressed = n, $($arg)+)
            }
            $crate::log_limit::Verdict::Drop => {}
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_per_window_then_the_dropped_count() {
        let l = LogLimiter::new(Duration::from_secs(10), 2);
        let t0 = Instant::now();
        assert_eq!(l.check_at("k", t0), Verdict::Log);
        assert_eq!(l.check_at("k", t0), Verdict::Log);
        assert_eq!(l.check_at("k", t0), Verdict::Drop);
        assert_eq!(l.check_at("k", t0), Verdict::Drop);
        // Other keys have their own window.
        assert_eq!(l.check_at("other", t0), Verdict::Log);
        let t1 = t0 + Duration::from_secs(10);
        assert_eq!(l.check_at("k", t1), Verdict::LogWithSuppressed(2));
        assert_eq!(l.check_at("k", t1), Verdict::Log);
    }

    #[test]
    fn ended_windows_are_forgotten_past_the_key_cap() {
        let l = LogLimiter::new(Duration::from_secs(1), 1);
        let t0 = Instant::now();
        for i in 0..=MAX_KEYS {
            l.check_at(&format!("k{i}"), t0);
        }
        l.check_at("late", t0 + Duration::from_secs(2));
        assert_eq!(l.state.lock().unwrap().len(), 1);
    }
}
