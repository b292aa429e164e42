//! An in-memory [`Sandboxes`] for tests: no daemon, no root, no gVisor.
//!
//! Contract (what a test may rely on):
//! - Sandboxes, their files (absolute path → bytes), network policy and
//!   metadata live in memory. `create` starts from the template's empty
//!   file system; `fork` starts from a copy of the snapshot's files with
//!   deny-all egress (`network` `None`), as the daemon's forks do;
//!   `snapshot` copies the files as they are at that moment.
//! - Deleted sandboxes stay inspectable ([`FakeSandboxes::sandbox`],
//!   [`FakeSandboxes::made`]) but answer every operation with 404
//!   `sandbox_not_found`, as a deleted sandbox of the daemon does. `delete`
//!   of an unknown or deleted sandbox is 404 too.
//! - Directories are implied by the files under them; `list_dir` lists
//!   the files and directories directly under a path.
//! - `exec` runs no program: the newest [`FakeSandboxes::on_exec`] rule
//!   whose matcher accepts the spec computes the outcome and may change the
//!   sandbox's files (a runner writing its report); without a matching rule
//!   the outcome is exit 0, `exited`, no output. `exec_stream` yields the
//!   same outcome as stdout, stderr and exit events.
//! - Faults ([`Fault`]) are checked before an operation takes effect, in
//!   the order they were added (`hatchery_client::faults::FaultPlan`): a
//!   fault matches the calls of its [`Op`] (with [`FaultExt::kind`], only
//!   those whose target sandbox, or for `create` and `fork` the one being
//!   made, is of that kind); it lets `skip` matching calls through and
//!   fires on the next `times`; a call it fires on is not seen by later
//!   faults. `Fail` answers an error and changes nothing;
//!   `Hang` waits until [`FakeSandboxes::release`] and then does the
//!   operation (whatever happened meanwhile); `Vanish` deletes the target
//!   sandbox and then does the operation, which so finds it gone (a sandbox
//!   lost mid-operation: expired, killed, its host gone).
//! - Every call is counted by [`Op`] ([`FakeSandboxes::calls`]); sandboxes
//!   and snapshots, deleted ones too, can be read back whole.

use super::*;
use hatchery_client::faults::{FaultPlan, Gate};
use std::sync::{Arc, Mutex};

pub type Files = BTreeMap<String, Vec<u8>>;

/// Computes an exec's outcome from its spec and the sandbox's files (which
/// it may change).
pub type ExecScript = Arc<dyn Fn(&ExecSpec, &mut Files) -> ExecOutcome + Send + Sync>;
type ExecMatch = Arc<dyn Fn(&ExecSpec) -> bool + Send + Sync>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Template,
    Create,
    Delete,
    List,
    Exists,
    SetNetwork,
    WriteFile,
    ReadFile,
    ListDir,
    Exec,
    ExecStream,
    Snapshot,
    Fork,
    DeleteSnapshot,
    SnapshotExists,
    PtyToken,
}

#[derive(Debug, Clone)]
pub enum Effect {
    /// An error body from the daemon.
    Fail { status: u16, code: String },
    /// No answer at all.
    Transport,
    /// Waits for [`FakeSandboxes::release`], then carries on.
    Hang,
    /// The target sandbox is gone before the operation reaches it.
    Vanish,
}

/// A scripted fault of one [`Op`] (see `hatchery_client::faults`); its
/// `meta` is matched against the target sandbox or, for `create` and
/// `fork`, the sandbox being made.
pub type Fault = hatchery_client::faults::Fault<Op, Effect>;

/// Rounds' shorthands for building a [`Fault`].
pub trait FaultExt {
    /// Fails the next call of `op` with an error body from the daemon.
    fn fail(op: Op, status: u16, code: &str) -> Fault;
    /// Only for sandboxes labelled `hatchery.kind` = `kind`.
    fn kind(self, kind: &str) -> Fault;
}

impl FaultExt for Fault {
    fn fail(op: Op, status: u16, code: &str) -> Fault {
        Fault::on(
            op,
            Effect::Fail {
                status,
                code: code.into(),
            },
        )
    }
    fn kind(self, kind: &str) -> Fault {
        self.meta("hatchery.kind", kind)
    }
}

