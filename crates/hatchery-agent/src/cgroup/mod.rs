//! Every command runs in a unit: its own cgroup inside gVisor, which all of
//! its descendants inherit whatever they do to their session, process group
//! or environment. A unit is what is killed (timeout, CPU limit, output
//! limit, cancel) and what is measured (`cpu_ms`, memory).
//!
//! The hierarchies are reachable only by the keeper process (see
//! `keeper.rs` for why); this is the agent's side of it. When the keeper
//! cannot be started (a runtime without in-guest cgroups), commands fall
//! back to process-group kill and the direct child's rusage, and their
//! results say `contained: false`.

pub mod keeper;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

static NEXT_UNIT: AtomicU64 = AtomicU64::new(1);

struct Conn {
    child: Child,
    tx: ChildStdin,
    rx: BufReader<ChildStdout>,
}

#[derive(Default)]
pub struct Keeper {
    conn: Mutex<Option<Conn>>,
    /// Units whose command exited but left processes behind; retried by
    /// the janitor until they are empty and can be removed.
    lingering: Mutex<Vec<String>>,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Stat {
    pub cpu_ns: u64,
    pub mem_bytes: u64,
    pub procs: u64,
}

/// The agent's one keeper, started on first use (before the template's
/// checkpoint, so every restored sandbox has it running already).
pub fn keeper() -> &'static Arc<Keeper> {
    static K: OnceLock<Arc<Keeper>> = OnceLock::new();
    K.get_or_init(|| {
        let k = Arc::new(Keeper::default());
        let j = Arc::clone(&k);
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_secs(1));
            j.sweep_lingering();
        });
        k
    })
}

impl Keeper {
    /// The keeper's process, if it runs; `Err` while a request is being
    /// served (something is being started or measured).
    pub fn pid(&self) -> Result<Option<u32>, ()> {
        match self.conn.try_lock() {
            Ok(g) => Ok(g.as_ref().map(|c| c.child.id())),
            Err(_) => Err(()),
        }
    }

    /// One request, one reply. A dead keeper is restarted once per request:
    /// guest root can kill it, but the cgroups it manages live on in the
    /// guest kernel, so a new keeper picks up where the old one stopped.
    fn call(&self, req: &str) -> Result<String, String> {
        let mut guard = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        for attempt in 0..2 {
            if guard.is_none() {
                *guard = Some(start()?);
            }
            let conn = guard.as_mut().expect("just set");
            let mut line = String::new();
            let ok = writeln!(conn.tx, "{req}").is_ok()
                && conn.tx.flush().is_ok()
                && conn.rx.read_line(&mut line).map(|n| n > 0).unwrap_or(false);
            if ok {
                let line = line.trim_end();
                return match line.strip_prefix("ok") {
                    Some(rest) => Ok(rest.trim().to_string()),
                    None => Err(line.to_string()),
                };
            }
            if let Some(mut dead) = guard.take() {
                let _ = dead.child.kill();
            }
            if attempt == 1 {
                break;
            }
        }
        Err("cgroup keeper unavailable".into())
    }

    /// Starts the keeper now if it is not running (the template bake calls
    /// this through the first exec, so it is inside every checkpoint).
    pub fn available(&self) -> bool {
        let mut guard = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            *guard = start().ok();
        }
        guard.is_some()
    }

    pub fn new_unit(self: &Arc<Self>) -> Option<Unit> {
        if !self.available() {
            return None;
        }
        let name = format!("e{}", NEXT_UNIT.fetch_add(1, Ordering::Relaxed));
        self.call(&format!("new {name}")).ok()?;
        Some(Unit {
            name,
            keeper: Arc::clone(self),
        })
    }

    fn sweep_lingering(&self) {
        let names: Vec<String> =
            std::mem::take(&mut *self.lingering.lock().unwrap_or_else(|p| p.into_inner()));
        let mut keep = Vec::new();
        for n in names {
            let empty = self
                .call(&format!("stat {n}"))
                .ok()
                .and_then(|s| parse_stat(&s))
                .map(|s| s.procs == 0)
                .unwrap_or(false);
            if !(empty && self.call(&format!("rm {n}")).is_ok()) {
                keep.push(n);
            }
        }
        self.lingering
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(keep);
    }
}

fn start() -> Result<Conn, String> {
    let mut child = Command::new("/proc/self/exe")
        .arg("--cgroup-keeper")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("start cgroup keeper: {e}"))?;
    let tx = child.stdin.take().expect("piped");
    let mut rx = BufReader::new(child.stdout.take().expect("piped"));
    let mut line = String::new();
    let _ = rx.read_line(&mut line);
    if line.trim_end() != "ready" {
        let _ = child.kill();
        let _ = child.wait();
        return Err(format!("cgroup keeper failed: {}", line.trim_end()));
    }
    Ok(Conn { child, tx, rx })
}

fn parse_stat(s: &str) -> Option<Stat> {
    let mut it = s.split_ascii_whitespace().map(|w| w.parse::<u64>().ok());
    Some(Stat {
        cpu_ns: it.next()??,
        mem_bytes: it.next()??,
        procs: it.next()??,
    })
}

/// One command's cgroup.
pub struct Unit {
    name: String,
    keeper: Arc<Keeper>,
}

impl Unit {
    /// Moves the calling thread into the unit; whatever it spawns next is
    /// born inside. Only a thread that is never reused may do this.
    pub fn join_current_thread(&self) -> Result<(), String> {
        // SAFETY: gettid has no arguments and cannot fail.
        let tid = unsafe { libc::gettid() };
        self.keeper
            .call(&format!("join {} {tid}", self.name))
            .map(|_| ())
    }

    pub fn stat(&self) -> Option<Stat> {
        parse_stat(&self.keeper.call(&format!("stat {}", self.name)).ok()?)
    }

    /// Kills every process in the unit. Returns how many were still alive
    /// when the keeper's budget ran out (0 when all are dead).
    pub fn kill(&self) -> Result<u64, String> {
        let left = self.keeper.call(&format!("kill {}", self.name))?;
        left.parse().map_err(|_| format!("bad kill reply {left:?}"))
    }
}

impl Drop for Unit {
    fn drop(&mut self) {
        if self.keeper.call(&format!("rm {}", self.name)).is_err() {
            self.keeper
                .lingering
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(std::mem::take(&mut self.name));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_replies_parse() {
        let s = parse_stat("1500000 4096 2").unwrap();
        assert_eq!((s.cpu_ns, s.mem_bytes, s.procs), (1_500_000, 4096, 2));
        assert!(parse_stat("1 2").is_none());
        assert!(parse_stat("x 2 3").is_none());
    }
}
