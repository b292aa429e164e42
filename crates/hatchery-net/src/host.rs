//! Host-wide state shared by every daemon: the per-prefix lock, and IPv4
//! forwarding, which allowed egress needs and which the first daemon turns
//! on and the last one puts back.

use crate::NetError;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::PathBuf;

const DIR: &str = "/run/hatchery";
const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";
/// The host's `ip_forward` before any daemon changed it; present while a
/// daemon (or a crashed one's slots) may still need forwarding.
const ORIGINAL: &str = "/run/hatchery/ip_forward.orig";
/// How often, and how far apart, a busy prefix lock is tried (2 s in all).
const LOCK_TRIES: u32 = 40;
const LOCK_RETRY: std::time::Duration = std::time::Duration::from_millis(50);

/// One daemon per prefix: held for the daemon's life, released by the
/// kernel if it dies.
pub struct PrefixLock {
    _file: File,
    path: PathBuf,
}

fn try_lock(f: &File) -> bool {
    // SAFETY: flock on an fd we own; no memory is involved.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

impl PrefixLock {
    pub fn take(prefix: &str) -> Result<PrefixLock, NetError> {
        std::fs::create_dir_all(DIR)?;
        let path = PathBuf::from(format!("{DIR}/net-{prefix}.lock"));
        let file = File::create(&path)?;
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
        Ok(PrefixLock { _file: file, path })
    }

    /// Whether any other daemon holds its prefix lock right now.
    fn others_alive(&self) -> bool {
        let Ok(rd) = std::fs::read_dir(DIR) else {
            return false;
        };
        rd.flatten().any(|e| {
            let p = e.path();
            p != self.path
                && p.extension().is_some_and(|x| x == "lock")
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
pub fn enable_forwarding() -> Result<bool, NetError> {
    let now = std::fs::read_to_string(IP_FORWARD)?.trim().to_string();
    let original = match std::fs::read_to_string(ORIGINAL) {
        Ok(v) => v.trim().to_string(),
        Err(_) => {
            std::fs::write(ORIGINAL, &now)?;
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
    if let Ok(v) = std::fs::read_to_string(ORIGINAL) {
        let _ = std::fs::write(IP_FORWARD, v.trim());
        let _ = std::fs::remove_file(ORIGINAL);
    }
}
