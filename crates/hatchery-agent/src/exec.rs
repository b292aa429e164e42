use crate::kill::kill_tree;
use crate::out::{send_locked, Out};
use crate::reaper::{exit_code, Reaper};
use hatchery_agent_proto::{ExecRequest, ExecResult, Frame, Kind};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CHUNK: usize = 32 * 1024;
/// After the command exits, how long to wait for its pipes to drain. A
/// background child that keeps them open must not hold the result hostage.
const DRAIN_GRACE: Duration = Duration::from_millis(100);
const BASE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

static NEXT_MARK: AtomicU64 = AtomicU64::new(1);

struct Running {
    pgid: i32,
    marker: Vec<u8>,
}

/// Running commands by channel, so that a host `Kill` finds its tree.
#[derive(Clone, Default)]
pub struct Registry(Arc<Mutex<HashMap<u32, Running>>>);

impl Registry {
    pub fn kill(&self, chan: u32) {
        let target = self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&chan)
            .map(|r| (r.pgid, r.marker.clone()));
        if let Some((pgid, marker)) = target {
            kill_tree(pgid, &marker);
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

fn run(
    chan: u32,
    req: ExecRequest,
    out: &Out,
    reaper: &Reaper,
    reg: &Registry,
) -> std::io::Result<()> {
    let start = Instant::now();
    let Some((prog, args)) = req.argv.split_first() else {
        out.error(chan, "invalid", "empty argv");
        return Ok(());
    };
    let cwd = req.cwd.as_deref().unwrap_or("/");
    if !std::path::Path::new(cwd).is_dir() {
        out.error(chan, "not_found", format!("cwd {cwd} is not a directory"));
        return Ok(());
    }
    let mark_value = format!("{}-{}", chan, NEXT_MARK.fetch_add(1, Ordering::Relaxed));
    let marker = format!("HATCHERY_EXEC_ID={mark_value}").into_bytes();

    // Resolve on the command's own PATH here: given a bare name plus a
    // changed PATH, std falls back from posix_spawn to fork(), and forking
    // this multi-threaded agent costs tens of ms under gVisor.
    let path_env = req.env.get("PATH").map(String::as_str).unwrap_or(BASE_PATH);
    let Some(resolved) = resolve(prog, path_env) else {
        let e = std::io::Error::new(std::io::ErrorKind::NotFound, "command not found");
        return spawn_failure(chan, prog, e, start, out);
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
        .stdin(if req.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // Its own process group, so one kill reaches the ordinary tree. Not a
    // pre_exec setsid: a pre_exec hook forces fork() of this multi-threaded
    // agent, which costs tens of ms under gVisor, while a plain spawn uses
    // posix_spawn (vfork).
    cmd.process_group(0);

    let spawned = reaper.spawn_watched(|| {
        let c = cmd.spawn()?;
        let pid = c.id() as i32;
        Ok((c, pid))
    });
    let (mut child, exited) = match spawned {
        Ok(x) => x,
        Err(e) => return spawn_failure(chan, prog, e, start, out),
    };
    let pgid = child.id() as i32;
    reg.0.lock().unwrap_or_else(|p| p.into_inner()).insert(
        chan,
        Running {
            pgid,
            marker: marker.clone(),
        },
    );

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
        let (out, done, truncated, tx) = (
            out.clone(),
            done.clone(),
            truncated.clone(),
            drained_tx.clone(),
        );
        let cap = req.max_output_bytes;
        crate::pool::run(move || {
            pump(chan, kind, pipe, cap, &out, &done, &truncated);
            let _ = tx.send(());
        });
    }
    drop(drained_tx);

    let deadline = start + Duration::from_millis(req.timeout_ms);
    let mut timed_out = false;
    let exit = match exited.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        Ok(e) => e,
        Err(RecvTimeoutError::Timeout) => {
            timed_out = true;
            kill_tree(pgid, &marker);
            exited
                .recv()
                .map_err(|_| std::io::Error::other("reaper gone"))?
        }
        Err(RecvTimeoutError::Disconnected) => return Err(std::io::Error::other("reaper gone")),
    };
    if timed_out {
        // Its tree is dead, so the pipes close at once.
        kill_tree(pgid, &marker);
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
    let result = ExecResult {
        exit_code: code,
        signal,
        timed_out,
        truncated: truncated.load(Ordering::SeqCst),
        duration_ms: start.elapsed().as_millis() as u64,
        cpu_ms: exit.cpu_ms,
    };
    let mut w = out.lock();
    // Under the writer lock, so no output frame can follow the result.
    done.store(true, Ordering::SeqCst);
    send_locked(&mut w, &Frame::json(chan, Kind::ExitResult, &result));
    Ok(())
}

/// Copies one output pipe to the host up to `cap` bytes, then keeps draining
/// so that the command never blocks on a full pipe, and drops the rest.
fn pump(
    chan: u32,
    kind: Kind,
    mut pipe: Box<dyn Read + Send>,
    cap: u64,
    out: &Out,
    done: &AtomicBool,
    truncated: &AtomicBool,
) {
    let mut sent: u64 = 0;
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match pipe.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let room = cap.saturating_sub(sent) as usize;
        if room < n {
            truncated.store(true, Ordering::SeqCst);
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

fn resolve(prog: &str, path_env: &str) -> Option<std::path::PathBuf> {
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
