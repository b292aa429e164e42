//! One code run in a context: send the cell, forward what the kernel and
//! its children print, its rich results and its error, and enforce the
//! deadline, the CPU limit and the output caps on the context's unit. A
//! run that has to be stopped kills the whole unit (the interpreter and
//! everything it started); the context then gets a clean interpreter.

use super::kernel::Kernel;
use crate::out::{send_locked, Out};
use hatchery_agent_proto::{CodeRequest, CodeResult, EndReason, Frame, Kind, MAX_FRAME};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::sync::mpsc::TryRecvError;
use std::time::{Duration, Instant};

const CHUNK: usize = 32 * 1024;
const TICK_MS: i32 = 10;
/// A kernel event line longer than this is not from our kernel.
const MAX_EVENT_LINE: usize = 8 << 20;
/// Room left in a frame for one JSON rich result.
const MAX_EVENT: usize = MAX_FRAME - 1024;

pub struct Outcome {
    pub result: CodeResult,
    /// The kernel must be replaced: it died, or it was killed.
    pub dead: bool,
}

struct Caps {
    max: u64,
    out: u64,
    err: u64,
    results: u64,
    truncated: bool,
}

impl Caps {
    /// Counts up to `n` more bytes of `kind`; returns how many fit under
    /// the cap (fewer than `n` marks the run truncated).
    fn take(&mut self, kind: Kind, n: usize) -> usize {
        let used = match kind {
            Kind::Stdout => &mut self.out,
            Kind::Stderr => &mut self.err,
            _ => &mut self.results,
        };
        let room = self.max.saturating_sub(*used) as usize;
        if n > room {
            self.truncated = true;
        }
        let take = n.min(room);
        *used += take as u64;
        take
    }
}

fn send_bytes(out: &Out, chan: u32, kind: Kind, data: &[u8], caps: &mut Caps) -> bool {
    let take = caps.take(kind, data.len());
    let mut w = out.lock();
    for c in data[..take].chunks(CHUNK) {
        send_locked(&mut w, &Frame::new(chan, kind, c.to_vec()));
    }
    take == data.len()
}

