//! Every cap on what a round, a Run or a submission may carry, in one
//! place (docs/interviews.md lists them). Checked at the boundary, before
//! anything is created.

use crate::RoundsError;
use std::collections::BTreeMap;

/// JSON request body of every rounds route. Bigger than the biggest legal
/// suite, so an oversized suite gets our own 413 with a message naming it.
pub const MAX_BODY: usize = 4 << 20;
/// Files per set (starter files, tests, a Run's or a submission's files).
pub const MAX_FILES: usize = 64;
pub const MAX_STARTER_BYTES: usize = 512 << 10;
pub const MAX_TESTS_BYTES: usize = 1 << 20;
/// A Run's or a submission's files together.
pub const MAX_RUN_BYTES: usize = 1 << 20;
pub const MAX_PATH_BYTES: usize = 255;
pub const MAX_PATH_DEPTH: usize = 8;
pub const MAX_NAME_BYTES: usize = 200;
pub const MAX_CANDIDATE_BYTES: usize = 200;
pub const MAX_ARGV: usize = 64;
pub const MAX_ARG_BYTES: usize = 4096;
pub const MAX_SETUP_COMMANDS: usize = 32;
pub const MAX_SETUP_COMMAND_BYTES: usize = 16 << 10;
/// Each setup command's deadline.
pub const SETUP_TIMEOUT_S: u64 = 600;
/// How often the reference solution runs at prepare time; the most CPU of
/// these is what the limit is judged against (one run can be the lucky one).
pub const REFERENCE_RUNS: usize = 3;
/// A round's CPU limit must be at least this many halves of the reference
/// solution's CPU: 1.5×, the headroom issue 34 asks for.
pub const REFERENCE_HEADROOM_HALVES: u64 = 3;
pub const MAX_CPU_LIMIT_MS: u64 = 600_000;
pub const MAX_WALL_LIMIT_MS: u64 = 3_600_000;
pub const MIN_WALL_LIMIT_MS: u64 = 1_000;
pub const DEFAULT_OUTPUT_LIMIT: u64 = 1 << 20;
pub const MAX_OUTPUT_LIMIT: u64 = 16 << 20;
/// What a Run answer carries of each stream: the tail.
pub const STDOUT_TAIL: usize = 16_000;
pub const STDERR_TAIL: usize = 4_000;
/// Output a Run streams live over SSE before it only counts.
pub const STREAM_FORWARD_BYTES: usize = 64 << 10;
pub const DEFAULT_SESSION_S: u64 = 3600;
pub const MIN_SESSION_S: u64 = 60;
pub const MAX_SESSION_S: u64 = 12 * 3600;
/// TTL of a session's sandbox past the session length: the outermost
/// deadline, enforced outside the guest.
pub const SESSION_SLACK_S: u64 = 900;
pub const DEFAULT_RETENTION_S: u64 = 7 * 24 * 3600;
pub const MAX_RETENTION_S: u64 = 90 * 24 * 3600;
pub const DEFAULT_REVIEWER_TOKEN_S: u64 = 7 * 24 * 3600;
pub const MAX_REVIEWER_TOKEN_S: u64 = 90 * 24 * 3600;
/// The live room (src/room/). One WebSocket message (a Yjs sync or
/// awareness message; a browser's keystroke is well under 1 KiB, pasting
/// a whole file fits): larger closes that connection.
pub const MAX_ROOM_MESSAGE_BYTES: usize = 256 << 10;
/// The sum of a session's accepted document updates, its seed included.
/// Every byte of the document arrived in one of them, so this bounds the
/// document (and its log) too; an update past it is refused and closes
/// that connection (an hour of steady typing logs well under 2 MiB).
pub const MAX_DOC_LOG_BYTES: u64 = 8 << 20;
/// Messages per second one connection may send, as a token bucket: this
/// steady rate after a burst of [`ROOM_RATE_BURST`]. Past it the
/// connection is closed (4429); the client reconnects and resyncs.
pub const ROOM_RATE_PER_S: f64 = 100.0;
pub const ROOM_RATE_BURST: f64 = 200.0;
/// Open WebSockets on one session's room, every member's tabs counted.
pub const MAX_ROOM_CONNECTIONS: usize = 8;
/// Distinct members (tokens, and the API key) in one session's room.
pub const MAX_ROOM_MEMBERS: usize = 4;
/// Presence entries (Yjs awareness client ids) one connection may own.
pub const MAX_AWARENESS_CLIENTS: usize = 4;
/// Messages queued for one slow receiver before it is dropped (it
/// reconnects and resyncs from the server's document).
pub const ROOM_FANOUT_QUEUE: usize = 1024;
/// Playback checkpoints (`room/checkpoint.rs`): the document's whole state
/// stored beside its log, so `document?at=` replays only the entries past
/// the nearest one. A checkpoint is taken at least this many entries after
/// the previous one...
pub const DOC_CHECKPOINT_MIN_ENTRIES: u64 = 256;
/// ...and only when it is at most twice the update bytes since the
/// previous one, so a session's checkpoints never add up to more than
/// twice its log. These two caps hold the total regardless: past either,
/// no further checkpoint is stored (playback replays a longer tail).
pub const MAX_DOC_CHECKPOINTS: usize = 512;
pub const MAX_DOC_CHECKPOINT_BYTES: u64 = 2 * MAX_DOC_LOG_BYTES;
/// The interviewers' notes on one session.
pub const MAX_NOTES_BYTES: usize = 64 << 10;
/// Runs kept per session for the reviewer (oldest go first).
pub const RUNS_KEPT: usize = 200;
/// Forks a replay may have at once.
pub const MAX_FORKS_PER_REPLAY: usize = 8;
pub const FORK_TTL_S: u64 = 3600;
/// Where candidate files live in every sandbox of a round.
pub const WORKDIR: &str = "/work";
/// Where the grader keeps the hidden tests and the runner (grader only).
pub const GRADER_DIR: &str = "/opt/hatchery-grader";

