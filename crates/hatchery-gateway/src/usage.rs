//! Reading token usage out of upstream answers, whole or streamed, for the
//! two wire formats the gateway speaks.

use crate::budget::Amount;
use crate::pricing::Price;
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// OpenAI chat completions: `usage.prompt_tokens`/`completion_tokens`;
    /// streamed, the last chunk carries `usage` when the request asked for
    /// it with `stream_options.include_usage` (the gateway always does).
    OpenAi,
    /// Anthropic messages: `usage.input_tokens`/`output_tokens`; streamed,
    /// `message_start` has the input and `message_delta` the output so far.
    Anthropic,
}

impl Flavor {
    /// The API's name, as metrics and session events give it.
    pub fn name(self) -> &'static str {
        match self {
            Flavor::OpenAi => "openai",
            Flavor::Anthropic => "anthropic",
        }
    }
}

/// What the upstream reported a call used: input tokens (cache reads and
/// writes included), output tokens, and the cache writes among the input
/// (priced twice: a cache write costs up to twice the input price).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reported {
    pub input: u64,
    pub output: u64,
    pub cache_write: u64,
}

impl Reported {
    pub fn nothing() -> Self {
        Reported {
            input: 0,
            output: 0,
            cache_write: 0,
        }
    }

    pub fn amount(&self, price: &Price) -> Amount {
        Amount {
            tokens: self.input.saturating_add(self.output),
            usd_cents: price.cents(self.input.saturating_add(self.cache_write), self.output),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    /// Anthropic counts prompt-cache writes and reads apart from
    /// `input_tokens`; both are input the call was billed for. (OpenAI's
    /// `prompt_tokens` already includes its cached tokens.)
    pub cache_write_tokens: u64,
    pub cache_read_tokens: u64,
}

impl Usage {
    /// What was reported, once both input and output are known.
    pub fn complete(&self) -> Option<Reported> {
        let input = self
            .input_tokens?
            .saturating_add(self.cache_write_tokens)
            .saturating_add(self.cache_read_tokens);
        Some(Reported {
            input,
            output: self.output_tokens?,
            cache_write: self.cache_write_tokens,
        })
    }

    fn take(&mut self, v: &Value, input: &str, output: &str) {
        if let Some(n) = v.get(input).and_then(Value::as_u64) {
            self.input_tokens = Some(n);
        }
        if let Some(n) = v.get(output).and_then(Value::as_u64) {
            self.output_tokens = Some(n);
        }
        if let Some(n) = v.get("cache_creation_input_tokens").and_then(Value::as_u64) {
            self.cache_write_tokens = n;
        }
        if let Some(n) = v.get("cache_read_input_tokens").and_then(Value::as_u64) {
            self.cache_read_tokens = n;
        }
    }

    /// Usage in a whole (non-streamed) answer.
    pub fn of_body(flavor: Flavor, v: &Value) -> Usage {
        let mut u = Usage::default();
        if let Some(x) = v.get("usage") {
            match flavor {
                Flavor::OpenAi => u.take(x, "prompt_tokens", "completion_tokens"),
                Flavor::Anthropic => u.take(x, "input_tokens", "output_tokens"),
            }
        }
        u
    }

    /// Folds one streamed SSE `data:` payload in.
    pub fn feed_event(&mut self, flavor: Flavor, data: &str) {
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            return;
        };
        match flavor {
            Flavor::OpenAi => {
                if let Some(x) = v.get("usage").filter(|x| !x.is_null()) {
                    self.take(x, "prompt_tokens", "completion_tokens");
                }
            }
            Flavor::Anthropic => match v.get("type").and_then(Value::as_str) {
                Some("message_start") => {
                    if let Some(x) = v.pointer("/message/usage") {
                        self.take(x, "input_tokens", "output_tokens");
                    }
                }
                Some("message_delta") => {
                    if let Some(x) = v.get("usage") {
                        self.take(x, "input_tokens", "output_tokens");
                    }
                }
                _ => {}
            },
        }
    }
}

/// Splits a byte stream into SSE `data:` payloads, across chunk borders.
#[derive(Default)]
pub struct SseData {
    buf: Vec<u8>,
}

/// Longest line kept while looking for usage; longer ones are skipped (the
/// bytes still pass through to the client untouched).
const MAX_LINE: usize = 1 << 20;

impl SseData {
    pub fn push(&mut self, chunk: &[u8], mut on_data: impl FnMut(&str)) {
        self.buf.extend_from_slice(chunk);
        while let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=i).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches(['\r', '\n']);
            if let Some(d) = line.strip_prefix("data:") {
                on_data(d.trim_start());
            }
        }
        if self.buf.len() > MAX_LINE {
            self.buf.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn r(input: u64, output: u64) -> Reported {
        Reported {
            input,
            output,
            cache_write: 0,
        }
    }

    #[test]
    fn whole_answers() {
        let o = json!({"usage": {"prompt_tokens": 12, "completion_tokens": 3}});
        assert_eq!(
            Usage::of_body(Flavor::OpenAi, &o).complete(),
            Some(r(12, 3))
        );
        let a = json!({"usage": {"input_tokens": 7, "output_tokens": 9}});
        assert_eq!(
            Usage::of_body(Flavor::Anthropic, &a).complete(),
            Some(r(7, 9))
        );
        let cached = json!({"usage": {"input_tokens": 7, "output_tokens": 9,
            "cache_creation_input_tokens": 100, "cache_read_input_tokens": 50}});
        assert_eq!(
            Usage::of_body(Flavor::Anthropic, &cached).complete(),
            Some(Reported {
                input: 157,
                output: 9,
                cache_write: 100
            })
        );
        assert_eq!(Usage::of_body(Flavor::OpenAi, &json!({})).complete(), None);
    }

    #[test]
    fn streams_split_anywhere() {
        let s = "data: {\"choices\":[],\"usage\":null}\n\ndata: {\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n";
        for cut in 0..s.len() {
            let (mut p, mut u) = (SseData::default(), Usage::default());
            p.push(&s.as_bytes()[..cut], |d| u.feed_event(Flavor::OpenAi, d));
            p.push(&s.as_bytes()[cut..], |d| u.feed_event(Flavor::OpenAi, d));
            assert_eq!(u.complete(), Some(r(5, 2)), "cut at {cut}");
        }
        let a = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":4,\"output_tokens\":1}}}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":6}}\n\n";
        let (mut p, mut u) = (SseData::default(), Usage::default());
        p.push(a.as_bytes(), |d| u.feed_event(Flavor::Anthropic, d));
        assert_eq!(u.complete(), Some(r(4, 6)));
    }

    #[test]
    fn cache_writes_are_priced_twice() {
        let p = Price {
            input_cents_per_mtok: 1_000_000,
            output_cents_per_mtok: 0,
        };
        let r = Reported {
            input: 10,
            output: 0,
            cache_write: 4,
        };
        assert_eq!(
            r.amount(&p),
            Amount {
                tokens: 10,
                usd_cents: 14
            }
        );
    }
}
