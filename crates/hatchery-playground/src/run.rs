//! One visitor's run: a fresh sandbox, the snippet run (Python through the
//! daemon's run_code, in the interpreter already running in the sandbox;
//! other runners as a file and a command), its output streamed with a byte
//! cap and a wall-clock cap enforced here, and the sandbox deleted on every
//! path (success, error, visitor gone, time up).

use crate::cache::Entry;
use crate::config::Runner;
use crate::events::{cut, Exception, Exit, Output, Stream};
use bytes::Bytes;
use hatchery_client::sse::SseEvent;
use hatchery_client::{
    Client, ClientError, CodeRequest, CreateSandbox, EventStream, ExecRequest, NetworkPolicy,
};
use serde::Deserialize;
use std::collections::BTreeMap;
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
    pub runner: Runner,
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

/// The `done` event of a code stream (the fields used here).
#[derive(Deserialize)]
struct CodeDone {
    reason: String,
    #[serde(default)]
    truncated: bool,
    #[serde(default)]
    oom_killed: bool,
}

/// The `error` event of a code stream: the snippet's exception.
#[derive(Deserialize)]
struct CodeError {
    name: String,
    #[serde(default)]
    value: String,
    #[serde(default)]
    traceback: String,
}

enum Ended {
    Exit(Exit),
    Disconnected,
    Failed(&'static str, String),
}

pub async fn execute(
    daemon: &Client,
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
    let id = match daemon.create_sandbox(&create_request(&job, limits)).await {
        Ok(s) => s.id,
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
    if let Err(e) = daemon.delete_sandbox(&id).await {
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

/// A fresh sandbox whose TTL destroys it even if nobody else does.
fn create_request(job: &Job, limits: &Limits) -> CreateSandbox {
    CreateSandbox {
        template: Some(job.template.clone()),
        ttl_seconds: Some(limits.ttl_seconds),
        metadata: BTreeMap::from([("created_by".into(), "hatchery-playground".into())]),
        // Explicit, not the daemon's default: a visitor's snippet must
        // never reach the network even on a daemon configured otherwise.
        network: Some(NetworkPolicy::deny_all()),
        ..Default::default()
    }
}

fn create_message(e: &ClientError) -> String {
    if e.is_capacity() {
        "the playground is at capacity; try again in a moment".into()
    } else {
        "the playground could not start a sandbox".into()
    }
}

#[allow(clippy::too_many_arguments)]
async fn drive(
    daemon: &Client,
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
    // The daemon's own deadline trails ours: ours stops the run, its is a backstop.
    let backstop = limits.timeout.as_secs() + 2;
    let mut stream = match start(daemon, limits, job, id, backstop).await {
        Ok(s) => s,
        Err(e) => return e,
    };
    let deadline = tokio::time::Instant::now() + limits.timeout;
    let mut fwd = Forward {
        limits,
        code: matches!(job.runner, Runner::Code { .. }),
        sent: [0; 2],
        exception: None,
        exit_code: 0,
        started,
    };
    loop {
        tokio::select! {
            ev = stream.next() => match fwd.handle(ev, output, report) {
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
                    return Ended::Exit(Exit {
                        truncated: true,
                        duration_ms: ms(started),
                        exception: fwd.exception.clone(),
                        ..Exit::default()
                    });
                }
                Step::Done(e) => return e,
            },
            _ = tokio::time::sleep_until(deadline) => {
                drop(stream);
                return Ended::Exit(Exit {
                    timed_out: true,
                    truncated: fwd.capped(),
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

/// Writes the snippet and starts it (file + exec), or hands it to the
/// sandbox's interpreter (run_code).
async fn start(
    daemon: &Client,
    limits: &Limits,
    job: &Job,
    id: &str,
    backstop: u64,
) -> Result<EventStream, Ended> {
    let started = match &job.runner {
        Runner::File { path, argv } => {
            if let Err(e) = daemon
                .write_file(id, path, Bytes::from(job.code.clone()))
                .await
            {
                return Err(Ended::Failed(
                    "unavailable",
                    format!("could not write the snippet: {e}"),
                ));
            }
            let req = ExecRequest::argv(argv.iter().copied())
                .cwd("/workspace")
                .env("PYTHONUNBUFFERED", "1")
                .timeout_seconds(backstop)
                .max_output_bytes(limits.max_output_bytes as u64);
            daemon.exec_stream(id, &req).await.map(|s| s.into_raw())
        }
        Runner::Code { language } => {
            let req = CodeRequest {
                code: job.code.clone(),
                language: Some(language.to_string()),
                timeout_seconds: Some(backstop),
                max_output_bytes: Some(limits.max_output_bytes as u64),
                ..Default::default()
            };
            // The raw events: Forward maps them onto the visitor's.
            daemon.run_code_stream(id, &req).await.map(|s| s.into_raw())
        }
    };
    started.map_err(|e| Ended::Failed("unavailable", format!("could not start the snippet: {e}")))
}

/// Turns the daemon's events into the visitor's, counting bytes per stream.
struct Forward<'a> {
    limits: &'a Limits,
    /// A run_code stream (events result, error, done, failed) rather than
    /// an exec stream (exit, error).
    code: bool,
    sent: [usize; 2],
    /// The snippet's exception and the exit status it means, from a code
    /// stream's `error` event.
    exception: Option<Exception>,
    exit_code: i32,
    started: Instant,
}

/// What the browser is shown of a result: its text/plain, as a line.
fn result_text(data: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(data).ok()?;
    let text = v["data"]["text/plain"].as_str()?;
    Some(line(text))
}

fn line(s: &str) -> String {
    if s.ends_with('\n') {
        s.to_string()
    } else {
        format!("{s}\n")
    }
}

/// How `python3 main.py` would have ended with this exception: (exit code,
/// what stderr shows, the exception to report). `sys.exit(N)` exits N with
/// nothing shown, `sys.exit("msg")` shows the message and exits 1; any
/// other exception shows its traceback and exits 1; a dead interpreter
/// exits 128+N for signal N, else at least 1.
fn python_exit(e: &CodeError) -> (i32, Option<String>, Option<Exception>) {
    let exception = Some(Exception {
        name: cut(&e.name, 200).to_string(),
        value: cut(&e.value, 1000).to_string(),
    });
    let num = |after: &str| {
        e.value
            .split(after)
            .nth(1)
            .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse::<i32>().ok())
    };
    match e.name.as_str() {
        "SystemExit" if e.value == "None" => (0, None, None),
        "SystemExit" => match e.value.parse::<i64>() {
            Ok(c) => ((c & 0xff) as i32, None, None),
            Err(_) => (1, Some(line(&e.value)), None),
        },
        "InterpreterDied" => {
            let code = match (num("killed by signal "), num("exited with status ")) {
                (Some(sig), _) => 128 + sig,
                (None, Some(c @ 1..=255)) => c,
                _ => 1,
            };
            (
                code,
                Some(line(&format!("{}: {}", e.name, e.value))),
                exception,
            )
        }
        _ => {
            let shown = if e.traceback.is_empty() {
                format!("{}: {}", e.name, e.value)
            } else {
                e.traceback.clone()
            };
            (1, Some(line(&shown)), exception)
        }
    }
}

impl Forward<'_> {
    fn capped(&self) -> bool {
        self.sent.iter().any(|&s| s >= self.limits.max_output_bytes)
    }

    /// A code run's end. The daemon stopping it (its backstop deadline, its
    /// own output cap) reads as the gateway stopping it: no exit code.
    fn done(&self, data: &str) -> Ended {
        let d = match serde_json::from_str::<CodeDone>(data) {
            Ok(d) => d,
            Err(e) => return Ended::Failed("unavailable", format!("bad done event: {e}")),
        };
        let mut exit = Exit {
            exit_code: Some(self.exit_code),
            truncated: d.truncated || self.capped(),
            oom_killed: d.oom_killed,
            duration_ms: ms(self.started),
            exception: self.exception.clone(),
            ..Exit::default()
        };
        match d.reason.as_str() {
            "timeout" => {
                exit.exit_code = None;
                exit.timed_out = true;
            }
            "output_limit" => {
                exit.exit_code = None;
                exit.truncated = true;
            }
            // Killed (as exec reports it: SIGKILL).
            "oom" | "cpu_limit" => {
                exit.exit_code = Some(137);
                exit.oom_killed |= d.reason == "oom";
            }
            "cancelled" => {
                return Ended::Failed("unavailable", "the daemon cancelled the run".into())
            }
            _ => {}
        }
        Ended::Exit(exit)
    }

    fn handle(
        &mut self,
        ev: Result<Option<SseEvent>, ClientError>,
        output: &mut Vec<Output>,
        report: &mut Report,
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
        let (stream, data) = match (self.code, ev.event.as_str()) {
            (_, "stdout") | (_, "stderr") => {
                let Ok(chunk) = serde_json::from_str::<Chunk>(&ev.data) else {
                    return Step::Skip;
                };
                let stream = if ev.event == "stdout" {
                    Stream::Stdout
                } else {
                    Stream::Stderr
                };
                (stream, chunk.data)
            }
            (false, "exit") => {
                return match serde_json::from_str::<DaemonExit>(&ev.data) {
                    Ok(d) => Step::Done(Ended::Exit(Exit {
                        exit_code: Some(d.exit_code),
                        timed_out: d.timed_out,
                        truncated: d.truncated || self.capped(),
                        oom_killed: d.oom_killed,
                        duration_ms: ms(self.started),
                        ..Exit::default()
                    })),
                    Err(e) => {
                        Step::Done(Ended::Failed("unavailable", format!("bad exit event: {e}")))
                    }
                };
            }
            (false, "error") | (true, "failed") => {
                return Step::Done(Ended::Failed(
                    "unavailable",
                    format!("the run failed: {}", cut(&ev.data, 1000)),
                ))
            }
            (true, "result") => match result_text(&ev.data) {
                Some(text) => (Stream::Stdout, text),
                None => return Step::Skip,
            },
            (true, "error") => {
                let Ok(e) = serde_json::from_str::<CodeError>(&ev.data) else {
                    return Step::Skip;
                };
                let (code, shown, exception) = python_exit(&e);
                self.exit_code = code;
                self.exception = exception;
                match shown {
                    Some(text) => (Stream::Stderr, text),
                    None => return Step::Skip,
                }
            }
            (true, "done") => return Step::Done(self.done(&ev.data)),
            _ => return Step::Skip,
        };
        let i = (stream == Stream::Stderr) as usize;
        let room = self.limits.max_output_bytes.saturating_sub(self.sent[i]);
        let full = data;
        let data = cut(&full, room).to_string();
        let capped =
            data.len() < full.len() || self.sent[i] + data.len() >= self.limits.max_output_bytes;
        self.sent[i] += data.len();
        report.bytes_out += data.len() as u64;
        let o = Output { stream, data };
        output.push(o.clone());
        if capped {
            Step::Capped(o)
        } else {
            Step::Send(o)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fwd(limits: &Limits) -> Forward<'_> {
        Forward {
            limits,
            code: true,
            sent: [0; 2],
            exception: None,
            exit_code: 0,
            started: Instant::now(),
        }
    }

    fn ev(event: &str, data: serde_json::Value) -> Result<Option<SseEvent>, ClientError> {
        Ok(Some(SseEvent {
            event: event.into(),
            data: data.to_string(),
        }))
    }

    fn limits(cap: usize) -> Limits {
        Limits {
            timeout: Duration::from_secs(5),
            ttl_seconds: 60,
            max_output_bytes: cap,
        }
    }

    fn report() -> Report {
        Report {
            outcome: "error",
            exit: None,
            bytes_out: 0,
            entry: None,
            first_output: None,
        }
    }

    #[test]
    fn code_events_map_onto_the_visitors() {
        let l = limits(1000);
        let mut f = fwd(&l);
        let (mut out, mut r) = (Vec::new(), report());
        let sent = |s: Step| match s {
            Step::Send(o) => (o.stream, o.data),
            _ => panic!("not sent"),
        };
        let s = f.handle(
            ev("stdout", serde_json::json!({"data": "hi\n"})),
            &mut out,
            &mut r,
        );
        assert_eq!(sent(s), (Stream::Stdout, "hi\n".into()));
        let res = serde_json::json!({"data": {"text/plain": "42", "text/html": "<b>42</b>"}, "is_main_result": true});
        assert_eq!(
            sent(f.handle(ev("result", res), &mut out, &mut r)),
            (Stream::Stdout, "42\n".into())
        );
        let err = serde_json::json!({"name": "ZeroDivisionError", "value": "division by zero",
            "traceback": "Traceback (most recent call last):\nZeroDivisionError: division by zero\n"});
        let (stream, text) = sent(f.handle(ev("error", err), &mut out, &mut r));
        assert_eq!(stream, Stream::Stderr);
        assert!(text.starts_with("Traceback"));
        let done = serde_json::json!({"reason": "exited", "truncated": false, "oom_killed": false, "error": null});
        let Step::Done(Ended::Exit(x)) = f.handle(ev("done", done), &mut out, &mut r) else {
            panic!("no exit")
        };
        assert_eq!(x.exit_code, Some(1));
        assert_eq!(x.exception.unwrap().name, "ZeroDivisionError");
        assert!(!x.timed_out && !x.truncated);
        assert_eq!(out.len(), 3);
        assert_eq!(
            r.bytes_out as usize,
            out.iter().map(|o| o.data.len()).sum::<usize>()
        );
    }

    #[test]
    fn failures_and_limits() {
        let l = limits(4);
        let mut f = fwd(&l);
        let (mut out, mut r) = (Vec::new(), report());
        // The traceback counts against the stderr cap.
        let err = serde_json::json!({"name": "E", "value": "", "traceback": "long traceback"});
        let Step::Capped(o) = f.handle(ev("error", err), &mut out, &mut r) else {
            panic!("not capped")
        };
        assert_eq!((o.stream, o.data.as_str()), (Stream::Stderr, "long"));
        let failed = serde_json::json!({"error": {"code": "sandbox_not_found", "message": "gone"}});
        assert!(matches!(
            f.handle(ev("failed", failed), &mut out, &mut r),
            Step::Done(Ended::Failed("unavailable", _))
        ));
        let mut f = fwd(&l);
        let done =
            serde_json::json!({"reason": "timeout", "truncated": false, "oom_killed": false});
        let Step::Done(Ended::Exit(x)) = f.handle(ev("done", done), &mut out, &mut r) else {
            panic!("no exit")
        };
        assert!(x.timed_out && x.exit_code.is_none());
        let done =
            serde_json::json!({"reason": "signaled", "truncated": false, "oom_killed": true});
        let died = serde_json::json!({"name": "InterpreterDied",
            "value": "the interpreter killed by signal 9; the context was restarted", "traceback": ""});
        let mut f = fwd(&l);
        f.handle(ev("error", died), &mut out, &mut r);
        let Step::Done(Ended::Exit(x)) = f.handle(ev("done", done), &mut out, &mut r) else {
            panic!("no exit")
        };
        assert_eq!((x.exit_code, x.oom_killed), (Some(137), true));
        // An exec stream's `error` is a daemon failure, and `done` means nothing there.
        let mut f = fwd(&l);
        f.code = false;
        let e = serde_json::json!({"error": {"code": "x", "message": "y"}});
        assert!(matches!(
            f.handle(ev("error", e), &mut out, &mut r),
            Step::Done(Ended::Failed(..))
        ));
        assert!(matches!(
            f.handle(ev("done", serde_json::json!({})), &mut out, &mut r),
            Step::Skip
        ));
    }

    #[test]
    fn exits_like_python3() {
        let e = |name: &str, value: &str| CodeError {
            name: name.into(),
            value: value.into(),
            traceback: "tb\n".into(),
        };
        assert_eq!(python_exit(&e("SystemExit", "3")).0, 3);
        assert_eq!(python_exit(&e("SystemExit", "3")).1, None);
        assert_eq!(python_exit(&e("SystemExit", "None")), (0, None, None));
        let (code, shown, exc) = python_exit(&e("SystemExit", "bye"));
        assert_eq!((code, shown.as_deref(), exc), (1, Some("bye\n"), None));
        let (code, shown, exc) = python_exit(&e("ValueError", "bad"));
        assert_eq!((code, shown.as_deref()), (1, Some("tb\n")));
        assert_eq!(exc.unwrap().value, "bad");
        assert_eq!(
            python_exit(&e(
                "InterpreterDied",
                "the interpreter exited with status 0"
            ))
            .0,
            1
        );
    }
}
