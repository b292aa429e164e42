//! Background processes: started by an exec with `background: true`, they
//! run in their own unit like any command, and their output goes to a
//! bounded ring here (in the guest, charged to the sandbox's memory) from
//! which any number of readers can replay it from an offset and follow it.

use crate::exec::{prepare, spawn_contained, Refused, Tree};
use crate::out::{send_locked, Out};
use crate::reaper::{exit_code, Exit, Reaper};
use hatchery_agent_proto::{EndReason, ExecRequest, Frame, Kind, ProcInfo, ProcRequest};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Running background processes per sandbox (429 beyond). The in-guest
/// process ceiling (RLIMIT_NPROC, 64 tasks for the default template, which
/// counts threads, and each background process costs its own tasks plus a
/// driver thread here) can refuse earlier, also with 429.
pub const MAX_RUNNING: usize = 16;
/// Exited ones kept for their output and status; the oldest go first.
pub const MAX_EXITED: usize = 64;
/// Output kept per process, stdout and stderr together.
pub const RING_BYTES: usize = 1 << 20;
/// Stdin queued and not yet taken by the process's pipe.
pub const MAX_STDIN_PENDING: usize = 4 << 20;
const CHUNK: usize = 32 * 1024;
/// A background process without a timeout lives as long as its sandbox.
const NO_TIMEOUT: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

#[derive(Default)]
struct Ring {
    chunks: VecDeque<(u64, u8, Vec<u8>)>,
    bytes: usize,
    next: u64,
}

impl Ring {
    fn push(&mut self, stream: u8, data: &[u8]) {
        self.chunks.push_back((self.next, stream, data.to_vec()));
        self.next += data.len() as u64;
        self.bytes += data.len();
        while self.bytes > RING_BYTES {
            match self.chunks.pop_front() {
                Some((_, _, d)) => self.bytes -= d.len(),
                None => break,
            }
        }
    }

    fn first(&self) -> u64 {
        self.chunks.front().map(|c| c.0).unwrap_or(self.next)
    }

    /// Chunks at or after `from` (a chunk that starts before it is cut).
    fn since(&self, from: u64) -> Vec<(u64, u8, Vec<u8>)> {
        self.chunks
            .iter()
            .filter(|(o, _, d)| o + d.len() as u64 > from)
            .map(|(o, s, d)| {
                let skip = from.saturating_sub(*o) as usize;
                (o + skip as u64, *s, d[skip..].to_vec())
            })
            .collect()
    }
}

struct State {
    ring: Ring,
    exit: Option<(i32, Option<i32>, EndReason, u64)>,
}

pub struct Proc {
    id: String,
    pid: i32,
    argv: Vec<String>,
    started_at_ms: u64,
    tree: Arc<Tree>,
    state: Mutex<State>,
    changed: Condvar,
    stdin: Mutex<Stdin>,
}

/// The process's stdin, written without ever blocking the agent: what the
/// pipe does not take at once waits here for the driver thread.
struct Stdin {
    pipe: Option<std::process::ChildStdin>,
    pending: VecDeque<u8>,
    close_when_flushed: bool,
}

impl Stdin {
    /// Writes what the pipe takes now. False once the process will never
    /// read again (the pipe is broken).
    fn flush(&mut self) -> bool {
        while let Some(pipe) = self.pipe.as_mut() {
            let (a, _) = self.pending.as_slices();
            if a.is_empty() {
                break;
            }
            match pipe.write(a) {
                Ok(n) => drop(self.pending.drain(..n)),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
                Err(_) => {
                    self.pipe = None;
                    self.pending.clear();
                    return false;
                }
            }
        }
        if self.pending.is_empty() && self.close_when_flushed {
            self.pipe = None;
        }
        true
    }

    fn open(&self) -> bool {
        self.pipe.is_some() && !self.close_when_flushed
    }
}

impl Proc {
    /// Whether it still runs, without `info`'s CPU sample (a keeper round
    /// trip per process).
    fn running(&self) -> bool {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .exit
            .is_none()
    }

    fn info(&self) -> ProcInfo {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (exit_code, signal, reason, cpu_ms) = match st.exit {
            Some((c, s, r, cpu)) => (Some(c), s, Some(r), cpu),
            None => (
                None,
                None,
                None,
                self.tree
                    .unit()
                    .and_then(|u| u.stat())
                    .map(|s| s.cpu_ns / 1_000_000)
                    .unwrap_or(0),
            ),
        };
        ProcInfo {
            id: self.id.clone(),
            pid: self.pid,
            argv: self.argv.clone(),
            started_at_ms: self.started_at_ms,
            running: st.exit.is_none(),
            exit_code,
            signal,
            reason,
            cpu_ms,
            output_bytes: st.ring.next,
            first_offset: st.ring.first(),
            stdin_open: self.stdin.lock().unwrap_or_else(|p| p.into_inner()).open(),
        }
    }
}

