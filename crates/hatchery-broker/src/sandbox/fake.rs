//! An in-memory [`SandboxAccess`] for tests: no daemon, no root, no gVisor.
//!
//! Contract (what a test may rely on):
//! - Only sandboxes added with [`FakeSandboxes::add`] exist; each holds
//!   files (absolute path → bytes). Any operation on another id, or on one
//!   lost with [`FakeSandboxes::vanish`], fails with "sandbox ID not found".
//! - `exec` runs no program: the newest [`FakeSandboxes::on_exec`] rule
//!   whose matcher accepts the argv computes the outcome and may change
//!   the files; without one the outcome is exit 0 and no output. Every
//!   argv run is kept ([`FakeSandboxes::execs`]).
//! - Faults ([`Fault`]) are checked before an operation takes effect, in
//!   the order they were added (`hatchery_client::faults::FaultPlan`): a
//!   fault lets `skip` calls of its [`Op`] through and fires on the next
//!   `times`; a call it fires on is not seen by later faults; a fault with
//!   `meta` never fires (calls carry none here). `Fail` answers an error
//!   and changes nothing; `Hang` waits until [`FakeSandboxes::release`] and
//!   then does the operation; `Vanish` loses the sandbox first, so the
//!   operation finds it gone.

use super::*;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

pub type Files = BTreeMap<String, Vec<u8>>;
type ExecMatch = Arc<dyn Fn(&[String]) -> bool + Send + Sync>;
type ExecScript = Arc<dyn Fn(&[String], &mut Files) -> Exec + Send + Sync>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Op {
    Exec,
    WriteFile,
    ReadFile,
}

pub use hatchery_client::faults::Effect;
use hatchery_client::faults::{FaultPlan, Gate};

/// A scripted fault of one [`Op`] (see `hatchery_client::faults`).
pub type Fault = hatchery_client::faults::Fault<Op>;

#[derive(Default)]
struct Inner {
    /// id → (alive, files).
    sandboxes: BTreeMap<String, (bool, Files)>,
    rules: Vec<(ExecMatch, ExecScript)>,
    faults: FaultPlan<Op>,
    execs: Vec<(String, Vec<String>)>,
}

pub struct FakeSandboxes {
    inner: Mutex<Inner>,
    gate: Gate,
}

impl Default for FakeSandboxes {
    fn default() -> Self {
        FakeSandboxes::new()
    }
}

impl FakeSandboxes {
    pub fn new() -> FakeSandboxes {
        FakeSandboxes {
            inner: Mutex::new(Inner::default()),
            gate: Gate::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A test that panicked while holding it has failed already.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn add(&self, id: &str, files: Files) {
        self.lock().sandboxes.insert(id.into(), (true, files));
    }

    pub fn vanish(&self, id: &str) {
        if let Some(s) = self.lock().sandboxes.get_mut(id) {
            s.0 = false;
        }
    }

    pub fn files(&self, id: &str) -> Files {
        self.lock()
            .sandboxes
            .get(id)
            .map(|s| s.1.clone())
            .unwrap_or_default()
    }

    /// Adds an exec rule; newer rules are tried first.
    pub fn on_exec(
        &self,
        matches: impl Fn(&[String]) -> bool + Send + Sync + 'static,
        script: impl Fn(&[String], &mut Files) -> Exec + Send + Sync + 'static,
    ) {
        self.lock()
            .rules
            .push((Arc::new(matches), Arc::new(script)));
    }

    pub fn inject(&self, f: Fault) {
        self.lock().faults.inject(f);
    }

    /// Lets every hung operation (and any later `Hang`) carry on.
    pub fn release(&self) {
        self.gate.release();
    }

    /// Operations that reached a `Hang` so far.
    pub fn hung(&self) -> usize {
        self.gate.hung()
    }

    pub fn calls(&self, op: Op) -> usize {
        self.lock().faults.calls(op)
    }

    /// `(sandbox, argv)` of every exec that reached a live sandbox.
    pub fn execs(&self) -> Vec<(String, Vec<String>)> {
        self.lock().execs.clone()
    }

    async fn gate(&self, op: Op, id: &str) -> Result<(), SandboxError> {
        let hit = self.lock().faults.take(op, None);
        match hit {
            None => Ok(()),
            Some(Effect::Fail(m)) => Err(SandboxError(format!("injected: {m}"))),
            Some(Effect::Hang) => {
                self.gate.wait().await;
                Ok(())
            }
            Some(Effect::Vanish) => {
                self.vanish(id);
                Ok(())
            }
        }
    }

    fn with_live<T>(&self, id: &str, f: impl FnOnce(&mut Inner) -> T) -> Result<T, SandboxError> {
        let mut g = self.lock();
        match g.sandboxes.get(id) {
            Some((true, _)) => Ok(f(&mut g)),
            _ => Err(SandboxError(format!("sandbox {id} not found"))),
        }
    }
}

#[async_trait]
impl SandboxAccess for FakeSandboxes {
    async fn exec(
        &self,
        sandbox: &str,
        argv: Vec<String>,
        _timeout_s: u64,
    ) -> Result<Exec, SandboxError> {
        self.gate(Op::Exec, sandbox).await?;
        self.with_live(sandbox, |g| {
            g.execs.push((sandbox.into(), argv.clone()));
            let rule = g
                .rules
                .iter()
                .rev()
                .find(|(m, _)| m(&argv))
                .map(|(_, s)| s.clone());
            let files = &mut g.sandboxes.get_mut(sandbox).expect("checked live").1;
            match rule {
                Some(script) => script(&argv, files),
                None => Exec {
                    exit_code: 0,
                    stdout: String::new(),
                    stderr: String::new(),
                },
            }
        })
    }

    async fn write_file(
        &self,
        sandbox: &str,
        path: &str,
        data: Vec<u8>,
    ) -> Result<(), SandboxError> {
        self.gate(Op::WriteFile, sandbox).await?;
        self.with_live(sandbox, |g| {
            if let Some(s) = g.sandboxes.get_mut(sandbox) {
                s.1.insert(path.into(), data);
            }
        })
    }

    async fn read_file(&self, sandbox: &str, path: &str) -> Result<Vec<u8>, SandboxError> {
        self.gate(Op::ReadFile, sandbox).await?;
        self.with_live(sandbox, |g| {
            g.sandboxes
                .get(sandbox)
                .and_then(|s| s.1.get(path).cloned())
        })?
        .ok_or_else(|| SandboxError(format!("{path}: no such file")))
    }
}
