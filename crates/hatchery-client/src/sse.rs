//! An incremental parser for server-sent events (the daemon's exec, code,
//! process-output and template-build streams).

#[derive(Debug, thiserror::Error)]
pub enum SseError {
    #[error("SSE line over {0} bytes")]
    LineTooLong(usize),
}

/// One event as the daemon sent it: its name and its (JSON) data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub event: String,
    pub data: String,
}

impl SseEvent {
    /// The data parsed as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.data).unwrap_or(serde_json::Value::Null)
    }
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
        assert_eq!(all[0].json()["data"], "1\n");
    }

    #[test]
    fn multi_line_data_is_joined() {
        let mut p = SseParser::new(1024);
        let evs = p.feed(b"data: a\ndata: b\n\n").unwrap();
        assert_eq!(evs[0].data, "a\nb");
        assert_eq!(evs[0].event, "");
    }

    #[test]
    fn bounded_line() {
        let mut p = SseParser::new(10);
        assert!(p.feed(&[b'x'; 11]).is_err());
        let mut p = SseParser::new(10);
        assert!(p.feed(&[b'x'; 10]).is_ok());
    }
}
