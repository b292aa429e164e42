use rand::Rng;

const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";

/// `sbx_` + 16 random characters (~82 bits). Short on purpose: the id is
/// part of unix socket paths, which are capped at 107 bytes.
pub fn new_sandbox_id() -> String {
    let mut rng = rand::thread_rng();
    let tail: String = (0..16)
        .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
        .collect();
    format!("sbx_{tail}")
}

pub fn new_snapshot_id() -> String {
    format!("snap_{}", &new_sandbox_id()[4..])
}

pub fn valid_snapshot_id(id: &str) -> bool {
    id.len() == 21 && id.starts_with("snap_") && id[5..].bytes().all(|b| ALPHABET.contains(&b))
}

/// Ids come from URLs; anything else is rejected before it reaches a path.
pub fn valid_sandbox_id(id: &str) -> bool {
    id.len() == 20 && id.starts_with("sbx_") && id[4..].bytes().all(|b| ALPHABET.contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn ids_are_valid_and_distinct() {
        let a = new_sandbox_id();
        assert!(valid_sandbox_id(&a));
        assert_ne!(a, new_sandbox_id());
        assert!(!valid_sandbox_id("sbx_../../etc/passwd"));
        assert!(!valid_sandbox_id("sbx_ABCDEFGHIJKLMNOP"));
        assert!(valid_snapshot_id(&new_snapshot_id()));
        assert!(!valid_snapshot_id("snap_../../../etc/x"));
    }
}
