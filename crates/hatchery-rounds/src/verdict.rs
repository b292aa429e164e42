//! From an exec's outcome to a Run's verdict, and the output tails.

use crate::models::Verdict;
use crate::sandbox::ExecOutcome;

/// The CPU limit is checked first: it is the pass/fail measure, and a
/// process killed for it may also have hit nothing else yet.
pub fn verdict(o: &ExecOutcome, memory_limit_bytes: u64) -> Verdict {
    match o.reason.as_str() {
        // Past its memory limit is a memory verdict whatever stopped it:
        // a hog under load can reach its CPU limit (the host counts the
        // page faults its allocation costs) before its OOM kill lands.
        "oom" => Verdict::MemoryLimit,
        _ if o.oom_killed || o.memory_peak_bytes > memory_limit_bytes => Verdict::MemoryLimit,
        "cpu_limit" => Verdict::TimeLimit,
        "timeout" => Verdict::WallLimit,
        "output_limit" => Verdict::OutputLimit,
        "exited" if o.exit_code == 0 => Verdict::Ok,
        _ => Verdict::RuntimeError,
    }
}

/// The last `max` bytes of `s`, cut at a character boundary.
pub fn tail(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    s[start..].to_string()
}

/// Keeps the last `max` bytes of a stream as it arrives.
pub struct Tail {
    buf: String,
    max: usize,
}

impl Tail {
    pub fn new(max: usize) -> Self {
        Tail {
            buf: String::new(),
            max,
        }
    }
    pub fn push(&mut self, s: &str) {
        self.buf.push_str(s);
        if self.buf.len() > self.max * 2 {
            self.buf = tail(&self.buf, self.max);
        }
    }
    pub fn finish(self) -> String {
        tail(&self.buf, self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(reason: &str, code: i64, peak: u64) -> ExecOutcome {
        ExecOutcome {
            reason: reason.into(),
            exit_code: code,
            memory_peak_bytes: peak,
            ..Default::default()
        }
    }

    #[test]
    fn verdicts() {
        let m = 100;
        assert_eq!(verdict(&out("exited", 0, 1), m), Verdict::Ok);
        assert_eq!(verdict(&out("exited", 1, 1), m), Verdict::RuntimeError);
        assert_eq!(verdict(&out("signaled", 139, 1), m), Verdict::RuntimeError);
        assert_eq!(verdict(&out("cpu_limit", 137, 100), m), Verdict::TimeLimit);
        // Over its memory limit when the CPU limit stopped it: memory.
        assert_eq!(
            verdict(&out("cpu_limit", 137, 1000), m),
            Verdict::MemoryLimit
        );
        assert_eq!(verdict(&out("timeout", 137, 1), m), Verdict::WallLimit);
        assert_eq!(verdict(&out("oom", 137, 1), m), Verdict::MemoryLimit);
        assert_eq!(verdict(&out("exited", 0, 101), m), Verdict::MemoryLimit);
        assert_eq!(verdict(&out("output_limit", 0, 1), m), Verdict::OutputLimit);
    }

    #[test]
    fn tails() {
        assert_eq!(tail("abcdef", 3), "def");
        assert_eq!(tail("ab", 3), "ab");
        assert_eq!(tail("aé", 1), "", "never splits a character");
        let mut t = Tail::new(4);
        for _ in 0..10 {
            t.push("0123456789");
        }
        assert_eq!(t.finish(), "6789");
    }
}
