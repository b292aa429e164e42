//! envd's `process.Process` service over Hatchery's background processes
//! and terminals. E2B names a process by its pid (or a tag); Hatchery by a
//! `proc_` id, found here by pid.
//!
//! - `Start` starts a background process (the `Connect-Timeout-Ms`
//!   deadline is its lifetime) and streams its output; closing the stream
//!   leaves the process running, as in E2B.
//! - `Connect` streams a running process's output, replayed from the
//!   oldest byte Hatchery still holds (its 1 MiB ring).
//! - With `pty`, `Start` opens a Hatchery terminal instead.

use crate::backend::{OutputChunk, ProcSpec, ProcView, Pty, PtyEvent};
use crate::connect::{self, Code, ConnectError, Framing};
use crate::pb::process::{
    process_event, process_input, process_selector, stream_input_request, CloseStdinRequest,
    CloseStdinResponse, ConnectRequest, ListRequest, ListResponse, ProcessConfig, ProcessEvent,
    ProcessInfo, ProcessInput, ProcessSelector, SendInputRequest, SendInputResponse,
    SendSignalRequest, SendSignalResponse, StartRequest, StreamInputRequest, StreamInputResponse,
    UpdateRequest, UpdateResponse,
};
use crate::process_frames::{event, frame, keepalive, Msg, Reply};
use crate::pty_tap::PtyTap;
use crate::sandbox::Target;
use crate::state::{ProcDetails, Shared};
use crate::user;
use axum::extract::{Path, Request, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::Extension;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Default keep-alive interval of a stream when the client names none.
const KEEPALIVE_DEFAULT: Duration = Duration::from_secs(50);
/// Terminal size bounds (Hatchery's).
const MAX_CELLS: u32 = 1000;

fn keepalive_interval(h: &HeaderMap) -> Duration {
    h.get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .map(|s| Duration::from_secs(s.clamp(1, 600)))
        .unwrap_or(KEEPALIVE_DEFAULT)
}

fn data(chunk: &OutputChunk) -> ProcessEvent {
    use process_event::data_event::Output;
    let out = if chunk.stderr {
        Output::Stderr(chunk.data.clone())
    } else {
        Output::Stdout(chunk.data.clone())
    };
    event(process_event::Event::Data(process_event::DataEvent {
        output: Some(out),
    }))
}

fn end_event(p: &ProcView) -> ProcessEvent {
    let code = p.exit_code.unwrap_or(-1);
    let signaled = matches!(
        p.reason.as_deref(),
        Some("signaled" | "cancelled" | "timeout" | "cpu_limit" | "oom" | "output_limit")
    );
    let status = if signaled && code > 128 {
        format!("signal: {}", signal_name(code - 128))
    } else {
        format!("exit status {code}")
    };
    event(process_event::Event::End(process_event::EndEvent {
        exit_code: code,
        exited: !signaled,
        status,
        error: None,
    }))
}

fn signal_name(n: i32) -> &'static str {
    match n {
        9 => "killed",
        15 => "terminated",
        2 => "interrupt",
        1 => "hangup",
        _ => "signaled",
    }
}

/// The argv a process was started with, without the user prologue.
fn real_argv(argv: &[String]) -> &[String] {
    if argv.len() >= 6 && argv[0] == "/bin/sh" && argv[3] == "e2b" {
        &argv[6..]
    } else {
        argv
    }
}

pub async fn rpc(
    State(s): State<Arc<Shared>>,
    Extension(t): Extension<Target>,
    Path(method): Path<String>,
    req: Request,
) -> Response {
    if t.port != crate::sandbox::ENVD_PORT {
        return crate::sandbox::wrong_port(&t);
    }
    let headers = req.headers().clone();
    let framing = match connect::framing(&headers) {
        Ok(f) => f,
        Err(e) => return e.into_response_for(Framing::Unary),
    };
    if method == "StreamInput" {
        return stream_input(&s, &t, framing, req).await;
    }
    let body = match crate::read_body(req, connect::MAX_MESSAGE_BYTES + 5).await {
        Ok(b) => b,
        Err(e) => return e.into_response_for(framing),
    };
    let res = match method.as_str() {
        "Start" => return start(&s, &t, &headers, framing, &body).await,
        "Connect" => return connect_stream(&s, &t, &headers, framing, &body).await,
        "List" => unary(framing, &body, |_: ListRequest| list(&s, &t)).await,
        "SendInput" => unary(framing, &body, |r: SendInputRequest| send_input(&s, &t, r)).await,
        "SendSignal" => {
            unary(framing, &body, |r: SendSignalRequest| {
                send_signal(&s, &t, r)
            })
            .await
        }
        "CloseStdin" => {
            unary(framing, &body, |r: CloseStdinRequest| {
                close_stdin(&s, &t, r)
            })
            .await
        }
        "Update" => unary(framing, &body, |r: UpdateRequest| update(&s, &t, r)).await,
        other => Err(ConnectError::new(
            Code::Unimplemented,
            format!("process.Process/{other} is not a method of this service"),
        )),
    };
    match res {
        Ok(r) => r,
        Err(e) => e.into_response_for(framing),
    }
}

