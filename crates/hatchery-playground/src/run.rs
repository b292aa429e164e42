//! One visitor's run: a fresh sandbox, the snippet written as a file, the
//! command streamed with a byte cap and a wall-clock cap enforced here, and
//! the sandbox deleted on every path (success, error, visitor gone, time up).

use crate::cache::Entry;
use crate::daemon::{Daemon, DaemonError};
use crate::events::{cut, Exit, Output, Stream};
use bytes::Bytes;
use serde::Deserialize;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// What the gateway streams to the visitor.
#[derive(Debug, Clone)]
pub enum Event {
    Start { run_id: String, cached: bool },
    Output(Output),
    Exit(Exit),
    Error { code: &'static str, message: String },
}

#[derive(Debug, Clone)]
pub struct Limits {
    pub timeout: Duration,
    pub ttl_seconds: u64,
    pub max_output_bytes: usize,
}

pub struct Job {
    pub run_id: String,
    pub template: String,
    pub path: &'static str,
    pub argv: &'static [&'static str],
    pub code: String,
}

/// How a run ended, for the runs table and the cache.
#[derive(Debug)]
pub struct Report {
    pub outcome: &'static str,
    pub exit: Option<Exit>,
    pub bytes_out: u64,
    /// Output as sent, when the run finished with an exit event (cacheable).
    pub entry: Option<Entry>,
    pub first_output: Option<Instant>,
}

#[derive(Deserialize)]
struct Chunk {
    data: String,
}

#[derive(Deserialize)]
struct DaemonExit {
    exit_code: i32,
    timed_out: bool,
    truncated: bool,
    #[serde(default)]
    oom_killed: bool,
}

