//! One interpreter process: a Python kernel (`python_kernel.py`), the
//! Bash kernel (`bash_kernel.py`, a Python driver of one `bash`), or the
//! JavaScript/TypeScript kernel (`js_kernel.js`, one `node`), the R kernel
//! (`r_kernel.R`, one `Rscript`) or the Java kernel (`java_kernel.java`,
//! one JVM running JShell in-process), in a unit of its own, with four
//! pipes: requests (its fd 3), events (its fd 4) and its raw stdout and
//! stderr (what it and its child processes write). The R and Java kernels
//! read their own source from a memfd on fd 5: nothing is written to the
//! sandbox's disk.

use crate::exec::{spawn_contained, Tree};
use crate::reaper::{Exit, Reaper};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const PYTHON_KERNEL: &str = include_str!("../kernel/python_kernel.py");
/// The Python kernel's chart extractor, passed as its argument (it loads
/// it on the first figure it shows).
pub const PYTHON_CHARTS: &str = include_str!("../kernel/python_charts.py");
pub const BASH_KERNEL: &str = include_str!("../kernel/bash_kernel.py");
pub const JS_KERNEL: &str = include_str!("../kernel/js_kernel.js");
pub const R_KERNEL: &str = include_str!("../kernel/r_kernel.R");
pub const JAVA_KERNEL: &str = include_str!("../kernel/java_kernel.java");
pub const PYTHON: &str = "/usr/bin/python3";
pub const NODE: &str = "/usr/bin/node";
pub const RSCRIPT: &str = "/usr/bin/Rscript";
pub const JAVA: &str = "/usr/bin/java";
/// Present with a JDK (Debian's openjdk-*-jdk-headless), whose jdk.jshell
/// module the Java kernel needs; a JRE has `java` but not this.
pub const JSHELL: &str = "/usr/bin/jshell";
/// The Java kernel's JVM: a small, quick start (one GC thread, the C1
/// compiler only, the JDK's class-data archive) and a heap well inside the
/// sandbox's memory (1 GiB in code-interpreter-full).
const JVM_FLAGS: &[&str] = &[
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Xshare:auto",
    "-XX:-UsePerfData",
    "-Xmx256m",
];
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How much of a kernel's stderr a failed start reports.
const STARTUP_STDERR: usize = 2048;

static NEXT_MARK: AtomicU64 = AtomicU64::new(1);

pub struct Kernel {
    pub tree: Arc<Tree>,
    pub req: Arc<File>,
    pub events: File,
    pub stdout: File,
    pub stderr: File,
    pub exited: Receiver<Exit>,
    /// Bytes of `events` read past the last full line.
    pub pending: Vec<u8>,
    child: Child,
}

/// A memfd holding `text`, positioned at its start, above fd 5 (see
/// [`high_pipe`]).
fn source_fd(text: &str) -> std::io::Result<File> {
    // SAFETY: memfd_create with a NUL-terminated name; the fd is ours.
    let fd = unsafe { libc::memfd_create(c"hatchery-kernel".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut f = lift(fd)?;
    f.write_all(text.as_bytes())?;
    std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(0))?;
    Ok(f)
}

/// A pipe whose ends are above the fds the kernel is given (3 and 4), so
/// that the dup2s in the child can never clobber one another.
fn high_pipe() -> std::io::Result<(File, File)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 writes two fds into the array we pass.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let read = lift(fds[0]);
    let write = lift(fds[1]);
    Ok((read?, write?))
}

/// `fd` (ours, closed here) moved to the lowest free fd at or above 10,
/// close-on-exec.
fn lift(fd: RawFd) -> std::io::Result<File> {
    // SAFETY: F_DUPFD_CLOEXEC on an fd we own.
    let high = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 10) };
    // Read before close, which may set errno too.
    let err = std::io::Error::last_os_error();
    // SAFETY: `fd` is ours and used no more.
    unsafe { libc::close(fd) };
    if high < 0 {
        return Err(err);
    }
    // SAFETY: a fresh fd owned by nothing else.
    Ok(unsafe { File::from_raw_fd(high) })
}

pub fn set_nonblocking(f: &File) {
    // SAFETY: fcntl on an fd we own.
    unsafe {
        let fl = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(f.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK);
    }
}

