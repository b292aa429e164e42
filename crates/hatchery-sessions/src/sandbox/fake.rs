//! An in-memory [`Sandboxes`] for tests: no daemon, no root, no gVisor.
//!
//! Contract (what a test may rely on):
//! - Sandboxes hold files (absolute path → bytes), metadata and processes
//!   in memory. Deleted sandboxes stay inspectable ([`FakeSandboxes::sandbox`])
//!   but answer every operation with `NotFound` (`delete` is idempotent,
//!   as the trait says).
//! - `exec` runs no program: the newest [`FakeSandboxes::on_exec`] rule
//!   whose matcher accepts the argv computes the outcome and may change
//!   the files; without one the outcome is exit 0 and no output.
//! - A started process does nothing by itself: the test plays the agent
//!   with [`FakeSandboxes::emit`] (output), [`FakeSandboxes::exit`] and
//!   reads what it was sent with [`FakeSandboxes::stdin`]. Process ids are
//!   `proc-N`. `follow_output` yields every chunk that ends after the
//!   offset (a chunk is cut to start at it), then follows new output, and
//!   ends with `Exit` once the process has exited; it simply ends (no
//!   `Exit`) when the sandbox is deleted or vanishes, as a broken
//!   connection does.
//! - `snapshot` copies files and processes (output so far, state), as a
//!   checkpoint of a running sandbox does; `fork` restores them into a new
//!   sandbox with the same process ids. Stdin is not part of a snapshot.
//! - Faults ([`Fault`]) are checked before an operation takes effect, in
//!   the order they were added (`hatchery_client::faults::FaultPlan`): a
//!   fault lets `skip` calls of its [`Op`] through and fires on the next
//!   `times`; a call it fires on is not seen by later faults; a fault with
//!   `meta` never fires (calls carry none here). `Fail` answers
//!   [`SandboxError::Other`] and changes nothing; `Hang` waits until
//!   [`FakeSandboxes::release`] and then does the operation; `Vanish`
//!   deletes the target sandbox first, so the operation finds it gone
//!   (lost mid-operation). A sandbox can also be lost at any moment with
//!   [`FakeSandboxes::vanish`].
//! - Every call is counted by [`Op`].

use super::*;
use std::sync::{Arc, Mutex};

pub type Files = BTreeMap<String, Vec<u8>>;
type ExecMatch = Arc<dyn Fn(&[String]) -> bool + Send + Sync>;
type ExecScript = Arc<dyn Fn(&[String], &mut Files) -> ExecOutcome + Send + Sync>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Op {
    TemplateExists,
    Create,
    Exists,
    Delete,
    Exec,
    WriteFile,
    ReadFile,
    RunPython,
    StartProcess,
    ProcessState,
    WriteStdin,
    FollowOutput,
    KillProcess,
    Snapshot,
    Fork,
    DeleteSnapshot,
    SnapshotMetadata,
    SetNetwork,
    SnapshotPool,
}

pub use hatchery_client::faults::Effect;

/// `argv[0]` of a [`Sandboxes::run_python`] snippet as exec rules see it.
pub const PYTHON_KERNEL: &str = "<python-kernel>";
use hatchery_client::faults::{FaultPlan, Gate};

/// A scripted fault of one [`Op`] (see `hatchery_client::faults`).
pub type Fault = hatchery_client::faults::Fault<Op>;

#[derive(Debug, Clone)]
pub struct FakeProcess {
    pub argv: Vec<String>,
    pub cwd: String,
    pub env: BTreeMap<String, String>,
    /// `(stdout, offset, data)` in order; offsets are shared by both streams.
    pub chunks: Vec<(bool, u64, Vec<u8>)>,
    pub stdin: Vec<u8>,
    pub state: ProcState,
    pub killed: bool,
}

impl FakeProcess {
    fn end(&self) -> u64 {
        self.chunks.last().map_or(0, |(_, o, d)| o + d.len() as u64)
    }
}

