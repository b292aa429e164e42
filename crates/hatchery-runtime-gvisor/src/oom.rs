//! The guest's OOM killer, run by the shim instead of the kernel's.
//!
//! Why: when a guest process fills the `guest` memory cgroup (memcg.rs),
//! the kernel's OOM killer takes its stub, and the hog's memory stays
//! charged to `guest` until the Sentry notices the death and releases the
//! hog's pages from its memory file, which it does asynchronously (in well
//! under a second on an idle host; seconds beside CPU burners). Any guest
//! allocation in that window found the cgroup still full, and the kernel
//! then killed the largest process left: an innocent one, with a few MiB,
//! sometimes the guest agent, which ended the sandbox (`make soak-memory`
//! lost its sandbox after about 20 hogs; the kernel's report listed only
//! processes of 9–14 MiB in a full 512 MiB cgroup).
//!
//! What holds now: the kernel's OOM killer is disabled for `guest`
//! (`memory.oom_control`), so a guest process that hits the ceiling waits
//! instead of triggering a kill, and the shim, notified by an eventfd
//! (cgroup v1 `cgroup.event_control`) and polling as a fallback, decides:
//! - a process holding at least [`BIG_FRACTION`] of the ceiling is the hog,
//!   killed at once;
//! - otherwise the memory is held by nobody alive (a killed hog's pages the
//!   Sentry is still releasing): wait, up to [`RELEASE`] after a kill and
//!   then while usage keeps falling;
//! - only if nothing is freed for [`STALL`] (many small processes filling
//!   the ceiling together, say) is the largest killed anyway.
//!
//! Measured (`make soak-memory`, beside CPU burners): 43 of 50 kills took a
//! hog at once; in the other 7 the Sentry had not released the previous
//! victim's pages after the whole [`RELEASE`] wait, and the stall rule
//! then took the 11–15 MiB process that needed memory (the next command
//! starting, whose file pages cannot reuse the freed anonymous ones); the
//! agent (2–3 MiB) was never chosen.
//!
//! Each kill is counted in the bundle's `oom_kills` file before the signal
//! (so an exec that ends because of it already sees the count) and added to
//! the kernel's own count by [`crate::memcg::oom_kills`]. The sandbox's
//! own cgroup keeps the kernel's killer: it stays the host's backstop.
//! If the shim cannot register for notifications, the kernel's killer is
//! left on (the earlier behaviour).

use crate::memcg::{io, MemcgError, GUEST};
// The kill count has its own module (oom_count.rs) because memcg.rs reads
// it too; its paths here stay.
pub use crate::oom_count::{kills, kills_file};
use std::cell::Cell;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A process holding this part of the ceiling or more is a hog.
pub const BIG_FRACTION: u64 = 8;
/// How long memory may stay pinned at the ceiling, with nobody big to
/// blame and nothing being freed, before the largest process goes anyway.
pub const STALL: Duration = Duration::from_secs(2);
/// How long a victim's memory may take to be released (the Sentry frees
/// it; beside CPU burners this took seconds) before the stall rule applies
/// again.
pub const RELEASE: Duration = Duration::from_secs(15);
/// Check interval while the guest is at its ceiling, and the fallback poll
/// when no notification comes.
const TICK: Duration = Duration::from_millis(50);
const POLL: Duration = Duration::from_millis(500);

/// What to do about a guest at its ceiling.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    Kill(u32),
    Wait,
}

/// The rule of the module doc. `rss` is every guest process with its
/// resident bytes; `stalled` is how long usage has not fallen.
pub fn decide(rss: &[(u32, u64)], limit: u64, stalled: Duration) -> Decision {
    let Some(&(pid, largest)) = rss.iter().max_by_key(|(pid, r)| (*r, *pid)) else {
        return Decision::Wait;
    };
    if largest >= limit / BIG_FRACTION || stalled >= STALL {
        Decision::Kill(pid)
    } else {
        Decision::Wait
    }
}

/// The guest cgroup of a sandbox, as the killer sees it.
pub struct Killer {
    guest: PathBuf,
    limit: u64,
    counter: PathBuf,
    count: Cell<u64>,
    /// The last victim's memory, until the Sentry has released about half
    /// of it: usage to get under, and since when. Kept across episodes (a
    /// kill ends the episode of the task it freed; the next allocation
    /// starts another while the memory is still being released).
    releasing: Cell<Option<(u64, Instant)>>,
    /// Unix ms of the last kill, for the shim's end cause.
    last_kill_ms: Arc<AtomicU64>,
    events: OwnedFd,
}

