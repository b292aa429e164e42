use crate::cgroup::Unit;
use crate::kill::kill_tree;
use crate::out::{send_locked, Out};
use crate::reaper::{exit_code, Exit, Reaper};
use hatchery_agent_proto::{EndReason, ExecRequest, ExecResult, Frame, Kind};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CHUNK: usize = 32 * 1024;
/// After the command exits, how long to wait for its pipes to drain. A
/// background child that keeps them open must not hold the result hostage.
const DRAIN_GRACE: Duration = Duration::from_millis(100);
pub(crate) const BASE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

static NEXT_MARK: AtomicU64 = AtomicU64::new(1);

/// How often a running command's unit is sampled: often enough that a CPU
/// limit fires within a few ticks of being spent.
const TICK_WITH_CPU_LIMIT: Duration = Duration::from_millis(10);
const TICK: Duration = Duration::from_millis(50);

/// Why a command is being stopped; the first reason set wins.
#[derive(Default)]
pub struct Stop(AtomicU8);

impl Stop {
    fn set(&self, r: EndReason) -> bool {
        self.0
            .compare_exchange(0, r as u8 + 1, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }
    pub fn get(&self) -> Option<EndReason> {
        const ALL: [EndReason; 7] = [
            EndReason::Exited,
            EndReason::Signaled,
            EndReason::Timeout,
            EndReason::CpuLimit,
            EndReason::Oom,
            EndReason::OutputLimit,
            EndReason::Cancelled,
        ];
        match self.0.load(Ordering::SeqCst) {
            0 => None,
            n => ALL.get(n as usize - 1).copied(),
        }
    }
}

/// What a kill must reach: the command's unit (everything it started), and
/// as a fallback when there is none its process group and environment marker.
pub struct Tree {
    pgid: i32,
    marker: Vec<u8>,
    unit: Option<Arc<Unit>>,
    pub stop: Stop,
}

impl Tree {
    pub fn new(pgid: i32, marker: Vec<u8>, unit: Option<Arc<Unit>>) -> Self {
        Tree {
            pgid,
            marker,
            unit,
            stop: Stop::default(),
        }
    }

    /// Records why (unless a reason was recorded first) and kills it all.
    pub fn stop(&self, why: EndReason) {
        self.stop.set(why);
        self.kill_all();
    }

    pub fn kill_all(&self) {
        // SAFETY: kill(2) with a negative pid signals a process group; the
        // worst case on a stale pgid is ESRCH.
        unsafe { libc::kill(-self.pgid, libc::SIGKILL) };
        match self.unit.as_ref().map(|u| u.kill()) {
            Some(Ok(0)) => {}
            _ => kill_tree(self.pgid, &self.marker),
        }
    }

    pub fn unit(&self) -> Option<&Arc<Unit>> {
        self.unit.as_ref()
    }
}

/// Running commands by channel, so that a host `Kill` finds its tree.
#[derive(Clone, Default)]
pub struct Registry(Arc<Mutex<HashMap<u32, Arc<Tree>>>>);

impl Registry {
    pub fn insert(&self, chan: u32, tree: Arc<Tree>) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(chan, tree);
    }

    pub fn remove(&self, chan: u32) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&chan);
    }

    pub fn kill(&self, chan: u32) {
        let target = self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&chan)
            .cloned();
        if let Some(t) = target {
            crate::pool::run(move || t.stop(EndReason::Cancelled));
        }
    }
}

pub fn spawn(chan: u32, req: ExecRequest, out: Out, reaper: Arc<Reaper>, reg: Registry) {
    crate::pool::run(move || {
        let result = run(chan, req, &out, &reaper, &reg);
        reg.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&chan);
        if let Err(e) = result {
            out.error(chan, "spawn_failed", e.to_string());
        }
    });
}

/// Spawns `cmd` inside `unit` (when there is one) from a fresh thread that
/// has dropped CAP_SYS_ADMIN. Returns the child, its exit receiver, and the
/// unit if the child really was born inside it.
pub fn spawn_contained(
    mut cmd: Command,
    unit: Option<Unit>,
    reaper: &Arc<Reaper>,
) -> std::io::Result<(Child, Receiver<Exit>, Option<Arc<Unit>>)> {
    let reaper = Arc::clone(reaper);
    let got = crate::spawner::once(move || {
        let unit = unit.filter(|u| u.join_current_thread().is_ok());
        crate::spawner::drop_sys_admin();
        let spawned = reaper.spawn_watched(|| {
            let c = cmd.spawn()?;
            let pid = c.id() as i32;
            Ok((c, pid))
        });
        spawned.map(|(c, rx)| (c, rx, unit.map(Arc::new)))
    });
    got.unwrap_or_else(|| Err(std::io::Error::other("no spawner thread")))
}

