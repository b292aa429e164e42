//! Tiny glob matcher for tool names and argument values: `*` matches any run
//! of characters (including none), `?` exactly one, everything else itself.
//! No classes or escapes, so a pattern cannot be expensive: matching is
//! O(pattern × text) at worst with the usual backtracking-on-last-star walk.

pub fn matches(pattern: &str, text: &str) -> bool {
    let p = pattern.as_bytes();
    let t = text.as_bytes();
    // Fast paths for the common shapes.
    if !p.iter().any(|&c| c == b'*' || c == b'?') {
        return p == t;
    }
    let (mut pi, mut ti) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == b'?' || p[pi] == t[ti]) && p[pi] != b'*' {
            // `?` consumes one UTF-8 byte; see below for multibyte chars.
            if p[pi] == b'?' {
                ti += utf8_len(t[ti]);
            } else {
                ti += 1;
            }
            pi += 1;
        } else if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            let next = st + utf8_len(t[st]);
            star = Some((sp, next));
            pi = sp + 1;
            ti = next;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == b'*' {
        pi += 1;
    }
    pi == p.len()
}

fn utf8_len(b: u8) -> usize {
    match b {
        0x00..=0x7f => 1,
        0xc0..=0xdf => 2,
        0xe0..=0xef => 3,
        0xf0..=0xf7 => 4,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn globs() {
        assert!(matches("git_push", "git_push"));
        assert!(!matches("git_push", "git_push2"));
        assert!(matches("mcp.*", "mcp.git.status"));
        assert!(matches("*", ""));
        assert!(matches("a*b*c", "aXXbYYc"));
        assert!(!matches("a*b*c", "aXXbYY"));
        assert!(matches("feature/*", "feature/x"));
        assert!(!matches("feature/*", "feature"));
        assert!(matches("?", "é"));
        assert!(!matches("??", "é"));
        assert!(matches("*.txt", "a.b.txt"));
        assert!(!matches("*.txt", "a.txt.gz"));
    }
}