async fn unary<Req, Resp, F, Fut>(
    framing: Framing,
    body: &[u8],
    f: F,
) -> Result<Response, ConnectError>
where
    Req: serde::de::DeserializeOwned,
    Resp: serde::Serialize,
    F: FnOnce(Req) -> Fut,
    Fut: std::future::Future<Output = Result<Resp, ConnectError>>,
{
    if framing != Framing::Unary {
        return Err(ConnectError::new(
            Code::InvalidArgument,
            "a unary method takes application/json",
        ));
    }
    let req = connect::decode_request(framing, body)?;
    Ok(connect::unary_response(&f(req).await?))
}

fn need_stream(framing: Framing) -> Result<(), ConnectError> {
    if framing != Framing::Stream {
        return Err(ConnectError::new(
            Code::InvalidArgument,
            "a streaming method takes application/connect+json",
        ));
    }
    Ok(())
}

/// The Hatchery process behind a selector: a running one with that pid
/// first, else the latest that had it.
async fn find(
    s: &Shared,
    t: &Target,
    sel: Option<ProcessSelector>,
) -> Result<(u32, Option<ProcView>), ConnectError> {
    let pid = match sel.and_then(|x| x.selector) {
        Some(process_selector::Selector::Pid(p)) => p,
        Some(process_selector::Selector::Tag(tag)) => {
            s.pid_for_tag(&t.sandbox, &tag).ok_or_else(|| {
                ConnectError::new(
                    Code::NotFound,
                    format!("process with tag {tag:?} not found"),
                )
            })?
        }
        None => {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                "process selector (pid or tag) is required",
            ))
        }
    };
    if s.proc_details(&t.sandbox, pid)
        .is_some_and(|d| d.pty.is_some())
    {
        return Ok((pid, None));
    }
    let procs = s.backend.list_processes(&t.sandbox).await?;
    let p = procs
        .iter()
        .filter(|p| p.pid == pid)
        .max_by_key(|p| p.running)
        .cloned()
        .ok_or_else(|| {
            ConnectError::new(Code::NotFound, format!("process with pid {pid} not found"))
        })?;
    Ok((pid, Some(p)))
}

fn pty_of(s: &Shared, t: &Target, pid: u32) -> Option<Arc<dyn Pty>> {
    s.proc_details(&t.sandbox, pid).and_then(|d| d.pty)
}

async fn start(
    s: &Arc<Shared>,
    t: &Target,
    h: &HeaderMap,
    framing: Framing,
    body: &[u8],
) -> Response {
    let res: Result<Response, ConnectError> = async {
        need_stream(framing)?;
        let req: StartRequest = connect::decode_request(framing, body)?;
        let cfg = req.process.ok_or_else(|| {
            ConnectError::new(Code::InvalidArgument, "process config is required")
        })?;
        if cfg.cmd.is_empty() {
            return Err(ConnectError::new(Code::InvalidArgument, "cmd is required"));
        }
        let timeout = connect::timeout(h)?.filter(|d| !d.is_zero());
        let user = user::user_of(t).to_string();
        let cwd = match &cfg.cwd {
            Some(c) if !c.is_empty() => Some(
                user::resolve_path(&user, c)
                    .ok_or_else(|| ConnectError::new(Code::InvalidArgument, "invalid cwd"))?,
            ),
            _ => None,
        };
        let mut argv = vec![cfg.cmd.clone()];
        argv.extend(cfg.args.iter().cloned());
        let argv = user::wrap(&user, cwd.as_deref(), argv);
        let env = cfg.envs.clone().into_iter().collect();
        let ka = keepalive_interval(h);
        if let Some(pty) = req.pty {
            let size = pty.size.unwrap_or_default();
            if size.cols == 0 || size.rows == 0 || size.cols > MAX_CELLS || size.rows > MAX_CELLS {
                return Err(ConnectError::new(
                    Code::InvalidArgument,
                    "pty size must be 1..1000 columns and rows",
                ));
            }
            let p: Arc<dyn Pty> = Arc::from(
                s.backend
                    .open_pty(&t.sandbox, argv, env, size.cols as u16, size.rows as u16)
                    .await?,
            );
            let pid = p.pid();
            let tap = Arc::new(PtyTap::default());
            s.remember_proc(
                &t.sandbox,
                pid,
                ProcDetails {
                    proc_id: None,
                    config: cfg,
                    tag: req.tag,
                    pty: Some(Arc::clone(&p)),
                    tap: Some(Arc::clone(&tap)),
                    seq: 0,
                },
            );
            let resp = tap.attach(Reply::Start, pid).await;
            pty_pump(Arc::clone(s), t.sandbox.clone(), pid, p, tap, ka, timeout);
            return Ok(resp);
        }
        let view = s
            .backend
            .start_process(&t.sandbox, ProcSpec { argv, env, timeout })
            .await?;
        if req.stdin == Some(false) {
            s.backend.close_stdin(&t.sandbox, &view.id).await?;
        }
        s.remember_proc(
            &t.sandbox,
            view.pid,
            ProcDetails {
                proc_id: Some(view.id.clone()),
                config: cfg,
                tag: req.tag,
                pty: None,
                tap: None,
                seq: 0,
            },
        );
        Ok(output_stream(
            Arc::clone(s),
            t.sandbox.clone(),
            view,
            Reply::Start,
            ka,
        ))
    }
    .await;
    res.unwrap_or_else(connect::stream_error)
}