/// Why a command could not be started.
pub enum Refused {
    /// Bad request: (error code, message) for the host.
    Invalid(&'static str, String),
    /// The program could not be run (127/126 like a shell, or another error).
    Spawn(String, std::io::Error),
}

/// A command ready to spawn, and the marker its fallback kill looks for.
pub fn prepare(chan: u32, req: &ExecRequest) -> Result<(Command, Vec<u8>), Refused> {
    let Some((prog, args)) = req.argv.split_first() else {
        return Err(Refused::Invalid("invalid", "empty argv".into()));
    };
    let cwd = req.cwd.as_deref().unwrap_or("/");
    if !std::path::Path::new(cwd).is_dir() {
        return Err(Refused::Invalid(
            "not_found",
            format!("cwd {cwd} is not a directory"),
        ));
    }
    let mark_value = format!("{}-{}", chan, NEXT_MARK.fetch_add(1, Ordering::Relaxed));
    let marker = format!("HATCHERY_EXEC_ID={mark_value}").into_bytes();

    // Resolve on the command's own PATH here: given a bare name plus a
    // changed PATH, std falls back from posix_spawn to fork(), and forking
    // this multi-threaded agent costs tens of ms under gVisor.
    let path_env = req.env.get("PATH").map(String::as_str).unwrap_or(BASE_PATH);
    let Some(resolved) = resolve(prog, path_env) else {
        let e = std::io::Error::new(std::io::ErrorKind::NotFound, "command not found");
        return Err(Refused::Spawn(prog.clone(), e));
    };
    let mut cmd = Command::new(resolved);
    cmd.arg0(prog);
    cmd.args(args)
        .env_clear()
        .env("PATH", BASE_PATH)
        .env("HOME", "/root")
        .env("LANG", "C.UTF-8")
        .envs(&req.env)
        .env("HATCHERY_EXEC_ID", &mark_value)
        .current_dir(cwd)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // Its own process group, so one kill reaches the ordinary tree. Not a
    // pre_exec setsid: a pre_exec hook forces fork() of this multi-threaded
    // agent, which costs tens of ms under gVisor, while a plain spawn uses
    // posix_spawn (vfork).
    cmd.process_group(0);
    Ok((cmd, marker))
}

fn run(
    chan: u32,
    req: ExecRequest,
    out: &Out,
    reaper: &Arc<Reaper>,
    reg: &Registry,
) -> std::io::Result<()> {
    let start = Instant::now();
    let (mut cmd, marker) = match prepare(chan, &req) {
        Ok(x) => x,
        Err(Refused::Invalid(code, msg)) => {
            out.error(chan, code, msg);
            return Ok(());
        }
        Err(Refused::Spawn(prog, e)) => return spawn_failure(chan, &prog, e, start, out),
    };
    cmd.stdin(if req.stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let prog = req.argv[0].clone();
    let unit = crate::cgroup::keeper().new_unit();
    let (mut child, exited, unit) = match spawn_contained(cmd, unit, reaper) {
        Ok(x) => x,
        Err(e) => return spawn_failure(chan, &prog, e, start, out),
    };
    let pgid = child.id() as i32;
    let tree = Arc::new(Tree::new(pgid, marker, unit));
    reg.0
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(chan, Arc::clone(&tree));

    if let (Some(mut stdin), Some(data)) = (child.stdin.take(), req.stdin) {
        crate::pool::run(move || {
            let _ = stdin.write_all(data.as_bytes());
        });
    }
    let done = Arc::new(AtomicBool::new(false));
    let truncated = Arc::new(AtomicBool::new(false));
    let (drained_tx, drained) = channel();
    for (pipe, kind) in [
        (
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
            Kind::Stdout,
        ),
        (
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
            Kind::Stderr,
        ),
    ] {
        let Some(pipe) = pipe else { continue };
        let ctl = PumpCtl {
            done: done.clone(),
            truncated: truncated.clone(),
            tree: Arc::clone(&tree),
        };
        let (out, tx) = (out.clone(), drained_tx.clone());
        let cap = req.max_output_bytes;
        crate::pool::run(move || {
            pump(chan, kind, pipe, cap, &out, &ctl);
            let _ = tx.send(());
        });
    }
    drop(drained_tx);

    let deadline = start + Duration::from_millis(req.timeout_ms);
    let (exit, peak) = watch(&tree, &exited, deadline, req.cpu_limit_ms)?;
    if tree.stop.get().is_some() {
        // Once more, for anything forked during the first sweep; then the
        // pipes close at once.
        tree.kill_all();
    }
    let grace_end = Instant::now() + DRAIN_GRACE;
    for _ in 0..2 {
        if drained
            .recv_timeout(grace_end.saturating_duration_since(Instant::now()))
            .is_err()
        {
            break;
        }
    }
    let (code, signal) = exit_code(exit.status);
    let last = tree.unit().and_then(|u| u.stat());
    let reason = tree.stop.get().unwrap_or(if signal.is_some() {
        EndReason::Signaled
    } else {
        EndReason::Exited
    });
    let result = ExecResult {
        exit_code: code,
        signal,
        timed_out: reason == EndReason::Timeout,
        truncated: truncated.load(Ordering::SeqCst),
        duration_ms: start.elapsed().as_millis() as u64,
        cpu_ms: last.map(|s| ns_to_ms(s.cpu_ns)).unwrap_or(exit.cpu_ms),
        reason,
        memory_peak_bytes: Some(
            peak.max(last.map(|s| s.mem_bytes).unwrap_or(0))
                .max(exit.max_rss_bytes),
        ),
        contained: tree.unit().is_some(),
    };
    let mut w = out.lock();
    // Under the writer lock, so no output frame can follow the result.
    done.store(true, Ordering::SeqCst);
    send_locked(&mut w, &Frame::json(chan, Kind::ExitResult, &result));
    Ok(())
}

fn ns_to_ms(ns: u64) -> u64 {
    (ns + 500_000) / 1_000_000
}

/// Waits for the direct child to exit while enforcing the deadline and the
/// CPU limit on the whole unit. Returns the exit and the peak memory seen.
pub fn watch(
    tree: &Tree,
    exited: &Receiver<Exit>,
    deadline: Instant,
    cpu_limit_ms: Option<u64>,
) -> std::io::Result<(Exit, u64)> {
    let tick = if cpu_limit_ms.is_some() {
        TICK_WITH_CPU_LIMIT
    } else {
        TICK
    };
    let mut peak = 0u64;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() && tree.stop.get().is_none() {
            tree.stop(EndReason::Timeout);
        }
        let wait = if tree.stop.get().is_some() {
            Duration::from_secs(3600)
        } else {
            left.min(tick)
        };
        match exited.recv_timeout(wait) {
            Ok(e) => return Ok((e, peak)),
            Err(RecvTimeoutError::Timeout) => {
                let Some(s) = tree.unit().and_then(|u| u.stat()) else {
                    continue;
                };
                peak = peak.max(s.mem_bytes);
                if cpu_limit_ms.is_some_and(|l| ns_to_ms(s.cpu_ns) >= l) {
                    tree.stop(EndReason::CpuLimit);
                }
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Err(std::io::Error::other("reaper gone"))
            }
        }
    }
}

/// Copies one output pipe to the host up to `cap` bytes; past it, asks for
/// the tree to be stopped and keeps draining (dropping the rest) so that
/// nothing blocks on a full pipe until it is dead.
struct PumpCtl {
    /// Set once the result is sent: no output may follow it.
    done: Arc<AtomicBool>,
    truncated: Arc<AtomicBool>,
    /// Stopped (`output_limit`) when the stream passes its cap.
    tree: Arc<Tree>,
}

fn pump(chan: u32, kind: Kind, mut pipe: Box<dyn Read + Send>, cap: u64, out: &Out, ctl: &PumpCtl) {
    let (done, truncated) = (&ctl.done, &ctl.truncated);
    let mut sent: u64 = 0;
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match pipe.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let room = cap.saturating_sub(sent) as usize;
        if room < n && !truncated.swap(true, Ordering::SeqCst) {
            let t = Arc::clone(&ctl.tree);
            crate::pool::run(move || t.stop(EndReason::OutputLimit));
        }
        let take = n.min(room);
        if take == 0 {
            continue;
        }
        let mut w = out.lock();
        if done.load(Ordering::SeqCst) {
            return;
        }
        send_locked(&mut w, &Frame::new(chan, kind, buf[..take].to_vec()));
        sent += take as u64;
    }
}

pub(crate) fn resolve(prog: &str, path_env: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    if prog.contains('/') {
        return Some(prog.into());
    }
    path_env
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|d| std::path::Path::new(d).join(prog))
        .find(|p| {
            p.metadata()
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

/// A missing program reads like a shell's "command not found" (127).
fn spawn_failure(
    chan: u32,
    prog: &str,
    e: std::io::Error,
    start: Instant,
    out: &Out,
) -> std::io::Result<()> {
    let code = match e.kind() {
        std::io::ErrorKind::NotFound => 127,
        std::io::ErrorKind::PermissionDenied => 126,
        _ => return Err(e),
    };
    let mut w = out.lock();
    send_locked(
        &mut w,
        &Frame::new(chan, Kind::Stderr, format!("{prog}: {e}\n").into_bytes()),
    );
    let result = ExecResult {
        exit_code: code,
        duration_ms: start.elapsed().as_millis() as u64,
        ..Default::default()
    };
    send_locked(&mut w, &Frame::json(chan, Kind::ExitResult, &result));
    Ok(())
}
