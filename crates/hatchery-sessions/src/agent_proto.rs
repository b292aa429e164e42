//! The agent's side channel: JSON lines on its stdout (what it does) and
//! on its stdin (acks, steering messages, approval decisions). Everything
//! the agent prints is untrusted: lines are size-capped and only known
//! shapes become typed events; anything else is kept as `agent_output`.

use crate::events::{Actor, EventKind, ToolCallInfo};
use serde::Deserialize;

/// Longest line kept from the agent's stdout.
pub const MAX_LINE_BYTES: usize = 4 << 20;

#[derive(Debug, Deserialize)]
struct RawCall {
    #[serde(default)]
    id: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    arguments: String,
}

#[derive(Debug, Deserialize, Default)]
struct Usage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Line {
    ModelRequest {
        step: u32,
        #[serde(default)]
        messages: u32,
    },
    ModelResponse {
        step: u32,
        #[serde(default)]
        content: Option<String>,
        #[serde(default)]
        tool_calls: Vec<RawCall>,
        #[serde(default)]
        usage: Option<Usage>,
    },
    ToolCall {
        call_id: String,
        tool: String,
        #[serde(default)]
        arguments: String,
    },
    ToolResult {
        call_id: String,
        tool: String,
        ok: bool,
        #[serde(default)]
        output: String,
    },
    CommandRun {
        call_id: String,
        command: String,
        exit_code: i32,
        #[serde(default)]
        duration_ms: u64,
        #[serde(default)]
        output: String,
    },
    FileChanged {
        call_id: String,
        path: String,
        #[serde(default)]
        bytes: u64,
    },
    MessageReceived {
        seq: u64,
    },
    AgentMessage {
        text: String,
    },
    Waiting {
        #[serde(default = "msg")]
        waiting_for: String,
    },
    ApprovalRequest {
        action: String,
        #[serde(default)]
        details: String,
    },
    Done {
        #[serde(default)]
        summary: String,
    },
    Error {
        message: String,
    },
}

fn msg() -> String {
    "message".into()
}

#[derive(Debug, Deserialize)]
struct Envelope {
    n: u64,
    #[serde(default)]
    ack: bool,
}

/// What one line means to the runner.
#[derive(Debug, PartialEq)]
pub struct Parsed {
    /// The agent's message number, if the line was a protocol message.
    pub n: Option<u64>,
    /// The agent waits for `{"type":"ack","n":n}` before acting.
    pub wants_ack: bool,
    pub event: EventKind,
    pub tokens: u64,
    pub effect: Effect,
}

#[derive(Debug, PartialEq)]
pub enum Effect {
    None,
    Waiting(String),
    ApprovalRequest {
        action: String,
        details: String,
    },
    Done(String),
    /// The agent is working again (asked the model).
    Busy,
}

pub fn actor() -> Actor {
    Actor::Agent
}

pub fn parse(line: &[u8]) -> Parsed {
    let text = String::from_utf8_lossy(line);
    let other = |t: &str| Parsed {
        n: None,
        wants_ack: false,
        event: EventKind::AgentOutput {
            text: t.to_string(),
            text_ref: None,
        },
        tokens: 0,
        effect: Effect::None,
    };
    let (Ok(env), Ok(l)) = (
        serde_json::from_str::<Envelope>(&text),
        serde_json::from_str::<Line>(&text),
    ) else {
        return other(&text);
    };
    let mut tokens = 0;
    let mut effect = Effect::None;
    let event = match l {
        Line::ModelRequest { step, messages } => {
            effect = Effect::Busy;
            EventKind::ModelRequest { step, messages }
        }
        Line::ModelResponse {
            step,
            content,
            tool_calls,
            usage,
        } => {
            let u = usage.unwrap_or_default();
            tokens = u.prompt_tokens.saturating_add(u.completion_tokens);
            EventKind::ModelResponse {
                step,
                content,
                content_ref: None,
                tool_calls: tool_calls
                    .into_iter()
                    .take(64)
                    .map(|c| ToolCallInfo {
                        call_id: c.id,
                        tool: c.name,
                        arguments: crate::events::cut(
                            &c.arguments,
                            crate::events::INLINE_TEXT_BYTES,
                        )
                        .to_string(),
                    })
                    .collect(),
                prompt_tokens: u.prompt_tokens,
                completion_tokens: u.completion_tokens,
            }
        }
        Line::ToolCall {
            call_id,
            tool,
            arguments,
        } => EventKind::ToolCall {
            call_id,
            tool,
            arguments,
        },
        Line::ToolResult {
            call_id,
            tool,
            ok,
            output,
        } => EventKind::ToolResult {
            call_id,
            tool,
            ok,
            output,
            output_ref: None,
            truncated: false,
        },
        Line::CommandRun {
            call_id,
            command,
            exit_code,
            duration_ms,
            output,
        } => EventKind::CommandRun {
            call_id,
            command,
            exit_code,
            duration_ms,
            output,
            output_ref: None,
            truncated: false,
        },
        Line::FileChanged {
            call_id,
            path,
            bytes,
        } => EventKind::FileChanged {
            call_id,
            path,
            bytes,
        },
        Line::MessageReceived { seq } => EventKind::MessageDelivered { message_seq: seq },
        Line::AgentMessage { text } => EventKind::AgentMessage {
            text,
            text_ref: None,
        },
        Line::Waiting { waiting_for } => {
            effect = Effect::Waiting(waiting_for.clone());
            EventKind::Waiting { waiting_for }
        }
        Line::ApprovalRequest { action, details } => {
            effect = Effect::ApprovalRequest {
                action: action.clone(),
                details: details.clone(),
            };
            // The approval id is filled in by the runner.
            EventKind::ApprovalRequested {
                approval_id: String::new(),
                action,
                details,
            }
        }
        Line::Done { summary } => {
            effect = Effect::Done(summary.clone());
            EventKind::AgentDone { summary }
        }
        Line::Error { message } => EventKind::Error {
            code: "agent_error".into(),
            message,
        },
    };
    Parsed {
        n: Some(env.n),
        wants_ack: env.ack,
        event,
        tokens,
        effect,
    }
}