#[derive(Debug, Clone, Default)]
pub struct FakeSandbox {
    pub id: String,
    pub template: String,
    /// The snapshot it was forked from, if any.
    pub forked_from: Option<String>,
    pub metadata: BTreeMap<String, String>,
    pub env: BTreeMap<String, String>,
    pub ttl_s: u64,
    pub files: Files,
    pub processes: BTreeMap<String, FakeProcess>,
    pub alive: bool,
    /// The egress policy it was created with or last given (`None`:
    /// deny-all; forks start with `None`, as real ones do).
    pub network: Option<serde_json::Value>,
    /// What the kernel refused, as a daemon keeps it (the tests push
    /// here with [`FakeSandboxes::kernel_denied`]).
    pub kernel_denials: Vec<KernelDenial>,
    /// How many were ever pushed (the next one's seq minus 1).
    pub kernel_logged: u64,
    /// Refused without a log line (the kernel log's rate limit).
    pub kernel_unlogged: u64,
}

#[derive(Debug, Clone)]
pub struct FakeSnapshot {
    pub id: String,
    pub source: String,
    pub metadata: BTreeMap<String, String>,
    pub files: Files,
    pub processes: BTreeMap<String, FakeProcess>,
    pub deleted: bool,
}

#[derive(Default)]
struct Inner {
    templates: Vec<String>,
    /// By template: its version, "1" when added.
    template_versions: BTreeMap<String, String>,
    sandboxes: BTreeMap<String, FakeSandbox>,
    order: Vec<String>,
    snapshots: BTreeMap<String, FakeSnapshot>,
    /// Warm pool sizes asked for, by snapshot (absent: never asked).
    snapshot_pools: BTreeMap<String, u64>,
    rules: Vec<(ExecMatch, ExecScript)>,
    faults: FaultPlan<Op>,
    next: u64,
}

struct Shared {
    inner: Mutex<Inner>,
    /// Bumped on every change a follower may be waiting for.
    changed: tokio::sync::watch::Sender<u64>,
    gate: Gate,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A test that panicked while holding it has failed already.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
    fn bump(&self) {
        self.changed.send_modify(|v| *v += 1);
    }
}

#[derive(Clone)]
pub struct FakeSandboxes {
    shared: Arc<Shared>,
}

impl Default for FakeSandboxes {
    fn default() -> Self {
        FakeSandboxes::new()
    }
}

fn gone(id: &str) -> SandboxError {
    SandboxError::NotFound(format!("sandbox {id}"))
}

impl FakeSandboxes {
    /// The warm pool size last asked for `snapshot`.
    pub fn snapshot_pool(&self, snapshot: &str) -> Option<u64> {
        self.lock().snapshot_pools.get(snapshot).copied()
    }