#[derive(Clone, Default)]
pub struct Procs {
    map: Arc<Mutex<BTreeMap<String, Arc<Proc>>>>,
    /// Readers by channel, so a host `Kill` on the channel stops one.
    readers: Arc<Mutex<HashMap<u32, Arc<AtomicBool>>>>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn new_id() -> String {
    let mut b = [0u8; 8];
    // SAFETY: getrandom into a local buffer of the given length.
    unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("proc_{hex}")
}

impl Procs {
    fn get(&self, id: &str) -> Option<Arc<Proc>> {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    /// Makes room for one more: refuses past the running cap, forgets the
    /// oldest exited processes past theirs.
    fn admit(&self) -> bool {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let (mut exited, running): (Vec<_>, Vec<_>) = m
            .values()
            .map(|p| (p.started_at_ms, p.id.clone(), p.running()))
            .partition(|x| !x.2);
        if running.len() >= MAX_RUNNING {
            return false;
        }
        exited.sort();
        while exited.len() >= MAX_EXITED {
            let (_, id, _) = exited.remove(0);
            m.remove(&id);
        }
        true
    }

    pub fn start(&self, chan: u32, req: ExecRequest, out: Out, reaper: Arc<Reaper>) {
        let me = self.clone();
        crate::pool::run(move || {
            if !me.admit() {
                return out.error(
                    chan,
                    "too_many",
                    format!("at most {MAX_RUNNING} background processes run at once"),
                );
            }
            let (mut cmd, marker) = match prepare(chan, &req) {
                Ok(x) => x,
                Err(Refused::Invalid(code, msg)) => return out.error(chan, code, msg),
                Err(Refused::Spawn(prog, e)) => {
                    return out.error(chan, "spawn_failed", format!("{prog}: {e}"))
                }
            };
            cmd.stdin(Stdio::piped());
            let unit = crate::cgroup::keeper().new_unit();
            let (mut child, exited, unit) = match spawn_contained(cmd, unit, &reaper) {
                Ok(x) => x,
                // EAGAIN: the sandbox's process ceiling.
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                    return out.error(
                        chan,
                        "too_many",
                        format!("the sandbox is at its process limit: {e}"),
                    )
                }
                Err(e) => return out.error(chan, "spawn_failed", format!("{}: {e}", req.argv[0])),
            };
            let pid = child.id() as i32;
            let tree = Arc::new(Tree::new(pid, marker, unit));
            let stdin = child.stdin.take();
            if let Some(s) = &stdin {
                set_nonblocking(s.as_raw_fd());
            }
            let p = Arc::new(Proc {
                id: new_id(),
                pid,
                argv: req.argv.clone(),
                started_at_ms: now_ms(),
                tree: Arc::clone(&tree),
                state: Mutex::new(State {
                    ring: Ring::default(),
                    exit: None,
                }),
                changed: Condvar::new(),
                stdin: Mutex::new(Stdin {
                    pipe: stdin,
                    pending: VecDeque::new(),
                    close_when_flushed: false,
                }),
            });
            me.map
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(p.id.clone(), Arc::clone(&p));
            out.send(&Frame::json(chan, Kind::Ok, &p.info()));
            let timeout = match req.timeout_ms {
                0 => NO_TIMEOUT,
                ms => Duration::from_millis(ms),
            };
            let pipes = [
                child
                    .stdout
                    .take()
                    .map(|p| File::from(std::os::fd::OwnedFd::from(p))),
                child
                    .stderr
                    .take()
                    .map(|p| File::from(std::os::fd::OwnedFd::from(p))),
            ];
            drive(
                &p,
                pipes,
                &exited,
                Instant::now() + timeout,
                req.cpu_limit_ms,
            );
        });
    }

    pub fn list(&self, chan: u32, out: &Out) {
        let all: Vec<ProcInfo> = self
            .map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(|p| p.info())
            .collect();
        out.send(&Frame::json(chan, Kind::Ok, &all));
    }

