//! Complete, idempotent removal of one sandbox's host footprint. Shared by
//! the shim (TTL expiry, agent death) and the daemon (delete, reconcile), so
//! both paths leave exactly the same nothing behind.

use std::path::Path;
use std::process::{Command, Stdio};

/// The sandbox's cgroup in every v1 hierarchy mounted here (runsc makes
/// one per hierarchy, named after the container, including `systemd`).
fn cgroups(id: &str) -> Vec<std::path::PathBuf> {
    let Ok(rd) = std::fs::read_dir("/sys/fs/cgroup") else {
        return vec![];
    };
    rd.flatten()
        .map(|h| h.path().join(id))
        .filter(|p| p.is_dir())
        .collect()
}

fn runsc(runsc: &Path, flags: &[String], args: &[&str]) -> bool {
    Command::new(runsc)
        .args(flags)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Kills the container, deletes its runsc state, removes cgroups runsc may
/// have left and finally the bundle directory.
pub fn destroy(runsc_bin: &Path, flags: &[String], id: &str, bundle: &Path) {
    // A parked (frozen) pool sandbox cannot answer `runsc kill`'s RPC nor
    // die of SIGKILL until thawed (freezer.rs).
    let _ = crate::freezer::thaw(id);
    runsc(runsc_bin, flags, &["kill", id, "KILL"]);
    // The sandbox's own processes are SIGKILLed and, in the shim (their
    // subreaper), reaped before `runsc delete`: that command polls until
    // their pids are gone, and a zombie left to a slow PID 1 kept every
    // delete waiting about 1.4 s (measured on the CI machine kind, whose
    // init reaps late). Nothing of the guest needs a graceful end.
    kill_sandbox_processes(id);
    // The guest's memory cgroup (memcg.rs) is the sandbox cgroup's child:
    // it must go first, or runsc cannot remove the sandbox's.
    crate::memcg::remove_guest(id);
    runsc(runsc_bin, flags, &["delete", "--force", id]);
    // runsc can only act on what its state directory still knows. If that
    // is gone or damaged, the sandbox and gofer processes are found by the
    // id in their command lines and killed directly.
    for pid in pids_mentioning(id) {
        // SAFETY: plain signal to a pid that is one of this sandbox's own
        // processes (see pids_mentioning; our own pid is never listed).
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    remove_cgroups(id);
    unmount_disk(bundle);
    let _ = std::fs::remove_dir_all(bundle);
    remove_runsc_state(flags, id);
}

/// How long a teardown keeps trying to remove the sandbox's cgroups while
/// the kernel still counts a dying task in them (EBUSY). One try after
/// 50 ms left empty `sbx_*` cgroups behind when a loaded host was slow to
/// finish the killed processes' exits.
const CGROUP_PATIENCE: std::time::Duration = std::time::Duration::from_secs(3);

fn remove_cgroups(id: &str) {
    let deadline = std::time::Instant::now() + CGROUP_PATIENCE;
    loop {
        std::thread::sleep(std::time::Duration::from_millis(50));
        crate::memcg::remove_guest(id);
        let busy = cgroups(id)
            .into_iter()
            .filter(|p| std::fs::remove_dir(p).is_err() && p.is_dir())
            .count();
        if busy == 0 || std::time::Instant::now() >= deadline {
            if busy > 0 {
                tracing::warn!(
                    sandbox = id,
                    busy,
                    "sandbox cgroups still busy after teardown"
                );
            }
            return;
        }
    }
}

/// runsc's own files for the container (`<id>_sandbox:<id>.state`, its
/// `.lock`, `runsc-<id>.sock`). `runsc delete` removes them, but not when the
/// daemon died while runsc was still creating the container: then a
/// restarted daemon's reconcile found the files left behind (the test of a
/// crash mid-grading did). Ids are unique, so anything naming this one is
/// this container's.
fn remove_runsc_state(flags: &[String], id: &str) {
    let Some(root) = flags.iter().find_map(|f| f.strip_prefix("--root=")) else {
        return;
    };
    for p in runsc_state(Path::new(root), id) {
        let _ = if p.is_dir() {
            std::fs::remove_dir_all(&p)
        } else {
            std::fs::remove_file(&p)
        };
    }
}

/// Entries of runsc's state directory that belong to container `id`: what
/// teardown removes and what `leftovers` reports, found the same way.
fn runsc_state(root: &Path, id: &str) -> Vec<std::path::PathBuf> {
    let Ok(rd) = std::fs::read_dir(root) else {
        return vec![];
    };
    rd.flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(id))
        .map(|e| e.path())
        .collect()
}

/// The shim mounts the sandbox's disk and `/tmp` lower layer inside the
/// bundle, in its private mount namespace; when the shim itself tears down
/// (TTL, agent death) they must go before the bundle can be removed. In the
/// daemon's namespace they are plain empty directories and this is a no-op
/// (EINVAL: not a mount point).
fn unmount_disk(bundle: &Path) {
    for p in [
        crate::layout::Layout::disk_dir(bundle),
        crate::layout::Layout::tmp_lower(bundle),
    ] {
        let Ok(c) = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()) else {
            continue;
        };
        // SAFETY: umount2 takes a valid NUL-terminated path; MNT_DETACH
        // only affects this process's mount namespace.
        let rc = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            if !matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOENT)) {
                eprintln!("teardown: unmount {}: {e}", p.display());
            }
        }
    }
}