async fn connect_stream(
    s: &Arc<Shared>,
    t: &Target,
    h: &HeaderMap,
    framing: Framing,
    body: &[u8],
) -> Response {
    let res: Result<Response, ConnectError> = async {
        need_stream(framing)?;
        let req: ConnectRequest = connect::decode_request(framing, body)?;
        let (pid, view) = find(s, t, req.process).await?;
        let Some(view) = view else {
            let tap = s
                .proc_details(&t.sandbox, pid)
                .and_then(|d| d.tap)
                .ok_or_else(|| {
                    ConnectError::new(Code::NotFound, format!("process with pid {pid} not found"))
                })?;
            return Ok(tap.attach(Reply::Connect, pid).await);
        };
        Ok(output_stream(
            Arc::clone(s),
            t.sandbox.clone(),
            view,
            Reply::Connect,
            keepalive_interval(h),
        ))
    }
    .await;
    res.unwrap_or_else(connect::stream_error)
}

/// start (pid), the output as it comes, keep-alives while silent, then
/// the end event and the end of the stream; if the sandbox died, the
/// connection drops instead (crate::sever).
fn output_stream(
    s: Arc<Shared>,
    sandbox: String,
    view: ProcView,
    kind: Reply,
    ka: Duration,
) -> Response {
    let (tx, rx) = mpsc::channel::<Msg>(16);
    let sever = crate::sever::Sever::default();
    let cut = sever.clone();
    tokio::spawn(async move {
        let start = event(process_event::Event::Start(process_event::StartEvent {
            pid: view.pid,
        }));
        if tx.send(frame(kind, start)).await.is_err() {
            return;
        }
        let (ctx, mut crx) = mpsc::channel::<OutputChunk>(16);
        let backend = Arc::clone(&s.backend);
        let (sb, pid) = (sandbox.clone(), view.id.clone());
        let reader =
            tokio::spawn(async move { backend.read_process(&sb, &pid, 0, true, ctx).await });
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + ka, ka);
        loop {
            tokio::select! {
                biased;
                c = crx.recv() => match c {
                    Some(c) => {
                        if tx.send(frame(kind, data(&c))).await.is_err() { return; }
                        tick.reset();
                    }
                    None => break,
                },
                _ = tick.tick() => {
                    if tx.send(keepalive(kind)).await.is_err() { return; }
                }
                _ = tx.closed() => return,
            }
        }
        let end = match reader.await {
            Ok(Ok(p)) if p.reason.as_deref() == Some("timeout") => Err(ConnectError::new(
                Code::DeadlineExceeded,
                "the process reached its deadline (Connect-Timeout-Ms) and was killed",
            )),
            Ok(Ok(p)) => Ok(p),
            Ok(Err(e)) => Err(ConnectError::from(e)),
            Err(_) => Err(ConnectError::new(Code::Internal, "output reader failed")),
        };
        match end {
            Ok(p) => {
                let _ = tx.send(frame(kind, end_event(&p))).await;
                let _ = tx.send(connect::end_stream(None)).await;
            }
            Err(_) if crate::sever::sandbox_gone(s.backend.as_ref(), &sandbox).await => cut.cut(),
            Err(e) => {
                let _ = tx.send(connect::end_stream(Some(&e))).await;
            }
        }
    });
    connect::severable_stream_response(tokio_stream::wrappers::ReceiverStream::new(rx), sever)
}

