use rand::Rng;

/// `prefix_` and 16 characters from `[a-z0-9]`.
pub fn new_id(prefix: &str) -> String {
    const ALPHA: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut r = rand::thread_rng();
    let tail: String = (0..16)
        .map(|_| ALPHA[r.gen_range(0..ALPHA.len())] as char)
        .collect();
    format!("{prefix}_{tail}")
}

pub fn valid(prefix: &str, id: &str) -> bool {
    id.strip_prefix(prefix)
        .and_then(|t| t.strip_prefix('_'))
        .is_some_and(|t| {
            t.len() == 16
                && t.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        })
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids() {
        let id = super::new_id("ses");
        assert!(super::valid("ses", &id));
        assert!(!super::valid("ses", "ses_x"));
        assert!(!super::valid("apr", &id));
    }
}
