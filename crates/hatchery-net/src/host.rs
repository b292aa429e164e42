//! Host-wide state shared by every daemon: the per-prefix lock, and IPv4
//! forwarding, which allowed egress needs and which the first daemon turns
//! on and the last one puts back.
//!
//! `ip_forward` belongs to a network namespace while `/run/hatchery` is
//! shared by all of them (daemons run inside namespaces in multi-host set-ups
//! and tests), so the saved value and "is another daemon alive" are both
//! per namespace: a daemon in a namespace never restores, or keeps from
//! restoring, the root namespace's forwarding.

use crate::NetError;
use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::PathBuf;

const DIR: &str = "/run/hatchery";
const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";
const NETNS: &str = "/proc/self/ns/net";
/// How often, and how far apart, a busy prefix lock is tried (2 s in all).
const LOCK_TRIES: u32 = 40;
const LOCK_RETRY: std::time::Duration = std::time::Duration::from_millis(50);

/// One daemon per prefix: held for the daemon's life, released by the
/// kernel if it dies.
pub struct PrefixLock {
    _file: File,
    path: PathBuf,
    /// The network namespace this daemon runs in (written into the lock
    /// file, so others can tell whose forwarding it shares).
    netns: String,
}

/// This process's network namespace, as the kernel names it
/// (`net:[4026531840]`).
fn netns() -> Result<String, NetError> {
    Ok(std::fs::read_link(NETNS)?.to_string_lossy().into_owned())
}

/// Where the namespace's `ip_forward` from before any daemon changed it is
/// kept; present while a daemon (or a crashed one's slots) may still need
/// forwarding there.
fn original_path(netns: &str) -> PathBuf {
    let id: String = netns.chars().filter(|c| c.is_ascii_digit()).collect();
    PathBuf::from(format!("{DIR}/ip_forward.{id}.orig"))
}

fn try_lock(f: &File) -> bool {
    // SAFETY: flock on an fd we own; no memory is involved.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

impl PrefixLock {
    pub fn take(prefix: &str) -> Result<PrefixLock, NetError> {
        std::fs::create_dir_all(DIR)?;
        let path = PathBuf::from(format!("{DIR}/net-{prefix}.lock"));
        // Not truncated on open: a daemon that finds the lock busy must
        // not wipe the owner's namespace name from it.
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)?;
        // Another daemon's `others_alive` probes a free lock by taking it
        // for an instant; a daemon restarting after a crash must not take
        // that probe for an owner, so a busy lock is tried again for a
        // while before the answer is no.
        let mut tries = 0;
        while !try_lock(&file) {
            tries += 1;
            if tries < LOCK_TRIES {
                std::thread::sleep(LOCK_RETRY);
                continue;
            }
            return Err(NetError::Busy(format!(
                "another hatcheryd owns network prefix {prefix:?} on this host; give this one another --net-prefix and --net-range"
            )));
        }
        let netns = netns()?;
        file.set_len(0)?;
        (&file).write_all(netns.as_bytes())?;
        Ok(PrefixLock {
            _file: file,
            path,
            netns,
        })
    }

    /// Whether any other daemon in this network namespace holds its prefix
    /// lock right now.
    fn others_alive(&self) -> bool {
        let Ok(rd) = std::fs::read_dir(DIR) else {
            return false;
        };
        rd.flatten().any(|e| {
            let p = e.path();
            p != self.path
                && p.extension().is_some_and(|x| x == "lock")
                && std::fs::read_to_string(&p).is_ok_and(|ns| ns == self.netns)
                && File::open(&p).is_ok_and(|f| !try_lock(&f))
        })
    }

    /// Gives the lock up and removes its file (clean stop only).
    pub fn release(self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Turns forwarding on. Returns whether it was off on this host before any
/// daemon touched it: then the caller must drop forwarded traffic that is
/// not its own, so the host does not start routing for anyone else.
pub fn enable_forwarding(lock: &PrefixLock) -> Result<bool, NetError> {
    let saved = original_path(&lock.netns);
    let now = std::fs::read_to_string(IP_FORWARD)?.trim().to_string();
    let original = match std::fs::read_to_string(&saved) {
        Ok(v) => v.trim().to_string(),
        Err(_) => {
            std::fs::write(&saved, &now)?;
            now.clone()
        }
    };
    if now != "1" {
        std::fs::write(IP_FORWARD, "1")?;
    }
    Ok(original == "0")
}

/// Puts forwarding back as it was, unless another daemon still runs.
pub fn restore_forwarding(lock: &PrefixLock) {
    if lock.others_alive() {
        return;
    }
    let saved = original_path(&lock.netns);
    if let Ok(v) = std::fs::read_to_string(&saved) {
        let _ = std::fs::write(IP_FORWARD, v.trim());
        let _ = std::fs::remove_file(&saved);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_namespace_saves_its_forwarding_apart() {
        let root = original_path("net:[4026531840]");
        let other = original_path("net:[4026532301]");
        assert_ne!(root, other);
        assert_eq!(
            root,
            PathBuf::from("/run/hatchery/ip_forward.4026531840.orig")
        );
    }

    #[test]
    fn this_process_has_a_namespace_name() {
        let ns = netns().unwrap();
        assert!(ns.starts_with("net:["), "{ns}");
    }
}
