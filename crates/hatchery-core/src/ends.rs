//! Why a sandbox ended on its own, kept long enough to tell the request
//! that was running in it.
//!
//! The runtime knows the cause (`Runtime::end_cause`) only until the
//! sandbox's teardown; the watcher in `Manager::adopt` reads it as soon as
//! the agent's channel closes and may have torn the sandbox down before an
//! exec that was running there gets its error. So the watcher notes the
//! cause here, and the exec asks both. The manager hands over its runtime
//! rather than itself, so this module needs nothing of the manager.

use crate::error::CoreError;
use hatchery_runtime::{EndCause, Runtime};
use std::collections::VecDeque;
use std::sync::Mutex;

/// Causes remembered (oldest dropped first): enough for the requests in
/// flight when their sandboxes died, bounded whatever guests do.
const REMEMBERED: usize = 256;

#[derive(Default)]
pub(crate) struct RecentEnds(Mutex<VecDeque<(String, EndCause)>>);

impl RecentEnds {
    fn note(&self, id: &str, cause: EndCause) {
        let mut q = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() >= REMEMBERED {
            q.pop_front();
        }
        q.push_back((id.to_string(), cause));
    }

    fn get(&self, id: &str) -> Option<EndCause> {
        let q = self.0.lock().unwrap_or_else(|p| p.into_inner());
        q.iter().rev().find(|(i, _)| i == id).map(|(_, c)| *c)
    }

    /// The stop reason of a sandbox whose guest went away on its own,
    /// as `runtime` tells it; the cause is noted for [`Self::explain`].
    pub(crate) fn ended_on_its_own(&self, runtime: &dyn Runtime, id: &str) -> &'static str {
        match runtime.end_cause(id) {
            Some(cause) => {
                self.note(id, cause);
                if cause == EndCause::HostOom {
                    // The guest's own ceiling should always act first; the
                    // operator needs to hear when it did not.
                    tracing::warn!(sandbox = %id, "the host's memory backstop killed the sandbox's runtime");
                }
                cause.reason()
            }
            None => "guest_exited",
        }
    }

    /// An error from a request whose guest stopped answering, told more
    /// precisely when the sandbox died of memory (the runtime's cause while
    /// it still knows it, else the one noted here).
    pub(crate) fn explain(&self, runtime: &dyn Runtime, id: &str, e: CoreError) -> CoreError {
        if !matches!(e, CoreError::GuestUnresponsive(_)) {
            return e;
        }
        match runtime.end_cause(id).or_else(|| self.get(id)) {
            Some(cause) => CoreError::SandboxOom {
                id: id.to_string(),
                reason: cause.reason(),
            },
            None => e,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_cause_wins_and_the_oldest_are_forgotten() {
        let r = RecentEnds::default();
        r.note("a", EndCause::GuestOom);
        r.note("a", EndCause::HostOom);
        assert_eq!(r.get("a"), Some(EndCause::HostOom));
        for i in 0..REMEMBERED {
            r.note(&format!("x{i}"), EndCause::GuestOom);
        }
        assert_eq!(r.get("a"), None);
        assert_eq!(r.get("x0"), Some(EndCause::GuestOom));
        assert_eq!(r.0.lock().unwrap().len(), REMEMBERED);
    }
}
