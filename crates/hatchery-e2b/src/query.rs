//! Query strings of the control plane's list calls (`GET /v2/sandboxes`,
//! `GET /snapshots`, a sandbox's metrics): decoded pairs, with malformed
//! ones refused in E2B's error shape, and the page size bound they share.

use crate::api_error::{ApiError, ApiResult};

/// Page size bound of `GET /v2/sandboxes` and `GET /snapshots`.
pub const MAX_PAGE: usize = 100;

/// The decoded `key=value` pairs of a query string.
pub(crate) fn form_pairs(q: &str) -> ApiResult<Vec<(String, String)>> {
    let mut out = vec![];
    for part in q.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = part.split_once('=').unwrap_or((part, ""));
        out.push((pct_decode(k)?, pct_decode(v)?));
    }
    Ok(out)
}

/// Why a query component could not be decoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum PctError {
    #[error("malformed percent-encoding in the query")]
    Escape,
    #[error("query is not UTF-8")]
    Utf8,
}

impl From<PctError> for ApiError {
    fn from(e: PctError) -> Self {
        ApiError::bad(e.to_string())
    }
}

/// Percent-decoding of one query component (`+` is a space); the list
/// filter's `metadata` parameter is decoded once more with it, and envd's
/// file routes decode their query with it too.
pub(crate) fn pct_decode(s: &str) -> Result<String, PctError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let h = s
                    .get(i + 1..i + 3)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or(PctError::Escape)?;
                out.push(h);
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| PctError::Utf8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_decode_and_bad_ones_say_why() {
        assert_eq!(pct_decode("a+b%2Fc%3d").unwrap(), "a b/c=");
        assert_eq!(pct_decode("%").unwrap_err(), PctError::Escape);
        assert_eq!(pct_decode("%4").unwrap_err(), PctError::Escape);
        assert_eq!(pct_decode("%zz").unwrap_err(), PctError::Escape);
        assert_eq!(pct_decode("%ff").unwrap_err(), PctError::Utf8);
        assert_eq!(
            form_pairs("limit=5&metadata=k%3Dv&&flag").unwrap(),
            vec![
                ("limit".into(), "5".into()),
                ("metadata".into(), "k=v".into()),
                ("flag".into(), String::new())
            ]
        );
    }
}
