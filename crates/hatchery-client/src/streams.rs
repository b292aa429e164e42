//! Typed views of the daemon's event streams. Each wraps an `EventStream`;
//! dropping one closes its connection (an exec or code run is then
//! cancelled; a process keeps running).

use crate::error::Result;
use crate::models::{
    CodeError, CodeResultItem, CodeSummary, ExecResponse, OutputChunk, ProcessChunk, ProcessInfo,
};
use crate::transport::EventStream;

/// One event of `POST /exec/stream`.
#[derive(Debug, Clone, PartialEq)]
pub enum ExecEvent {
    Stdout(String),
    Stderr(String),
    /// The last event.
    Exit(ExecResponse),
}

pub struct ExecStream {
    inner: EventStream,
    ended: bool,
}

impl ExecStream {
    pub(crate) fn new(inner: EventStream) -> Self {
        ExecStream {
            inner,
            ended: false,
        }
    }

    /// The next event; None after `Exit`. An `error` event is an
    /// `Err(ClientError::Stream)`; a stream cut before `Exit` is a
    /// `Protocol` error.
    pub async fn next(&mut self) -> Result<Option<ExecEvent>> {
        if self.ended {
            return Ok(None);
        }
        loop {
            let Some(ev) = self.inner.next().await? else {
                self.ended = true;
                return Err(self
                    .inner
                    .protocol("stream ended before its exit event".into()));
            };
            let out = match ev.event.as_str() {
                "stdout" => ExecEvent::Stdout(self.inner.parse::<OutputChunk>(&ev)?.data),
                "stderr" => ExecEvent::Stderr(self.inner.parse::<OutputChunk>(&ev)?.data),
                "exit" => {
                    self.ended = true;
                    ExecEvent::Exit(self.inner.parse(&ev)?)
                }
                "error" => {
                    self.ended = true;
                    return Err(self.inner.failure(&ev.data));
                }
                // Events a newer daemon may add.
                _ => continue,
            };
            return Ok(Some(out));
        }
    }

    /// Reads to the end, collecting output (at most what the daemon sends:
    /// its per-stream cap).
    pub async fn collect(mut self) -> Result<ExecResponse> {
        let (mut out, mut err) = (String::new(), String::new());
        while let Some(ev) = self.next().await? {
            match ev {
                ExecEvent::Stdout(d) => out.push_str(&d),
                ExecEvent::Stderr(d) => err.push_str(&d),
                ExecEvent::Exit(mut r) => {
                    if r.stdout.is_empty() {
                        r.stdout = out;
                    }
                    if r.stderr.is_empty() {
                        r.stderr = err;
                    }
                    return Ok(r);
                }
            }
        }
        Err(self
            .inner
            .protocol("stream ended before its exit event".into()))
    }

    /// The raw events, for callers that relay them as they are.
    pub fn into_raw(self) -> EventStream {
        self.inner
    }
}

/// One event of `POST /code/stream`.
#[derive(Debug, Clone, PartialEq)]
pub enum CodeEvent {
    Stdout(String),
    Stderr(String),
    /// A rich result (display data or the value of the last expression).
    Result(CodeResultItem),
    /// The exception the snippet raised (the run still ends with `Done`).
    Error(CodeError),
    /// The last event.
    Done(CodeSummary),
}

pub struct CodeStream {
    inner: EventStream,
    ended: bool,
}

impl CodeStream {
    pub(crate) fn new(inner: EventStream) -> Self {
        CodeStream {
            inner,
            ended: false,
        }
    }

    /// The next event; None after `Done`. A `failed` event (the run could
    /// not happen) is an `Err(ClientError::Stream)`.
    pub async fn next(&mut self) -> Result<Option<CodeEvent>> {
        if self.ended {
            return Ok(None);
        }
        loop {
            let Some(ev) = self.inner.next().await? else {
                self.ended = true;
                return Err(self
                    .inner
                    .protocol("stream ended before its done event".into()));
            };
            let out = match ev.event.as_str() {
                "stdout" => CodeEvent::Stdout(self.inner.parse::<OutputChunk>(&ev)?.data),
                "stderr" => CodeEvent::Stderr(self.inner.parse::<OutputChunk>(&ev)?.data),
                "result" => CodeEvent::Result(self.inner.parse(&ev)?),
                "error" => CodeEvent::Error(self.inner.parse(&ev)?),
                "done" => {
                    self.ended = true;
                    CodeEvent::Done(self.inner.parse(&ev)?)
                }
                "failed" => {
                    self.ended = true;
                    return Err(self.inner.failure(&ev.data));
                }
                _ => continue,
            };
            return Ok(Some(out));
        }
    }

    pub fn into_raw(self) -> EventStream {
        self.inner
    }
}

/// One event of `GET /processes/{pid}/output`.
#[derive(Debug, Clone, PartialEq)]
pub enum ProcessEvent {
    Stdout(ProcessChunk),
    Stderr(ProcessChunk),
    /// The process exited (last event).
    Exit(ProcessInfo),
    /// Not following and the process still runs (last event).
    End(ProcessInfo),
}

pub struct ProcessStream {
    inner: EventStream,
    ended: bool,
}

impl ProcessStream {
    pub(crate) fn new(inner: EventStream) -> Self {
        ProcessStream {
            inner,
            ended: false,
        }
    }

    pub async fn next(&mut self) -> Result<Option<ProcessEvent>> {
        if self.ended {
            return Ok(None);
        }
        loop {
            let Some(ev) = self.inner.next().await? else {
                self.ended = true;
                return Err(self
                    .inner
                    .protocol("stream ended before its exit or end event".into()));
            };
            let out = match ev.event.as_str() {
                "stdout" => ProcessEvent::Stdout(self.inner.parse(&ev)?),
                "stderr" => ProcessEvent::Stderr(self.inner.parse(&ev)?),
                "exit" => {
                    self.ended = true;
                    ProcessEvent::Exit(self.inner.parse(&ev)?)
                }
                "end" => {
                    self.ended = true;
                    ProcessEvent::End(self.inner.parse(&ev)?)
                }
                "error" => {
                    self.ended = true;
                    return Err(self.inner.failure(&ev.data));
                }
                _ => continue,
            };
            return Ok(Some(out));
        }
    }

    pub fn into_raw(self) -> EventStream {
        self.inner
    }
}

/// The events of a template build (`step`, `log`, then `done` or `error`).
pub struct BuildStream {
    inner: EventStream,
    ended: bool,
}

impl BuildStream {
    pub(crate) fn new(inner: EventStream) -> Self {
        BuildStream {
            inner,
            ended: false,
        }
    }

    /// The next event, `done` and `error` included (an `error` event is the
    /// build's failure, reported as data, not as `Err`); None after them.
    pub async fn next(&mut self) -> Result<Option<crate::models::BuildEvent>> {
        if self.ended {
            return Ok(None);
        }
        let Some(ev) = self.inner.next().await? else {
            self.ended = true;
            return Ok(None);
        };
        if ev.event == "done" || ev.event == "error" {
            self.ended = true;
        }
        Ok(Some(crate::models::BuildEvent {
            data: ev.json(),
            kind: ev.event,
        }))
    }

    pub fn into_raw(self) -> EventStream {
        self.inner
    }
}
