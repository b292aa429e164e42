//! The events a visitor's run produces (what the gateway streams and what the
//! cache stores). The daemon's SSE stream is parsed by hatchery-client.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    pub fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    pub stream: Stream,
    pub data: String,
}

/// The last event of a run. `exit_code` is absent when the gateway stopped
/// the command itself (time limit, output cap) before it exited.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Exit {
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    pub truncated: bool,
    pub oom_killed: bool,
    pub duration_ms: u64,
    pub cached: bool,
    /// The exception a run_code snippet ended with (its traceback went to
    /// stderr); null otherwise, and for `sys.exit`.
    pub exception: Option<Exception>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Exception {
    pub name: String,
    pub value: String,
}

/// Cuts `s` to at most `max` bytes on a character boundary.
pub fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_on_char_boundary() {
        assert_eq!(cut("héllo", 2), "h");
        assert_eq!(cut("héllo", 3), "hé");
        assert_eq!(cut("abc", 10), "abc");
    }
}
