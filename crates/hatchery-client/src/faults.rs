//! Scripted faults for the in-memory fakes of the products' sandbox ports
//! (feature `faults`): which calls of an operation fail, hang or lose
//! their sandbox. Generic over the fake's operation type and, where a fake
//! needs other effects than [`Effect`], over the effect too; what an
//! effect does is each fake's business.
//!
//! Contract:
//! - [`FaultPlan::take`] is called once per call, before the operation
//!   takes effect. It counts the call ([`FaultPlan::calls`]) and checks
//!   the faults in the order they were injected; a fault matches a call
//!   of its `op` (and, if it has `meta`, only one whose target carries that
//!   metadata pair). Each matching fault counts the call, and the first
//!   one for which it is the `skip`+1-th to `skip`+`times`-th matching call
//!   fires: its effect is returned and later faults do not see the call.
//! - A [`Gate`] holds every [`Gate::wait`] until [`Gate::release`]; after
//!   the release nothing waits any more. [`Gate::hung`] counts the waits
//!   begun.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::watch;

/// The effects the fakes share.
#[derive(Debug, Clone)]
pub enum Effect {
    /// The call answers an error with this message and changes nothing.
    Fail(String),
    /// The call waits for the fake's [`Gate`], then carries on.
    Hang,
    /// The target sandbox is lost before the operation reaches it.
    Vanish,
}

/// One scripted fault: which calls it hits and what it does.
#[derive(Debug, Clone)]
pub struct Fault<Op, E = Effect> {
    pub op: Op,
    /// Only calls whose target carries this metadata pair.
    pub meta: Option<(String, String)>,
    /// Matching calls let through before it fires.
    pub skip: usize,
    /// How many times it fires.
    pub times: usize,
    pub effect: E,
}

impl<Op, E> Fault<Op, E> {
    /// Fires on the next call of `op`, once.
    pub fn on(op: Op, effect: E) -> Self {
        Fault {
            op,
            meta: None,
            skip: 0,
            times: 1,
            effect,
        }
    }
    pub fn skip(mut self, n: usize) -> Self {
        self.skip = n;
        self
    }
    pub fn times(mut self, n: usize) -> Self {
        self.times = n;
        self
    }
    /// Only for calls whose target carries `key` = `value`.
    pub fn meta(mut self, key: &str, value: &str) -> Self {
        self.meta = Some((key.into(), value.into()));
        self
    }
}

/// The faults injected into one fake, and its calls counted by operation.
#[derive(Debug, Clone)]
pub struct FaultPlan<Op, E = Effect> {
    /// Each fault with the matching calls it has seen.
    faults: Vec<(Fault<Op, E>, usize)>,
    calls: Vec<(Op, usize)>,
}

impl<Op, E> Default for FaultPlan<Op, E> {
    fn default() -> Self {
        FaultPlan {
            faults: Vec::new(),
            calls: Vec::new(),
        }
    }
}

impl<Op: Copy + PartialEq, E: Clone> FaultPlan<Op, E> {
    pub fn new() -> Self {
        FaultPlan::default()
    }

    pub fn inject(&mut self, fault: Fault<Op, E>) {
        self.faults.push((fault, 0));
    }

    /// Counts a call of `op` and returns the effect of the fault that fires
    /// on it, if one does. `meta` is the metadata of the call's target
    /// (`None` if it has none; faults with `meta` then never match).
    pub fn take(&mut self, op: Op, meta: Option<&BTreeMap<String, String>>) -> Option<E> {
        match self.calls.iter_mut().find(|(o, _)| *o == op) {
            Some((_, n)) => *n += 1,
            None => self.calls.push((op, 1)),
        }
        for (f, seen) in self.faults.iter_mut() {
            if f.op != op {
                continue;
            }
            if let Some((k, v)) = &f.meta {
                if meta.and_then(|m| m.get(k)) != Some(v) {
                    continue;
                }
            }
            *seen += 1;
            if *seen > f.skip && *seen - f.skip <= f.times {
                return Some(f.effect.clone());
            }
        }
        None
    }

    /// Calls of `op` so far, faulted or not.
    pub fn calls(&self, op: Op) -> usize {
        self.calls
            .iter()
            .find(|(o, _)| *o == op)
            .map_or(0, |(_, n)| *n)
    }
}

/// Holds hung calls until [`Gate::release`].
#[derive(Debug)]
pub struct Gate {
    open: watch::Sender<bool>,
    hung: AtomicUsize,
}

impl Default for Gate {
    fn default() -> Self {
        Gate {
            open: watch::channel(false).0,
            hung: AtomicUsize::new(0),
        }
    }
}

impl Gate {
    pub fn new() -> Gate {
        Gate::default()
    }

    /// Lets every waiting call, and every later one, through.
    pub fn release(&self) {
        self.open.send_replace(true);
    }

    /// Waits begun so far.
    pub fn hung(&self) -> usize {
        self.hung.load(Ordering::SeqCst)
    }

    /// Counts a hung call and waits for the release.
    pub async fn wait(&self) {
        self.hung.fetch_add(1, Ordering::SeqCst);
        let mut rx = self.open.subscribe();
        // The sender lives in `self`: this only ends on release.
        let _ = rx.wait_for(|open| *open).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Op {
        A,
        B,
    }

    #[test]
    fn skip_times_order_and_meta() {
        let mut p: FaultPlan<Op> = FaultPlan::new();
        p.inject(Fault::on(Op::A, Effect::Hang).skip(1).times(2));
        p.inject(Fault::on(Op::A, Effect::Vanish));
        p.inject(Fault::on(Op::B, Effect::Vanish).meta("k", "v"));
        let hits: Vec<_> = (0..5)
            .map(|_| p.take(Op::A, None).map(|e| format!("{e:?}")))
            .collect();
        // The first call passes the first fault (skipped) and fires the
        // second; the next two fire the first; then both are spent.
        assert_eq!(
            hits,
            [
                Some("Vanish".into()),
                Some("Hang".into()),
                Some("Hang".into()),
                None,
                None
            ]
        );
        assert_eq!(p.calls(Op::A), 5);
        let other = BTreeMap::from([("k".to_string(), "w".to_string())]);
        let right = BTreeMap::from([("k".to_string(), "v".to_string())]);
        assert!(p.take(Op::B, None).is_none());
        assert!(p.take(Op::B, Some(&other)).is_none());
        assert!(p.take(Op::B, Some(&right)).is_some());
        assert!(p.take(Op::B, Some(&right)).is_none());
        assert_eq!(p.calls(Op::B), 4);
    }

    #[tokio::test]
    async fn gate_holds_until_released() {
        let g = std::sync::Arc::new(Gate::new());
        let w = tokio::spawn({
            let g = g.clone();
            async move { g.wait().await }
        });
        while g.hung() == 0 {
            tokio::task::yield_now().await;
        }
        assert!(!w.is_finished());
        g.release();
        w.await.unwrap();
        g.wait().await;
        assert_eq!(g.hung(), 2);
    }
}
