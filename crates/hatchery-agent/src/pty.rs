//! Terminals: a program (by default a login shell) on a pseudo-terminal,
//! as its session leader with the terminal as its controlling tty, so job
//! control, Ctrl-C, full-screen programs and window sizes work.
//!
//! A terminal is contained like an exec: it is spawned through
//! [`spawn_contained`] into a unit of its own, from a thread without
//! CAP_SYS_ADMIN. Whichever way it ends (its program exits, the host closes
//! it, the idle backstop fires, the sandbox goes), the whole unit is
//! killed, so nothing started in the terminal outlives it.
//!
//! Threads per terminal: one waits for the program and enforces the idle
//! backstop, one copies the master's output to the host (blocking on the
//! host pipe is the backpressure), one writes keystrokes into the master
//! (the main loop never blocks on a terminal that does not read).

use crate::exec::{resolve, spawn_contained, Tree, BASE_PATH};
use crate::out::{send_locked, Out};
use crate::pty_size::{resizer, Tty, WinSize};
use crate::reaper::{exit_code, Reaper};
use hatchery_agent_proto::{EndReason, Frame, Kind, PtyExit, PtyRequest, PtySize, PtyStarted};
use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

const CHUNK: usize = 32 * 1024;
/// Keystrokes queued for a program that is not reading them; past this,
/// more input is dropped (a tty's own input buffer is only 4 KiB).
const MAX_PENDING_INPUT: usize = 1 << 20;
/// How often a thread blocked on the terminal looks up to see whether the
/// terminal is over (normally its descriptors tell it first).
const POLL_MS: i32 = 250;
const TICK: Duration = Duration::from_millis(250);
/// After the program exits and its unit is killed, how long output still
/// buffered in the terminal may take to drain.
const DRAIN_GRACE: Duration = Duration::from_secs(1);

static NEXT_MARK: AtomicU64 = AtomicU64::new(1);

fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64
}

struct Term {
    /// Resizes, for the terminal's resizer thread.
    resize: Mutex<Sender<PtySize>>,
    tree: Arc<Tree>,
    input: Mutex<Sender<Vec<u8>>>,
    pending: Arc<AtomicUsize>,
    /// Last input or resize, in `now_ms()` time: what the idle backstop
    /// measures.
    active_at: AtomicU64,
}

/// Running terminals by channel.
#[derive(Clone, Default)]
pub struct Ptys(Arc<Mutex<HashMap<u32, Arc<Term>>>>);

impl Ptys {
    fn get(&self, chan: u32) -> Option<Arc<Term>> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&chan)
            .cloned()
    }

    /// Starts a terminal; answers `PtyStarted` (or `Error`), then output
    /// and finally `PtyExit`.
    pub fn open(&self, chan: u32, req: PtyRequest, out: Out, reaper: Arc<Reaper>) {
        let reg = self.clone();
        crate::pool::run(move || {
            if let Err(e) = run(chan, req, &out, &reaper, &reg) {
                out.error(chan, "spawn_failed", e.to_string());
            }
            reg.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&chan);
        });
    }

    /// Queues keystrokes for the terminal's writer; never blocks.
    pub fn input(&self, chan: u32, data: Vec<u8>) {
        let Some(t) = self.get(chan) else { return };
        t.active_at.store(now_ms(), Ordering::Relaxed);
        let n = data.len();
        if t.pending.fetch_add(n, Ordering::SeqCst) + n > MAX_PENDING_INPUT {
            t.pending.fetch_sub(n, Ordering::SeqCst);
            return;
        }
        let sent = t.input.lock().unwrap_or_else(|p| p.into_inner()).send(data);
        if sent.is_err() {
            t.pending.fetch_sub(n, Ordering::SeqCst);
        }
    }

    /// A new window size, for the terminal's resizer (pty_size.rs), which
    /// answers every resize with `PtyResized`, in order.
    pub fn resize(&self, chan: u32, size: PtySize, out: &Out) {
        let Some(t) = self.get(chan) else {
            return crate::pty_size::refuse(out, chan, "no such terminal".into());
        };
        t.active_at.store(now_ms(), Ordering::Relaxed);
        let _ = t
            .resize
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(size);
    }

    /// Ends the terminal and everything started in it.
    pub fn close(&self, chan: u32) {
        if let Some(t) = self.get(chan) {
            crate::pool::run(move || t.tree.stop(EndReason::Cancelled));
        }
    }
}

