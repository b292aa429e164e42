//! The events a visitor's run produces (what the gateway streams and what the
//! cache stores), and an incremental parser for the daemon's SSE stream.

use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum SseError {
    #[error("SSE line over {0} bytes")]
    LineTooLong(usize),
}

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

/// One event of the daemon's exec stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub event: String,
    pub data: String,
}

/// Feeds bytes in, gets whole events out. Comment lines (keep-alives) are
/// skipped; a single line is bounded so a broken peer cannot grow memory.
pub struct SseParser {
    buf: Vec<u8>,
    event: String,
    data: Vec<String>,
    max_line: usize,
}

impl SseParser {
    pub fn new(max_line: usize) -> Self {
        SseParser {
            buf: Vec::new(),
            event: String::new(),
            data: Vec::new(),
            max_line,
        }
    }

    pub fn feed(&mut self, bytes: &[u8]) -> Result<Vec<SseEvent>, SseError> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        let mut start = 0;
        while let Some(nl) = self.buf[start..].iter().position(|&b| b == b'\n') {
            let mut line = &self.buf[start..start + nl];
            start += nl + 1;
            if line.last() == Some(&b'\r') {
                line = &line[..line.len() - 1];
            }
            let line = String::from_utf8_lossy(line).into_owned();
            if line.is_empty() {
                if !self.data.is_empty() || !self.event.is_empty() {
                    out.push(SseEvent {
                        event: std::mem::take(&mut self.event),
                        data: std::mem::take(&mut self.data).join("\n"),
                    });
                }
            } else if line.starts_with(':') {
                // keep-alive comment
            } else {
                let (field, value) = line.split_once(':').unwrap_or((&line, ""));
                let value = value.strip_prefix(' ').unwrap_or(value);
                match field {
                    "event" => self.event = value.to_string(),
                    "data" => self.data.push(value.to_string()),
                    _ => {}
                }
            }
        }
        self.buf.drain(..start);
        if self.buf.len() > self.max_line {
            return Err(SseError::LineTooLong(self.max_line));
        }
        Ok(out)
    }
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
    fn parses_split_events() {
        let mut p = SseParser::new(1024);
        let raw = b"event: stdout\ndata: {\"data\":\"1\\n\"}\n\n: keep-alive\n\nevent: exit\r\ndata: {}\r\n\r\n";
        let mut all = Vec::new();
        for chunk in raw.chunks(5) {
            all.extend(p.feed(chunk).unwrap());
        }
        assert_eq!(
            all,
            vec![
                SseEvent {
                    event: "stdout".into(),
                    data: "{\"data\":\"1\\n\"}".into()
                },
                SseEvent {
                    event: "exit".into(),
                    data: "{}".into()
                },
            ]
        );
    }

    #[test]
    fn bounded_line() {
        let mut p = SseParser::new(10);
        assert!(p.feed(&[b'x'; 11]).is_err());
    }

    #[test]
    fn cuts_on_char_boundary() {
        assert_eq!(cut("héllo", 2), "h");
        assert_eq!(cut("héllo", 3), "hé");
        assert_eq!(cut("abc", 10), "abc");
    }
}