/// A file name inside the work dir: relative, normalized, plain
/// characters, no `..`. Anything else would let a starter file or a Run
/// write outside `/work` (or into the grader's directory).
pub fn check_path(p: &str) -> Result<(), RoundsError> {
    let bad = |why: &str| Err(RoundsError::Invalid(format!("file name {p:?}: {why}")));
    if p.is_empty() || p.len() > MAX_PATH_BYTES {
        return bad("must be 1..255 bytes");
    }
    if p.starts_with('/') {
        return bad("must be relative to the work dir");
    }
    let parts: Vec<&str> = p.split('/').collect();
    if parts.len() > MAX_PATH_DEPTH {
        return bad("too deep (8 components at most)");
    }
    for c in parts {
        if c.is_empty() || c == "." || c == ".." {
            return bad("no empty, '.' or '..' components (path traversal)");
        }
        if !c
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            return bad("use only [A-Za-z0-9._-] and '/'");
        }
    }
    Ok(())
}

/// A file set: count, names, and total size (413 over `max_bytes`).
pub fn check_files(
    what: &str,
    files: &BTreeMap<String, String>,
    max_bytes: usize,
) -> Result<(), RoundsError> {
    if files.len() > MAX_FILES {
        return Err(RoundsError::TooLarge(format!(
            "{what}: {} files, at most {MAX_FILES}",
            files.len()
        )));
    }
    let total: usize = files.iter().map(|(k, v)| k.len() + v.len()).sum();
    if total > max_bytes {
        return Err(RoundsError::TooLarge(format!(
            "{what}: {total} bytes, at most {max_bytes}"
        )));
    }
    for p in files.keys() {
        check_path(p)?;
    }
    Ok(())
}

/// An argv: a JSON array of non-empty strings, never a shell string.
pub fn check_argv(what: &str, v: &serde_json::Value) -> Result<Vec<String>, RoundsError> {
    let arr = v.as_array().ok_or_else(|| {
        RoundsError::Invalid(format!(
            "{what} must be an argv array of strings, not a shell string"
        ))
    })?;
    if arr.is_empty() || arr.len() > MAX_ARGV {
        return Err(RoundsError::Invalid(format!(
            "{what} must have 1..{MAX_ARGV} elements"
        )));
    }
    arr.iter()
        .map(|a| match a.as_str() {
            Some(s) if !s.is_empty() && s.len() <= MAX_ARG_BYTES && !s.contains('\0') => {
                Ok(s.to_string())
            }
            _ => Err(RoundsError::Invalid(format!(
                "{what}: every element must be a non-empty string of at most {MAX_ARG_BYTES} bytes without NUL"
            ))),
        })
        .collect()
}

pub fn within(name: &str, v: u64, min: u64, max: u64) -> Result<u64, RoundsError> {
    if v < min || v > max {
        return Err(RoundsError::Invalid(format!(
            "{name} must be between {min} and {max}"
        )));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        for ok in ["solution.py", "pkg/mod.py", ".hidden", "a-b_c.txt"] {
            assert!(check_path(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../b",
            "a//b",
            "./a",
            "a b",
            "a\\b",
            "x\0",
        ] {
            assert!(check_path(bad).is_err(), "{bad:?}");
        }
        assert!(check_path(&"a/".repeat(9)).is_err());
    }

    #[test]
    fn sizes_at_the_boundary() {
        let mut f = BTreeMap::new();
        f.insert("a".to_string(), "x".repeat(MAX_TESTS_BYTES - 1));
        assert!(check_files("tests", &f, MAX_TESTS_BYTES).is_ok());
        f.insert("a".to_string(), "x".repeat(MAX_TESTS_BYTES));
        assert!(matches!(
            check_files("tests", &f, MAX_TESTS_BYTES),
            Err(RoundsError::TooLarge(_))
        ));
        let many: BTreeMap<_, _> = (0..=MAX_FILES)
            .map(|i| (format!("f{i}"), String::new()))
            .collect();
        assert!(matches!(
            check_files("x", &many, MAX_TESTS_BYTES),
            Err(RoundsError::TooLarge(_))
        ));
    }

    #[test]
    fn argv_only() {
        assert!(check_argv("runner", &serde_json::json!("python3 run.py; rm -rf /")).is_err());
        assert!(check_argv("runner", &serde_json::json!([])).is_err());
        assert!(check_argv("runner", &serde_json::json!(["python3", 3])).is_err());
        assert_eq!(
            check_argv("runner", &serde_json::json!(["python3", "r.py"])).unwrap(),
            vec!["python3", "r.py"]
        );
    }
}
