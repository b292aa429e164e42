//! One command in a sandbox, with the deadline enforced from the host.
//!
//! Deadlines are layered: the agent kills the command's tree at
//! `timeout`; the host, at `timeout + HOST_GRACE`, sends its own kill; and
//! if the guest still says nothing by `KILL_GRACE` later, the exec is
//! answered with an error anyway. A wedged or hostile guest can therefore
//! delay an answer by at most a few seconds past its deadline.

use crate::agent_client::{guest_error, AgentClient};
use crate::CoreError;
use hatchery_agent_proto::{EndReason, ExecRequest, ExecResult, Frame, Kind};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

pub const HOST_GRACE: Duration = Duration::from_secs(1);
pub const KILL_GRACE: Duration = Duration::from_secs(3);

#[derive(Debug, Clone)]
pub struct ExecParams {
    pub argv: Vec<String>,
    pub cwd: Option<String>,
    pub env: BTreeMap<String, String>,
    pub stdin: Option<String>,
    pub timeout: Duration,
    pub max_output_bytes: u64,
    /// CPU time of the whole tree after which the guest kills it.
    pub cpu_limit_ms: Option<u64>,
    /// Which clock `cpu_limit_ms` is judged on.
    pub cpu_basis: CpuBasis,
}

/// Which CPU clock a limit is judged on.
///
/// Under systrap on a shared host the guest's own accounting (a process's
/// utime, its exec cgroup's usage) counts time the Sentry's thread spent
/// descheduled, so the same work reads 1–3.4× apart with busy neighbours
/// (docs/benchmarks.md, "Which CPU measure is steadiest"); the host's
/// cpuacct cgroup of the sandbox counts only CPU really used, within about
/// 20 %. `Host` judges the limit on the sandbox's whole host cgroup (so
/// anything else running in the sandbox meanwhile counts too), watched by
/// the host every [`HOST_CPU_TICK`]; the guest then keeps a backstop of
/// [`GUEST_BACKSTOP`]× the limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CpuBasis {
    #[default]
    Guest,
    Host,
}

pub const HOST_CPU_TICK: Duration = Duration::from_millis(10);
/// The guest over-counts by up to ~3.4× on this host; its kill must never
/// come before the host's.
pub const GUEST_BACKSTOP: u64 = 4;

/// Reads the sandbox's host-side CPU time in ns (`None`: cannot tell).
pub type HostCpuReader = std::sync::Arc<dyn Fn() -> Option<u64> + Send + Sync>;

