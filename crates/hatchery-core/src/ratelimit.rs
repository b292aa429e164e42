//! Log lines that a sandbox can trigger (its guest misbehaving, its
//! commands timing out) go through this, so a hostile guest cannot flood
//! the daemon's logs. A fixed window per key: at most `burst` lines per
//! `window`, then one summary line with the number suppressed.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub struct LogLimiter {
    window: Duration,
    burst: u32,
    state: Mutex<HashMap<String, (Instant, u32, u64)>>,
}

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
        let now = Instant::now();
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.len() > 10_000 {
            st.retain(|_, (start, _, _)| now.duration_since(*start) < self.window);
        }
        let e = st.entry(key.to_string()).or_insert((now, 0, 0));
        if now.duration_since(e.0) >= self.window {
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

/// `warn!` through a limiter keyed by sandbox and event kind.
#[macro_export]
macro_rules! limited_warn {
    ($limiter:expr, $key:expr, $($arg:tt)+) => {
        match $limiter.check($key) {
            $crate::ratelimit_verdict::Log => tracing::warn!($($arg)+),
            $crate::ratelimit_verdict::LogWithSuppressed(n) => {
                tracing::warn!(suppressed = n, $($arg)+)
            }
            $crate::ratelimit_verdict::Drop => {}
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_then_drops_then_reports() {
        let l = LogLimiter::new(Duration::from_millis(50), 2);
        assert!(matches!(l.check("a"), Verdict::Log));
        assert!(matches!(l.check("a"), Verdict::Log));
        assert!(matches!(l.check("a"), Verdict::Drop));
        assert!(matches!(l.check("b"), Verdict::Log), "keys are independent");
        std::thread::sleep(Duration::from_millis(60));
        assert!(matches!(l.check("a"), Verdict::LogWithSuppressed(1)));
    }
}
