//! As init, the agent inherits every orphan in the sandbox and must reap it.
//! One thread owns all `wait4` calls so that exit statuses of the commands we
//! started are never stolen by a competing waiter.

use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

pub struct Exit {
    pub status: i32,
    pub cpu_ms: u64,
    pub max_rss_bytes: u64,
}

#[derive(Default)]
pub struct Reaper {
    waiters: Mutex<HashMap<i32, Sender<Exit>>>,
    spawned: Condvar,
}

impl Reaper {
    pub fn start() -> Arc<Reaper> {
        let r = Arc::new(Reaper::default());
        let r2 = Arc::clone(&r);
        std::thread::spawn(move || r2.run());
        r
    }

    /// Runs `spawn` with the waiter table locked, so that a child exiting
    /// immediately is still matched to its waiter.
    pub fn spawn_watched<T>(
        &self,
        spawn: impl FnOnce() -> std::io::Result<(T, i32)>,
    ) -> std::io::Result<(T, Receiver<Exit>)> {
        let mut w = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
        let (child, pid) = spawn()?;
        let (tx, rx) = channel();
        w.insert(pid, tx);
        self.spawned.notify_all();
        Ok((child, rx))
    }

    fn run(&self) {
        loop {
            let mut status = 0;
            // SAFETY: all-zero is a valid rusage.
            let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: valid pointers to locals; -1 waits for any child.
            let pid = unsafe { libc::wait4(-1, &mut status, 0, &mut ru) };
            if pid > 0 {
                let cpu_ms = tv_ms(ru.ru_utime) + tv_ms(ru.ru_stime);
                let max_rss_bytes = (ru.ru_maxrss.max(0) as u64) * 1024;
                let tx = self
                    .waiters
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&pid);
                if let Some(tx) = tx {
                    let _ = tx.send(Exit {
                        status,
                        cpu_ms,
                        max_rss_bytes,
                    });
                }
                continue;
            }
            // No children at all: sleep until a spawn, or briefly so that
            // orphans re-parented to us are reaped promptly.
            let w = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
            let _ = self.spawned.wait_timeout(w, Duration::from_millis(200));
        }
    }
}

fn tv_ms(tv: libc::timeval) -> u64 {
    (tv.tv_sec as u64) * 1000 + (tv.tv_usec as u64) / 1000
}

/// 128+N for a signal, like a shell reports it.
pub fn exit_code(status: i32) -> (i32, Option<i32>) {
    if libc::WIFSIGNALED(status) {
        let sig = libc::WTERMSIG(status);
        (128 + sig, Some(sig))
    } else {
        (libc::WEXITSTATUS(status), None)
    }
}