impl Killer {
    /// Registers for the guest cgroup's OOM notifications and turns the
    /// kernel's killer off for it. On error the kernel's killer stays on.
    pub fn arm(cgroup: &Path, bundle: &Path, limit: u64) -> Result<Killer, MemcgError> {
        let guest = cgroup.join(GUEST);
        let control = guest.join("memory.oom_control");
        let ofd = std::fs::File::open(&control).map_err(io("opening", &control))?;
        // SAFETY: eventfd takes no pointers; the result is checked.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if efd < 0 {
            return Err(io("creating an eventfd for", &control)(
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: efd is a fresh descriptor that nothing else owns.
        let events = unsafe { OwnedFd::from_raw_fd(efd) };
        let reg = guest.join("cgroup.event_control");
        std::fs::write(&reg, format!("{} {}", events.as_raw_fd(), ofd.as_raw_fd()))
            .map_err(io("registering with", &reg))?;
        std::fs::write(&control, "1").map_err(io("disabling the kernel killer in", &control))?;
        Ok(Killer {
            guest,
            limit,
            counter: kills_file(bundle),
            count: Cell::new(kills(bundle)),
            releasing: Cell::new(None),
            last_kill_ms: Arc::new(AtomicU64::new(0)),
            events,
        })
    }

    /// Where the killer keeps the time of its last kill (unix ms; 0: none).
    pub fn last_kill(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.last_kill_ms)
    }

    fn usage(&self) -> Result<u64, MemcgError> {
        let p = self.guest.join("memory.usage_in_bytes");
        let s = std::fs::read_to_string(&p).map_err(io("reading", &p))?;
        Ok(s.trim().parse().unwrap_or(0))
    }

    fn rss(&self) -> Result<Vec<(u32, u64)>, MemcgError> {
        // SAFETY: sysconf takes no pointers.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
        Ok(crate::memcg::procs(&self.guest)?
            .into_iter()
            .filter_map(|pid| {
                let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
                let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
                Some((pid, pages * page))
            })
            .collect())
    }

    /// Waits for a notification, at most [`POLL`].
    fn wait(&self) {
        let mut pfd = libc::pollfd {
            fd: self.events.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, POLL.as_millis() as i32) };
        if n > 0 {
            let mut buf = [0u8; 8];
            // SAFETY: reads 8 bytes into a buffer of 8 bytes from our eventfd.
            unsafe { libc::read(self.events.as_raw_fd(), buf.as_mut_ptr().cast(), 8) };
        }
    }

    fn kill(&self, pid: u32) {
        let n = self.count.get() + 1;
        self.count.set(n);
        // Counted first: the exec this kill ends reads the count when it
        // learns of the end.
        let _ = std::fs::write(&self.counter, n.to_string());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.last_kill_ms.store(now, Ordering::SeqCst);
        // SAFETY: a plain signal to a process read from the guest cgroup a
        // moment ago (a stub of this sandbox; a recycled pid would have to
        // be recycled into this cgroup, which only this sandbox can do).
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        eprintln!("hatchery-shim: guest out of memory, killed pid {pid} (kill {n})");
    }

    /// Runs until the cgroup goes away (the sandbox's teardown).
    pub fn run(self) {
        loop {
            self.wait();
            match self.relieve() {
                Ok(()) => {}
                Err(_) => return,
            }
        }
    }

    /// While the guest is at its ceiling, applies [`decide`].
    fn relieve(&self) -> Result<(), MemcgError> {
        let mut low = u64::MAX;
        let mut since = Instant::now();
        while crate::memcg::under_oom(&self.guest)? {
            let used = self.usage()?;
            if used < low {
                low = used;
                since = Instant::now();
            }
            if let Some((target, at)) = self.releasing.get() {
                if used <= target || at.elapsed() >= RELEASE {
                    self.releasing.set(None);
                }
                // Not stalled while the Sentry releases.
                since = Instant::now();
            }
            let rss = self.rss()?;
            match decide(&rss, self.limit, since.elapsed()) {
                Decision::Kill(pid) => {
                    let victim = rss.iter().find(|(p, _)| *p == pid).map_or(0, |(_, r)| *r);
                    self.kill(pid);
                    // Its pages are released by the Sentry from now on:
                    // the stall clock waits for that.
                    self.releasing
                        .set(Some((used.saturating_sub(victim / 2), Instant::now())));
                    low = u64::MAX;
                    since = Instant::now();
                    // Until it is gone, it is still the largest.
                    let gone = Instant::now() + Duration::from_secs(1);
                    while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < gone {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
                Decision::Wait => std::thread::sleep(TICK),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: u64 = 512 << 20;

    #[test]
    fn a_process_with_an_eighth_of_the_ceiling_is_the_hog() {
        let rss = [(1, 9 << 20), (2, 64 << 20), (3, 14 << 20)];
        assert_eq!(decide(&rss, LIMIT, Duration::ZERO), Decision::Kill(2));
    }

    #[test]
    fn memory_nobody_holds_is_waited_for_until_it_stops_being_freed() {
        // The soak's case: a full cgroup, the largest process 14 MiB.
        let rss = [(1, 9 << 20), (2, 14 << 20), (3, 10 << 20)];
        assert_eq!(
            decide(&rss, LIMIT, Duration::from_millis(500)),
            Decision::Wait
        );
        assert_eq!(decide(&rss, LIMIT, STALL), Decision::Kill(2));
    }

    #[test]
    fn no_process_no_kill() {
        assert_eq!(decide(&[], LIMIT, STALL), Decision::Wait);
    }
}
