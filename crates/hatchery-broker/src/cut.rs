//! Capping text the broker passes on (call arguments in events, server
//! descriptions, command output in results) at a byte budget.
//!
//! Its own module because the call path (service.rs) and the MCP client
//! (mcp.rs) both cap text, and the MCP client must not depend on the
//! service that uses it.

/// `s` cut to at most `n` bytes, on a character boundary.
pub(crate) fn cut(s: &str, n: usize) -> String {
    if s.len() <= n {
        return s.to_string();
    }
    let mut e = n;
    while !s.is_char_boundary(e) {
        e -= 1;
    }
    s[..e].to_string()
}

#[cfg(test)]
mod tests {
    use super::cut;

    #[test]
    fn cuts_on_a_character_boundary() {
        assert_eq!(cut("short", 10), "short");
        assert_eq!(cut("abcdef", 3), "abc");
        // "é" is two bytes: a cut inside it keeps it out whole.
        assert_eq!(cut("aé", 2), "a");
    }
}
