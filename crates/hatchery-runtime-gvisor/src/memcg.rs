//! The memory ceiling, split so that a guest that exhausts its memory is
//! the one that pays.
//!
//! Why: runsc puts the Sentry, the gofer and the systrap stub processes
//! (one per guest address space; guest memory a guest process touches is
//! charged to its stub) in one memory cgroup. When a memory hog filled
//! that cgroup, the host OOM killer chose among all of them. It usually
//! killed the hog's stub, but a killed stub's pages stay charged until the
//! Sentry notices and frees them (they live in the Sentry's memory file),
//! so under CPU load a second OOM came first and killed the Sentry: the
//! whole sandbox died (measured: 4 of 8 hogs beside three CPU burners, see
//! docs/threat-model.md, "Memory").
//!
//! What holds now: the sandbox's cgroup (`/sys/fs/cgroup/memory/<id>`, the
//! one runsc makes) is limited to the guest's memory plus its disk (the
//! disk is a tmpfs the Sentry writes, charged here) plus
//! [`RUNTIME_HEADROOM_MB`] for the Sentry and gofer themselves. A child
//! cgroup, `guest`, limited to exactly the guest's memory, holds every
//! process of the sandbox except the Sentry and the gofer. A hog fills
//! `guest`; the OOM killer of `guest` can only choose among guest
//! processes' stubs, and the Sentry, outside it with room to spare, frees
//! the victim's memory. The parent's limit stays as the host's backstop.
//! Who chooses the victim inside `guest` is the shim (oom.rs), not the
//! kernel, because the victim's memory is released late.
//!
//! The Sentry and gofer are told apart from stubs by their parent: runsc
//! starts both from outside the cgroup, while every stub is a child of the
//! Sentry or of another stub. A parent pid is kernel state, so nothing a
//! guest writes (its stub's command line, say) can move it out of `guest`.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

/// Host memory the Sentry and gofer get beyond the guest's memory and
/// disk (measured: about 60 MiB in use for a 512 MiB guest at its limit).
pub const RUNTIME_HEADROOM_MB: u64 = 256;

/// The child cgroup that holds the guest's processes.
pub const GUEST: &str = "guest";

const MIB: u64 = 1024 * 1024;

/// The sandbox cgroup's limit (what runsc is given in the OCI spec).
pub fn sandbox_limit_bytes(memory_mb: u64, disk_mb: u64) -> u64 {
    memory_mb
        .saturating_add(disk_mb)
        .saturating_add(RUNTIME_HEADROOM_MB)
        .saturating_mul(MIB)
}

/// The guest cgroup's limit: exactly the memory the sandbox was given.
pub fn guest_limit_bytes(memory_mb: u64) -> u64 {
    memory_mb.saturating_mul(MIB)
}

/// The sandbox's memory cgroup.
pub fn sandbox_dir(id: &str) -> PathBuf {
    Path::new("/sys/fs/cgroup/memory").join(id)
}

/// The processes of the cgroup that are the runtime (Sentry, gofer):
/// those whose parent is not in it. `procs` maps pid to parent pid.
pub fn runtime_pids(procs: &HashMap<u32, u32>) -> BTreeSet<u32> {
    procs
        .iter()
        .filter(|(_, ppid)| !procs.contains_key(ppid))
        .map(|(pid, _)| *pid)
        .collect()
}

/// The processes to move into `guest`: everything but the runtime.
pub fn to_move(procs: &[u32], runtime: &BTreeSet<u32>) -> Vec<u32> {
    procs
        .iter()
        .copied()
        .filter(|p| !runtime.contains(p))
        .collect()
}

#[derive(Debug, thiserror::Error)]
pub enum MemcgError {
    #[error("{what} {path}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub(crate) fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> MemcgError {
    let path = path.to_path_buf();
    move |source| MemcgError::Io { what, path, source }
}

pub(crate) fn procs(dir: &Path) -> Result<Vec<u32>, MemcgError> {
    let p = dir.join("cgroup.procs");
    let s = std::fs::read_to_string(&p).map_err(io("reading", &p))?;
    Ok(s.split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect())
}

