//! Terminals over WebSocket: `GET /v1/sandboxes/{id}/pty` upgrades to a
//! WebSocket relaying a pseudo-terminal in the sandbox (protocol in
//! docs/api.md), and `POST /v1/sandboxes/{id}/pty/token` mints the
//! short-lived token browsers pass as `?token=` instead of the API key.
//!
//! Everything that can be refused is refused before the upgrade, with the
//! usual JSON error and status; the terminal is started before the upgrade
//! too, so a missing command or directory is a 404, not a socket that
//! closes at once. If the upgrade then fails, dropping the terminal ends it.

use crate::error::ErrorBody;
use crate::extract::Query;
use crate::models::ExecReason;
use crate::terminal_models::{
    TerminalClientMessage, TerminalQuery, TerminalServerMessage, TerminalToken,
};
use crate::{ApiError, AppState};
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use hatchery_core::pty::{Terminal, TerminalEvent};
use hatchery_core::CoreError;
use tokio::time::{timeout_at, Instant};

/// Largest message a client may send (a paste); a bigger one closes the
/// connection (1009, and the terminal with it).
const MAX_MESSAGE: usize = 1 << 20;
pub const CLOSE_IDLE: u16 = 4000;

#[utoipa::path(post, path = "/v1/sandboxes/{id}/pty/token", tag = "terminals", params(("id" = String, Path)),
    responses((status = 200, body = TerminalToken), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn token(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<axum::Json<TerminalToken>, ApiError> {
    st.manager.get(&id).await?;
    let (token, expires) = st.terminal_tokens.issue(&id, hatchery_core::now_ms());
    Ok(axum::Json(TerminalToken {
        token,
        expires_at: hatchery_core::rfc3339(expires),
    }))
}

/// A WebSocket upgrade (101) to a pseudo-terminal running the sandbox's
/// login shell, or `cmd`/`argv`. Binary messages carry raw terminal bytes
/// both ways; text messages are JSON control messages
/// (`TerminalClientMessage`, `TerminalServerMessage`). Authenticated by
/// the API key as a Bearer header or by `?token=` from
/// `POST /v1/sandboxes/{id}/pty/token`; a tenant's key reaches only its
/// tenant's sandboxes (404 for any other). The terminal and everything
/// started in it are killed when the socket closes, when the client sends
/// nothing for the idle timeout (default 15 min, `--terminal-idle-timeout`)
/// and when the sandbox goes; at most `--max-terminals` (8) per sandbox.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/pty", tag = "terminals",
    params(("id" = String, Path), TerminalQuery),
    security(("bearer" = []), ("terminal_token" = [])),
    responses((status = 101, description = "Switching Protocols: the connection is now a WebSocket carrying the terminal"),
              (status = 400, body = ErrorBody, description = "bad query, or not a WebSocket upgrade request"),
              (status = 401, body = ErrorBody, description = "no valid API key or token"),
              (status = 404, body = ErrorBody, description = "no such sandbox, directory or command"),
              (status = 409, body = ErrorBody), (status = 429, body = ErrorBody, description = "too many terminals on this sandbox"),
              (status = 504, body = ErrorBody)))]
pub async fn attach(
    State(st): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Query(q): Query<TerminalQuery>,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let nonce = authorize(&st, &id, &headers, q.token.as_deref()).await?;
    let opened = async {
        let ws = ws.map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "not_a_websocket",
                format!("this route is a WebSocket upgrade: {}", e.body_text()),
            )
        })?;
        let params = q.into_params(&st.manager.caps)?;
        let term = st.manager.open_terminal(&id, params).await?;
        Ok::<_, ApiError>((ws, term))
    }
    .await;
    let (ws, term) = match opened {
        Ok(x) => x,
        Err(e) => {
            // No terminal came of this token: the client may retry with it.
            if let Some(n) = nonce {
                st.terminal_tokens.release(&n);
            }
            return Err(e);
        }
    };
    Ok(ws
        .max_message_size(MAX_MESSAGE)
        .max_frame_size(MAX_MESSAGE)
        .on_failed_upgrade(|e| tracing::debug!(error = %e, "terminal upgrade failed"))
        .on_upgrade(move |socket| relay(socket, term)))
}