#[derive(Debug, Clone, Default)]
pub struct FakeSandbox {
    pub id: String,
    pub metadata: BTreeMap<String, String>,
    pub files: Files,
    pub network: Option<serde_json::Value>,
    pub ttl_seconds: u64,
    /// The template it was created from, or the snapshot it was forked from.
    pub origin: String,
    pub alive: bool,
}

#[derive(Debug, Clone)]
pub struct FakeSnapshot {
    pub id: String,
    pub source: String,
    pub files: Files,
    pub metadata: BTreeMap<String, String>,
    pub retention_seconds: u64,
}

#[derive(Default)]
struct Inner {
    templates: BTreeMap<String, TemplateVersion>,
    sandboxes: BTreeMap<String, FakeSandbox>,
    /// Ids in creation order.
    order: Vec<String>,
    snapshots: BTreeMap<String, FakeSnapshot>,
    rules: Vec<(ExecMatch, ExecScript)>,
    faults: FaultPlan<Op, Effect>,
    next: u64,
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

fn not_found(code: &str, what: &str) -> SandboxError {
    SandboxError::Api {
        status: 404,
        code: code.into(),
        message: format!("{what} not found"),
    }
}

/// What a fault decided before the operation.
enum Entry {
    Go,
    Hang,
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

    pub fn add_template(&self, name: &str, version: &str, memory_mb: u64) {
        self.lock().templates.insert(
            name.into(),
            TemplateVersion {
                name: name.into(),
                version: version.into(),
                memory_mb,
            },
        );
    }

    /// Adds an exec rule; newer rules are tried first.
    pub fn on_exec(
        &self,
        matches: impl Fn(&ExecSpec) -> bool + Send + Sync + 'static,
        script: impl Fn(&ExecSpec, &mut Files) -> ExecOutcome + Send + Sync + 'static,
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

    pub fn sandbox(&self, id: &str) -> Option<FakeSandbox> {
        self.lock().sandboxes.get(id).cloned()
    }

    pub fn snapshot_of(&self, id: &str) -> Option<FakeSnapshot> {
        self.lock().snapshots.get(id).cloned()
    }

    /// Every sandbox ever made (deleted ones too) with `hatchery.kind` =
    /// `kind`, in creation order.
    pub fn made(&self, kind: &str) -> Vec<FakeSandbox> {
        let g = self.lock();
        g.order
            .iter()
            .filter_map(|id| g.sandboxes.get(id))
            .filter(|s| s.metadata.get("hatchery.kind").map(String::as_str) == Some(kind))
            .cloned()
            .collect()
    }

    /// As if a process in the sandbox wrote the file.
    pub fn put_file(&self, id: &str, path: &str, data: &[u8]) {
        if let Some(s) = self.lock().sandboxes.get_mut(id) {
            s.files.insert(path.into(), data.to_vec());
        }
    }

    pub fn remove_file(&self, id: &str, path: &str) {
        if let Some(s) = self.lock().sandboxes.get_mut(id) {
            s.files.remove(path);
        }
    }

    /// Counts the call and applies the first fault that hits it.
    /// `target` is the sandbox acted on; `making` the metadata of one
    /// being made.
    fn enter(
        &self,
        op: Op,
        target: Option<&str>,
        making: Option<&BTreeMap<String, String>>,
    ) -> Result<Entry, SandboxError> {
        let mut g = self.lock();
        let meta = match (making, target) {
            (Some(m), _) => Some(m.clone()),
            (None, Some(id)) => g.sandboxes.get(id).map(|s| s.metadata.clone()),
            (None, None) => None,
        };
        let hit = g.faults.take(op, meta.as_ref());
        match hit {
            None => Ok(Entry::Go),
            Some(Effect::Fail { status, code }) => Err(SandboxError::Api {
                status,
                message: format!("injected {code}"),
                code,
            }),
            Some(Effect::Transport) => Err(SandboxError::Transport(format!(
                "injected: connection reset during {op:?}"
            ))),
            Some(Effect::Hang) => Ok(Entry::Hang),
            Some(Effect::Vanish) => {
                if let Some(s) = target.and_then(|id| g.sandboxes.get_mut(id)) {
                    s.alive = false;
                }
                Ok(Entry::Go)
            }
        }
    }

    async fn gate(
        &self,
        op: Op,
        target: Option<&str>,
        making: Option<&BTreeMap<String, String>>,
    ) -> Result<(), SandboxError> {
        if let Entry::Hang = self.enter(op, target, making)? {
            self.gate.wait().await;
        }
        Ok(())
    }

    fn with_live<T>(
        &self,
        id: &str,
        f: impl FnOnce(&mut FakeSandbox) -> Result<T, SandboxError>,
    ) -> Result<T, SandboxError> {
        match self.lock().sandboxes.get_mut(id) {
            Some(s) if s.alive => f(s),
            _ => Err(not_found("sandbox_not_found", &format!("sandbox {id}"))),
        }
    }

    fn add_sandbox(&self, mut s: FakeSandbox, prefix: &str) -> String {
        let mut g = self.lock();
        g.next += 1;
        s.id = format!("{prefix}-{}", g.next);
        s.alive = true;
        let id = s.id.clone();
        g.order.push(id.clone());
        g.sandboxes.insert(id.clone(), s);
        id
    }

    fn run(&self, id: &str, spec: &ExecSpec) -> Result<ExecOutcome, SandboxError> {
        let rule = self
            .lock()
            .rules
            .iter()
            .rev()
            .find(|(m, _)| m(spec))
            .map(|(_, s)| s.clone());
        self.with_live(id, |s| {
            Ok(match rule {
                Some(script) => script(spec, &mut s.files),
                None => ExecOutcome {
                    reason: "exited".into(),
                    ..ExecOutcome::default()
                },
            })
        })
    }
}

#[async_trait]
impl Sandboxes for FakeSandboxes {
    async fn template(&self, name: &str) -> Result<TemplateVersion, SandboxError> {
        self.gate(Op::Template, None, None).await?;
        self.lock()
            .templates
            .get(name)
            .cloned()
            .ok_or_else(|| not_found("template_not_found", &format!("template {name}")))
    }