    /// Streams output from `req.offset` as ProcChunk frames, then a ProcEnd
    /// with the process's info: at once unless `follow`, else at its exit.
    pub fn read(&self, chan: u32, req: ProcRequest, out: Out) {
        let Some(p) = self.get(&req.id) else {
            return out.error(chan, "not_found", format!("no process {}", req.id));
        };
        let stop = Arc::new(AtomicBool::new(false));
        self.readers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(chan, Arc::clone(&stop));
        let readers = Arc::clone(&self.readers);
        crate::pool::run(move || {
            let mut cursor = req.offset;
            loop {
                let mut st = p.state.lock().unwrap_or_else(|e| e.into_inner());
                let fresh = st.ring.since(cursor);
                let exited = st.exit.is_some();
                if fresh.is_empty() && !exited && req.follow && !stop.load(Ordering::SeqCst) {
                    st = p
                        .changed
                        .wait_timeout(st, Duration::from_millis(500))
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                    drop(st);
                    continue;
                }
                drop(st);
                for (off, stream, data) in fresh {
                    for (i, c) in data.chunks(CHUNK).enumerate() {
                        let mut payload = Vec::with_capacity(9 + c.len());
                        payload.extend_from_slice(&(off + (i * CHUNK) as u64).to_be_bytes());
                        payload.push(stream);
                        payload.extend_from_slice(c);
                        // Blocks when the host's channel is full: a slow
                        // reader slows only itself (and this sandbox's
                        // channel), never the process, which writes to the ring.
                        send_locked(&mut out.lock(), &Frame::new(chan, Kind::ProcChunk, payload));
                    }
                    cursor = off + data.len() as u64;
                }
                if exited || !req.follow || stop.load(Ordering::SeqCst) {
                    break;
                }
            }
            readers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&chan);
            out.send(&Frame::json(chan, Kind::ProcEnd, &p.info()));
        });
    }

    /// A host `Kill` on a reader's channel ends that reader (the process
    /// goes on). Returns whether `chan` was a reader.
    pub fn stop_reader(&self, chan: u32) -> bool {
        match self
            .readers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&chan)
        {
            Some(s) => {
                s.store(true, Ordering::SeqCst);
                true
            }
            None => false,
        }
    }

    pub fn stdin(&self, chan: u32, payload: &[u8], out: &Out) {
        let Some(nul) = payload.iter().position(|&b| b == 0) else {
            return out.error(chan, "invalid", "stdin frame without a process id");
        };
        let id = String::from_utf8_lossy(&payload[..nul]).into_owned();
        let Some(p) = self.get(&id) else {
            return out.error(chan, "not_found", format!("no process {id}"));
        };
        let mut st = p.stdin.lock().unwrap_or_else(|e| e.into_inner());
        if !st.open() {
            return out.error(chan, "closed", "the process's stdin is closed");
        }
        let data = &payload[nul + 1..];
        if st.pending.len() + data.len() > MAX_STDIN_PENDING {
            return out.error(chan, "too_many", "the process is not reading its stdin");
        }
        st.pending.extend(data);
        st.flush();
        out.send(&Frame::new(chan, Kind::Ok, b"{}".to_vec()));
    }

    pub fn close_stdin(&self, chan: u32, req: ProcRequest, out: &Out) {
        let Some(p) = self.get(&req.id) else {
            return out.error(chan, "not_found", format!("no process {}", req.id));
        };
        let mut st = p.stdin.lock().unwrap_or_else(|e| e.into_inner());
        st.close_when_flushed = true;
        st.flush();
        out.send(&Frame::new(chan, Kind::Ok, b"{}".to_vec()));
    }

    pub fn signal(&self, chan: u32, req: ProcRequest, out: &Out) {
        let Some(p) = self.get(&req.id) else {
            return out.error(chan, "not_found", format!("no process {}", req.id));
        };
        if p.running() {
            // To its process group, as a terminal would.
            // SAFETY: kill(2) of a process group we started, with a signal
            // number the host validated.
            unsafe { libc::kill(-p.pid, req.signal) };
        }
        out.send(&Frame::json(chan, Kind::Ok, &p.info()));
    }

    pub fn wait(&self, chan: u32, req: ProcRequest, out: Out) {
        let Some(p) = self.get(&req.id) else {
            return out.error(chan, "not_found", format!("no process {}", req.id));
        };
        crate::pool::run(move || {
            let end = Instant::now() + Duration::from_millis(req.timeout_ms);
            let mut st = p.state.lock().unwrap_or_else(|e| e.into_inner());
            while st.exit.is_none() && Instant::now() < end {
                st = p
                    .changed
                    .wait_timeout(st, end.saturating_duration_since(Instant::now()))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            drop(st);
            out.send(&Frame::json(chan, Kind::Ok, &p.info()));
        });
    }

    pub fn kill(&self, chan: u32, req: ProcRequest, out: Out) {
        let Some(p) = self.get(&req.id) else {
            return out.error(chan, "not_found", format!("no process {}", req.id));
        };
        crate::pool::run(move || {
            p.tree.stop(EndReason::Cancelled);
            out.send(&Frame::json(chan, Kind::Ok, &p.info()));
        });
    }
}

