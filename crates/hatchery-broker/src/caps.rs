//! Per-session caps on broker calls (docs/sessions.md, "Caps";
//! docs/threat-model.md, "3. What a session can store"). Every new seq
//! stores a call row with up to 64 KiB of arguments, writes events and
//! may open an approval, so a session could otherwise fill the disk
//! through the broker. Checked for a new call only, before anything of it
//! is recorded; a retry of a seq already recorded is answered from the
//! record whatever the caps say.

use crate::config::SessionCallCaps;
use crate::store::CallUsage;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

pub const CALLS: &str = "session_call_cap";
pub const RATE: &str = "session_call_rate";
pub const ARG_BYTES: &str = "session_arg_bytes_cap";
pub const APPROVALS: &str = "session_approval_cap";

/// A refusal: the code (the 429's `error.code` and the metric's label),
/// the message, and for the rate when to ask again.
#[derive(Debug, PartialEq, Eq)]
pub struct Refusal {
    pub code: &'static str,
    pub limit: u64,
    pub message: String,
    pub retry_after: Option<u64>,
}

/// The count and argument-bytes caps for one more call with `arg_bytes`
/// of arguments, given what the session's calls hold.
pub fn check_stored(caps: &SessionCallCaps, u: &CallUsage, arg_bytes: u64) -> Result<(), Refusal> {
    if u.calls >= caps.max_calls {
        return Err(Refusal {
            code: CALLS,
            limit: caps.max_calls,
            message: format!(
                "the session has made {} broker calls, its cap; no more are taken",
                u.calls
            ),
            retry_after: None,
        });
    }
    if u.arg_bytes.saturating_add(arg_bytes) > caps.max_arg_bytes {
        return Err(Refusal {
            code: ARG_BYTES,
            limit: caps.max_arg_bytes,
            message: format!(
                "the session's broker calls hold {} bytes of arguments; {} more would pass its cap of {}",
                u.arg_bytes, arg_bytes, caps.max_arg_bytes
            ),
            retry_after: None,
        });
    }
    Ok(())
}

/// The approval cap, for a call the policy sends to an approver.
pub fn check_approvals(caps: &SessionCallCaps, u: &CallUsage) -> Result<(), Refusal> {
    if u.awaiting_approval >= caps.max_open_approvals {
        return Err(Refusal {
            code: APPROVALS,
            limit: caps.max_open_approvals,
            message: format!(
                "the session has {} broker calls waiting for an approval, its cap; decide one first",
                u.awaiting_approval
            ),
            retry_after: None,
        });
    }
    Ok(())
}

/// One token bucket per session: `per_minute` calls at once, refilled
/// evenly over a minute. In this process's memory (a restart refills it;
/// the count cap still holds, it is in the record).
pub struct RateBuckets {
    per_minute: u64,
    m: Mutex<HashMap<String, (f64, Instant)>>,
}

impl RateBuckets {
    pub fn new(per_minute: u64) -> Self {
        RateBuckets {
            per_minute: per_minute.max(1),
            m: Mutex::new(HashMap::new()),
        }
    }

    pub fn take(&self, session: &str, now: Instant) -> Result<(), Refusal> {
        let cap = self.per_minute as f64;
        let per_s = cap / 60.0;
        let mut m = self.m.lock().unwrap_or_else(|p| p.into_inner());
        if m.len() > 10_000 {
            // Full buckets are the same as none.
            m.retain(|_, (t, at)| {
                *t + now.saturating_duration_since(*at).as_secs_f64() * per_s < cap
            });
        }
        let (tokens, at) = m.entry(session.to_string()).or_insert((cap, now));
        *tokens = (*tokens + now.saturating_duration_since(*at).as_secs_f64() * per_s).min(cap);
        *at = now;
        if *tokens < 1.0 {
            let wait = ((1.0 - *tokens) / per_s).ceil().max(1.0) as u64;
            return Err(Refusal {
                code: RATE,
                limit: self.per_minute,
                message: format!(
                    "the session makes broker calls faster than {} a minute; ask again in {wait} s",
                    self.per_minute
                ),
                retry_after: Some(wait),
            });
        }
        *tokens -= 1.0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn caps() -> SessionCallCaps {
        SessionCallCaps {
            max_calls: 3,
            calls_per_minute: 6,
            max_arg_bytes: 100,
            max_open_approvals: 2,
        }
    }

    #[test]
    fn count_and_bytes_at_the_boundary() {
        let c = caps();
        let u = |calls, arg_bytes| CallUsage {
            calls,
            arg_bytes,
            awaiting_approval: 0,
        };
        assert!(check_stored(&c, &u(2, 0), 1).is_ok());
        assert_eq!(check_stored(&c, &u(3, 0), 1).unwrap_err().code, CALLS);
        assert!(check_stored(&c, &u(0, 60), 40).is_ok());
        assert_eq!(check_stored(&c, &u(0, 60), 41).unwrap_err().code, ARG_BYTES);
    }

    #[test]
    fn approvals_at_the_boundary() {
        let c = caps();
        let u = |a| CallUsage {
            calls: 0,
            arg_bytes: 0,
            awaiting_approval: a,
        };
        assert!(check_approvals(&c, &u(1)).is_ok());
        assert_eq!(check_approvals(&c, &u(2)).unwrap_err().code, APPROVALS);
    }

    #[test]
    fn the_rate_passes_a_minute_at_once_then_refills() {
        let b = RateBuckets::new(6);
        let t = Instant::now();
        for _ in 0..6 {
            b.take("s", t).unwrap();
        }
        let e = b.take("s", t).unwrap_err();
        assert_eq!((e.code, e.retry_after), (RATE, Some(10)));
        // Another session has its own bucket.
        b.take("other", t).unwrap();
        // One token every 10 s.
        b.take("s", t + Duration::from_secs(10)).unwrap();
        assert!(b.take("s", t + Duration::from_secs(10)).is_err());
    }
}
