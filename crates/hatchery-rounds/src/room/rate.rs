//! The per-connection message budget of a room: a token bucket (a burst,
//! then a steady rate), on a clock the caller passes so the boundary is
//! tested without sleeping.

use std::time::Instant;

pub struct Bucket {
    tokens: f64,
    last: Instant,
    per_s: f64,
    burst: f64,
}

impl Bucket {
    pub fn new(now: Instant, per_s: f64, burst: f64) -> Bucket {
        Bucket {
            tokens: burst,
            last: now,
            per_s,
            burst,
        }
    }

    /// Spends one message; `false` once the budget is gone.
    pub fn take(&mut self, now: Instant) -> bool {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + dt * self.per_s).min(self.burst);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn burst_then_rate() {
        let t0 = Instant::now();
        let mut b = Bucket::new(t0, 10.0, 20.0);
        for i in 0..20 {
            assert!(b.take(t0), "message {i} of the burst");
        }
        assert!(!b.take(t0), "the 21st at once is over");
        // 100 ms at 10/s buys exactly one more.
        let t1 = t0 + Duration::from_millis(100);
        assert!(b.take(t1));
        assert!(!b.take(t1));
        // A long pause refills to the burst, never past it.
        let t2 = t1 + Duration::from_secs(3600);
        for _ in 0..20 {
            assert!(b.take(t2));
        }
        assert!(!b.take(t2));
    }

    /// The room's own constants: ROOM_RATE_BURST messages at once pass,
    /// the next does not; then exactly one per 1/ROOM_RATE_PER_S.
    #[test]
    fn room_caps_at_the_boundary() {
        use crate::limits::{ROOM_RATE_BURST, ROOM_RATE_PER_S};
        let t0 = Instant::now();
        let mut b = Bucket::new(t0, ROOM_RATE_PER_S, ROOM_RATE_BURST);
        for i in 0..ROOM_RATE_BURST as usize {
            assert!(b.take(t0), "message {i} of the burst");
        }
        assert!(!b.take(t0), "one past the burst");
        let step = Duration::from_secs_f64(1.0 / ROOM_RATE_PER_S);
        let t1 = t0 + step;
        assert!(b.take(t1), "one interval buys one message");
        assert!(!b.take(t1), "and only one");
        // Just short of an interval buys nothing.
        let t2 = t1 + step - Duration::from_micros(100);
        assert!(!b.take(t2));
    }
}
