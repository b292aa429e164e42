//! How `process.Process` events go on the wire: a `ProcessEvent` in the
//! stream message of the call that carries it (`Start` or `Connect`).
//! Used by the process service's output streams and by a terminal's tap
//! (`pty_tap`), which the adapter's state holds.

use crate::connect;
use crate::pb::process::{process_event, ConnectResponse, ProcessEvent, StartResponse};
use axum::body::Bytes;

/// One enveloped stream message.
pub(crate) type Msg = Bytes;

pub(crate) fn event(e: process_event::Event) -> ProcessEvent {
    ProcessEvent { event: Some(e) }
}

/// Which message type goes on the wire, `StartResponse` or `ConnectResponse`
/// (the same shape).
#[derive(Clone, Copy)]
pub enum Reply {
    Start,
    Connect,
}

pub(crate) fn frame(kind: Reply, e: ProcessEvent) -> Msg {
    match kind {
        Reply::Start => connect::stream_message(&StartResponse { event: Some(e) }),
        Reply::Connect => connect::stream_message(&ConnectResponse { event: Some(e) }),
    }
}

pub(crate) fn keepalive(kind: Reply) -> Msg {
    frame(
        kind,
        event(process_event::Event::Keepalive(process_event::KeepAlive {})),
    )
}
