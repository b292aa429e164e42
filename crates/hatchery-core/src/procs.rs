//! Background processes: started like an exec but answered at once; their
//! output lives in a ring in the guest that readers replay and follow.

use crate::agent_client::{expect_ok, AgentClient, Channel};
use crate::exec::ExecParams;
use crate::CoreError;
use hatchery_agent_proto::{ExecRequest, Frame, Kind, ProcInfo, ProcRequest};
use std::time::Duration;
use tokio::sync::mpsc;

/// Longest `wait` the API accepts.
pub const MAX_WAIT: Duration = Duration::from_secs(300);
/// Largest stdin write.
pub const MAX_STDIN_WRITE: usize = 1 << 20;
/// Signals a client may send (by number); others are refused.
pub const SIGNALS: &[(&str, i32)] = &[
    ("SIGHUP", 1),
    ("SIGINT", 2),
    ("SIGQUIT", 3),
    ("SIGKILL", 9),
    ("SIGUSR1", 10),
    ("SIGUSR2", 12),
    ("SIGTERM", 15),
    ("SIGCONT", 18),
    ("SIGSTOP", 19),
    ("SIGWINCH", 28),
];

/// One piece of a process's output, at its offset in the process's output.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcChunk {
    pub offset: u64,
    pub stderr: bool,
    pub data: Vec<u8>,
}

fn map(e: CoreError) -> CoreError {
    match e {
        CoreError::Guest { code, message } => match code.as_str() {
            "not_found" => CoreError::ProcessNotFound(message),
            "too_many" => CoreError::TooMany(message),
            "closed" => CoreError::Conflict(message),
            "invalid" => CoreError::Invalid(message),
            _ => CoreError::Guest { code, message },
        },
        other => other,
    }
}

async fn open_with(
    client: &AgentClient,
    f: impl FnOnce(u32) -> Frame,
) -> Result<Channel, CoreError> {
    let ch = client.open();
    client
        .send(&f(ch.id))
        .await
        .map_err(|e| CoreError::GuestUnresponsive(e.to_string()))?;
    Ok(ch)
}

async fn call<T: serde::de::DeserializeOwned>(
    client: &AgentClient,
    kind: Kind,
    req: &ProcRequest,
    wait: Duration,
) -> Result<T, CoreError> {
    let mut ch = open_with(client, |id| Frame::json(id, kind, req)).await?;
    let f = tokio::time::timeout(wait, expect_ok(&mut ch))
        .await
        .map_err(|_| CoreError::GuestUnresponsive("no answer about the process".into()))?
        .map_err(map)?;
    f.parse()
        .map_err(|e| CoreError::GuestUnresponsive(format!("bad process reply: {e}")))
}

fn req(id: &str) -> ProcRequest {
    ProcRequest {
        id: id.to_string(),
        ..Default::default()
    }
}

const ANSWER: Duration = Duration::from_secs(10);

pub async fn start(
    client: &AgentClient,
    p: ExecParams,
    background_timeout: Option<Duration>,
) -> Result<ProcInfo, CoreError> {
    let r = ExecRequest {
        argv: p.argv,
        cwd: p.cwd,
        env: p.env,
        stdin: None,
        timeout_ms: background_timeout
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        max_output_bytes: p.max_output_bytes,
        cpu_limit_ms: p.cpu_limit_ms,
    };
    let mut ch = open_with(client, |id| Frame::json(id, Kind::ProcStart, &r)).await?;
    let f = tokio::time::timeout(ANSWER, expect_ok(&mut ch))
        .await
        .map_err(|_| CoreError::GuestUnresponsive("no answer to a process start".into()))?
        .map_err(map)?;
    let info: ProcInfo = f
        .parse()
        .map_err(|e| CoreError::GuestUnresponsive(format!("bad process reply: {e}")))?;
    if let Some(data) = p.stdin {
        write_stdin(client, &info.id, data.as_bytes()).await?;
    }
    Ok(info)
}

