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

/// Percent-decoding of one query component (`+` is a space); the list
/// filter's `metadata` parameter is decoded once more with it.
pub(crate) fn pct_decode(s: &str) -> ApiResult<String> {
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
                    .ok_or_else(|| ApiError::bad("malformed percent-encoding in the query"))?;
                out.push(h);
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| ApiError::bad("query is not UTF-8"))
}
