//! Ids and the clock. Ids are a prefix and 16 random `[a-z0-9]`.

use rand::Rng;

const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";

pub fn new_id(prefix: &str) -> String {
    let mut rng = rand::thread_rng();
    let tail: String = (0..16)
        .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
        .collect();
    format!("{prefix}_{tail}")
}

/// Whether `id` looks like one of ours with this prefix (checked before
/// any lookup, so garbage never reaches the store).
pub fn valid_id(prefix: &str, id: &str) -> bool {
    id.strip_prefix(prefix)
        .and_then(|r| r.strip_prefix('_'))
        .is_some_and(|t| t.len() == 16 && t.bytes().all(|b| ALPHABET.contains(&b)))
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

pub fn rfc3339(ms: u64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids() {
        let id = new_id("rnd");
        assert!(valid_id("rnd", &id), "{id}");
        assert!(!valid_id("ses", &id));
        assert!(!valid_id("rnd", "rnd_../../etc"));
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
    }
}