fn ppid(pid: u32) -> Option<u32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name, which may hold spaces and parentheses.
    let rest = &s[s.rfind(')')? + 2..];
    rest.split(' ').nth(1)?.parse().ok()
}

/// The split of one sandbox's memory cgroup (module doc).
pub struct Split {
    dir: PathBuf,
    guest: PathBuf,
    runtime: BTreeSet<u32>,
}

impl Split {
    /// Makes `guest` with the guest's limit and moves every process but
    /// the runtime into it. Call once runsc has started the sandbox, before
    /// anyone may run code in it. `None` when the host has no v1 memory
    /// cgroup for the sandbox (nothing to split).
    pub fn create(id: &str, memory_mb: u64) -> Result<Option<Split>, MemcgError> {
        let dir = sandbox_dir(id);
        if !dir.is_dir() {
            return Ok(None);
        }
        let guest = dir.join(GUEST);
        match std::fs::create_dir(&guest) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io("creating", &guest)(e)),
        }
        let limit = guest.join("memory.limit_in_bytes");
        std::fs::write(&limit, guest_limit_bytes(memory_mb).to_string())
            .map_err(io("writing", &limit))?;
        let all = procs(&dir)?;
        let parents: HashMap<u32, u32> = all
            .iter()
            .filter_map(|p| ppid(*p).map(|pp| (*p, pp)))
            .collect();
        let split = Split {
            runtime: runtime_pids(&parents),
            dir,
            guest,
        };
        split.sweep()?;
        Ok(Some(split))
    }

    /// Moves into `guest` any process of the sandbox that is not the
    /// runtime; returns how many. Stubs are cloned from stubs already in
    /// `guest`, so this normally finds none; it runs again periodically in
    /// case the Sentry starts one itself.
    pub fn sweep(&self) -> Result<usize, MemcgError> {
        let procs_file = self.guest.join("cgroup.procs");
        let mut moved = 0;
        for pid in to_move(&procs(&self.dir)?, &self.runtime) {
            match std::fs::write(&procs_file, pid.to_string()) {
                Ok(()) => moved += 1,
                // Gone meanwhile.
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(e) => return Err(io("moving a process into", &procs_file)(e)),
            }
        }
        Ok(moved)
    }
}

/// The `oom_kill` count of the memory cgroup at `dir`.
fn oom_kill_count(dir: &Path) -> Option<u64> {
    let s = std::fs::read_to_string(dir.join("memory.oom_control")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|v| v.trim().parse().ok())
}

/// OOM kills in the sandbox's cgroup and its `guest` child together (in
/// cgroup v1 each counts only its own), with the shim's own in `guest`
/// (oom_count.rs; `bundle` is the sandbox's bundle).
pub fn oom_kills(id: &str, bundle: &Path) -> Option<u64> {
    let dir = sandbox_dir(id);
    let parent = oom_kill_count(&dir)?;
    Some(parent + guest_kills(&dir, bundle))
}

fn guest_kills(dir: &Path, bundle: &Path) -> u64 {
    oom_kill_count(&dir.join(GUEST)).unwrap_or(0) + crate::oom_count::kills(bundle)
}

/// Why a sandbox whose guest just ended on its own died, judged from its
/// cgroups. The kernel counts a kill in the victim's own cgroup (in cgroup
/// v1 events do not propagate to parents), so a kill counted in the
/// sandbox's cgroup took the Sentry or the gofer: the host backstop fired.
/// `guest_oom_now`: the guest was at its ceiling, or a guest process was
/// killed for memory, just before the end (the shim knows, oom.rs); then
/// the victim was one the sandbox needs (its agent). Otherwise it was not a
/// memory death.
pub fn end_cause(id: &str, guest_oom_now: bool) -> Option<hatchery_runtime::EndCause> {
    end_cause_of(oom_kill_count(&sandbox_dir(id)), guest_oom_now)
}