/// What is left of sandbox `id` on the host. Empty means fully torn down.
pub fn leftovers(id: &str, bundle: &Path, runsc_root: &Path) -> Vec<String> {
    let mut left = Vec::new();
    for pid in pids_mentioning(id) {
        left.push(format!("process {pid}"));
    }
    for p in cgroups(id) {
        {
            left.push(format!("cgroup {}", p.display()));
        }
    }
    if bundle.exists() {
        left.push(format!("dir {}", bundle.display()));
    }
    for p in runsc_state(runsc_root, id) {
        left.push(format!("runsc state {}", p.display()));
    }
    if let Ok(mi) = std::fs::read_to_string("/proc/self/mountinfo") {
        for line in mi.lines().filter(|l| l.contains(id)) {
            left.push(format!("mount {line}"));
        }
    }
    left
}

/// SIGKILLs the sandbox's Sentry and gofer (`runsc-sandbox`, `runsc-gofer`
/// naming `id`), not runsc commands that may be at work on it, and reaps
/// them if they are this process's children (the shim is their subreaper;
/// in the daemon they are not, and the wait ends at once with ECHILD).
fn kill_sandbox_processes(id: &str) {
    let mut killed = vec![];
    for (pid, argv0) in sandbox_processes(id) {
        if argv0.starts_with("runsc-sandbox") || argv0.starts_with("runsc-gofer") {
            // SAFETY: plain signal to a pid whose command line is this
            // sandbox's Sentry or gofer; no memory is involved.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            killed.push(pid as i32);
        }
    }
    for pid in killed {
        reap(pid);
    }
    reap_dead_children();
}

/// Collects children of this process that already died (a Sentry killed
/// by the host, before teardown; its command line reads empty once it is a
/// zombie, so the scan above cannot name it). Only sandbox processes are
/// collected (see `is_sandbox_zombie`): any other child belongs to a
/// thread that waits for it, and collecting it here would hand that wait
/// ECHILD (a session's `git fetch` failed with "No child processes").
fn reap_dead_children() {
    let me = std::process::id().to_string();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": comm may hold spaces, so split after
        // its closing parenthesis.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = &stat[open + 1..close];
        let mut rest = stat[close + 1..].split_whitespace();
        let (state, ppid) = (rest.next(), rest.next());
        if state == Some("Z") && ppid == Some(me.as_str()) && is_sandbox_zombie(comm) {
            reap(pid);
        }
    }
}