/// The API key (Bearer, compared in constant time), a tenant's key for
/// one of its own sandboxes (another's answers 404, as a missing one), or
/// a token for this sandbox, used up by this request (its nonce is
/// returned). Tokens are minted only through the keyed, scoped
/// `…/pty/token` route, so a token already names a sandbox its holder
/// may reach.
async fn authorize(
    st: &AppState,
    id: &str,
    headers: &HeaderMap,
    token: Option<&str>,
) -> Result<Option<String>, ApiError> {
    let unauthorized = |m: &str| ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", m);
    if let Some(h) = headers.get(axum::http::header::AUTHORIZATION) {
        let given = h
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if hatchery_serve::headers::constant_time_eq(given.as_bytes(), st.api_key.as_bytes()) {
            return Ok(None);
        }
        return match st.tenants.resolve(given).await {
            Ok(Some(p)) => {
                if let Some(t) = p.tenant() {
                    let path = format!("/v1/sandboxes/{id}/pty");
                    crate::scope::check(st, t, &axum::http::Method::GET, &path).await?;
                }
                Ok(None)
            }
            Ok(None) => Err(unauthorized("missing or wrong API key")),
            Err(e) => Err(crate::scope::store_failed(e)),
        };
    }
    match token {
        Some(t) => st
            .terminal_tokens
            .redeem(id, t, hatchery_core::now_ms())
            .map(Some)
            .map_err(|e| unauthorized(e.message())),
        None => Err(unauthorized(
            "missing API key (Authorization: Bearer) or ?token= from POST /v1/sandboxes/{id}/pty/token",
        )),
    }
}

/// How often an attached terminal looks for new OOM kills in its sandbox.
const OOM_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

fn control(m: &TerminalServerMessage) -> Message {
    Message::Text(serde_json::to_string(m).unwrap_or_default().into())
}

fn close(code: u16, reason: &str) -> Message {
    Message::Close(Some(CloseFrame {
        code,
        reason: reason.into(),
    }))
}