    pub fn new() -> FakeSandboxes {
        FakeSandboxes {
            shared: Arc::new(Shared {
                inner: Mutex::new(Inner::default()),
                changed: tokio::sync::watch::channel(0).0,
                gate: Gate::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.shared.lock()
    }

    pub fn add_template(&self, name: &str) {
        let mut g = self.lock();
        g.templates.push(name.into());
        g.template_versions.insert(name.into(), "1".into());
    }

    /// A rebuild of template `name`: its version becomes `version`.
    pub fn set_template_version(&self, name: &str, version: &str) {
        self.lock()
            .template_versions
            .insert(name.into(), version.into());
    }

    /// Adds an exec rule; newer rules are tried first.
    pub fn on_exec(
        &self,
        matches: impl Fn(&[String]) -> bool + Send + Sync + 'static,
        script: impl Fn(&[String], &mut Files) -> ExecOutcome + Send + Sync + 'static,
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
        self.shared.gate.release();
    }

    /// Operations that reached a `Hang` so far.
    pub fn hung(&self) -> usize {
        self.shared.gate.hung()
    }

    pub fn calls(&self, op: Op) -> usize {
        self.lock().faults.calls(op)
    }

    pub fn sandbox(&self, id: &str) -> Option<FakeSandbox> {
        self.lock().sandboxes.get(id).cloned()
    }

    /// Every sandbox ever made, deleted ones too, in creation order.
    pub fn all(&self) -> Vec<FakeSandbox> {
        let g = self.lock();
        g.order
            .iter()
            .filter_map(|id| g.sandboxes.get(id).cloned())
            .collect()
    }

    pub fn live(&self) -> Vec<String> {
        self.all()
            .into_iter()
            .filter(|s| s.alive)
            .map(|s| s.id)
            .collect()
    }

    pub fn snapshot_of(&self, id: &str) -> Option<FakeSnapshot> {
        self.lock().snapshots.get(id).cloned()
    }

    /// The sandbox is lost now (its host died, or it was deleted under
    /// the session); its followers see their streams end.
    pub fn vanish(&self, id: &str) {
        if let Some(s) = self.lock().sandboxes.get_mut(id) {
            s.alive = false;
        }
        self.shared.bump();
    }

    /// The agent prints `data` (stdout or stderr).
    pub fn emit(&self, sbx: &str, pid: &str, stdout: bool, data: &[u8]) {
        if let Some(p) = self
            .lock()
            .sandboxes
            .get_mut(sbx)
            .and_then(|s| s.processes.get_mut(pid))
        {
            let at = p.end();
            p.chunks.push((stdout, at, data.to_vec()));
        }
        self.shared.bump();
    }

    /// The agent prints one JSON line on stdout.
    pub fn emit_line(&self, sbx: &str, pid: &str, v: serde_json::Value) {
        let mut b = v.to_string().into_bytes();
        b.push(b'\n');
        self.emit(sbx, pid, true, &b);
    }

    pub fn exit(&self, sbx: &str, pid: &str, code: i32) {
        if let Some(p) = self
            .lock()
            .sandboxes
            .get_mut(sbx)
            .and_then(|s| s.processes.get_mut(pid))
        {
            p.state = ProcState::Exited {
                exit_code: Some(code),
                reason: Some("exited".into()),
            };
        }
        self.shared.bump();
    }

    /// What the process was sent on stdin so far.
    pub fn stdin(&self, sbx: &str, pid: &str) -> Vec<u8> {
        self.lock()
            .sandboxes
            .get(sbx)
            .and_then(|s| s.processes.get(pid))
            .map(|p| p.stdin.clone())
            .unwrap_or_default()
    }

    async fn gate(&self, op: Op, target: Option<&str>) -> Result<(), SandboxError> {
        let hit = self.lock().faults.take(op, None);
        match hit {
            None => Ok(()),
            Some(Effect::Fail(m)) => Err(SandboxError::Other(format!("injected: {m}"))),
            Some(Effect::Hang) => {
                self.shared.gate.wait().await;
                Ok(())
            }
            Some(Effect::Vanish) => {
                if let Some(id) = target {
                    self.vanish(id);
                }
                Ok(())
            }
        }
    }

    /// The kernel refuses `n` attempts of sandbox `id` without logging
    /// them (past the log's rate limit): only the total counts them.
    pub fn kernel_denied_unlogged(&self, id: &str, n: u64) {
        if let Some(s) = self.lock().sandboxes.get_mut(id) {
            s.kernel_unlogged += n;
        }
    }

    /// The kernel refuses `n` attempts of sandbox `id` to `dest:port`;
    /// like the daemon, only the last `keep` are kept.
    pub fn kernel_denied(&self, id: &str, dest: &str, port: u16, n: u64, keep: usize) {
        let mut g = self.lock();
        let Some(s) = g.sandboxes.get_mut(id) else {
            return;
        };
        for _ in 0..n {
            s.kernel_logged += 1;
            s.kernel_denials.push(KernelDenial {
                seq: s.kernel_logged,
                protocol: "tcp".into(),
                destination: dest.into(),
                port: Some(port),
            });
        }
        let over = s.kernel_denials.len().saturating_sub(keep);
        s.kernel_denials.drain(..over);
    }

    /// The newest exec rule that matches `argv`.
    fn rule_for(&self, argv: &[String]) -> Option<ExecScript> {
        self.lock()
            .rules
            .iter()
            .rev()
            .find(|(m, _)| m(argv))
            .map(|(_, s)| s.clone())
    }

    fn with_live<T>(
        &self,
        id: &str,
        f: impl FnOnce(&mut FakeSandbox) -> Result<T, SandboxError>,
    ) -> Result<T, SandboxError> {
        let r = match self.lock().sandboxes.get_mut(id) {
            Some(s) if s.alive => f(s),
            _ => Err(gone(id)),
        };
        self.shared.bump();
        r
    }

    fn add(&self, mut s: FakeSandbox) -> SandboxInfo {
        let mut g = self.lock();
        g.next += 1;
        s.id = format!("sbx-{}", g.next);
        s.alive = true;
        g.order.push(s.id.clone());
        g.sandboxes.insert(s.id.clone(), s.clone());
        SandboxInfo {
            id: s.id,
            boot_mode: Some("fake".into()),
            boot_ms: Some(1),
        }
    }
}

#[async_trait]
impl Sandboxes for FakeSandboxes {
    async fn template_exists(&self, name: &str) -> Result<bool, SandboxError> {
        self.gate(Op::TemplateExists, None).await?;
        Ok(self.lock().templates.iter().any(|t| t == name))
    }

    async fn template_version(&self, name: &str) -> Result<Option<String>, SandboxError> {
        let g = self.lock();
        if !g.templates.iter().any(|t| t == name) {
            return Ok(None);
        }
        Ok(g.template_versions.get(name).cloned())
    }

    async fn create(&self, req: NewSandbox) -> Result<SandboxInfo, SandboxError> {
        self.gate(Op::Create, None).await?;
        if !self.lock().templates.contains(&req.template) {
            return Err(SandboxError::TemplateNotFound(req.template));
        }
        Ok(self.add(FakeSandbox {
            template: req.template,
            metadata: req.metadata,
            env: req.env,
            ttl_s: req.ttl_s,
            network: req.network,
            ..FakeSandbox::default()
        }))
    }

    async fn exists(&self, id: &str) -> Result<bool, SandboxError> {
        self.gate(Op::Exists, Some(id)).await?;
        Ok(self.lock().sandboxes.get(id).is_some_and(|s| s.alive))
    }

    async fn delete(&self, id: &str) -> Result<(), SandboxError> {
        self.gate(Op::Delete, Some(id)).await?;
        self.vanish(id);
        Ok(())
    }

    async fn exec(
        &self,
        id: &str,
        argv: Vec<String>,
        _cwd: &str,
        _timeout_s: u64,
    ) -> Result<ExecOutcome, SandboxError> {
        self.gate(Op::Exec, Some(id)).await?;
        let rule = self.rule_for(&argv);
        self.with_live(id, |s| {
            Ok(match rule {
                Some(script) => script(&argv, &mut s.files),
                None => ExecOutcome {
                    exit_code: 0,
                    stdout: String::new(),
                    stderr: String::new(),
                },
            })
        })
    }

    async fn write_file(&self, id: &str, path: &str, data: Vec<u8>) -> Result<(), SandboxError> {
        self.gate(Op::WriteFile, Some(id)).await?;
        self.with_live(id, |s| {
            s.files.insert(path.into(), data);
            Ok(())
        })
    }

    async fn read_file(&self, id: &str, path: &str) -> Result<Vec<u8>, SandboxError> {
        self.gate(Op::ReadFile, Some(id)).await?;
        self.with_live(id, |s| {
            s.files
                .get(path)
                .cloned()
                .ok_or_else(|| SandboxError::NotFound(format!("{id}:{path}")))
        })
    }

    /// Exec rules see it as argv `[PYTHON_KERNEL, code]`; without a rule
    /// the snippet succeeds printing nothing. A rule's non-zero exit is
    /// an exception whose text is its stderr.
    async fn run_python(
        &self,
        id: &str,
        code: &str,
        _timeout_s: u64,
    ) -> Result<PythonOutcome, SandboxError> {
        self.gate(Op::RunPython, Some(id)).await?;
        let argv = vec![PYTHON_KERNEL.to_string(), code.to_string()];
        let rule = self.rule_for(&argv);
        self.with_live(id, |s| {
            Ok(match rule {
                Some(script) => {
                    let x = script(&argv, &mut s.files);
                    PythonOutcome {
                        stdout: x.stdout,
                        error: (x.exit_code != 0).then_some(x.stderr),
                    }
                }
                None => PythonOutcome::default(),
            })
        })
    }

    async fn start_process(
        &self,
        id: &str,
        argv: Vec<String>,
        cwd: &str,
        env: BTreeMap<String, String>,
    ) -> Result<String, SandboxError> {
        self.gate(Op::StartProcess, Some(id)).await?;
        let n = {
            let mut g = self.lock();
            g.next += 1;
            g.next
        };
        let pid = format!("proc-{n}");
        self.with_live(id, |s| {
            s.processes.insert(
                pid.clone(),
                FakeProcess {
                    argv,
                    cwd: cwd.into(),
                    env,
                    chunks: vec![],
                    stdin: vec![],
                    state: ProcState::Running,
                    killed: false,
                },
            );
            Ok(pid.clone())
        })
    }

    async fn process_state(&self, id: &str, pid: &str) -> Result<ProcState, SandboxError> {
        self.gate(Op::ProcessState, Some(id)).await?;
        self.with_live(id, |s| {
            s.processes
                .get(pid)
                .map(|p| p.state.clone())
                .ok_or_else(|| SandboxError::NotFound(format!("process {pid}")))
        })
    }

    async fn write_stdin(&self, id: &str, pid: &str, data: Vec<u8>) -> Result<(), SandboxError> {
        self.gate(Op::WriteStdin, Some(id)).await?;
        self.with_live(id, |s| match s.processes.get_mut(pid) {
            Some(p) if p.state == ProcState::Running => {
                p.stdin.extend_from_slice(&data);
                Ok(())
            }
            Some(_) => Err(SandboxError::Other(format!("process {pid} has exited"))),
            None => Err(SandboxError::NotFound(format!("process {pid}"))),
        })
    }

    async fn follow_output(
        &self,
        id: &str,
        pid: &str,
        offset: u64,
    ) -> Result<BoxStream<'static, Result<OutputItem, SandboxError>>, SandboxError> {
        self.gate(Op::FollowOutput, Some(id)).await?;
        self.with_live(id, |s| {
            s.processes
                .get(pid)
                .map(|_| ())
                .ok_or_else(|| SandboxError::NotFound(format!("process {pid}")))
        })?;
        let shared = self.shared.clone();
        let (id, pid) = (id.to_string(), pid.to_string());
        let rx = shared.changed.subscribe();
        // State: where the reader is, and whether `Exit` was sent.
        let st = (shared, rx, offset, false);
        Ok(Box::pin(futures::stream::unfold(
            st,
            move |(shared, mut rx, at, done)| {
                let (id, pid) = (id.clone(), pid.clone());
                async move {
                    if done {
                        return None;
                    }
                    loop {
                        rx.borrow_and_update();
                        let next = {
                            let g = shared.lock();
                            let s = g.sandboxes.get(&id)?;
                            if !s.alive {
                                return None;
                            }
                            let p = s.processes.get(&pid)?;
                            let chunk = p
                                .chunks
                                .iter()
                                .find(|(_, o, d)| o + d.len() as u64 > at)
                                .map(|(out, o, d)| {
                                    let skip = at.saturating_sub(*o) as usize;
                                    (*out, o + skip as u64, d[skip..].to_vec())
                                });
                            match (chunk, &p.state) {
                                (Some(c), _) => Some(Ok(c)),
                                (None, ProcState::Exited { .. }) => Some(Err(p.state.clone())),
                                (None, ProcState::Running) => None,
                            }
                        };
                        match next {
                            Some(Ok((stdout, offset, data))) => {
                                let end = offset + data.len() as u64;
                                let item = OutputItem::Chunk {
                                    stdout,
                                    offset,
                                    data,
                                };
                                return Some((Ok(item), (shared, rx, end, false)));
                            }
                            Some(Err(exit)) => {
                                return Some((Ok(OutputItem::Exit(exit)), (shared, rx, at, true)))
                            }
                            None => {
                                if rx.changed().await.is_err() {
                                    return None;
                                }
                            }
                        }
                    }
                }
            },
        )))
    }

    async fn kill_process(&self, id: &str, pid: &str) -> Result<(), SandboxError> {
        self.gate(Op::KillProcess, Some(id)).await?;
        self.with_live(id, |s| {
            if let Some(p) = s.processes.get_mut(pid) {
                p.killed = true;
                if p.state == ProcState::Running {
                    p.state = ProcState::Exited {
                        exit_code: None,
                        reason: Some("killed".into()),
                    };
                }
            }
            Ok(())
        })
    }

    async fn snapshot(
        &self,
        id: &str,
        _retention_s: u64,
        metadata: BTreeMap<String, String>,
    ) -> Result<String, SandboxError> {
        self.gate(Op::Snapshot, Some(id)).await?;
        let (files, mut processes) =
            self.with_live(id, |s| Ok((s.files.clone(), s.processes.clone())))?;
        for p in processes.values_mut() {
            p.stdin.clear();
        }
        let mut g = self.lock();
        g.next += 1;
        let sid = format!("snap-{}", g.next);
        g.snapshots.insert(
            sid.clone(),
            FakeSnapshot {
                id: sid.clone(),
                source: id.into(),
                metadata,
                files,
                processes,
                deleted: false,
            },
        );
        Ok(sid)
    }

    async fn fork(
        &self,
        snapshot_id: &str,
        ttl_s: u64,
        metadata: BTreeMap<String, String>,
    ) -> Result<SandboxInfo, SandboxError> {
        self.gate(Op::Fork, None).await?;
        let snap = match self.lock().snapshots.get(snapshot_id) {
            Some(s) if !s.deleted => s.clone(),
            _ => return Err(SandboxError::NotFound(format!("snapshot {snapshot_id}"))),
        };
        // As a daemon whose pool of it was refilled: a snapshot kept warm
        // serves a claim.
        let pooled = self.snapshot_pool(snapshot_id).is_some_and(|n| n > 0);
        let mut info = self.add(FakeSandbox {
            template: String::new(),
            forked_from: Some(snapshot_id.into()),
            metadata,
            ttl_s,
            files: snap.files,
            processes: snap.processes,
            ..FakeSandbox::default()
        });
        info.boot_mode = Some(if pooled { "pool" } else { "fork" }.into());
        Ok(info)
    }

    async fn kernel_denials(&self, id: &str) -> Result<KernelDenials, SandboxError> {
        self.with_live(id, |s| {
            Ok(KernelDenials {
                list: s.kernel_denials.clone(),
                total: Some(s.kernel_logged + s.kernel_unlogged),
            })
        })
    }

    async fn set_network(&self, id: &str, policy: serde_json::Value) -> Result<(), SandboxError> {
        self.gate(Op::SetNetwork, Some(id)).await?;
        self.with_live(id, |s| {
            s.network = Some(policy);
            Ok(())
        })
    }

    async fn delete_snapshot(&self, id: &str) -> Result<(), SandboxError> {
        self.gate(Op::DeleteSnapshot, None).await?;
        match self.lock().snapshots.get_mut(id) {
            Some(s) if !s.deleted => {
                s.deleted = true;
                Ok(())
            }
            _ => Err(SandboxError::NotFound(format!("snapshot {id}"))),
        }
    }

    async fn set_snapshot_pool(&self, snapshot_id: &str, size: u64) -> Result<(), SandboxError> {
        self.gate(Op::SnapshotPool, None).await?;
        let mut g = self.lock();
        match g.snapshots.get(snapshot_id) {
            Some(s) if !s.deleted => {
                g.snapshot_pools.insert(snapshot_id.to_string(), size);
                Ok(())
            }
            _ => Err(SandboxError::NotFound(format!("snapshot {snapshot_id}"))),
        }
    }

    async fn snapshot_metadata(&self, id: &str) -> Result<BTreeMap<String, String>, SandboxError> {
        self.gate(Op::SnapshotMetadata, None).await?;
        match self.lock().snapshots.get(id) {
            Some(s) if !s.deleted => Ok(s.metadata.clone()),
            _ => Err(SandboxError::NotFound(format!("snapshot {id}"))),
        }
    }
}
