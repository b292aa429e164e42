//! `hatchery shell ID` on a terminal: a real one in the sandbox
//! (`GET /v1/sandboxes/{id}/pty`, a WebSocket), with ours in raw mode so
//! every key (Ctrl-C, Ctrl-Z, arrows) goes to the sandbox, the window size
//! following ours (SIGWINCH), and our terminal put back as it was however
//! the session ends.

use crate::client::{Api, ApiError};
use crate::commands::sandbox::not_found;
use anyhow::{bail, Context};
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use std::io::Write;
use std::os::fd::RawFd;
use tokio::signal::unix::{signal, SignalKind};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{self, Message};

const STDIN: RawFd = 0;

/// Our terminal's settings, restored on drop (also when a panic unwinds).
struct RawMode {
    saved: libc::termios,
}

impl RawMode {
    fn enter() -> anyhow::Result<RawMode> {
        // SAFETY: tcgetattr/tcsetattr on fd 0 with termios structs we own;
        // all-zero is a valid termios to be filled in.
        unsafe {
            let mut saved: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(STDIN, &mut saved) != 0 {
                bail!(
                    "cannot read the terminal's settings: {}",
                    std::io::Error::last_os_error()
                );
            }
            let mut raw = saved;
            libc::cfmakeraw(&mut raw);
            if libc::tcsetattr(STDIN, libc::TCSANOW, &raw) != 0 {
                bail!(
                    "cannot put the terminal in raw mode: {}",
                    std::io::Error::last_os_error()
                );
            }
            Ok(RawMode { saved })
        }
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // SAFETY: restores the settings read in `enter`.
        unsafe { libc::tcsetattr(STDIN, libc::TCSANOW, &self.saved) };
    }
}

/// Our window, or 80×24 when the terminal does not say.
fn window() -> (u16, u16) {
    // SAFETY: TIOCGWINSZ fills one winsize we own.
    unsafe {
        let mut ws: libc::winsize = std::mem::zeroed();
        for fd in [1, 0, 2] {
            if libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) == 0 && ws.ws_col > 0 && ws.ws_row > 0 {
                return (ws.ws_col.min(1000), ws.ws_row.min(1000));
            }
        }
    }
    (80, 24)
}

fn query_value(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The ws:// URL of the terminal route for this daemon.
fn url(api: &Api, id: &str, cwd: Option<&str>, argv: &[String]) -> anyhow::Result<String> {
    let base = api.url.trim_end_matches('/');
    let base = match base.split_once("://") {
        Some(("http", rest)) => format!("ws://{rest}"),
        Some(("https", _)) => bail!(
            "`hatchery shell` on a terminal speaks plain http only (as the rest of this CLI); \
             {base} needs TLS"
        ),
        _ => bail!("HATCHERY_URL {base:?} is not an http:// URL"),
    };
    let (cols, rows) = window();
    let mut u = format!("{base}/v1/sandboxes/{id}/pty?cols={cols}&rows={rows}");
    if let Some(c) = cwd {
        u.push_str(&format!("&cwd={}", query_value(c)));
    }
    if !argv.is_empty() {
        u.push_str(&format!("&argv={}", query_value(&json!(argv).to_string())));
    }
    Ok(u)
}

pub fn run(api: &Api, id: &str, cwd: Option<&str>, argv: &[String]) -> anyhow::Result<i32> {
    let mut req = url(api, id, cwd, argv)?
        .into_client_request()
        .context("terminal URL")?;
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {}", api.key()?)
            .parse()
            .context("API key is not a valid header value")?,
    );
    tokio::runtime::Handle::current().block_on(session(api, id, req))
}

async fn session(
    api: &Api,
    id: &str,
    req: tungstenite::handshake::client::Request,
) -> anyhow::Result<i32> {
    let (ws, _) = match tokio_tungstenite::connect_async(req).await {
        Ok(x) => x,
        Err(tungstenite::Error::Http(resp)) => {
            let status = resp.status().as_u16();
            let body = resp.body().as_deref().unwrap_or_default();
            let v: Value = serde_json::from_slice(body).unwrap_or_default();
            let text = |k: &str| v["error"][k].as_str().map(str::to_string);
            let e = ApiError {
                status,
                code: text("code").unwrap_or_else(|| "unknown".into()),
                message: text("message")
                    .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned()),
            };
            return Err(not_found(e.into(), id));
        }
        Err(e) => bail!(
            "cannot open a terminal at {} ({e}). Start the daemon with `make run` or \
             `hatchery serve`, or point HATCHERY_URL / --url at a running one.",
            api.url
        ),
    };
    let (mut tx, mut rx) = ws.split();

    let raw = RawMode::enter()?;
    // Our stdin on a thread of its own: a read that blocks must not hold
    // up the runtime, and it stays blocked harmlessly when we are done.
    let (keys_tx, mut keys) = tokio::sync::mpsc::channel::<Vec<u8>>(64);
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        loop {
            // SAFETY: read(2) into a buffer we own.
            let n = unsafe { libc::read(STDIN, buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                if n < 0
                    && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
                {
                    continue;
                }
                return;
            }
            if keys_tx.blocking_send(buf[..n as usize].to_vec()).is_err() {
                return;
            }
        }
    });
    let mut winch = signal(SignalKind::window_change())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut hup = signal(SignalKind::hangup())?;
    let mut stdin_open = true;
    let mut exit: Option<Value> = None;
    let mut closed: Option<Value> = None;

    let outcome: anyhow::Result<()> = async {
        loop {
            tokio::select! {
                msg = rx.next() => match msg {
                    Some(Ok(Message::Binary(b))) => {
                        let mut o = std::io::stdout().lock();
                        o.write_all(&b).and_then(|_| o.flush())?;
                    }
                    Some(Ok(Message::Text(t))) => {
                        let v: Value = serde_json::from_str(t.as_str()).unwrap_or_default();
                        match v["type"].as_str() {
                            Some("exit") => exit = Some(v),
                            Some("closed") => closed = Some(v),
                            _ => {}
                        }
                    }
                    Some(Ok(Message::Close(_))) | None => return Ok(()),
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Err(anyhow::anyhow!("terminal connection: {e}")),
                },
                k = keys.recv(), if stdin_open => match k {
                    Some(k) => tx.send(Message::Binary(k.into())).await?,
                    // Our stdin is gone: nothing more to type, but the
                    // program may still have output for us.
                    None => stdin_open = false,
                },
                _ = winch.recv() => {
                    let (cols, rows) = window();
                    let m = json!({"type": "resize", "cols": cols, "rows": rows}).to_string();
                    tx.send(Message::Text(m.into())).await?;
                }
                _ = term.recv() => return Ok(()),
                _ = hup.recv() => return Ok(()),
            }
        }
    }
    .await;
    let _ = tx.send(Message::Close(None)).await;
    drop(raw);

    if let Some(e) = exit {
        return Ok(match e["exit_code"].as_i64() {
            Some(c @ 0..=255) => c as i32,
            _ => 255,
        });
    }
    outcome?;
    match closed {
        Some(c) => bail!(
            "the terminal was closed: {} ({})",
            c["message"].as_str().unwrap_or(""),
            c["reason"].as_str().unwrap_or("?")
        ),
        None => bail!("the terminal was closed without an exit status"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn query_values_are_encoded() {
        assert_eq!(super::query_value("/a b&c"), "%2Fa%20b%26c");
        assert_eq!(super::query_value(r#"["x"]"#), "%5B%22x%22%5D");
    }
}
