//! How command output is put into JSON: UTF-8 text, where a character split
//! across two chunks is held back until its end arrives (never garbled), or
//! base64 of the raw bytes.

use base64::Engine;
use serde::Deserialize;
use utoipa::ToSchema;

#[derive(Debug, Clone, Copy, Default, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OutputEncoding {
    /// UTF-8; invalid sequences become U+FFFD.
    #[default]
    Text,
    /// The raw bytes, base64 (standard alphabet, padded).
    Base64,
}

impl OutputEncoding {
    pub fn whole(self, bytes: &[u8]) -> String {
        match self {
            OutputEncoding::Text => String::from_utf8_lossy(bytes).into_owned(),
            OutputEncoding::Base64 => base64::engine::general_purpose::STANDARD.encode(bytes),
        }
    }
}

/// Turns a stream of chunks into text without splitting a character: the
/// bytes of an incomplete trailing sequence wait for the next chunk.
#[derive(Debug, Default)]
pub struct Utf8Carry {
    held: Vec<u8>,
}

impl Utf8Carry {
    pub fn push(&mut self, chunk: &[u8]) -> String {
        let mut buf = std::mem::take(&mut self.held);
        buf.extend_from_slice(chunk);
        let keep = incomplete_tail(&buf);
        self.held = buf.split_off(buf.len() - keep);
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// What is left at the end of the stream (an unfinished character).
    pub fn finish(&mut self) -> String {
        String::from_utf8_lossy(&std::mem::take(&mut self.held)).into_owned()
    }
}

/// Length of a trailing, possibly valid but unfinished UTF-8 sequence.
fn incomplete_tail(b: &[u8]) -> usize {
    for back in 1..=3.min(b.len()) {
        let c = b[b.len() - back];
        if c & 0xC0 == 0x80 {
            continue; // a continuation byte: look further back
        }
        let need = match c {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => return 0,
        };
        return if need > back { back } else { 0 };
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_characters_are_joined() {
        let s = "añ€😀".as_bytes();
        for cut in 0..=s.len() {
            let mut c = Utf8Carry::default();
            let got = c.push(&s[..cut]) + &c.push(&s[cut..]) + &c.finish();
            assert_eq!(got, "añ€😀", "cut at {cut}");
        }
        let mut c = Utf8Carry::default();
        assert_eq!(c.push(&[0xE2, 0x82]), "");
        assert_eq!(c.push(&[0xAC, b'x']), "€x");
        assert_eq!(c.push(&[0xFF]), "\u{FFFD}");
        assert_eq!(c.push(&[0xE2]), "");
        assert_eq!(c.finish(), "\u{FFFD}");
    }

    #[test]
    fn base64_is_the_raw_bytes() {
        assert_eq!(OutputEncoding::Base64.whole(&[0xff, 0, 1]), "/wAB");
        assert_eq!(OutputEncoding::Text.whole(b"hi"), "hi");
    }
}
