//! User-defined file metadata (envd 0.6.2): an upload's `X-Metadata-<key>:
//! <value>` headers become the file's `user.e2b.<key>` extended attributes
//! (set by the guest helper, `guest/fsop.py`), and every entry info
//! (`Stat`, `ListDir`, `Move`, watch events, the upload's answer) reports
//! them back with the prefix stripped. The rules are envd's, checked here
//! before anything is written so a bad set leaves no file behind.

use axum::http::HeaderMap;
use std::collections::BTreeMap;

/// The header prefix; matched without regard to case, as HTTP header
/// names are.
const HEADER_PREFIX: &str = "x-metadata-";
/// The attribute namespace the keys live under in the sandbox.
pub const XATTR_PREFIX: &str = "user.e2b.";
/// Longest key: Linux caps an attribute's whole name at 255 bytes.
pub const MAX_KEY_BYTES: usize = 255 - XATTR_PREFIX.len();
/// Most metadata on one file, counting each key's stored name (prefix and
/// key) and its value: within what ext4 keeps on one inode, as envd caps it.
pub const MAX_TOTAL_BYTES: usize = 4096;

/// Why an upload's metadata was refused (400).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum MetadataError {
    #[error("invalid metadata: key {key:?} is longer than {MAX_KEY_BYTES} bytes")]
    KeyTooLong { key: String },
    #[error("invalid metadata: the value for key {key:?} has a byte that is not printable US-ASCII (0x{byte:02x} at offset {at})")]
    NotPrintable { key: String, byte: u8, at: usize },
    #[error("invalid metadata: {total} bytes in all, more than {MAX_TOTAL_BYTES}")]
    TooLarge { total: usize },
}

fn printable(key: &str, s: &[u8]) -> Result<(), MetadataError> {
    match s.iter().position(|b| !(0x20..=0x7e).contains(b)) {
        None => Ok(()),
        Some(at) => Err(MetadataError::NotPrintable {
            key: key.into(),
            byte: s[at],
            at,
        }),
    }
}

/// The metadata an upload sets: its `X-Metadata-*` headers, prefix
/// stripped and keys lowercased; the first value of a repeated header
/// wins, and a bare `X-Metadata-` is ignored (as envd). Empty when there
/// are none, which clears the file's metadata.
pub fn from_headers(h: &HeaderMap) -> Result<BTreeMap<String, String>, MetadataError> {
    let mut out = BTreeMap::new();
    // Header names arrive lowercased and are HTTP tokens, so a key is
    // printable ASCII already; values may hold tabs and bytes above 0x7e.
    for name in h.keys() {
        let Some(key) = name.as_str().strip_prefix(HEADER_PREFIX) else {
            continue;
        };
        if key.is_empty() || out.contains_key(key) {
            continue;
        }
        if key.len() > MAX_KEY_BYTES {
            return Err(MetadataError::KeyTooLong { key: key.into() });
        }
        let Some(value) = h.get(name) else { continue };
        printable(key, value.as_bytes())?;
        // Printable ASCII, so the bytes are a str.
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        out.insert(key.to_string(), value);
    }
    let total: usize = out
        .iter()
        .map(|(k, v)| XATTR_PREFIX.len() + k.len() + v.len())
        .sum();
    if total > MAX_TOTAL_BYTES {
        return Err(MetadataError::TooLarge { total });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderName, HeaderValue};

    fn headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_bytes(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn headers_become_lowercased_keys() {
        let h = headers(&[
            ("X-Metadata-Author", b"Mish"),
            ("x-metadata-purpose", b"upload it"),
            ("X-Metadata-", b"ignored"),
            ("Content-Type", b"text/plain"),
            ("X-Metadata-Author", b"second"),
        ]);
        let m = from_headers(&h).unwrap();
        assert_eq!(
            m,
            BTreeMap::from([
                ("author".to_string(), "Mish".to_string()),
                ("purpose".to_string(), "upload it".to_string()),
            ])
        );
        assert!(from_headers(&HeaderMap::new()).unwrap().is_empty());
        // An empty value is a value.
        let m = from_headers(&headers(&[("x-metadata-k", b"")])).unwrap();
        assert_eq!(m["k"], "");
    }

    #[test]
    fn values_must_be_printable_ascii() {
        // (Control bytes but tab never get this far: HTTP refuses them.)
        for bad in [&b"tab\there"[..], b"\xff", "é".as_bytes()] {
            let e = from_headers(&headers(&[("x-metadata-k", bad)])).unwrap_err();
            assert!(matches!(e, MetadataError::NotPrintable { .. }), "{e}");
        }
        assert!(from_headers(&headers(&[("x-metadata-k", b" ~!")])).is_ok());
    }

    #[test]
    fn caps_are_exact() {
        let key = "k".repeat(MAX_KEY_BYTES);
        let name = format!("x-metadata-{key}");
        assert!(from_headers(&headers(&[(name.as_str(), b"v")])).is_ok());
        let name = format!("x-metadata-{key}k");
        assert!(matches!(
            from_headers(&headers(&[(name.as_str(), b"v")])),
            Err(MetadataError::KeyTooLong { .. })
        ));
        // One key whose stored name and value add up to the cap exactly.
        let v = "v".repeat(MAX_TOTAL_BYTES - XATTR_PREFIX.len() - 1);
        assert!(from_headers(&headers(&[("x-metadata-a", v.as_bytes())])).is_ok());
        let v = format!("{v}v");
        assert_eq!(
            from_headers(&headers(&[("x-metadata-a", v.as_bytes())])),
            Err(MetadataError::TooLarge {
                total: MAX_TOTAL_BYTES + 1
            })
        );
    }
}