/// Whether `guest` is at its ceiling right now, with its tasks waiting.
pub fn guest_under_oom(id: &str) -> bool {
    under_oom(&sandbox_dir(id).join(GUEST)).unwrap_or(false)
}

/// Whether the memory cgroup at `dir` is at its limit with tasks waiting
/// (its OOM killer disabled, oom.rs).
pub(crate) fn under_oom(dir: &Path) -> Result<bool, MemcgError> {
    let p = dir.join("memory.oom_control");
    let s = std::fs::read_to_string(&p).map_err(io("reading", &p))?;
    Ok(s.lines().any(|l| l.trim() == "under_oom 1"))
}

fn end_cause_of(parent: Option<u64>, guest_oom_now: bool) -> Option<hatchery_runtime::EndCause> {
    use hatchery_runtime::EndCause;
    match parent.unwrap_or(0) {
        p if p > 0 => Some(EndCause::HostOom),
        _ if guest_oom_now => Some(EndCause::GuestOom),
        _ => None,
    }
}

/// The sandbox's CPU time: its cpuacct cgroup, which runsc makes beside
/// the memory one. (Its memory cgroups are no measure of the guest's
/// memory: pages touched before a process moved into `guest`, and a
/// restored memory file, stay charged to the parent with the disk.)
pub fn usage(id: &str) -> Option<hatchery_runtime::Usage> {
    let p = Path::new("/sys/fs/cgroup/cpuacct")
        .join(id)
        .join("cpuacct.usage");
    let cpu_ns = std::fs::read_to_string(p).ok()?.trim().parse().ok()?;
    Some(hatchery_runtime::Usage { cpu_ns })
}

/// Removes `guest` (its processes must be gone; a cgroup with a child
/// cannot be removed, so this comes before the sandbox's own cgroup).
/// Retries briefly while killed processes are being reaped.
pub fn remove_guest(id: &str) {
    let g = sandbox_dir(id).join(GUEST);
    for _ in 0..20 {
        match std::fs::remove_dir(&g) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kill_in_the_sandbox_cgroup_is_the_backstop_whatever_the_guest_saw() {
        use hatchery_runtime::EndCause;
        assert_eq!(end_cause_of(Some(1), true), Some(EndCause::HostOom));
        assert_eq!(end_cause_of(Some(1), false), Some(EndCause::HostOom));
        assert_eq!(end_cause_of(Some(0), true), Some(EndCause::GuestOom));
        // Kills long before the end (a hog an hour ago) say nothing about it.
        assert_eq!(end_cause_of(Some(0), false), None);
        assert_eq!(end_cause_of(None, false), None);
    }

    #[test]
    fn the_runtime_is_what_was_started_from_outside() {
        // Sentry 10 and gofer 11 started by runsc (5, outside); stubs 12,
        // 13 are the Sentry's children, 14 a child of stub 13.
        let procs: HashMap<u32, u32> = [(10, 5), (11, 5), (12, 10), (13, 10), (14, 13)].into();
        assert_eq!(runtime_pids(&procs), [10, 11].into());
        assert_eq!(
            to_move(&[10, 11, 12, 13, 14, 15], &runtime_pids(&procs)),
            vec![12, 13, 14, 15]
        );
    }

    #[test]
    fn a_stub_whose_parent_died_is_still_not_the_runtime_once_known() {
        // The runtime is fixed at the split: a stub reparented later (to
        // init, outside) is moved, not promoted.
        let runtime: BTreeSet<u32> = [10, 11].into();
        assert_eq!(to_move(&[10, 11, 40], &runtime), vec![40]);
    }

    #[test]
    fn limits_leave_the_runtime_room_beside_memory_and_disk() {
        assert_eq!(guest_limit_bytes(512), 512 << 20);
        assert_eq!(
            sandbox_limit_bytes(512, 256),
            (512 + 256 + RUNTIME_HEADROOM_MB) << 20
        );
        assert_eq!(sandbox_limit_bytes(u64::MAX, 1), u64::MAX);
    }
}
