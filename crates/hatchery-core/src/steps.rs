//! Where the time of a multi-step operation went (a snapshot, a fork),
//! logged with its outcome: `docs/benchmarks.md` breaks snapshots and
//! forks down from these lines, and an operator can see which step of a
//! slow one was slow. A step is the time since the previous mark.
//!
//! The marks of a fork are made deep in the create path (`start_row`,
//! `boot`) that plain creates share; a task-local collects them only
//! inside [`Steps::scope`], so elsewhere [`mark`] does nothing and no
//! signature carries a timer.

use std::cell::RefCell;
use std::fmt;
use std::future::Future;
use std::time::{Duration, Instant};

tokio::task_local! {
    static CURRENT: RefCell<Steps>;
}

#[derive(Debug, Clone)]
pub(crate) struct Steps {
    last: Instant,
    done: Vec<(&'static str, Duration)>,
}

impl Steps {
    pub(crate) fn new() -> Steps {
        Steps {
            last: Instant::now(),
            done: Vec::new(),
        }
    }

    /// Ends step `name` now.
    pub(crate) fn mark(&mut self, name: &'static str) {
        let now = Instant::now();
        self.done.push((name, now - self.last));
        self.last = now;
    }

    /// Runs `f` with a fresh timer that [`mark`] reaches; returns what it
    /// returned and the steps it marked.
    pub(crate) async fn scope<T>(f: impl Future<Output = T>) -> (T, Steps) {
        CURRENT
            .scope(RefCell::new(Steps::new()), async move {
                let out = f.await;
                (out, CURRENT.with(|s| s.borrow().clone()))
            })
            .await
    }
}

/// Ends step `name` of the operation this task is timing, if any.
pub(crate) fn mark(name: &'static str) {
    let _ = CURRENT.try_with(|s| s.borrow_mut().mark(name));
}

impl fmt::Display for Steps {
    /// `name=12.3 other=4.5` (milliseconds).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (name, d)) in self.done.iter().enumerate() {
            let sep = if i == 0 { "" } else { " " };
            write!(f, "{sep}{name}={:.1}", d.as_secs_f64() * 1000.0)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn marks_inside_a_scope_are_collected_and_outside_ignored() {
        mark("outside");
        let (v, steps) = Steps::scope(async {
            mark("a");
            tokio::time::sleep(Duration::from_millis(20)).await;
            mark("b");
            7
        })
        .await;
        assert_eq!(v, 7);
        let names: Vec<_> = steps.done.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["a", "b"]);
        assert!(steps.done[1].1 >= Duration::from_millis(20));
        let shown = steps.to_string();
        assert!(shown.starts_with("a=") && shown.contains(" b="), "{shown}");
    }
}