/// Reads the terminal until it ends, for whoever is attached.
fn pty_pump(
    s: Arc<Shared>,
    sandbox: String,
    pid: u32,
    p: Arc<dyn Pty>,
    tap: Arc<PtyTap>,
    ka: Duration,
    timeout: Option<Duration>,
) {
    use process_event::data_event::Output;
    tokio::spawn(async move {
        let deadline = timeout.map(|d| tokio::time::Instant::now() + d);
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + ka, ka);
        let result: Result<(i32, bool), ConnectError> = loop {
            tokio::select! {
                ev = p.next() => match ev {
                    Ok(PtyEvent::Output(b)) => {
                        let e = event(process_event::Event::Data(process_event::DataEvent { output: Some(Output::Pty(b)) }));
                        tap.send(|k| frame(k, e.clone())).await;
                    }
                    Ok(PtyEvent::Exit { exit_code, signaled }) => break Ok((exit_code, signaled)),
                    Err(e) => break Err(e.into()),
                },
                _ = tick.tick() => tap.send(keepalive).await,
                _ = async { match deadline { Some(d) => tokio::time::sleep_until(d).await, None => std::future::pending().await } } => {
                    p.close().await;
                    break Err(ConnectError::new(Code::DeadlineExceeded, "the terminal reached its deadline (Connect-Timeout-Ms) and was closed"));
                }
            }
        };
        s.drop_proc(&sandbox, pid);
        match result {
            Ok((code, signaled)) => {
                let end = process_event::EndEvent {
                    exit_code: code,
                    exited: !signaled,
                    status: if signaled {
                        format!("signal: {}", signal_name(code - 128))
                    } else {
                        format!("exit status {code}")
                    },
                    error: None,
                };
                tap.send(|k| frame(k, event(process_event::Event::End(end.clone()))))
                    .await;
                tap.send(|_| connect::end_stream(None)).await;
            }
            Err(_) if crate::sever::sandbox_gone(s.backend.as_ref(), &sandbox).await => {
                tap.sever_current()
            }
            Err(e) => tap.send(|_| connect::end_stream(Some(&e))).await,
        }
    });
}

async fn list(s: &Shared, t: &Target) -> Result<ListResponse, ConnectError> {
    let mut out = vec![];
    for p in s
        .backend
        .list_processes(&t.sandbox)
        .await?
        .into_iter()
        .filter(|p| p.running)
    {
        let d = s.proc_details(&t.sandbox, p.pid);
        let config = d.as_ref().map(|d| d.config.clone()).unwrap_or_else(|| {
            let a = real_argv(&p.argv);
            ProcessConfig {
                cmd: a.first().cloned().unwrap_or_default(),
                args: a.iter().skip(1).cloned().collect(),
                envs: Default::default(),
                cwd: None,
            }
        });
        out.push(ProcessInfo {
            config: Some(config),
            pid: p.pid,
            tag: d.and_then(|d| d.tag),
        });
    }
    for (pid, d) in s.ptys(&t.sandbox) {
        out.push(ProcessInfo {
            config: Some(d.config),
            pid,
            tag: d.tag,
        });
    }
    out.sort_by_key(|p| p.pid);
    Ok(ListResponse { processes: out })
}

fn input_bytes(i: Option<ProcessInput>) -> Result<(Vec<u8>, bool), ConnectError> {
    match i.and_then(|i| i.input) {
        Some(process_input::Input::Stdin(b)) => Ok((b.to_vec(), false)),
        Some(process_input::Input::Pty(b)) => Ok((b.to_vec(), true)),
        None => Err(ConnectError::new(
            Code::InvalidArgument,
            "input (stdin or pty) is required",
        )),
    }
}

async fn write_input(
    s: &Shared,
    t: &Target,
    sel: Option<ProcessSelector>,
    input: Option<ProcessInput>,
) -> Result<(), ConnectError> {
    let (bytes, _) = input_bytes(input)?;
    let (pid, view) = find(s, t, sel).await?;
    match view {
        None => {
            let p = pty_of(s, t, pid).ok_or_else(|| {
                ConnectError::new(Code::NotFound, format!("process with pid {pid} not found"))
            })?;
            p.input(&bytes).await?;
        }
        Some(v) => s
            .backend
            .write_stdin(&t.sandbox, &v.id, &bytes)
            .await
            .map_err(|e| {
                if e.kind == crate::backend::FailKind::Conflict {
                    ConnectError::new(
                        Code::FailedPrecondition,
                        format!("stdin of process {pid} is closed"),
                    )
                } else {
                    e.into()
                }
            })?,
    }
    Ok(())
}