/// A host-side CPU limit being watched during one command.
struct HostCpuLimit {
    read: HostCpuReader,
    start_ns: u64,
    limit_ns: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ExecEvent {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    /// A code run's rich result or error, as the kernel reported it.
    Rich(serde_json::Value),
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExecOutcome {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub timed_out: bool,
    pub truncated: bool,
    pub oom_killed: bool,
    pub duration_ms: u64,
    pub cpu_ms: u64,
    pub reason: EndReason,
    pub memory_peak_bytes: Option<u64>,
    /// Whether kill and accounting covered every process the command
    /// started (its in-guest cgroup), not just its process group.
    pub contained: bool,
    /// The sandbox's host-side CPU time over the command (all of the
    /// sandbox, see [`CpuBasis`]); `None` when the runtime cannot tell.
    pub host_cpu_ms: Option<u64>,
}

/// Where output goes: collected (bounded by the cap) or streamed to a
/// consumer whose disappearance kills the command.
pub enum Sink {
    Collect,
    Stream(mpsc::Sender<ExecEvent>),
}

pub async fn run(
    client: &AgentClient,
    p: ExecParams,
    sink: Sink,
    host_cpu: Option<HostCpuReader>,
) -> Result<ExecOutcome, CoreError> {
    let start = Instant::now();
    let start_ns = host_cpu.as_ref().and_then(|r| r());
    let watch = match (p.cpu_basis, p.cpu_limit_ms, &host_cpu, start_ns) {
        (CpuBasis::Host, Some(ms), Some(read), Some(start_ns)) => Some(HostCpuLimit {
            read: read.clone(),
            start_ns,
            limit_ns: ms * 1_000_000,
        }),
        (CpuBasis::Host, Some(_), _, _) => return Err(CoreError::Invalid(
            "cpu_limit_basis \"host\": the runtime cannot account this sandbox's CPU on the host"
                .into(),
        )),
        _ => None,
    };
    let guest_limit = match watch {
        Some(_) => p.cpu_limit_ms.map(|ms| ms * GUEST_BACKSTOP),
        None => p.cpu_limit_ms,
    };
    let req = ExecRequest {
        argv: p.argv,
        cwd: p.cwd,
        env: p.env,
        stdin: p.stdin,
        timeout_ms: p.timeout.as_millis() as u64,
        max_output_bytes: p.max_output_bytes,
        cpu_limit_ms: guest_limit,
    };
    let limits = (p.timeout, p.max_output_bytes);
    let (got, result, end) = drive_watched::<_, ExecResult>(
        client,
        Kind::Exec,
        &req,
        Kind::ExitResult,
        limits,
        sink,
        watch.as_ref(),
    )
    .await?;
    let host_killed = end.deadline;
    let host_cpu_ms = match (host_cpu.and_then(|r| r()), start_ns) {
        (Some(now), Some(then)) => Some(now.saturating_sub(then) / 1_000_000),
        _ => None,
    };
    let reason = if end.cpu && !result.timed_out {
        EndReason::CpuLimit
    } else if host_killed && !result.timed_out {
        EndReason::Timeout
    } else {
        result.reason
    };
    Ok(ExecOutcome {
        exit_code: result.exit_code,
        stdout: got.stdout,
        stderr: got.stderr,
        timed_out: result.timed_out || host_killed,
        truncated: got.truncated || result.truncated,
        oom_killed: false,
        duration_ms: start.elapsed().as_millis() as u64,
        cpu_ms: result.cpu_ms,
        reason,
        memory_peak_bytes: result.memory_peak_bytes,
        contained: result.contained,
        host_cpu_ms,
    })
}

/// What a run sent before its end frame, when collected.
#[derive(Debug, Default)]
pub struct Collected {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Rich results and errors of a code run, in order.
    pub rich: Vec<serde_json::Value>,
    pub truncated: bool,
}

/// Which of the host's own kills ended a command.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct HostKills {
    /// The host's deadline (timeout + grace) passed.
    pub deadline: bool,
    /// The sandbox's host-side CPU passed a [`CpuBasis::Host`] limit.
    pub cpu: bool,
}

/// Sends `req` on a new channel and relays what comes back (output, rich
/// events) into `sink` until the `end` frame, enforcing the host's own
/// deadline on top of the guest's. Shared by exec and code runs. Returns
/// whether the host had to send its own kill.
pub(crate) async fn drive<Q: serde::Serialize, R: serde::de::DeserializeOwned>(
    client: &AgentClient,
    kind: Kind,
    req: &Q,
    end: Kind,
    limits: (Duration, u64),
    sink: Sink,
) -> Result<(Collected, R, bool), CoreError> {
    let (got, r, kills) = drive_watched(client, kind, req, end, limits, sink, None).await?;
    Ok((got, r, kills.deadline))
}

/// [`drive`], also killing the command when a host-side CPU limit passes.
async fn drive_watched<Q: serde::Serialize, R: serde::de::DeserializeOwned>(
    client: &AgentClient,
    kind: Kind,
    req: &Q,
    end: Kind,
    (timeout, max_output_bytes): (Duration, u64),
    mut sink: Sink,
    cpu: Option<&HostCpuLimit>,
) -> Result<(Collected, R, HostKills), CoreError> {
    let mut ch = client.open();
    client
        .send(&Frame::json(ch.id, kind, req))
        .await
        .map_err(|e| CoreError::GuestUnresponsive(e.to_string()))?;

    let mut out = Collected::default();
    let (mut sent_out, mut sent_err) = (0u64, 0u64);
    let host_deadline = tokio::time::Instant::now() + timeout + HOST_GRACE;
    let mut give_up_at: Option<tokio::time::Instant> = None;
    let mut kills = HostKills::default();
    let mut tick = tokio::time::interval(HOST_CPU_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    let result: R = loop {
        let consumer_gone = async {
            match &sink {
                Sink::Stream(tx) => tx.closed().await,
                Sink::Collect => std::future::pending().await,
            }
        };
        let wake = give_up_at.unwrap_or(host_deadline);
        tokio::select! {
            f = ch.rx.recv() => {
                let Some(f) = f else {
                    return Err(CoreError::GuestUnresponsive("agent connection closed during exec".into()));
                };
                let ev = match f.kind {
                    Kind::Stdout | Kind::Stderr => {
                        let is_out = f.kind == Kind::Stdout;
                        let sent = if is_out { &mut sent_out } else { &mut sent_err };
                        // The guest is asked to cap, but is not trusted to.
                        let room = max_output_bytes.saturating_sub(*sent) as usize;
                        if f.payload.len() > room {
                            out.truncated = true;
                        }
                        let data = &f.payload[..f.payload.len().min(room)];
                        if data.is_empty() {
                            continue;
                        }
                        *sent += data.len() as u64;
                        if is_out { ExecEvent::Stdout(data.to_vec()) } else { ExecEvent::Stderr(data.to_vec()) }
                    }
                    Kind::CodeEvent => match serde_json::from_slice::<serde_json::Value>(&f.payload) {
                        Ok(v) if v.is_object() => ExecEvent::Rich(v),
                        _ => continue,
                    },
                    k if k == end => match f.parse::<R>() {
                        Ok(r) => break r,
                        Err(e) => return Err(CoreError::GuestUnresponsive(format!("bad end frame: {e}"))),
                    },
                    Kind::Error => return Err(guest_error(&f)),
                    _ => continue,
                };
                match &mut sink {
                    Sink::Collect => match ev {
                        ExecEvent::Stdout(d) => out.stdout.extend_from_slice(&d),
                        ExecEvent::Stderr(d) => out.stderr.extend_from_slice(&d),
                        ExecEvent::Rich(v) => out.rich.push(v),
                    },
                    Sink::Stream(tx) => {
                        // The end summary of a streamed code run repeats
                        // its error, so the error is kept as well as sent.
                        if let ExecEvent::Rich(v) = &ev {
                            if v["type"] == "error" {
                                out.rich.push(v.clone());
                            }
                        }
                        if tx.send(ev).await.is_err() {
                            kill(client, ch.id, &mut give_up_at).await;
                        }
                    }
                }
            }
            _ = tokio::time::sleep_until(wake) => {
                if give_up_at.is_some() {
                    return Err(CoreError::GuestUnresponsive(format!(
                        "no answer {}s after the {}s deadline", (HOST_GRACE + KILL_GRACE).as_secs(), timeout.as_secs()
                    )));
                }
                kills.deadline = true;
                kill(client, ch.id, &mut give_up_at).await;
            }
            _ = consumer_gone, if give_up_at.is_none() => {
                kill(client, ch.id, &mut give_up_at).await;
            }
            _ = tick.tick(), if cpu.is_some() && give_up_at.is_none() => {
                let Some(w) = cpu else { continue };
                if (w.read)().is_some_and(|now| now.saturating_sub(w.start_ns) >= w.limit_ns) {
                    kills.cpu = true;
                    kill(client, ch.id, &mut give_up_at).await;
                }
            }
        }
    };
    Ok((out, result, kills))
}

async fn kill(client: &AgentClient, chan: u32, give_up_at: &mut Option<tokio::time::Instant>) {
    if give_up_at.is_none() {
        let _ = client.send(&Frame::new(chan, Kind::Kill, vec![])).await;
        *give_up_at = Some(tokio::time::Instant::now() + KILL_GRACE);
    }
}