/// Host → agent lines.
pub fn ack(n: u64) -> Vec<u8> {
    line(serde_json::json!({"type": "ack", "n": n}))
}

pub fn deliverable(seq: u64, kind: &EventKind) -> Option<Vec<u8>> {
    match kind {
        EventKind::Message { text } => Some(line(
            serde_json::json!({"type": "message", "seq": seq, "text": text}),
        )),
        // An egress or model call hold's decision is the proxy's or the
        // gateway's business, not the agent's (it asked for no approval).
        // So is a held re-run's (the runner acts on it, crate::replay).
        EventKind::ApprovalDecided { approval_id, .. }
            if crate::held_approvals::is_held(approval_id)
                || approval_id.starts_with(crate::replay::APPROVAL_PREFIX) =>
        {
            None
        }
        EventKind::ApprovalDecided {
            approval_id,
            decision,
            note,
            ..
        } => Some(line(serde_json::json!({
            "type": "approval", "seq": seq, "approval_id": approval_id, "decision": decision, "note": note
        }))),
        _ => None,
    }
}

fn line(v: serde_json::Value) -> Vec<u8> {
    let mut b = serde_json::to_vec(&v).unwrap_or_default();
    b.push(b'\n');
    b
}

/// Splits a process's stdout into lines and knows the output offset at
/// which each ends (stdout and stderr share the offset space).
#[derive(Default)]
pub struct LineSplitter {
    buf: Vec<u8>,
    overflow: bool,
}

impl LineSplitter {
    /// Feeds a stdout chunk that starts at `offset`; returns each complete
    /// line with the offset just past its newline.
    pub fn feed(&mut self, offset: u64, data: &[u8]) -> Vec<(Vec<u8>, u64)> {
        let mut out = vec![];
        let mut start = 0;
        for (i, b) in data.iter().enumerate() {
            if *b == b'\n' {
                self.push(&data[start..i]);
                let l = std::mem::take(&mut self.buf);
                let over = std::mem::take(&mut self.overflow);
                let mut l = l;
                if over {
                    l.extend_from_slice(b" [line cut]");
                }
                out.push((l, offset + i as u64 + 1));
                start = i + 1;
            }
        }
        self.push(&data[start..]);
        out
    }

    fn push(&mut self, d: &[u8]) {
        let room = MAX_LINE_BYTES.saturating_sub(self.buf.len());
        if d.len() > room {
            self.overflow = true;
        }
        self.buf.extend_from_slice(&d[..d.len().min(room)]);
    }

    pub fn clear(&mut self) {
        self.buf.clear();
        self.overflow = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_offsets() {
        let mut s = LineSplitter::default();
        assert_eq!(s.feed(10, b"ab"), vec![]);
        assert_eq!(
            s.feed(12, b"c\nde\n"),
            vec![(b"abc".to_vec(), 14), (b"de".to_vec(), 17)]
        );
    }

    #[test]
    fn parses_known_and_keeps_unknown() {
        let p = parse(br#"{"n":3,"ack":true,"type":"tool_call","call_id":"c","tool":"shell","arguments":"{}"}"#);
        assert_eq!(p.n, Some(3));
        assert!(p.wants_ack);
        assert!(matches!(p.event, EventKind::ToolCall { .. }));
        let p = parse(br#"{"n":4,"type":"model_response","step":1,"content":"hi","usage":{"prompt_tokens":5,"completion_tokens":2}}"#);
        assert_eq!(p.tokens, 7);
        let p = parse(b"Traceback (most recent call last):");
        assert_eq!(p.n, None);
        assert!(matches!(p.event, EventKind::AgentOutput { .. }));
        let p = parse(br#"{"n":5,"type":"launch_missiles"}"#);
        assert!(matches!(p.event, EventKind::AgentOutput { .. }));
    }
}