    async fn create(&self, req: NewSandbox) -> Result<String, SandboxError> {
        self.gate(Op::Create, None, Some(&req.metadata)).await?;
        if !self.lock().templates.contains_key(&req.template) {
            return Err(not_found(
                "template_not_found",
                &format!("template {}", req.template),
            ));
        }
        Ok(self.add_sandbox(
            FakeSandbox {
                metadata: req.metadata,
                network: req.network,
                ttl_seconds: req.ttl_seconds,
                origin: req.template,
                ..FakeSandbox::default()
            },
            "sbx",
        ))
    }

    async fn delete(&self, id: &str) -> Result<(), SandboxError> {
        self.gate(Op::Delete, Some(id), None).await?;
        self.with_live(id, |s| {
            s.alive = false;
            Ok(())
        })
    }

    async fn list(&self, filter: BTreeMap<String, String>) -> Result<Vec<String>, SandboxError> {
        self.gate(Op::List, None, None).await?;
        let g = self.lock();
        Ok(g.order
            .iter()
            .filter_map(|id| g.sandboxes.get(id))
            .filter(|s| s.alive && filter.iter().all(|(k, v)| s.metadata.get(k) == Some(v)))
            .map(|s| s.id.clone())
            .collect())
    }

    async fn exists(&self, id: &str) -> Result<bool, SandboxError> {
        self.gate(Op::Exists, Some(id), None).await?;
        Ok(self.lock().sandboxes.get(id).is_some_and(|s| s.alive))
    }

    async fn set_network(&self, id: &str, policy: serde_json::Value) -> Result<(), SandboxError> {
        self.gate(Op::SetNetwork, Some(id), None).await?;
        self.with_live(id, |s| {
            s.network = Some(policy);
            Ok(())
        })
    }

    async fn write_file(&self, id: &str, path: &str, data: Vec<u8>) -> Result<(), SandboxError> {
        self.gate(Op::WriteFile, Some(id), None).await?;
        self.with_live(id, |s| {
            s.files.insert(path.into(), data);
            Ok(())
        })
    }

    async fn read_file(&self, id: &str, path: &str) -> Result<Vec<u8>, SandboxError> {
        self.gate(Op::ReadFile, Some(id), None).await?;
        self.with_live(id, |s| {
            s.files
                .get(path)
                .cloned()
                .ok_or_else(|| not_found("file_not_found", path))
        })
    }

