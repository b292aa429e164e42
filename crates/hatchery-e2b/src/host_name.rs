//! The shape of a DNS name, as E2B's allow and deny lists (network.rs)
//! and its header-transform rules (header_rules.rs) take them.

/// A DNS name's shape: at most 253 bytes, dot-separated labels of 1-63
/// ASCII letters, digits and inner hyphens.
pub(crate) fn is_dns_name(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_of_letters_digits_and_inner_hyphens() {
        assert!(is_dns_name("api.example.com"));
        assert!(is_dns_name("a-1.b"));
        for bad in [
            "",
            "a..b",
            "-a.b",
            "a-.b",
            "a_b.c",
            &"a".repeat(64),
            &"a.".repeat(127),
        ] {
            assert!(!is_dns_name(bad), "{bad:?}");
        }
    }
}