async fn send_input(
    s: &Shared,
    t: &Target,
    r: SendInputRequest,
) -> Result<SendInputResponse, ConnectError> {
    write_input(s, t, r.process, r.input).await?;
    Ok(SendInputResponse {})
}

async fn send_signal(
    s: &Shared,
    t: &Target,
    r: SendSignalRequest,
) -> Result<SendSignalResponse, ConnectError> {
    let sig = match r.signal {
        9 => 9,
        15 => 15,
        n => {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                format!("unsupported signal {n} (SIGKILL and SIGTERM are)"),
            ))
        }
    };
    let (pid, view) = find(s, t, r.process).await?;
    match view {
        None => {
            if let Some(p) = pty_of(s, t, pid) {
                // A terminal is ended whole: its program and all it started.
                p.close().await;
                s.drop_proc(&t.sandbox, pid);
            }
        }
        Some(v) => {
            if !v.running {
                return Err(ConnectError::new(
                    Code::NotFound,
                    format!("process with pid {pid} is not running"),
                ));
            }
            s.backend.signal_process(&t.sandbox, &v.id, sig).await?;
        }
    }
    Ok(SendSignalResponse {})
}

async fn close_stdin(
    s: &Shared,
    t: &Target,
    r: CloseStdinRequest,
) -> Result<CloseStdinResponse, ConnectError> {
    let (pid, view) = find(s, t, r.process).await?;
    let Some(v) = view else {
        return Err(ConnectError::new(
            Code::FailedPrecondition,
            format!("process {pid} is a terminal; send Ctrl-D (0x04) instead"),
        ));
    };
    s.backend.close_stdin(&t.sandbox, &v.id).await?;
    Ok(CloseStdinResponse {})
}

async fn update(s: &Shared, t: &Target, r: UpdateRequest) -> Result<UpdateResponse, ConnectError> {
    let (pid, view) = find(s, t, r.process).await?;
    if view.is_some() {
        return Err(ConnectError::new(
            Code::FailedPrecondition,
            format!("process {pid} has no terminal to resize"),
        ));
    }
    let size = r
        .pty
        .and_then(|p| p.size)
        .ok_or_else(|| ConnectError::new(Code::InvalidArgument, "pty size is required"))?;
    if size.cols == 0 || size.rows == 0 || size.cols > MAX_CELLS || size.rows > MAX_CELLS {
        return Err(ConnectError::new(
            Code::InvalidArgument,
            "pty size must be 1..1000 columns and rows",
        ));
    }
    let p = pty_of(s, t, pid).ok_or_else(|| {
        ConnectError::new(Code::NotFound, format!("process with pid {pid} not found"))
    })?;
    p.resize(size.cols as u16, size.rows as u16).await?;
    Ok(UpdateResponse {})
}

/// `StreamInput` (client stream): a start message naming the process,
/// then data messages, in order; answered once the client ends its stream.
async fn stream_input(s: &Shared, t: &Target, framing: Framing, req: Request) -> Response {
    use futures::StreamExt;
    let res: Result<(), ConnectError> = async {
        need_stream(framing)?;
        let mut body = req.into_body().into_data_stream();
        let mut env = connect::Envelopes::default();
        let mut target: Option<ProcessSelector> = None;
        let mut ended = false;
        while !ended {
            let Some(chunk) = body.next().await else {
                break;
            };
            let chunk = chunk
                .map_err(|e| ConnectError::new(Code::Canceled, format!("request body: {e}")))?;
            env.push(&chunk);
            while let Some((flags, msg)) = env.next_frame()? {
                if flags & 0x02 != 0 {
                    ended = true;
                    break;
                }
                let m: StreamInputRequest = connect::decode_message(&msg)?;
                match m.event {
                    Some(stream_input_request::Event::Start(st)) => target = st.process,
                    Some(stream_input_request::Event::Data(d)) => {
                        let sel = target.clone().ok_or_else(|| {
                            ConnectError::new(
                                Code::InvalidArgument,
                                "data before the start message",
                            )
                        })?;
                        write_input(s, t, Some(sel), d.input).await?;
                    }
                    Some(stream_input_request::Event::Keepalive(_)) | None => {}
                }
            }
        }
        if env.leftover() != 0 {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                "the request ended inside a message",
            ));
        }
        Ok(())
    }
    .await;
    match res {
        Ok(()) => connect::stream_response(futures::stream::iter([
            connect::stream_message(&StreamInputResponse {}),
            connect::end_stream(None),
        ])),
        Err(e) => connect::stream_error(e),
    }
}