fn run(
    chan: u32,
    req: PtyRequest,
    out: &Out,
    reaper: &Arc<Reaper>,
    reg: &Ptys,
) -> std::io::Result<()> {
    let argv = if req.argv.is_empty() {
        default_shell()
    } else {
        req.argv
    };
    let Some((prog, args)) = argv.split_first() else {
        out.error(chan, "invalid", "empty argv");
        return Ok(());
    };
    // A login shell starts at home, like any terminal.
    let home_or_root = if std::path::Path::new("/root").is_dir() {
        "/root"
    } else {
        "/"
    };
    let cwd = req.cwd.as_deref().unwrap_or(home_or_root);
    if !std::path::Path::new(cwd).is_dir() {
        out.error(chan, "not_found", format!("cwd {cwd} is not a directory"));
        return Ok(());
    }
    let path_env = req.env.get("PATH").map(String::as_str).unwrap_or(BASE_PATH);
    let Some(resolved) = resolve(prog, path_env) else {
        out.error(chan, "not_found", format!("command not found: {prog}"));
        return Ok(());
    };
    let (master, slave) = open_pty()?;
    if let Err(e) = Tty(master.as_raw_fd()).set(req.size) {
        out.error(chan, "invalid", e);
        return Ok(());
    }
    set_utf8(slave.as_raw_fd());

    let mark_value = format!("t{}-{}", chan, NEXT_MARK.fetch_add(1, Ordering::Relaxed));
    let marker = format!("HATCHERY_EXEC_ID={mark_value}").into_bytes();
    let mut cmd = Command::new(resolved);
    cmd.arg0(prog)
        .args(args)
        .env_clear()
        .env("PATH", BASE_PATH)
        .env("HOME", "/root")
        .env("LANG", "C.UTF-8")
        .env("TERM", "xterm-256color")
        .envs(&req.env)
        .env("HATCHERY_EXEC_ID", &mark_value)
        .current_dir(cwd)
        .stdin(Stdio::from(slave.try_clone()?))
        .stdout(Stdio::from(slave.try_clone()?))
        .stderr(Stdio::from(slave.try_clone()?));
    // SAFETY: only async-signal-safe calls between fork and exec. A new
    // session makes the child its leader, and TIOCSCTTY makes the terminal
    // (already its fd 0) the session's controlling tty. This hook forces a
    // fork() of the agent, which is slower than posix_spawn but happens
    // once per terminal, not per command.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let unit = crate::cgroup::keeper().new_unit();
    let (child, exited, unit) = match spawn_contained(cmd, unit, reaper) {
        Ok(x) => x,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            out.error(chan, "not_found", format!("{prog}: {e}"));
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    // Only the program may hold the slave: once it and its children are
    // gone, the master reads end.
    drop(slave);
    let pid = child.id() as i32;
    // The program leads its own session, hence its own process group.
    let tree = Arc::new(Tree::new(pid, marker, unit));
    let master = Arc::new(master);
    set_nonblocking(master.as_raw_fd());
    let (input_tx, input_rx) = channel();
    let (resize_tx, resize_rx) = channel();
    let term = Arc::new(Term {
        resize: Mutex::new(resize_tx),
        tree: Arc::clone(&tree),
        input: Mutex::new(input_tx),
        pending: Arc::new(AtomicUsize::new(0)),
        active_at: AtomicU64::new(now_ms()),
    });
    reg.0
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(chan, Arc::clone(&term));
    out.send(&Frame::json(
        chan,
        Kind::PtyStarted,
        &PtyStarted {
            pid,
            contained: tree.unit().is_some(),
        },
    ));

    let done = Arc::new(AtomicBool::new(false));
    let ending = Arc::new(AtomicBool::new(false));
    let (drained_tx, drained) = channel::<()>();
    {
        let (master, out, done, ending) = (
            Arc::clone(&master),
            out.clone(),
            Arc::clone(&done),
            Arc::clone(&ending),
        );
        crate::pool::run(move || {
            pump_output(chan, &master, &out, &done, &ending);
            let _ = drained_tx.send(());
        });
    }
    {
        let (master, pending, ending) = (
            Arc::clone(&master),
            Arc::clone(&term.pending),
            Arc::clone(&ending),
        );
        crate::pool::run(move || pump_input(&master, input_rx, &pending, &ending));
    }
    {
        let (master, out) = (Arc::clone(&master), out.clone());
        crate::pool::run(move || resizer(chan, master, pid, resize_rx, out));
    }

    let idle = Duration::from_millis(req.idle_timeout_ms.max(1000));
    let exit = loop {
        match exited.recv_timeout(TICK) {
            Ok(e) => break e,
            Err(RecvTimeoutError::Timeout) => {
                let quiet = now_ms().saturating_sub(term.active_at.load(Ordering::Relaxed));
                if quiet >= idle.as_millis() as u64 && tree.stop.get().is_none() {
                    tree.stop(EndReason::Timeout);
                }
            }
            Err(RecvTimeoutError::Disconnected) => {
                tree.kill_all();
                return Err(std::io::Error::other("reaper gone"));
            }
        }
    };
    // The terminal is over: so is everything started in it.
    tree.kill_all();
    let _ = drained.recv_timeout(DRAIN_GRACE);
    ending.store(true, Ordering::SeqCst);
    let _ = drained.recv_timeout(Duration::from_millis(500));
    reg.0
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&chan);
    let (code, signal) = exit_code(exit.status);
    let reason = tree.stop.get().unwrap_or(if signal.is_some() {
        EndReason::Signaled
    } else {
        EndReason::Exited
    });
    let mut w = out.lock();
    // Under the writer lock, so no output frame can follow the exit.
    done.store(true, Ordering::SeqCst);
    send_locked(
        &mut w,
        &Frame::json(
            chan,
            Kind::PtyExit,
            &PtyExit {
                exit_code: code,
                signal,
                reason,
            },
        ),
    );
    Ok(())
}

