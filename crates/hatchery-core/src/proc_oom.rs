//! Which background processes memory killed.
//!
//! Only the host sees OOM kills (when the shim kills a guest process's
//! stub, the guest sees that process end with exit code 1, measured), and
//! it sees them per sandbox, not per process: an exec compares the
//! sandbox's count before and after, which works because the exec is
//! watched from start to end. A background process outlives its start
//! request, so its count at start is kept here, and a process later found
//! ended unsuccessfully (not exit 0, not its deadline, not cancelled), with
//! kills counted since it started and no SIGKILL sent by a caller, is
//! reported as `oom`. A process that fails on its own while another one of
//! the same sandbox is OOM-killed is misread the same way (as an exec
//! running beside it is); the host cannot tell those apart.
//!
//! The manager keeps one [`ProcOoms`] per live sandbox and passes in the
//! sandbox's count (`Manager::explain_process`), so this module needs
//! nothing of the manager.

use hatchery_agent_proto::{EndReason, ProcInfo};
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

/// Processes remembered per sandbox; past it, new ones are not judged
/// (the agent bounds how many processes a sandbox has anyway).
const REMEMBERED: usize = 4096;

#[derive(Default)]
pub(crate) struct ProcOoms {
    /// Process id → the sandbox's OOM kill count when it started.
    at_start: Mutex<HashMap<String, u64>>,
    /// Processes a caller sent SIGKILL (kill, or a signal 9).
    killed: Mutex<HashSet<String>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl ProcOoms {
    pub(crate) fn started(&self, proc_id: &str, count: u64) {
        let mut m = lock(&self.at_start);
        if m.len() < REMEMBERED {
            m.insert(proc_id.to_string(), count);
        }
    }

    pub(crate) fn killed_by_caller(&self, proc_id: &str) {
        let mut k = lock(&self.killed);
        if k.len() < REMEMBERED {
            k.insert(proc_id.to_string());
        }
    }

    /// The rule of the module doc, given the sandbox's count now.
    pub(crate) fn explain(&self, mut info: ProcInfo, now: Option<u64>) -> ProcInfo {
        let Some(now) = now else { return info };
        let failed = !info.running
            && info.exit_code != Some(0)
            && !matches!(info.reason, Some(EndReason::Timeout | EndReason::Cancelled));
        if failed
            && !lock(&self.killed).contains(&info.id)
            && lock(&self.at_start).get(&info.id).is_some_and(|c| now > *c)
        {
            info.reason = Some(EndReason::Oom);
        }
        info
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(id: &str, exit_code: i32, reason: EndReason) -> ProcInfo {
        ProcInfo {
            id: id.into(),
            running: false,
            exit_code: Some(exit_code),
            reason: Some(reason),
            ..Default::default()
        }
    }

    #[test]
    fn a_failure_after_an_oom_kill_since_the_start_is_memory() {
        use EndReason::*;
        let p = ProcOoms::default();
        p.started("a", 2);
        assert_eq!(p.explain(ended("a", 1, Exited), Some(3)).reason, Some(Oom));
        assert_eq!(
            p.explain(ended("a", -1, Signaled), Some(3)).reason,
            Some(Oom)
        );
        // No kill since it started, a success, its deadline, or still
        // running: as is.
        assert_eq!(
            p.explain(ended("a", 1, Exited), Some(2)).reason,
            Some(Exited)
        );
        assert_eq!(
            p.explain(ended("a", 0, Exited), Some(3)).reason,
            Some(Exited)
        );
        assert_eq!(
            p.explain(ended("a", -1, Timeout), Some(3)).reason,
            Some(Timeout)
        );
        let mut running = ended("a", 0, Exited);
        (running.running, running.exit_code, running.reason) = (true, None, None);
        assert_eq!(p.explain(running, Some(3)).reason, None);
        // Unknown to the host (started before a restart), or no count.
        assert_eq!(
            p.explain(ended("b", 1, Exited), Some(3)).reason,
            Some(Exited)
        );
        assert_eq!(p.explain(ended("a", 1, Exited), None).reason, Some(Exited));
    }

    #[test]
    fn a_kill_a_caller_sent_is_never_memory() {
        let p = ProcOoms::default();
        p.started("a", 0);
        p.killed_by_caller("a");
        let info = ended("a", -1, EndReason::Signaled);
        assert_eq!(p.explain(info, Some(5)).reason, Some(EndReason::Signaled));
    }
}
