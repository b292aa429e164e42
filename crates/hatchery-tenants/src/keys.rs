//! Tenant keys: `htk_` and 64 hex digits (32 random bytes). Stored only as
//! the SHA-256 of the whole key (hex) and a display prefix; a key that is
//! not shaped like one is refused before any lookup.

use rand::RngCore;
use sha2::{Digest, Sha256};

/// Every tenant key starts with this, so it is told from the operator key
/// and from E2B's keys at a glance.
pub const KEY_PREFIX: &str = "htk_";
const SECRET_HEX: usize = 64;
/// How much of a key is kept for display: `htk_` and 8 hex digits.
pub const DISPLAY_CHARS: usize = KEY_PREFIX.len() + 8;

/// A new key and its stored hash.
pub fn generate() -> (String, String) {
    let mut bytes = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut bytes);
    let key = format!("{KEY_PREFIX}{}", hex(&bytes));
    let hash = hash(&key);
    (key, hash)
}

/// The stored form of a key.
pub fn hash(key: &str) -> String {
    hex(&Sha256::digest(key.as_bytes()))
}

/// Whether `key` is shaped like a tenant key (not whether it exists).
pub fn well_formed(key: &str) -> bool {
    key.len() == KEY_PREFIX.len() + SECRET_HEX
        && key.starts_with(KEY_PREFIX)
        && key[KEY_PREFIX.len()..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

pub fn display_prefix(key: &str) -> String {
    key.chars().take(DISPLAY_CHARS).collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_well_formed_distinct_and_hashed() {
        let (a, ha) = generate();
        let (b, hb) = generate();
        assert!(well_formed(&a) && well_formed(&b));
        assert_ne!(a, b);
        assert_ne!(ha, hb);
        assert_eq!(hash(&a), ha);
        assert!(
            !ha.contains(&a[KEY_PREFIX.len()..]),
            "the hash is not the key"
        );
        assert_eq!(display_prefix(&a).len(), DISPLAY_CHARS);
        for bad in ["", "htk_", "hx_0000", &a[..a.len() - 1], &a.to_uppercase()] {
            assert!(!well_formed(bad), "{bad:?}");
        }
    }
}