fn default_shell() -> Vec<String> {
    use std::os::unix::fs::PermissionsExt;
    let bash = std::fs::metadata("/bin/bash")
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false);
    if bash {
        vec!["/bin/bash".into(), "-l".into()]
    } else {
        vec!["/bin/sh".into()]
    }
}

/// Copies the terminal's output to the host until the terminal has no
/// writer left, or until told the terminal is over.
fn pump_output(chan: u32, master: &File, out: &Out, done: &AtomicBool, ending: &AtomicBool) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        match (&*master).read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                let mut w = out.lock();
                if done.load(Ordering::SeqCst) {
                    return;
                }
                send_locked(
                    &mut w,
                    &Frame::new(chan, Kind::PtyOutput, buf[..n].to_vec()),
                );
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if ending.load(Ordering::SeqCst) {
                    return;
                }
                wait_fd(master.as_raw_fd(), libc::POLLIN);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // EIO: every slave descriptor is closed.
            Err(_) => return,
        }
    }
}

/// Writes queued keystrokes into the terminal, waiting (not spinning) while
/// the program does not read them.
fn pump_input(master: &File, rx: Receiver<Vec<u8>>, pending: &AtomicUsize, ending: &AtomicBool) {
    // Ends when the terminal is dropped (its sender with it).
    while let Ok(data) = rx.recv() {
        let mut rest = &data[..];
        while !rest.is_empty() {
            match (&*master).write(rest) {
                Ok(n) => rest = &rest[n..],
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if ending.load(Ordering::SeqCst) {
                        return;
                    }
                    wait_fd(master.as_raw_fd(), libc::POLLOUT);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
        pending.fetch_sub(data.len(), Ordering::SeqCst);
    }
}

fn wait_fd(fd: RawFd, events: libc::c_short) {
    let mut pfd = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: one valid pollfd on an fd the caller keeps open.
    unsafe { libc::poll(&mut pfd, 1, POLL_MS) };
    if pfd.revents & (libc::POLLHUP | libc::POLLERR) != 0 && pfd.revents & events == 0 {
        // Nothing will ever be readable or writable; do not spin on it.
        std::thread::sleep(Duration::from_millis(POLL_MS as u64));
    }
}

/// A new terminal pair, both ends close-on-exec: a command spawned by
/// another thread at the same moment must not inherit either end (a held
/// slave would keep the master from ever seeing the end). `openpty(3)`
/// cannot set that atomically, hence the steps it takes, by hand.
fn open_pty() -> std::io::Result<(File, File)> {
    let err = std::io::Error::last_os_error;
    // SAFETY: plain libc calls; the name buffer outlives ptsname_r, and
    // each fd is owned by exactly one File from here on.
    unsafe {
        let m = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        if m < 0 {
            return Err(err());
        }
        let master = File::from_raw_fd(m);
        if libc::grantpt(m) != 0 || libc::unlockpt(m) != 0 {
            return Err(err());
        }
        let mut name = [0 as libc::c_char; 64];
        if libc::ptsname_r(m, name.as_mut_ptr(), name.len()) != 0 {
            return Err(err());
        }
        let s = libc::open(
            name.as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        );
        if s < 0 {
            return Err(err());
        }
        Ok((master, File::from_raw_fd(s)))
    }
}

/// UTF-8 aware line editing (backspace over a multibyte character).
fn set_utf8(fd: RawFd) {
    // SAFETY: all-zero is a valid termios, filled in by tcgetattr.
    unsafe {
        let mut t: libc::termios = std::mem::zeroed();
        if libc::tcgetattr(fd, &mut t) == 0 {
            t.c_iflag |= libc::IUTF8;
            libc::tcsetattr(fd, libc::TCSANOW, &t);
        }
    }
}

fn set_nonblocking(fd: RawFd) {
    // SAFETY: fcntl on an fd the caller owns.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
    }
}
