//! A resumed session's re-run, checked against what ran before.
//!
//! After a resume from a checkpoint the agent runs again from the
//! checkpoint's state, and its messages up to `replay_through` were handled
//! before the host was lost. A deterministic agent re-sends them as they
//! were; one driven by a model that answers differently the second time
//! may ask for something else under the same number: a tool call that was
//! never logged or approved. So each numbered message records what it
//! asked ([`AgentLine`]: its kind and the part of it that decides its
//! effect), and a re-run message is logged as `replayed` and compared
//! with it. A difference ends the session (`replay_diverged`) before the
//! re-run message is acknowledged, so the different effect never runs.
//!
//! What is compared ([`asked`]): a tool call's tool and arguments, a
//! command's text, a changed file's path, an approval's action and
//! details, a model request's step; for other kinds the kind alone (a
//! model's prose may differ without any effect differing).

use crate::events::{cut, EventKind};
use crate::store::AgentLine;
use sha2::{Digest, Sha256};

/// How much of a re-run message's `asked` its `replayed` event shows.
pub const SHOWN: usize = 1024;

/// The part of an agent event that decides its effect.
pub fn asked(e: &EventKind) -> String {
    match e {
        EventKind::ToolCall {
            tool, arguments, ..
        } => format!("{tool} {arguments}"),
        EventKind::CommandRun { command, .. } => command.clone(),
        EventKind::FileChanged { path, .. } => path.clone(),
        EventKind::ApprovalRequested {
            action, details, ..
        } => format!("{action} {details}"),
        EventKind::ModelRequest { step, .. } => step.to_string(),
        _ => String::new(),
    }
}

/// What message `n` asked, as kept: its kind and a digest of [`asked`]
/// (fixed size, whatever the arguments' length).
pub fn line(n: u64, e: &EventKind) -> AgentLine {
    AgentLine {
        n,
        kind: e.type_name().to_string(),
        asked: digest(&asked(e)),
    }
}

fn digest(s: &str) -> String {
    Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The `replayed` event of re-run message `n`: `matches` is `None` when
/// the first run's record is missing (a line dropped by a cap, or handled
/// before this was kept).
pub fn replayed(n: u64, e: &EventKind, original: Option<&AgentLine>) -> (EventKind, Option<bool>) {
    let now = line(n, e);
    let matches = original.map(|o| o.kind == now.kind && o.asked == now.asked);
    let ev = EventKind::Replayed {
        n,
        kind: now.kind,
        asked: cut(&asked(e), SHOWN).to_string(),
        matches,
    };
    (ev, matches)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(args: &str) -> EventKind {
        EventKind::ToolCall {
            call_id: "call_1".into(),
            tool: "shell".into(),
            arguments: args.into(),
        }
    }

    /// The same tool call under another call id matches; other arguments,
    /// another kind, or no record at all do not (or are unknown).
    #[test]
    fn a_rerun_matches_only_what_decides_its_effect() {
        let first = line(3, &tool(r#"{"command":"ls"}"#));
        let mut again = tool(r#"{"command":"ls"}"#);
        if let EventKind::ToolCall { call_id, .. } = &mut again {
            *call_id = "call_other".into();
        }
        assert_eq!(replayed(3, &again, Some(&first)).1, Some(true));
        let other = tool(r#"{"command":"curl evil"}"#);
        let (ev, m) = replayed(3, &other, Some(&first));
        assert_eq!(m, Some(false));
        assert!(
            matches!(ev, EventKind::Replayed { n: 3, ref asked, .. } if asked.contains("curl evil"))
        );
        let msg = EventKind::Message { text: "x".into() };
        assert_eq!(replayed(3, &msg, Some(&first)).1, Some(false));
        assert_eq!(replayed(3, &other, None).1, None);
        // Prose may differ: only the kind is compared.
        let said = |t: &str| EventKind::AgentMessage {
            text: t.into(),
            text_ref: None,
        };
        assert_eq!(
            replayed(4, &said("b"), Some(&line(4, &said("a")))).1,
            Some(true)
        );
    }

    /// What is kept is fixed-size; what is shown is capped.
    #[test]
    fn records_are_bounded() {
        let big = tool(&"a".repeat(100_000));
        assert_eq!(line(1, &big).asked.len(), 64);
        let (ev, _) = replayed(1, &big, None);
        let EventKind::Replayed { asked, .. } = ev else {
            unreachable!()
        };
        assert!(asked.len() <= SHOWN);
    }
}
