//! One member's WebSocket in a room: the Yjs sync protocol both ways,
//! under the connection's message budget, until either side closes, the
//! token expires, or the connection breaks a rule (then only it closes).

use super::rate::Bucket;
use super::{Member, Slot};
use crate::ids::now_ms;
use crate::limits::{ROOM_RATE_BURST, ROOM_RATE_PER_S};
use crate::Rounds;
use axum::extract::ws::{CloseFrame, Message as Ws, WebSocket};
use futures::{SinkExt, StreamExt};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::broadcast::error::RecvError;

fn close(code: u16, reason: &'static str) -> Ws {
    Ws::Close(Some(CloseFrame {
        code,
        reason: reason.into(),
    }))
}

pub(crate) async fn serve(st: Arc<Rounds>, slot: Slot, who: Member, socket: WebSocket) {
    let room = slot.room.clone();
    let conn = slot.conn;
    let (mut tx, mut rx) = socket.split();
    // Subscribed before the greeting, so no update falls between the
    // state the client is sent and the fan-out it then follows.
    let mut fanout = room.subscribe();
    let mut ok = true;
    for m in room.greeting().await {
        if tx.send(Ws::Binary(m.into())).await.is_err() {
            ok = false;
            break;
        }
    }
    let mut budget = Bucket::new(Instant::now(), ROOM_RATE_PER_S, ROOM_RATE_BURST);
    let left = Duration::from_millis(who.expires_at_ms.saturating_sub(now_ms()));
    let expiry = tokio::time::sleep(left);
    tokio::pin!(expiry);
    while ok {
        tokio::select! {
            m = rx.next() => match m {
                Some(Ok(Ws::Binary(b))) => {
                    if !budget.take(Instant::now()) {
                        let _ = tx.send(close(4429, "too many messages")).await;
                        break;
                    }
                    match room.handle(st.store.as_ref(), conn, &who, &b).await {
                        Ok(replies) => {
                            for r in replies {
                                if tx.send(Ws::Binary(r.into())).await.is_err() {
                                    ok = false;
                                    break;
                                }
                            }
                        }
                        Err(e) => {
                            if let Some(dropped) = crate::ratelimit::CANDIDATE_EVENTS.allow() {
                                tracing::info!(dropped, session = %room.session_id, error = %e, "rounds: a room connection was closed");
                            }
                            let (code, reason) = e.close();
                            let _ = tx.send(close(code, reason)).await;
                            break;
                        }
                    }
                }
                Some(Ok(Ws::Text(_))) => {
                    let _ = tx.send(close(4400, "binary Yjs messages only")).await;
                    break;
                }
                Some(Ok(Ws::Ping(_) | Ws::Pong(_))) => {}
                Some(Ok(Ws::Close(_))) | Some(Err(_)) | None => break,
            },
            f = fanout.recv() => match f {
                Ok(f) if f.bytes.is_empty() => {
                    let _ = tx.send(close(1012, "room reloading; reconnect")).await;
                    break;
                }
                Ok(f) if f.from == conn => {}
                Ok(f) => {
                    if tx.send(Ws::Binary(f.bytes.to_vec().into())).await.is_err() {
                        break;
                    }
                }
                // Too slow to follow: it reconnects and resyncs.
                Err(RecvError::Lagged(_)) => {
                    let _ = tx.send(close(4408, "too slow; reconnect")).await;
                    break;
                }
                Err(RecvError::Closed) => break,
            },
            _ = &mut expiry => {
                let _ = tx.send(close(4401, "token expired")).await;
                break;
            }
        }
    }
    room.leave(conn).await;
    drop(slot);
}
