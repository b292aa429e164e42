//! The relay's `PROXY UNKNOWN <sandbox id>\r\n` line, read before the
//! guest's bytes (the daemon's relay writes it from the host side of the
//! agent channel; see the module above).

use tokio::io::{AsyncBufReadExt, AsyncReadExt};

/// `PROXY UNKNOWN ` + a sandbox id + CRLF; the relay's line is far shorter.
const MAX_PROXY_LINE: usize = 128;

/// Reads the relay's `PROXY UNKNOWN <id>\r\n` from a buffered stream (what
/// the guest sent after it stays in the buffer for the proxy).
pub(super) async fn read<S: tokio::io::AsyncBufRead + Unpin>(s: &mut S) -> Option<String> {
    let mut line = Vec::with_capacity(64);
    s.take(MAX_PROXY_LINE as u64 + 1)
        .read_until(b'\n', &mut line)
        .await
        .ok()?;
    if !line.ends_with(b"\r\n") {
        return None;
    }
    let text = std::str::from_utf8(&line[..line.len() - 2]).ok()?;
    text.strip_prefix("PROXY UNKNOWN ")
        .filter(|id| {
            !id.is_empty()
                && id
                    .bytes()
                    .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
        })
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::BufReader;

    #[tokio::test]
    async fn proxy_lines() {
        let mut ok = BufReader::new(&b"PROXY UNKNOWN sbx_abc-1\r\nCONNECT x:443 HTTP/1.1\r\n"[..]);
        assert_eq!(read(&mut ok).await.as_deref(), Some("sbx_abc-1"));
        // What follows the line is left for the proxy.
        let mut rest = String::new();
        ok.read_to_string(&mut rest).await.unwrap();
        assert!(rest.starts_with("CONNECT"), "{rest}");
        for bad in [
            &b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n"[..],
            b"PROXY UNKNOWN \r\n",
            b"PROXY UNKNOWN a b\r\n",
            b"PROXY UNKNOWN abc",
        ] {
            let mut b = BufReader::new(bad);
            assert_eq!(read(&mut b).await, None, "{bad:?}");
        }
        let long = [b'a'; 200];
        let mut l = BufReader::new(&long[..]);
        assert_eq!(read(&mut l).await, None);
    }
}