/// `chdir`: a directory the kernel moves to before the cell (and stays in).
pub fn run(
    k: &mut Kernel,
    chan: u32,
    req: &CodeRequest,
    count: u64,
    chdir: Option<&str>,
    out: &Out,
) -> Outcome {
    let start = Instant::now();
    k.discard_stale();
    let unit = k.tree.unit().cloned();
    let cpu0 = unit
        .as_ref()
        .and_then(|u| u.stat())
        .map(|s| s.cpu_ns)
        .unwrap_or(0);
    let mut line = serde_json::to_vec(&serde_json::json!({
        "id": count, "code": req.code, "env": req.env, "chdir": chdir,
    }))
    .expect("plain JSON");
    line.push(b'\n');
    k.send(line);

    let deadline = start + Duration::from_millis(req.timeout_ms);
    let mut caps = Caps {
        max: req.max_output_bytes,
        out: 0,
        err: 0,
        results: 0,
        truncated: false,
    };
    let mut peak = 0u64;
    let mut died: Option<i32> = None;
    let mut done = false;
    let mut buf = vec![0u8; 64 * 1024];
    let mut next_stat = Instant::now() + Duration::from_millis(TICK_MS as u64);
    while !done && died.is_none() && k.tree.stop.get().is_none() {
        let mut pfds = [
            k.events.as_raw_fd(),
            k.stdout.as_raw_fd(),
            k.stderr.as_raw_fd(),
        ]
        .map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
        // SAFETY: a valid array of three pollfds.
        unsafe { libc::poll(pfds.as_mut_ptr(), 3, TICK_MS) };
        for (i, kind) in [(1, Kind::Stdout), (2, Kind::Stderr)] {
            if pfds[i].revents & libc::POLLIN != 0 {
                let f = if i == 1 { &mut k.stdout } else { &mut k.stderr };
                if let Ok(n @ 1..) = f.read(&mut buf) {
                    if !send_bytes(out, chan, kind, &buf[..n], &mut caps) {
                        k.tree.stop(EndReason::OutputLimit);
                    }
                }
            }
        }
        if pfds[0].revents != 0 {
            match k.events.read(&mut buf) {
                Ok(0) => died = Some(wait_exit(k)),
                Ok(n) => {
                    k.pending.extend_from_slice(&buf[..n]);
                    done = handle_events(k, chan, count, out, &mut caps);
                    if k.pending.len() > MAX_EVENT_LINE {
                        k.tree.stop(EndReason::OutputLimit);
                    }
                }
                Err(_) => {}
            }
        }
        if died.is_none() {
            match k.exited.try_recv() {
                Ok(e) => died = Some(e.status),
                Err(TryRecvError::Disconnected) => died = Some(0),
                Err(TryRecvError::Empty) => {}
            }
        }
        // Sampled on the tick, not on every wake-up: each sample is a round
        // trip to the keeper process.
        if Instant::now() < next_stat || done {
            continue;
        }
        next_stat = Instant::now() + Duration::from_millis(TICK_MS as u64);
        if Instant::now() >= deadline {
            k.tree.stop(EndReason::Timeout);
        }
        if let Some(s) = unit.as_ref().and_then(|u| u.stat()) {
            peak = peak.max(s.mem_bytes);
            let cpu_ms = s.cpu_ns.saturating_sub(cpu0) / 1_000_000;
            if req.cpu_limit_ms.is_some_and(|l| cpu_ms >= l) {
                k.tree.stop(EndReason::CpuLimit);
            }
        }
    }
    // What the kernel's children printed before the cell ended is already
    // in the pipes: forward it before the result.
    for (f, kind) in [(&mut k.stdout, Kind::Stdout), (&mut k.stderr, Kind::Stderr)] {
        while let Ok(n @ 1..) = f.read(&mut buf) {
            send_bytes(out, chan, kind, &buf[..n], &mut caps);
        }
    }
    let stopped = k.tree.stop.get();
    let status = match (stopped, died) {
        (Some(_), _) => Some(wait_exit(k)),
        (None, d) => d,
    };
    let reason = match (stopped, status) {
        (Some(r), _) => r,
        (None, Some(st)) if libc::WIFSIGNALED(st) => EndReason::Signaled,
        _ => EndReason::Exited,
    };
    if let (None, Some(st)) = (stopped, status) {
        let what = if libc::WIFSIGNALED(st) {
            format!("killed by signal {}", libc::WTERMSIG(st))
        } else {
            format!("exited with status {}", libc::WEXITSTATUS(st))
        };
        let ev = serde_json::json!({"type": "error", "name": "InterpreterDied",
            "value": format!("the interpreter {what}; the context was restarted"), "traceback": ""});
        out.send(&Frame::json(chan, Kind::CodeEvent, &ev));
    }
    let last = unit.as_ref().and_then(|u| u.stat());
    let dead = stopped.is_some() || status.is_some();
    Outcome {
        result: CodeResult {
            context: String::new(),
            execution_count: count,
            reason,
            truncated: caps.truncated,
            duration_ms: start.elapsed().as_millis() as u64,
            cpu_ms: last
                .map(|s| s.cpu_ns.saturating_sub(cpu0) / 1_000_000)
                .unwrap_or(0),
            memory_peak_bytes: Some(peak.max(last.map(|s| s.mem_bytes).unwrap_or(0))),
            restarted: dead,
        },
        dead,
    }
}

/// Kills what is left of the unit and collects the interpreter's status.
fn wait_exit(k: &mut Kernel) -> i32 {
    k.tree.kill_all();
    k.exited
        .recv_timeout(Duration::from_secs(3))
        .map(|e| e.status)
        .unwrap_or(libc::SIGKILL)
}

/// Forwards every complete event line. Returns true at this run's `done`.
fn handle_events(k: &mut Kernel, chan: u32, count: u64, out: &Out, caps: &mut Caps) -> bool {
    while let Some(pos) = k.pending.iter().position(|&b| b == b'\n') {
        let line: Vec<u8> = k.pending.drain(..=pos).collect();
        // The kernel shares its process with guest code: its lines are
        // parsed as hostile input, and only this run's are used.
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(&line) else {
            continue;
        };
        if v["id"].as_u64() != Some(count) {
            continue;
        }
        match v["type"].as_str() {
            Some("stdout") | Some("stderr") => {
                let kind = if v["type"] == "stdout" {
                    Kind::Stdout
                } else {
                    Kind::Stderr
                };
                let text = v["text"].as_str().unwrap_or("");
                if !send_bytes(out, chan, kind, text.as_bytes(), caps) {
                    k.tree.stop(EndReason::OutputLimit);
                }
            }
            Some("result") | Some("error") => {
                let payload = serde_json::to_vec(&v).expect("re-serializing a Value");
                if payload.len() > MAX_EVENT {
                    caps.truncated = true;
                    continue;
                }
                if caps.take(Kind::CodeEvent, payload.len()) < payload.len() {
                    k.tree.stop(EndReason::OutputLimit);
                    continue;
                }
                out.send(&Frame::new(chan, Kind::CodeEvent, payload));
            }
            Some("done") => return true,
            _ => {}
        }
    }
    false
}
