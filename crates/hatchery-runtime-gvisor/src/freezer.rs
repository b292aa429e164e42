//! Parking a pooled sandbox: its cgroup v1 freezer stops every process in
//! it (Sentry, its systrap stubs, the guest) until it is thawed.
//!
//! Why: runsc 0.0~20240729's systrap platform runs a fast-path monitor in
//! the Sentry that wakes every 400 µs whether the guest does anything or
//! not (upstream gVisor parks it when idle since PR #13470, June 2026; no
//! flag turns it off in this release, and one CPU or `--cpu-num=1` does not
//! either, measured). That cost an idle sandbox 30-37 ms of CPU per second
//! (docs/benchmarks.md, "Idle CPU"), so a host's warm pool of eight burned
//! a quarter of a core doing nothing. A pooled sandbox serves no one until
//! it is claimed, so it can be stopped outright; the claim thaws it first.
//!
//! Everything that acts on a sandbox through runsc (`runsc kill` is an RPC
//! to the Sentry) must thaw it first, or it waits on a process that cannot
//! answer: `teardown::destroy` does.

use std::io;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How long a freeze may take to settle before it is reported as stuck
/// (the kernel freezes tasks as they reach a safe point; a Sentry with
/// hundreds of threads settles in well under this).
const SETTLE: Duration = Duration::from_millis(500);

fn state_file(id: &str) -> PathBuf {
    PathBuf::from("/sys/fs/cgroup/freezer")
        .join(id)
        .join("freezer.state")
}

/// Freezes `id`'s processes. Returns once the kernel reports the cgroup
/// `FROZEN`; if it is still `FREEZING` after [`SETTLE`] the sandbox is
/// thawed again and an error returned, so a sandbox is never left half
/// stopped.
pub fn freeze(id: &str) -> io::Result<()> {
    let f = state_file(id);
    std::fs::write(&f, "FROZEN")?;
    let start = Instant::now();
    loop {
        if std::fs::read_to_string(&f)?.trim() == "FROZEN" {
            return Ok(());
        }
        if start.elapsed() > SETTLE {
            let _ = thaw(id);
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("freezer of {id} did not settle in {SETTLE:?}"),
            ));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Thaws `id`'s processes. Idempotent; a sandbox without a freezer cgroup
/// (already torn down) is not an error.
pub fn thaw(id: &str) -> io::Result<()> {
    match std::fs::write(state_file(id), "THAWED") {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}