    async fn list_dir(&self, id: &str, dir: &str) -> Result<Vec<FileEntry>, SandboxError> {
        self.gate(Op::ListDir, Some(id), None).await?;
        let prefix = format!("{}/", dir.trim_end_matches('/'));
        self.with_live(id, |s| {
            let mut out: BTreeMap<String, FileEntry> = BTreeMap::new();
            for (p, data) in &s.files {
                let Some(rest) = p.strip_prefix(&prefix) else {
                    continue;
                };
                let (name, is_dir) = match rest.split_once('/') {
                    Some((d, _)) => (d, true),
                    None => (rest, false),
                };
                let path = format!("{prefix}{name}");
                out.entry(path.clone()).or_insert(FileEntry {
                    path,
                    is_dir,
                    size: if is_dir { 0 } else { data.len() as u64 },
                });
            }
            Ok(out.into_values().collect())
        })
    }

    async fn exec(&self, id: &str, spec: ExecSpec) -> Result<ExecOutcome, SandboxError> {
        self.gate(Op::Exec, Some(id), None).await?;
        self.run(id, &spec)
    }

    async fn exec_stream(
        &self,
        id: &str,
        spec: ExecSpec,
    ) -> Result<BoxStream<'static, Result<ExecEvent, SandboxError>>, SandboxError> {
        self.gate(Op::ExecStream, Some(id), None).await?;
        let o = self.run(id, &spec)?;
        let mut events = vec![];
        if !o.stdout.is_empty() {
            events.push(Ok(ExecEvent::Stdout(o.stdout.clone())));
        }
        if !o.stderr.is_empty() {
            events.push(Ok(ExecEvent::Stderr(o.stderr.clone())));
        }
        events.push(Ok(ExecEvent::Exit(o)));
        Ok(Box::pin(futures::stream::iter(events)))
    }

    async fn snapshot(
        &self,
        id: &str,
        retention_seconds: u64,
        metadata: BTreeMap<String, String>,
    ) -> Result<String, SandboxError> {
        self.gate(Op::Snapshot, Some(id), None).await?;
        let files = self.with_live(id, |s| Ok(s.files.clone()))?;
        let mut g = self.lock();
        g.next += 1;
        let sid = format!("snap-{}", g.next);
        g.snapshots.insert(
            sid.clone(),
            FakeSnapshot {
                id: sid.clone(),
                source: id.into(),
                files,
                metadata,
                retention_seconds,
            },
        );
        Ok(sid)
    }

    async fn fork(
        &self,
        snapshot_id: &str,
        ttl_seconds: u64,
        metadata: BTreeMap<String, String>,
    ) -> Result<String, SandboxError> {
        self.gate(Op::Fork, None, Some(&metadata)).await?;
        let files = self
            .lock()
            .snapshots
            .get(snapshot_id)
            .map(|s| s.files.clone())
            .ok_or_else(|| not_found("snapshot_not_found", &format!("snapshot {snapshot_id}")))?;
        Ok(self.add_sandbox(
            FakeSandbox {
                metadata,
                files,
                network: None,
                ttl_seconds,
                origin: snapshot_id.into(),
                ..FakeSandbox::default()
            },
            "sbx",
        ))
    }

    async fn delete_snapshot(&self, id: &str) -> Result<(), SandboxError> {
        self.gate(Op::DeleteSnapshot, None, None).await?;
        self.lock()
            .snapshots
            .remove(id)
            .map(|_| ())
            .ok_or_else(|| not_found("snapshot_not_found", &format!("snapshot {id}")))
    }

    async fn snapshot_exists(&self, id: &str) -> Result<bool, SandboxError> {
        self.gate(Op::SnapshotExists, None, None).await?;
        Ok(self.lock().snapshots.contains_key(id))
    }

    async fn pty_token(&self, id: &str) -> Result<(String, String), SandboxError> {
        self.gate(Op::PtyToken, Some(id), None).await?;
        self.with_live(id, |s| {
            Ok((format!("pty-{}", s.id), "2099-01-01T00:00:00Z".into()))
        })
    }
}
