//! Whether anything of the user's runs in the guest, for the host's idle
//! parking (hatchery-core idle.rs): a sandbox nobody uses is stopped whole
//! (its Sentry burns CPU while the guest sleeps), and a sandbox with work
//! in it must never be, or a background job would silently make no
//! progress.
//!
//! The rule is by process, not by request: the guest is quiet when every
//! process in it is the agent's own (itself, its cgroup keeper, and the
//! interpreters of contexts that are not running code). Anything else, a
//! command, a terminal's shell, a background process, a daemon a command
//! left behind, a child an interpreter started, keeps the sandbox running.
//! Requests in flight are the host's to count (its open channels).

use hatchery_agent_proto::QuietReport;

/// The processes of the guest, by pid (`/proc` lists one entry per thread
/// group, under gVisor as under Linux).
fn guest_pids() -> std::io::Result<Vec<u32>> {
    let mut pids = vec![];
    for e in std::fs::read_dir("/proc")? {
        if let Some(pid) = e?.file_name().to_str().and_then(|n| n.parse().ok()) {
            pids.push(pid);
        }
    }
    Ok(pids)
}

/// The first process that is not the agent's own, if any.
fn stranger(pids: &[u32], own: &[u32]) -> Option<u32> {
    let me = std::process::id();
    pids.iter()
        .copied()
        .find(|p| *p != me && *p != 1 && !own.contains(p))
}

pub fn report(contexts: &crate::code::Contexts, writes_pending: bool) -> QuietReport {
    let busy = |why: String| QuietReport {
        quiet: false,
        busy: Some(why),
    };
    if writes_pending {
        return busy("a file is being written".into());
    }
    let mut own = match contexts.idle_pids() {
        Ok(p) => p,
        Err(why) => return busy(why.into()),
    };
    match crate::cgroup::keeper().pid() {
        Ok(Some(p)) => own.push(p),
        Ok(None) => {}
        Err(()) => return busy("the cgroup keeper is serving a request".into()),
    }
    match guest_pids() {
        Ok(pids) => match stranger(&pids, &own) {
            Some(p) => busy(format!("process {p} runs")),
            None => QuietReport {
                quiet: true,
                busy: None,
            },
        },
        Err(e) => busy(format!("cannot list processes: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_agents_own_processes_are_quiet() {
        let me = std::process::id();
        assert_eq!(stranger(&[1, me, 7, 9], &[7, 9]), None);
        assert_eq!(stranger(&[1, me, 7, 9, 12], &[7, 9]), Some(12));
        // A child of an idle interpreter is the user's.
        assert_eq!(stranger(&[1, 7, 8], &[7]), Some(8));
    }

    #[test]
    fn this_hosts_proc_lists_this_process() {
        // The scan itself, against a real /proc: it must see us.
        let pids = guest_pids().unwrap();
        assert!(pids.contains(&std::process::id()));
    }
}