/// Whether a dead child with this `comm` is a sandbox's Sentry or gofer
/// (runsc re-executes itself through /proc/self/exe, so their comm is
/// "exe") or its shim. runsc commands ("runsc") and everything else the
/// daemon spawns (git, psql, ...) are waited for by their spawner.
fn is_sandbox_zombie(comm: &str) -> bool {
    comm == "exe" || comm == "hatchery-shim" || comm.starts_with("runsc-")
}

/// Waits (at most 2 s) for a SIGKILLed child to exit and collects it.
/// Only that pid is waited for: a wait for any child would take the exit
/// status of a runsc command another thread is running.
fn reap(pid: i32) {
    for _ in 0..200 {
        // SAFETY: waitpid on one pid with a null status pointer (allowed:
        // the status is not wanted); no memory of ours is written.
        let r = unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
        if r != 0 {
            return; // reaped, or not our child (ECHILD)
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// The sandbox's own host processes: its shim, Sentry, gofer and runsc
/// commands at work on it, i.e. a process whose program is one of those
/// and whose command line names the sandbox. Naming the sandbox alone is
/// not enough: an operator's `grep sbx_…` or a `psql` query about it must
/// never be killed by a teardown (one was, in the tests).
pub fn pids_mentioning(id: &str) -> Vec<u32> {
    sandbox_processes(id)
        .into_iter()
        .map(|(pid, _)| pid)
        .collect()
}

/// Program names (argv[0]'s file name) of a sandbox's own processes.
fn is_sandbox_program(name: &str) -> bool {
    name == "hatchery-shim" || name == "runsc" || name.starts_with("runsc-")
}

/// (pid, argv[0]) of the sandbox's own processes; see pids_mentioning.
fn sandbox_processes(id: &str) -> Vec<(u32, String)> {
    let me = std::process::id();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter_map(|pid| {
            let c = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let mut args = c.split(|&b| b == 0).map(String::from_utf8_lossy);
            let argv0 = args.next()?.into_owned();
            let name = argv0.rsplit('/').next().unwrap_or_default();
            (is_sandbox_program(name) && args.any(|a| a.contains(id))).then_some((pid, argv0))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_sandboxs_own_programs_count() {
        for own in ["hatchery-shim", "runsc", "runsc-sandbox", "runsc-gofer"] {
            assert!(is_sandbox_program(own), "{own}");
        }
        for other in ["psql", "runuser", "grep", "python3", "sh", "hatcheryd"] {
            assert!(!is_sandbox_program(other), "{other}");
        }
    }

    #[test]
    fn only_sandbox_zombies_are_collected() {
        for own in ["exe", "hatchery-shim", "runsc-sandbox", "runsc-gofer"] {
            assert!(is_sandbox_zombie(own), "{own}");
        }
        for other in ["runsc", "git", "psql", "sh", "true"] {
            assert!(!is_sandbox_zombie(other), "{other}");
        }
    }

    #[test]
    fn a_teardown_leaves_other_children_to_their_waiter() {
        // A child that died while its spawner has not yet waited for it (a
        // session's git fetch) must still be there for that wait after a
        // teardown's sweep; it was once collected and the wait got ECHILD.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let stat = format!("/proc/{}/stat", child.id());
        for _ in 0..500 {
            let s = std::fs::read_to_string(&stat).unwrap_or_default();
            if s.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
            {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        reap_dead_children();
        let status = child.wait().expect("the child is still ours to wait for");
        assert!(status.success());
    }

    #[test]
    fn a_process_that_only_names_the_sandbox_is_not_its_own() {
        // This test's own command line does not name the id, but a child
        // that does (as a psql query about the sandbox would) is not listed.
        let id = format!("sbx_teardowntest{}", std::process::id());
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 5", &id])
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let listed = pids_mentioning(&id);
        let _ = child.kill();
        let _ = child.wait();
        assert!(!listed.contains(&child.id()), "{listed:?}");
    }
}