pub async fn list(client: &AgentClient) -> Result<Vec<ProcInfo>, CoreError> {
    let mut all: Vec<ProcInfo> = call(client, Kind::ProcList, &req(""), ANSWER).await?;
    all.truncate(256);
    Ok(all)
}

pub async fn get(client: &AgentClient, id: &str) -> Result<ProcInfo, CoreError> {
    list(client)
        .await?
        .into_iter()
        .find(|p| p.id == id)
        .ok_or_else(|| CoreError::ProcessNotFound(id.to_string()))
}

pub async fn write_stdin(client: &AgentClient, id: &str, data: &[u8]) -> Result<(), CoreError> {
    let mut payload = Vec::with_capacity(id.len() + 1 + data.len());
    payload.extend_from_slice(id.as_bytes());
    payload.push(0);
    payload.extend_from_slice(data);
    let mut ch = open_with(client, |c| Frame::new(c, Kind::ProcStdin, payload)).await?;
    tokio::time::timeout(ANSWER, expect_ok(&mut ch))
        .await
        .map_err(|_| CoreError::GuestUnresponsive("no answer to a stdin write".into()))?
        .map_err(map)
        .map(drop)
}

pub async fn close_stdin(client: &AgentClient, id: &str) -> Result<(), CoreError> {
    call::<serde_json::Value>(client, Kind::ProcStdinClose, &req(id), ANSWER)
        .await
        .map(drop)
}

pub async fn signal(client: &AgentClient, id: &str, signal: i32) -> Result<ProcInfo, CoreError> {
    let r = ProcRequest { signal, ..req(id) };
    call(client, Kind::ProcSignal, &r, ANSWER).await
}

pub async fn wait(
    client: &AgentClient,
    id: &str,
    timeout: Duration,
) -> Result<ProcInfo, CoreError> {
    let r = ProcRequest {
        timeout_ms: timeout.as_millis() as u64,
        ..req(id)
    };
    call(client, Kind::ProcWait, &r, timeout + ANSWER).await
}

pub async fn kill(client: &AgentClient, id: &str) -> Result<ProcInfo, CoreError> {
    call(client, Kind::ProcKill, &req(id), ANSWER).await
}

/// Replays output from `offset` into `tx`, and with `follow` keeps going
/// until the process exits. Returns the process's info at the end. A
/// consumer that goes away stops the reader in the guest, not the process.
pub async fn read(
    client: &AgentClient,
    id: &str,
    offset: u64,
    follow: bool,
    tx: mpsc::Sender<ProcChunk>,
) -> Result<ProcInfo, CoreError> {
    let r = ProcRequest {
        offset,
        follow,
        ..req(id)
    };
    let mut ch = open_with(client, |c| Frame::json(c, Kind::ProcRead, &r)).await?;
    let mut stopping = false;
    loop {
        let f = tokio::select! {
            f = ch.rx.recv() => f,
            _ = tx.closed(), if !stopping => {
                stopping = true;
                let _ = client.send(&Frame::new(ch.id, Kind::Kill, vec![])).await;
                continue;
            }
        };
        let Some(f) = f else {
            return Err(CoreError::GuestUnresponsive(
                "agent connection closed".into(),
            ));
        };
        match f.kind {
            Kind::ProcChunk if f.payload.len() >= 9 => {
                let offset = u64::from_be_bytes(f.payload[..8].try_into().expect("8 bytes"));
                let chunk = ProcChunk {
                    offset,
                    stderr: f.payload[8] == 2,
                    data: f.payload[9..].to_vec(),
                };
                if !stopping && tx.send(chunk).await.is_err() {
                    stopping = true;
                    let _ = client.send(&Frame::new(ch.id, Kind::Kill, vec![])).await;
                }
            }
            Kind::ProcEnd => {
                return f
                    .parse()
                    .map_err(|e| CoreError::GuestUnresponsive(format!("bad process info: {e}")))
            }
            Kind::Error => return Err(map(crate::agent_client::guest_error(&f))),
            _ => {}
        }
    }
}