fn set_nonblocking(fd: i32) {
    // SAFETY: fcntl on an fd we own.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
    }
}

const TICK: Duration = Duration::from_millis(20);

/// The one thread of a background process: moves its output into the ring,
/// feeds its stdin, and enforces its deadline and CPU limit until it exits
/// (then gives its pipes a moment to drain, since a detached child may hold
/// them open for ever).
fn drive(
    p: &Proc,
    mut pipes: [Option<File>; 2],
    exited: &Receiver<Exit>,
    deadline: Instant,
    cpu_limit_ms: Option<u64>,
) {
    for f in pipes.iter().flatten() {
        set_nonblocking(f.as_raw_fd());
    }
    let mut buf = vec![0u8; CHUNK];
    let mut exit: Option<Exit> = None;
    let mut drain_until: Option<Instant> = None;
    let mut next_stat = Instant::now();
    loop {
        let mut fds: Vec<libc::pollfd> = pipes
            .iter()
            .flatten()
            .map(|f| libc::pollfd {
                fd: f.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let want_out = {
            let st = p.stdin.lock().unwrap_or_else(|e| e.into_inner());
            st.pipe
                .as_ref()
                .filter(|_| !st.pending.is_empty())
                .map(|s| s.as_raw_fd())
        };
        if let Some(fd) = want_out {
            fds.push(libc::pollfd {
                fd,
                events: libc::POLLOUT,
                revents: 0,
            });
        }
        // SAFETY: a valid array of pollfds of the given length.
        unsafe {
            libc::poll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                TICK.as_millis() as i32,
            )
        };
        for (i, stream) in [(0usize, 1u8), (1, 2)] {
            let Some(f) = pipes[i].as_mut() else { continue };
            match f.read(&mut buf) {
                Ok(0) => pipes[i] = None,
                Ok(n) => {
                    p.state
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .ring
                        .push(stream, &buf[..n]);
                    p.changed.notify_all();
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => pipes[i] = None,
            }
        }
        if want_out.is_some() {
            p.stdin.lock().unwrap_or_else(|e| e.into_inner()).flush();
        }
        if exit.is_none() {
            if let Ok(e) = exited.try_recv() {
                exit = Some(e);
                drain_until = Some(Instant::now() + Duration::from_millis(200));
            }
        }
        let drained = pipes.iter().all(Option::is_none);
        if let Some(e) = &exit {
            if drained || drain_until.is_some_and(|t| Instant::now() >= t) {
                return finish(p, e);
            }
            continue;
        }
        if Instant::now() >= next_stat {
            next_stat = Instant::now() + TICK;
            if Instant::now() >= deadline {
                p.tree.stop(EndReason::Timeout);
            }
            let spent = p
                .tree
                .unit()
                .and_then(|u| u.stat())
                .map(|s| s.cpu_ns / 1_000_000);
            if cpu_limit_ms.zip(spent).is_some_and(|(l, s)| s >= l) {
                p.tree.stop(EndReason::CpuLimit);
            }
        }
    }
}

fn finish(p: &Proc, exit: &Exit) {
    if p.tree.stop.get().is_some() {
        p.tree.kill_all();
    }
    let (code, signal) = exit_code(exit.status);
    let reason = p.tree.stop.get().unwrap_or(if signal.is_some() {
        EndReason::Signaled
    } else {
        EndReason::Exited
    });
    let cpu = p
        .tree
        .unit()
        .and_then(|u| u.stat())
        .map(|s| s.cpu_ns / 1_000_000)
        .unwrap_or(exit.cpu_ms);
    p.state.lock().unwrap_or_else(|e| e.into_inner()).exit = Some((code, signal, reason, cpu));
    p.stdin.lock().unwrap_or_else(|e| e.into_inner()).pipe = None;
    p.changed.notify_all();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_keeps_the_newest_bytes_and_replays_from_any_offset() {
        let mut r = Ring::default();
        r.push(1, b"hello ");
        r.push(2, b"world");
        assert_eq!(r.first(), 0);
        let got = r.since(3);
        assert_eq!(got[0], (3, 1, b"lo ".to_vec()));
        assert_eq!(got[1], (6, 2, b"world".to_vec()));
        assert!(r.since(11).is_empty());
        let big = vec![b'x'; RING_BYTES];
        r.push(1, &big);
        assert_eq!(r.first(), 11, "the old chunks were dropped");
        assert_eq!(r.next, 11 + RING_BYTES as u64);
        assert_eq!(
            r.since(0)[0].0,
            11,
            "a reader behind the ring starts at its start"
        );
    }
}
