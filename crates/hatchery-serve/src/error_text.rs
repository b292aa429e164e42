//! An error as one line with its causes, for an answer's message (a 400
//! or a refusal a guest reads) where the error chain would otherwise be
//! lost; logs use tracing's fields instead.

/// `e`, then each of its sources, joined by ": ".
pub fn with_causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut m = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        m.push_str(": ");
        m.push_str(&c.to_string());
        cause = c.source();
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Outer(std::io::Error);

    impl std::fmt::Display for Outer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("not a broker write")
        }
    }

    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn an_error_says_its_causes() {
        let e = Outer(std::io::Error::other("unknown variant `drop`"));
        assert_eq!(
            with_causes(&e),
            "not a broker write: unknown variant `drop`"
        );
    }
}