enum Ended {
    Exit(Exit),
    Disconnected,
    Failed(&'static str, String),
}

pub async fn execute(
    daemon: &Daemon,
    limits: &Limits,
    job: Job,
    tx: mpsc::Sender<Event>,
) -> Report {
    let started = Instant::now();
    let _ = tx
        .send(Event::Start {
            run_id: job.run_id.clone(),
            cached: false,
        })
        .await;
    let mut report = Report {
        outcome: "error",
        exit: None,
        bytes_out: 0,
        entry: None,
        first_output: None,
    };
    // Not cancelled on disconnect: dropping a create half-way could leave a
    // sandbox whose id we never learn (the TTL would still get it).
    let id = match daemon.create(&job.template, limits.ttl_seconds).await {
        Ok(id) => id,
        Err(e) => {
            let code = if e.is_capacity() {
                "busy"
            } else {
                "unavailable"
            };
            tracing::warn!(run = %job.run_id, error = %e, "create failed");
            let _ = tx
                .send(Event::Error {
                    code,
                    message: create_message(&e),
                })
                .await;
            return report;
        }
    };
    tracing::debug!(run = %job.run_id, sandbox = %id, "sandbox created");
    let mut output = Vec::new();
    let ended = drive(
        daemon,
        limits,
        &job,
        &id,
        &tx,
        started,
        &mut output,
        &mut report,
    )
    .await;
    // Always delete, and before the last event goes out: a visitor who has
    // seen `exit` can rely on the sandbox being gone.
    if let Err(e) = daemon.delete(&id).await {
        tracing::error!(run = %job.run_id, sandbox = %id, error = %e, "delete failed; the TTL will reap it");
    }
    match ended {
        Ended::Exit(exit) => {
            report.outcome = if exit.timed_out {
                "timeout"
            } else if exit.truncated {
                "truncated"
            } else {
                "ok"
            };
            report.entry = Some(Entry {
                output,
                exit: exit.clone(),
            });
            report.exit = Some(exit.clone());
            let _ = tx.send(Event::Exit(exit)).await;
        }
        Ended::Disconnected => report.outcome = "disconnected",
        Ended::Failed(code, message) => {
            tracing::warn!(run = %job.run_id, sandbox = %id, %message, "run failed");
            let _ = tx.send(Event::Error { code, message }).await;
        }
    }
    report
}

fn create_message(e: &DaemonError) -> String {
    if e.is_capacity() {
        "the playground is at capacity; try again in a moment".into()
    } else {
        "the playground could not start a sandbox".into()
    }
}

#[allow(clippy::too_many_arguments)]
async fn drive(
    daemon: &Daemon,
    limits: &Limits,
    job: &Job,
    id: &str,
    tx: &mpsc::Sender<Event>,
    started: Instant,
    output: &mut Vec<Output>,
    report: &mut Report,
) -> Ended {
    if tx.is_closed() {
        return Ended::Disconnected;
    }
    if let Err(e) = daemon
        .put_file(id, job.path, Bytes::from(job.code.clone()))
        .await
    {
        return Ended::Failed("unavailable", format!("could not write the snippet: {e}"));
    }
    // The daemon's own deadline trails ours: ours stops the run, its is a backstop.
    let backstop = limits.timeout.as_secs() + 2;
    let mut stream = match daemon
        .exec_stream(id, job.argv, backstop, limits.max_output_bytes)
        .await
    {
        Ok(s) => s,
        Err(e) => return Ended::Failed("unavailable", format!("could not start the snippet: {e}")),
    };
    let deadline = tokio::time::Instant::now() + limits.timeout;
    let mut sent = [0usize; 2];
    loop {
        tokio::select! {
            ev = stream.next() => match handle(ev, limits, &mut sent, output, report, started) {
                Step::Send(o) => {
                    report.first_output.get_or_insert_with(Instant::now);
                    if tx.send(Event::Output(o)).await.is_err() {
                        return Ended::Disconnected;
                    }
                }
                Step::Skip => {}
                Step::Capped(o) => {
                    // Stop the command: dropping the stream closes the
                    // connection and the daemon kills it.
                    drop(stream);
                    report.first_output.get_or_insert_with(Instant::now);
                    if tx.send(Event::Output(o)).await.is_err() {
                        return Ended::Disconnected;
                    }
                    return Ended::Exit(Exit { truncated: true, duration_ms: ms(started), ..Exit::default() });
                }
                Step::Done(e) => return e,
            },
            _ = tokio::time::sleep_until(deadline) => {
                drop(stream);
                return Ended::Exit(Exit {
                    timed_out: true,
                    truncated: sent.iter().any(|&s| s >= limits.max_output_bytes),
                    duration_ms: ms(started),
                    ..Exit::default()
                });
            }
            _ = tx.closed() => return Ended::Disconnected,
        }
    }
}

enum Step {
    Send(Output),
    Skip,
    Capped(Output),
    Done(Ended),
}

fn ms(since: Instant) -> u64 {
    since.elapsed().as_millis() as u64
}

fn handle(
    ev: Result<Option<crate::events::SseEvent>, DaemonError>,
    limits: &Limits,
    sent: &mut [usize; 2],
    output: &mut Vec<Output>,
    report: &mut Report,
    started: Instant,
) -> Step {
    let ev = match ev {
        Ok(Some(ev)) => ev,
        Ok(None) => {
            return Step::Done(Ended::Failed(
                "unavailable",
                "the sandbox went away mid-run".into(),
            ))
        }
        Err(e) => return Step::Done(Ended::Failed("unavailable", e.to_string())),
    };
    let stream = match ev.event.as_str() {
        "stdout" => Stream::Stdout,
        "stderr" => Stream::Stderr,
        "exit" => {
            return match serde_json::from_str::<DaemonExit>(&ev.data) {
                Ok(d) => Step::Done(Ended::Exit(Exit {
                    exit_code: Some(d.exit_code),
                    timed_out: d.timed_out,
                    truncated: d.truncated || sent.iter().any(|&s| s >= limits.max_output_bytes),
                    oom_killed: d.oom_killed,
                    duration_ms: ms(started),
                    cached: false,
                })),
                Err(e) => Step::Done(Ended::Failed("unavailable", format!("bad exit event: {e}"))),
            };
        }
        "error" => {
            return Step::Done(Ended::Failed(
                "unavailable",
                format!("the run failed: {}", ev.data),
            ))
        }
        _ => return Step::Skip,
    };
    let Ok(chunk) = serde_json::from_str::<Chunk>(&ev.data) else {
        return Step::Skip;
    };
    let i = (stream == Stream::Stderr) as usize;
    let room = limits.max_output_bytes.saturating_sub(sent[i]);
    let data = cut(&chunk.data, room).to_string();
    let capped = data.len() < chunk.data.len() || sent[i] + data.len() >= limits.max_output_bytes;
    sent[i] += data.len();
    report.bytes_out += data.len() as u64;
    let o = Output { stream, data };
    output.push(o.clone());
    if capped {
        Step::Capped(o)
    } else {
        Step::Send(o)
    }
}