/// Relays until the program ends, the client goes, the client is idle for
/// the idle timeout, or the sandbox goes. Every way out ends the terminal.
async fn relay(mut socket: WebSocket, mut term: Terminal) {
    let idle = term.idle_timeout;
    let mut deadline = Instant::now() + idle;
    // A client that stops reading blocks our sends (that is the
    // backpressure); it must not block the idle deadline too.
    macro_rules! send {
        ($msg:expr) => {
            match timeout_at(deadline, socket.send($msg)).await {
                Ok(Ok(())) => true,
                _ => false,
            }
        };
    }
    let mut oom_check = tokio::time::interval(OOM_CHECK);
    oom_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ooms_told = 0;
    let (message, code, reason) = loop {
        tokio::select! {
            _ = oom_check.tick() => {
                let kills = term.oom_kills_since_open().unwrap_or(0);
                if kills > ooms_told {
                    ooms_told = kills;
                    if !send!(control(&TerminalServerMessage::Oom { kills })) {
                        break (None, None, "client gone or idle");
                    }
                }
            }
            ev = term.next() => match ev {
                Ok(TerminalEvent::Output(d)) => {
                    if !send!(Message::Binary(d.into())) {
                        break (None, None, "client gone or idle");
                    }
                }
                Ok(TerminalEvent::Resized(r)) => {
                    let m = match (r.size, r.error) {
                        (Some(sz), None) => TerminalServerMessage::Resized { cols: sz.cols, rows: sz.rows },
                        (_, e) => TerminalServerMessage::Error {
                            code: "resize_failed".into(),
                            message: e.unwrap_or_else(|| "the guest did not say".into()),
                        },
                    };
                    if !send!(control(&m)) {
                        break (None, None, "client gone or idle");
                    }
                }
                Ok(TerminalEvent::Exit(e)) => {
                    let m = TerminalServerMessage::Exit {
                        exit_code: e.exit_code,
                        signal: e.signal,
                        reason: ExecReason::from(e.reason),
                        oom_killed: e.reason == hatchery_agent_proto::EndReason::Oom,
                    };
                    break (Some(m), Some(1000), "exited");
                }
                Err(e) => {
                    let (why, code) = match e {
                        CoreError::GuestUnresponsive(_) => ("sandbox_gone", 1001),
                        _ => ("error", 1011),
                    };
                    let m = TerminalServerMessage::Closed { reason: why.into(), message: e.to_string() };
                    break (Some(m), Some(code), why);
                }
            },
            msg = socket.recv() => match msg {
                None | Some(Ok(Message::Close(_))) => break (None, None, "client closed"),
                Some(Err(e)) => {
                    let code = match e.into_inner().downcast::<tungstenite::Error>().map(|e| *e) {
                        Ok(tungstenite::Error::Capacity(_)) => Some(1009),
                        Ok(tungstenite::Error::Protocol(_)) => Some(1002),
                        _ => None,
                    };
                    break (None, code, "client message refused");
                }
                Some(Ok(Message::Binary(b))) => {
                    deadline = Instant::now() + idle;
                    if let Err(e) = term.input(&b).await {
                        let m = TerminalServerMessage::Closed { reason: "sandbox_gone".into(), message: e.to_string() };
                        break (Some(m), Some(1001), "sandbox_gone");
                    }
                }
                Some(Ok(Message::Text(t))) => {
                    let refused = match serde_json::from_str::<TerminalClientMessage>(t.as_str()) {
                        Ok(TerminalClientMessage::Resize { cols, rows }) => {
                            // Out-of-range values are refused by the core,
                            // with the limits in the message.
                            let cell = |v: i64| v.clamp(0, u16::MAX as i64) as u16;
                            match term.resize(cell(cols), cell(rows)).await {
                                Ok(()) => {
                                    deadline = Instant::now() + idle;
                                    None
                                }
                                Err(CoreError::Invalid(m)) => Some(("invalid_resize", m)),
                                Err(e) => {
                                    let m = TerminalServerMessage::Closed { reason: "sandbox_gone".into(), message: e.to_string() };
                                    break (Some(m), Some(1001), "sandbox_gone");
                                }
                            }
                        }
                        Err(e) => Some(("invalid_message", format!(
                            "expected {{\"type\":\"resize\",\"cols\":N,\"rows\":N}}: {e}"
                        ))),
                    };
                    if let Some((code, message)) = refused {
                        let m = TerminalServerMessage::Error { code: code.into(), message };
                        if !send!(control(&m)) {
                            break (None, None, "client gone or idle");
                        }
                    }
                }
                // Pings are answered by the WebSocket layer; neither they
                // nor pongs count as activity.
                Some(Ok(_)) => {}
            },
            _ = tokio::time::sleep_until(deadline) => {
                let m = TerminalServerMessage::Closed {
                    reason: "idle_timeout".into(),
                    message: format!("no input for {} s", idle.as_secs()),
                };
                break (Some(m), Some(CLOSE_IDLE), "idle timeout");
            }
        }
    };
    // End the terminal first: closing the socket must never leave it
    // running, however the client behaves from here on.
    term.close().await;
    if let Some(code) = code {
        let grace = Instant::now() + std::time::Duration::from_secs(2);
        let _ = timeout_at(grace, async {
            if let Some(m) = &message {
                socket.send(control(m)).await?;
            }
            socket.send(close(code, reason)).await
        })
        .await;
    }
    tracing::debug!(reason, "terminal closed");
}
