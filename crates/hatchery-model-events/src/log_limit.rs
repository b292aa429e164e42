//! One rate-limited warning for every event that does not reach a
//! session's log: guest code can cause them in a loop (calls refused by
//! the thousand, a full queue), so at most one line per 10 s is logged,
//! then one with the number suppressed (hatchery-serve's limiter).

use hatchery_serve::log_limit::LogLimiter;
use std::sync::OnceLock;
use std::time::Duration;

/// An event not written to `session`'s log; `why` says where it stopped.
pub(crate) fn not_written(session: Option<&str>, why: &str) {
    static LIMIT: OnceLock<LogLimiter> = OnceLock::new();
    let l = LIMIT.get_or_init(|| LogLimiter::new(Duration::from_secs(10), 1));
    hatchery_serve::limited_warn!(
        l,
        "gateway-event",
        session,
        why,
        "gateway event not written to the session log"
    );
}

/// An event its caller waited for that was not taken before the wait's
/// bound: the answer went out first (the event is still written in turn).
pub(crate) fn answered_first() {
    static LIMIT: OnceLock<LogLimiter> = OnceLock::new();
    let l = LIMIT.get_or_init(|| LogLimiter::new(Duration::from_secs(10), 1));
    hatchery_serve::limited_warn!(
        l,
        "gateway-event-late",
        "a gateway event was not recorded before its answer"
    );
}