impl Kernel {
    /// The interpreter's own process (quiet.rs counts it as the agent's).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Starts the kernel of `language` (`python`, `bash`, `javascript`,
    /// `typescript`, `r` or `java`) in `cwd` and waits until it says it is ready.
    pub fn start(language: &str, cwd: &str, reaper: &Arc<Reaper>) -> std::io::Result<Kernel> {
        let (req_r, req_w) = high_pipe()?;
        let (ev_r, ev_w) = high_pipe()?;
        let (req_fd, ev_fd) = (req_r.as_raw_fd(), ev_w.as_raw_fd());
        let mark = format!("k-{}", NEXT_MARK.fetch_add(1, Ordering::Relaxed));
        // The R and Java kernels' source, on the kernel's fd 5.
        let source = match language {
            "r" => Some(source_fd(R_KERNEL)?),
            "java" => Some(source_fd(JAVA_KERNEL)?),
            _ => None,
        };
        let src_fd = source.as_ref().map(|f| f.as_raw_fd());
        let mut cmd = match language {
            "r" => {
                let mut c = Command::new(RSCRIPT);
                c.args(["--vanilla", "/dev/fd/5"]);
                c
            }
            "java" => {
                // The JDK's source launcher compiles the kernel in memory;
                // it needs a seekable file, which a memfd is.
                let mut c = Command::new(JAVA);
                c.args(JVM_FLAGS).args(["--source", "17", "/dev/fd/5"]);
                c
            }
            "javascript" | "typescript" => {
                // --expose-internals: the kernel uses Node's REPL rewrite
                // of top-level await (internal/repl/await).
                let mut c = Command::new(NODE);
                c.args(["--expose-internals", "-e", JS_KERNEL]);
                c
            }
            _ => {
                let mut c = Command::new(PYTHON);
                if language == "bash" {
                    c.args(["-u", "-E", "-s", "-c", BASH_KERNEL]);
                } else {
                    c.args(["-u", "-E", "-s", "-c", PYTHON_KERNEL, PYTHON_CHARTS]);
                }
                c
            }
        };
        cmd.env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .env("HOME", "/root")
            .env("LANG", "C.UTF-8")
            .env("HATCHERY_EXEC_ID", &mark)
            .current_dir(cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        if matches!(language, "javascript" | "typescript") {
            // Read and unset by the kernel before any cell runs.
            cmd.env("HATCHERY_KERNEL_LANGUAGE", language);
        }
        // SAFETY: only dup2 (async-signal-safe) between fork and exec; the
        // sources are CLOEXEC and vanish at exec, the copies do not.
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(req_fd, 3) < 0 || libc::dup2(ev_fd, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some(fd) = src_fd {
                    if libc::dup2(fd, 5) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let unit = crate::cgroup::keeper().new_unit();
        let (mut child, exited, unit) = spawn_contained(cmd, unit, reaper)?;
        drop((req_r, ev_w, source));
        let marker = format!("HATCHERY_EXEC_ID={mark}").into_bytes();
        let tree = Arc::new(Tree::new(child.id() as i32, marker, unit));
        let stdout = File::from(std::os::fd::OwnedFd::from(
            child.stdout.take().expect("piped"),
        ));
        let stderr = File::from(std::os::fd::OwnedFd::from(
            child.stderr.take().expect("piped"),
        ));
        let mut k = Kernel {
            tree,
            req: Arc::new(req_w),
            events: ev_r,
            stdout,
            stderr,
            exited,
            pending: Vec::new(),
            child,
        };
        if let Err(e) = k.wait_ready() {
            k.tree.kill_all();
            return Err(e);
        }
        for f in [&k.events, &k.stdout, &k.stderr] {
            set_nonblocking(f);
        }
        Ok(k)
    }

    fn wait_ready(&mut self) -> std::io::Result<()> {
        let end = Instant::now() + READY_TIMEOUT;
        let mut buf = [0u8; 4096];
        while Instant::now() < end {
            let mut pfd = libc::pollfd {
                fd: self.events.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut pfd, 1, 100) };
            if pfd.revents == 0 {
                continue;
            }
            let n = self.events.read(&mut buf)?;
            if n == 0 {
                return Err(std::io::Error::other(self.exited_while_starting()));
            }
            self.pending.extend_from_slice(&buf[..n]);
            if let Some(pos) = self.pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=pos).collect();
                let v: serde_json::Value = serde_json::from_slice(&line).unwrap_or_default();
                if v["type"] == "ready" {
                    return Ok(());
                }
            }
            if self.pending.len() > 64 * 1024 {
                break;
            }
        }
        Err(std::io::Error::other(format!(
            "interpreter did not get ready within {} s",
            READY_TIMEOUT.as_secs()
        )))
    }

    /// What a kernel that ended before it was ready said on its stderr
    /// (the JS kernel's "no TypeScript compiler ...", a Python traceback):
    /// the reason a client is given. Read without blocking (it wrote
    /// before it exited; a child of it may hold the pipe open), at most
    /// [`STARTUP_STDERR`] bytes.
    fn exited_while_starting(&self) -> String {
        set_nonblocking(&self.stderr);
        let mut buf = vec![0u8; STARTUP_STDERR];
        let n = (&self.stderr).read(&mut buf).unwrap_or(0);
        let said = String::from_utf8_lossy(&buf[..n]);
        let said = said.trim();
        if said.is_empty() {
            "interpreter exited while starting".to_string()
        } else {
            format!("interpreter exited while starting: {said}")
        }
    }

    /// Sends one request line without blocking the caller: a kernel that
    /// is stuck must not wedge the run that will kill it.
    pub fn send(&self, line: Vec<u8>) {
        // Most cells fit in the pipe: write them here, without a thread
        // hand-off. A pipe buffer holds at least 4 KiB (PIPE_BUF).
        if line.len() <= 4096 {
            let _ = (&*self.req).write_all(&line);
            return;
        }
        let req = Arc::clone(&self.req);
        crate::pool::run(move || {
            let _ = (&*req).write_all(&line);
        });
    }

    /// Throws away whatever arrived between runs: output of background
    /// threads or processes belongs to no run.
    pub fn discard_stale(&mut self) {
        let mut buf = [0u8; 16 * 1024];
        for f in [&mut self.stdout, &mut self.stderr, &mut self.events] {
            while matches!(f.read(&mut buf), Ok(n) if n > 0) {}
        }
        self.pending.clear();
    }
}
