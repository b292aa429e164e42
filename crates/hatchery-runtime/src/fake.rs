//! An in-memory [`Runtime`] for unit tests of what sits above the seam: no
//! root, no runsc, no processes, answers in microseconds.
//!
//! What it simulates:
//! - sandboxes as entries in a map: `create` and `restore` add one,
//!   `destroy` removes it (idempotently), `list` returns every entry, dead
//!   or alive, as the trait asks; `leftovers` is non-empty while an entry
//!   exists, so "nothing left behind" is checkable;
//! - the agent channel: `connect` hands out one end of a
//!   [`tokio::io::duplex`] pipe and serves the other with a small scripted
//!   agent speaking `hatchery-agent-proto`. A new connection replaces the
//!   previous one, as the gVisor shim does (that is how a restarted daemon
//!   re-attaches). The agent answers `Ping`; `RelayListen` (binding
//!   nothing, failing nothing); `Exec` with the first scripted reply whose
//!   pattern occurs in the command line ([`FakeRuntime::on_exec`]), exit 0
//!   and no output otherwise, and records every command line; file
//!   write/read/list/remove against an in-memory map of path to bytes;
//!   `CodeRun` (no output, a counter per sandbox) and the context calls,
//!   always listing one `default` python context that is `ready`;
//! - checkpoints: `checkpoint` writes one file into the directory holding
//!   the guest's files, and `restore` starts a sandbox whose guest has
//!   those files again, so a fork sees what was written before its
//!   snapshot. The image carries a serial the runtime remembers;
//!   [`FakeRuntime::forget_checkpoint`] makes an image that still verifies
//!   on disk unrestorable (a runtime that cannot read its own image);
//!   deleting the file is the test's way of losing it on disk;
//! - filesystem-only pauses: `export_files` writes the guest's files (all
//!   of them: the fake has no template files and no clock) as JSON,
//!   failing with `TooLarge` past the cap, and `import_files` adds them
//!   to another guest's;
//! - faults, per operation ([`Op`]): fail with an error, hang until a
//!   [`Gate`] is released, or be delayed, each for every call, one call, or
//!   one call after skipping some ([`FakeRuntime::inject`]);
//! - guests dying: [`FakeRuntime::kill`] ends the guest (its connection
//!   closes, `connect` and `set_expiry` answer `NotFound`) but keeps the
//!   entry, as a crashed sandbox's state directory stays until `destroy`;
//!   [`FakeRuntime::disconnect`] only breaks the agent connection;
//!   [`FakeRuntime::vanish`] removes the entry outright;
//!   [`FakeRuntime::fire_deadlines`] kills every sandbox whose expiry has
//!   passed, standing in for the shim's own TTL kill.
//!
//! What it does not simulate: processes, exit codes other than scripted
//! ones, exec deadlines and kills (an exec is answered at once), output
//! caps, background processes, terminals, port relays (answered with an
//! `invalid` error), OOM kills (`oom_kills` is `None`), network namespaces
//! (`spec.netns` is only recorded), resource limits, and the shim's
//! deadline running on its own (only [`FakeRuntime::fire_deadlines`]
//! applies it). The agent trusts the host: it does no path validation.

use crate::{AgentStream, Runtime, RuntimeError, SandboxSpec};
use async_trait::async_trait;
use hatchery_agent_proto::relay::RelayListening;
use hatchery_agent_proto::{
    check_len, CodeRequest, CodeResult, ContextInfo, ContextRequest, ExecRequest, ExecResult,
    FileEntry, FileListRequest, FilePathRequest, FileReadRequest, FileWriteRequest, Frame,
    GuestError, Kind, RelayListen,
};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::watch;

/// The file a fake checkpoint consists of.
pub const CHECKPOINT_FILE: &str = "fake-checkpoint.json";
/// Largest file chunk the agent sends, as the real agent chunks reads.
const CHUNK: usize = 256 * 1024;

/// A runtime operation faults can be injected into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Create,
    Restore,
    Connect,
    SetExpiry,
    Destroy,
    List,
    Checkpoint,
    ExportFiles,
    ImportFiles,
}

/// What an injected fault does to a call.
#[derive(Clone)]
pub enum Fault {
    /// The call returns `RuntimeError::Other` with this message, having
    /// done nothing.
    Fail(String),
    /// The call waits until the gate is released, then proceeds normally.
    Hang(Gate),
    /// The call waits this long, then proceeds normally.
    Delay(Duration),
}

/// Holds hung calls until [`Gate::release`].
#[derive(Clone)]
pub struct Gate(Arc<watch::Sender<bool>>);

impl Default for Gate {
    fn default() -> Self {
        Gate(Arc::new(watch::channel(false).0))
    }
}

impl Gate {
    pub fn new() -> Gate {
        Gate::default()
    }

    /// Lets every call held now, and every later one, through.
    pub fn release(&self) {
        self.0.send_replace(true);
    }

    async fn wait(&self) {
        let mut rx = self.0.subscribe();
        // The sender lives in `self`, so this only ends on release.
        let _ = rx.wait_for(|open| *open).await;
    }
}

/// Which calls of an operation a fault applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    /// Calls let through untouched before the fault starts.
    pub skip: usize,
    /// Calls the fault applies to; `None`: every one from then on.
    pub times: Option<usize>,
}

impl Schedule {
    pub const ALWAYS: Schedule = Schedule {
        skip: 0,
        times: None,
    };
    pub const ONCE: Schedule = Schedule {
        skip: 0,
        times: Some(1),
    };
    /// Only the call after `skip` untouched ones.
    pub fn nth(skip: usize) -> Schedule {
        Schedule {
            skip,
            times: Some(1),
        }
    }
}

struct Rule {
    fault: Fault,
    sched: Schedule,
}

/// A command's scripted result.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecReply {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl ExecReply {
    pub fn exit(code: i32) -> ExecReply {
        ExecReply {
            exit_code: code,
            ..Default::default()
        }
    }

    pub fn stdout(s: &str) -> ExecReply {
        ExecReply {
            stdout: s.as_bytes().to_vec(),
            ..Default::default()
        }
    }
}

/// What runs inside one sandbox, shared by its successive connections.
#[derive(Default)]
struct Guest {
    files: Mutex<BTreeMap<String, Vec<u8>>>,
    /// Every exec's argv, in order.
    execs: Mutex<Vec<Vec<String>>>,
    /// User code runs (warm-up cells excluded).
    code_runs: Mutex<u64>,
    /// Idle-parked: like a frozen cgroup, the agent reads nothing until it
    /// is unparked, so a request that skipped the unpark hangs.
    frozen: std::sync::atomic::AtomicBool,
    /// Something of the user's runs: the agent's `Quiet` says so.
    busy: std::sync::atomic::AtomicBool,
}

struct Sandbox {
    spec: SandboxSpec,
    expires_at_ms: u64,
    alive: bool,
    guest: Arc<Guest>,
    /// Dropping it ends the current agent connection.
    conn: Option<watch::Sender<()>>,
    /// The checkpoint serial it was restored from.
    restored_from: Option<u64>,
    /// Set by [`FakeRuntime::kill_for`].
    end_cause: Option<crate::EndCause>,
    /// Started with `background` and not yet [`Runtime::foreground`]ed.
    background: bool,
    /// [`Runtime::park`]ed and not yet foregrounded.
    parked: bool,
}

#[derive(Default)]
struct State {
    sandboxes: HashMap<String, Sandbox>,
    rules: HashMap<Op, Rule>,
    /// Every call, in order, with the sandbox id it named ("" for list).
    calls: Vec<(Op, String)>,
    /// Serials of checkpoints this runtime can still restore.
    images: HashSet<u64>,
    next_serial: u64,
    script: Vec<(String, ExecReply)>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Image {
    serial: u64,
    source: String,
    files: BTreeMap<String, Vec<u8>>,
}

/// See the module documentation.
#[derive(Default)]
pub struct FakeRuntime {
    state: Mutex<State>,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl FakeRuntime {
    pub fn new() -> Arc<FakeRuntime> {
        Arc::new(FakeRuntime::default())
    }

    fn st(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Applies `fault` to calls of `op` as `sched` says, replacing any
    /// earlier fault of `op`.
    pub fn inject(&self, op: Op, fault: Fault, sched: Schedule) {
        self.st().rules.insert(op, Rule { fault, sched });
    }

    /// Every call of `op` fails until [`FakeRuntime::clear`].
    pub fn fail(&self, op: Op) {
        self.inject(
            op,
            Fault::Fail(format!("injected {op:?} failure")),
            Schedule::ALWAYS,
        );
    }

    /// The next call of `op` fails.
    pub fn fail_once(&self, op: Op) {
        self.inject(
            op,
            Fault::Fail(format!("injected {op:?} failure")),
            Schedule::ONCE,
        );
    }

    /// Every call of `op` hangs until the returned gate is released.
    pub fn hang(&self, op: Op) -> Gate {
        let g = Gate::new();
        self.inject(op, Fault::Hang(g.clone()), Schedule::ALWAYS);
        g
    }

    pub fn clear(&self, op: Op) {
        self.st().rules.remove(&op);
    }

    /// Commands whose command line (argv joined by spaces) contains
    /// `pattern` get `reply`; the first matching pattern wins.
    pub fn on_exec(&self, pattern: &str, reply: ExecReply) {
        self.st().script.push((pattern.to_string(), reply));
    }

    /// Ids of the calls of `op` so far, in order (entered, whatever their
    /// outcome).
    pub fn calls(&self, op: Op) -> Vec<String> {
        self.st()
            .calls
            .iter()
            .filter(|(o, _)| *o == op)
            .map(|(_, id)| id.clone())
            .collect()
    }

    /// Every sandbox the runtime holds, dead or alive, sorted.
    pub fn ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.st().sandboxes.keys().cloned().collect();
        ids.sort();
        ids
    }

    pub fn is_alive(&self, id: &str) -> bool {
        self.st().sandboxes.get(id).is_some_and(|s| s.alive)
    }

    /// The self-destruct deadline the runtime holds for `id`.
    pub fn expiry(&self, id: &str) -> Option<u64> {
        self.st().sandboxes.get(id).map(|s| s.expires_at_ms)
    }

    /// The spec `id` was started with.
    pub fn spec(&self, id: &str) -> Option<SandboxSpec> {
        self.st().sandboxes.get(id).map(|s| s.spec.clone())
    }

    /// Whether `id` was restored from a checkpoint (rather than created).
    pub fn was_restored(&self, id: &str) -> bool {
        self.st()
            .sandboxes
            .get(id)
            .is_some_and(|s| s.restored_from.is_some())
    }

    fn guest(&self, id: &str) -> Option<Arc<Guest>> {
        self.st().sandboxes.get(id).map(|s| Arc::clone(&s.guest))
    }

    /// A file in `id`'s guest.
    pub fn file(&self, id: &str, path: &str) -> Option<Vec<u8>> {
        let g = self.guest(id)?;
        let files = g.files.lock().unwrap_or_else(|p| p.into_inner());
        files.get(path).cloned()
    }

    /// Every command `id`'s guest ran, as argv, in order.
    pub fn execs(&self, id: &str) -> Vec<Vec<String>> {
        self.guest(id)
            .map(|g| g.execs.lock().unwrap_or_else(|p| p.into_inner()).clone())
            .unwrap_or_default()
    }

    /// User code runs in `id`'s guest (warm-up cells not counted).
    pub fn code_runs(&self, id: &str) -> u64 {
        self.guest(id)
            .map(|g| *g.code_runs.lock().unwrap_or_else(|p| p.into_inner()))
            .unwrap_or(0)
    }

    /// The guest dies: its connection closes, `connect` and `set_expiry`
    /// answer `NotFound`, the entry stays until `destroy`. False if unknown.
    pub fn kill(&self, id: &str) -> bool {
        let mut st = self.st();
        let Some(s) = st.sandboxes.get_mut(id) else {
            return false;
        };
        s.alive = false;
        s.conn = None;
        true
    }

    /// Whether `id` still has the background CPU weight it was started
    /// with (`None`: unknown).
    pub fn is_background(&self, id: &str) -> Option<bool> {
        self.st().sandboxes.get(id).map(|s| s.background)
    }

    /// Makes `id`'s guest report work in progress (or none) to `Quiet`.
    pub fn set_busy(&self, id: &str, busy: bool) {
        if let Some(s) = self.st().sandboxes.get(id) {
            s.guest.busy.store(busy, Ordering::SeqCst);
        }
    }

    /// Whether `id` is parked now (`None`: unknown).
    pub fn is_parked(&self, id: &str) -> Option<bool> {
        self.st().sandboxes.get(id).map(|s| s.parked)
    }

    /// The guest dies as [`FakeRuntime::kill`] says, and the runtime knows
    /// why (`end_cause` answers `cause` until `destroy`).
    pub fn kill_for(&self, id: &str, cause: crate::EndCause) -> bool {
        if let Some(s) = self.st().sandboxes.get_mut(id) {
            s.end_cause = Some(cause);
        }
        self.kill(id)
    }

    /// Ends the current agent connection while the sandbox lives on (an
    /// agent channel that broke, the shim still up): `set_expiry` works,
    /// and a new `connect` reaches the same guest. False if unknown.
    pub fn disconnect(&self, id: &str) -> bool {
        match self.st().sandboxes.get_mut(id) {
            Some(s) => {
                s.conn = None;
                true
            }
            None => false,
        }
    }

    /// The sandbox disappears entirely, as if destroyed behind the
    /// caller's back. False if unknown.
    pub fn vanish(&self, id: &str) -> bool {
        self.st().sandboxes.remove(id).is_some()
    }

    /// Kills every live sandbox whose expiry is at or before `now_ms`
    /// (the shim's own deadline); returns their ids.
    pub fn fire_deadlines(&self, now_ms: u64) -> Vec<String> {
        let mut st = self.st();
        let mut out = Vec::new();
        for (id, s) in st.sandboxes.iter_mut() {
            if s.alive && s.expires_at_ms <= now_ms {
                s.alive = false;
                s.conn = None;
                out.push(id.clone());
            }
        }
        out.sort();
        out
    }

    /// Makes the checkpoint image in `dir` unrestorable while it still
    /// verifies on disk. False if `dir` holds no fake checkpoint.
    pub fn forget_checkpoint(&self, dir: &Path) -> bool {
        match read_image(dir) {
            Ok(img) => self.st().images.remove(&img.serial),
            Err(_) => false,
        }
    }

    /// Checkpoints taken so far.
    pub fn checkpoints_taken(&self) -> u64 {
        self.st().next_serial
    }

    /// Records the call, then applies `op`'s fault, if it has one due.
    async fn enter(&self, op: Op, id: &str) -> Result<(), RuntimeError> {
        let fault = {
            let mut st = self.st();
            st.calls.push((op, id.to_string()));
            let mut fault = None;
            let mut spent = false;
            if let Some(r) = st.rules.get_mut(&op) {
                if r.sched.skip > 0 {
                    r.sched.skip -= 1;
                } else {
                    fault = Some(r.fault.clone());
                    if let Some(n) = r.sched.times.as_mut() {
                        *n -= 1;
                        spent = *n == 0;
                    }
                }
            }
            if spent {
                st.rules.remove(&op);
            }
            fault
        };
        match fault {
            None => Ok(()),
            Some(Fault::Fail(msg)) => Err(RuntimeError::Other(msg)),
            Some(Fault::Hang(g)) => {
                g.wait().await;
                Ok(())
            }
            Some(Fault::Delay(d)) => {
                tokio::time::sleep(d).await;
                Ok(())
            }
        }
    }

    fn start(
        &self,
        spec: &SandboxSpec,
        files: BTreeMap<String, Vec<u8>>,
        restored_from: Option<u64>,
    ) -> Result<(), RuntimeError> {
        let mut st = self.st();
        if st.sandboxes.contains_key(&spec.id) {
            return Err(RuntimeError::Start(format!("{} exists already", spec.id)));
        }
        let guest = Guest {
            files: Mutex::new(files),
            ..Default::default()
        };
        st.sandboxes.insert(
            spec.id.clone(),
            Sandbox {
                spec: spec.clone(),
                expires_at_ms: spec.expires_at_ms,
                alive: true,
                guest: Arc::new(guest),
                conn: None,
                restored_from,
                end_cause: None,
                background: spec.background,
                parked: false,
            },
        );
        Ok(())
    }
}

fn read_image(dir: &Path) -> Result<Image, RuntimeError> {
    let raw = std::fs::read(dir.join(CHECKPOINT_FILE))?;
    serde_json::from_slice(&raw).map_err(|e| RuntimeError::Other(format!("bad image: {e}")))
}

#[async_trait]
impl Runtime for FakeRuntime {
    fn name(&self) -> &'static str {
        "fake"
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<(), RuntimeError> {
        self.enter(Op::Create, &spec.id).await?;
        self.start(spec, BTreeMap::new(), None)
    }

    async fn connect(&self, id: &str) -> Result<AgentStream, RuntimeError> {
        self.enter(Op::Connect, id).await?;
        let mut st = self.st();
        let script = st.script.clone();
        let Some(s) = st.sandboxes.get_mut(id).filter(|s| s.alive) else {
            return Err(RuntimeError::NotFound(id.to_string()));
        };
        let (host, agent) = tokio::io::duplex(1 << 20);
        let (tx, rx) = watch::channel(());
        // Replaces (and so closes) the previous connection.
        s.conn = Some(tx);
        tokio::spawn(serve(agent, Arc::clone(&s.guest), script, rx));
        Ok(Box::pin(host))
    }

    async fn set_expiry(&self, id: &str, expires_at_ms: u64) -> Result<(), RuntimeError> {
        self.enter(Op::SetExpiry, id).await?;
        match self.st().sandboxes.get_mut(id).filter(|s| s.alive) {
            Some(s) => {
                s.expires_at_ms = expires_at_ms;
                Ok(())
            }
            None => Err(RuntimeError::NotFound(id.to_string())),
        }
    }

    async fn destroy(&self, id: &str) -> Result<(), RuntimeError> {
        self.enter(Op::Destroy, id).await?;
        self.st().sandboxes.remove(id);
        Ok(())
    }

    async fn list(&self) -> Result<Vec<String>, RuntimeError> {
        self.enter(Op::List, "").await?;
        Ok(self.ids())
    }

    fn oom_kills(&self, _id: &str) -> Option<u64> {
        None
    }

    fn end_cause(&self, id: &str) -> Option<crate::EndCause> {
        self.st().sandboxes.get(id).and_then(|s| s.end_cause)
    }

    fn foreground(&self, id: &str) {
        if let Some(s) = self.st().sandboxes.get_mut(id) {
            s.background = false;
            s.parked = false;
        }
    }

    async fn park(&self, id: &str) {
        if let Some(s) = self.st().sandboxes.get_mut(id) {
            s.parked = true;
        }
    }

    fn park_idle(&self, id: &str) -> bool {
        match self.st().sandboxes.get_mut(id) {
            Some(s) if s.alive => {
                s.parked = true;
                s.guest.frozen.store(true, Ordering::SeqCst);
                true
            }
            _ => false,
        }
    }

    fn unpark(&self, id: &str) {
        if let Some(s) = self.st().sandboxes.get_mut(id) {
            s.parked = false;
            s.guest.frozen.store(false, Ordering::SeqCst);
        }
    }

    fn leftovers(&self, id: &str) -> Vec<String> {
        match self.st().sandboxes.get(id) {
            Some(s) if s.alive => vec![format!("fake sandbox {id} (running)")],
            Some(_) => vec![format!("fake sandbox {id} (dead)")],
            None => vec![],
        }
    }

    fn image_compat(&self) -> String {
        "fake-1".into()
    }

    async fn checkpoint(&self, id: &str, dir: &Path) -> Result<(), RuntimeError> {
        self.enter(Op::Checkpoint, id).await?;
        let img = {
            let mut st = self.st();
            let Some(s) = st.sandboxes.get(id).filter(|s| s.alive) else {
                return Err(RuntimeError::NotFound(id.to_string()));
            };
            let files = s
                .guest
                .files
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            st.next_serial += 1;
            let serial = st.next_serial;
            st.images.insert(serial);
            Image {
                serial,
                source: id.to_string(),
                files,
            }
        };
        let body = serde_json::to_vec(&img).map_err(|e| RuntimeError::Other(e.to_string()))?;
        std::fs::write(dir.join(CHECKPOINT_FILE), body)?;
        Ok(())
    }

    async fn restore(&self, spec: &SandboxSpec, dir: &Path) -> Result<(), RuntimeError> {
        self.enter(Op::Restore, &spec.id).await?;
        let img = read_image(dir)?;
        if !self.st().images.contains(&img.serial) {
            return Err(RuntimeError::Start(format!(
                "checkpoint {} of {} cannot be restored",
                img.serial, img.source
            )));
        }
        self.start(spec, img.files, Some(img.serial))
    }

    async fn export_files(
        &self,
        id: &str,
        _since_ms: u64,
        dest: &Path,
        max_bytes: u64,
    ) -> Result<u64, RuntimeError> {
        self.enter(Op::ExportFiles, id).await?;
        let guest = self
            .st()
            .sandboxes
            .get(id)
            .filter(|s| s.alive)
            .map(|s| Arc::clone(&s.guest))
            .ok_or_else(|| RuntimeError::NotFound(id.to_string()))?;
        let files = guest
            .files
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let body = serde_json::to_vec(&files).map_err(|e| RuntimeError::Other(e.to_string()))?;
        if body.len() as u64 > max_bytes {
            return Err(RuntimeError::TooLarge { limit: max_bytes });
        }
        std::fs::write(dest, &body)?;
        Ok(body.len() as u64)
    }

    async fn import_files(&self, id: &str, src: &Path) -> Result<(), RuntimeError> {
        self.enter(Op::ImportFiles, id).await?;
        let add = exported_files(src)?;
        let guest = self
            .st()
            .sandboxes
            .get(id)
            .filter(|s| s.alive)
            .map(|s| Arc::clone(&s.guest))
            .ok_or_else(|| RuntimeError::NotFound(id.to_string()))?;
        guest
            .files
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(add);
        Ok(())
    }
}

/// The guest's files as [`Runtime::export_files`] wrote them into `src`.
pub fn exported_files(src: &Path) -> Result<BTreeMap<String, Vec<u8>>, RuntimeError> {
    let raw = std::fs::read(src)?;
    serde_json::from_slice(&raw).map_err(|e| RuntimeError::Other(format!("bad export: {e}")))
}

/// The file a fake checkpoint in image directory `dir` consists of: what a
/// test deletes or corrupts to lose the image on disk.
pub fn checkpoint_file(dir: &Path) -> PathBuf {
    dir.join(CHECKPOINT_FILE)
}

async fn read_frame(r: &mut (impl AsyncReadExt + Unpin)) -> std::io::Result<Option<Frame>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes(len) as usize;
    check_len(len).map_err(std::io::Error::other)?;
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await?;
    Frame::decode_body(&body)
        .map(Some)
        .map_err(std::io::Error::other)
}

/// Serves one agent connection until the host closes it or the runtime
/// ends it (a kill, a newer connection, a destroy).
async fn serve(
    stream: DuplexStream,
    guest: Arc<Guest>,
    script: Vec<(String, ExecReply)>,
    mut ended: watch::Receiver<()>,
) {
    let (mut r, mut w) = tokio::io::split(stream);
    let mut agent = Agent {
        guest,
        script,
        writes: HashMap::new(),
        out: Vec::new(),
    };
    loop {
        let f = tokio::select! {
            f = read_frame(&mut r) => f,
            // Only ever ends by the sender going away.
            _ = ended.changed() => break,
        };
        let Ok(Some(f)) = f else { break };
        // A frozen guest reads nothing until it is thawed.
        while agent.guest.frozen.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        agent.handle(f);
        for reply in agent.out.drain(..) {
            if w.write_all(&reply.encode()).await.is_err() {
                return;
            }
        }
    }
}

struct Agent {
    guest: Arc<Guest>,
    script: Vec<(String, ExecReply)>,
    /// File writes in progress, by channel.
    writes: HashMap<u32, (String, Vec<u8>)>,
    out: Vec<Frame>,
}

fn default_context(n: u64) -> ContextInfo {
    ContextInfo {
        id: "default".into(),
        language: "python".into(),
        cwd: "/home/user".into(),
        state: "ready".into(),
        execution_count: n,
    }
}

impl Agent {
    fn error(&mut self, chan: u32, code: &str, msg: impl Into<String>) {
        self.out
            .push(Frame::json(chan, Kind::Error, &GuestError::new(code, msg)));
    }

    fn ok<T: serde::Serialize>(&mut self, chan: u32, v: &T) {
        self.out.push(Frame::json(chan, Kind::Ok, v));
    }

    fn files(&self) -> MutexGuard<'_, BTreeMap<String, Vec<u8>>> {
        self.guest.files.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn handle(&mut self, f: Frame) {
        let chan = f.channel;
        macro_rules! parse {
            ($t:ty) => {
                match f.parse::<$t>() {
                    Ok(v) => v,
                    Err(e) => return self.error(chan, "invalid", e.to_string()),
                }
            };
        }
        match f.kind {
            Kind::Ping => self.out.push(Frame::new(chan, Kind::Pong, f.payload)),
            Kind::Quiet => {
                let quiet = !self.guest.busy.load(Ordering::SeqCst);
                let busy = (!quiet).then(|| "a fake job runs".to_string());
                self.ok(chan, &hatchery_agent_proto::QuietReport { quiet, busy })
            }
            Kind::RelayListen => {
                let req = parse!(RelayListen);
                let ans = RelayListening {
                    listening: req.ports,
                    failed: vec![],
                };
                self.ok(chan, &ans)
            }
            Kind::Exec => {
                let req = parse!(ExecRequest);
                let line = req.argv.join(" ");
                self.guest
                    .execs
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(req.argv);
                let reply = self
                    .script
                    .iter()
                    .find(|(p, _)| line.contains(p.as_str()))
                    .map(|(_, r)| r.clone())
                    .unwrap_or_default();
                if !reply.stdout.is_empty() {
                    self.out.push(Frame::new(chan, Kind::Stdout, reply.stdout));
                }
                if !reply.stderr.is_empty() {
                    self.out.push(Frame::new(chan, Kind::Stderr, reply.stderr));
                }
                let res = ExecResult {
                    exit_code: reply.exit_code,
                    ..Default::default()
                };
                self.out.push(Frame::json(chan, Kind::ExitResult, &res));
            }
            // Commands are answered at once; there is nothing to kill.
            Kind::Kill => {}
            Kind::CodeRun => {
                let req = parse!(CodeRequest);
                let mut n = self
                    .guest
                    .code_runs
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                if !req.warm {
                    *n += 1;
                }
                let res = CodeResult {
                    context: req.context.unwrap_or_else(|| "default".into()),
                    execution_count: *n,
                    ..Default::default()
                };
                drop(n);
                self.out.push(Frame::json(chan, Kind::CodeDone, &res));
            }
            Kind::ContextList => {
                let n = *self
                    .guest
                    .code_runs
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                self.ok(chan, &vec![default_context(n)])
            }
            Kind::ContextCreate | Kind::ContextRestart => {
                let req = parse!(ContextRequest);
                let mut c = default_context(0);
                c.id = req.id.unwrap_or_else(|| format!("ctx-{chan}"));
                c.cwd = req.cwd.unwrap_or(c.cwd);
                self.ok(chan, &c)
            }
            Kind::ContextDelete => self.ok(chan, &serde_json::json!({})),
            Kind::FileWriteStart => {
                let req = parse!(FileWriteRequest);
                self.writes.insert(chan, (req.path, Vec::new()));
            }
            Kind::FileData => {
                if let Some((_, buf)) = self.writes.get_mut(&chan) {
                    buf.extend_from_slice(&f.payload);
                }
            }
            Kind::FileWriteEnd => match self.writes.remove(&chan) {
                Some((path, data)) => {
                    self.files().insert(path, data);
                    self.ok(chan, &serde_json::json!({}))
                }
                None => self.error(chan, "invalid", "no write in progress"),
            },
            Kind::FileRead => {
                let req = parse!(FileReadRequest);
                let data = self.files().get(&req.path).cloned();
                match data {
                    None => self.error(chan, "not_found", format!("{}: no such file", req.path)),
                    Some(d) if d.len() as u64 > req.max_bytes => {
                        self.error(chan, "too_large", format!("{} bytes", d.len()))
                    }
                    Some(d) => {
                        for c in d.chunks(CHUNK) {
                            self.out.push(Frame::new(chan, Kind::FileChunk, c.to_vec()));
                        }
                        self.out.push(Frame::new(chan, Kind::FileEof, vec![]));
                    }
                }
            }
            Kind::FileList => {
                let req = parse!(FileListRequest);
                let entries = list_dir(&self.files(), &req.path);
                match entries {
                    Some(mut e) => {
                        e.truncate(req.max_entries as usize);
                        self.ok(chan, &e)
                    }
                    None => self.error(
                        chan,
                        "not_found",
                        format!("{}: no such directory", req.path),
                    ),
                }
            }
            Kind::FileRemove => {
                let req = parse!(FilePathRequest);
                let prefix = format!("{}/", req.path.trim_end_matches('/'));
                let mut files = self.files();
                let before = files.len();
                files.retain(|p, _| *p != req.path && !p.starts_with(&prefix));
                let removed = files.len() != before;
                drop(files);
                if removed {
                    self.ok(chan, &serde_json::json!({}))
                } else {
                    self.error(chan, "not_found", format!("{}: no such file", req.path))
                }
            }
            other => self.error(
                chan,
                "invalid",
                format!("{other:?} is not simulated by the fake agent"),
            ),
        }
    }
}

/// Direct children of `dir`; `None` if nothing lies under it (and it is
/// not `/`).
fn list_dir(files: &BTreeMap<String, Vec<u8>>, dir: &str) -> Option<Vec<FileEntry>> {
    let prefix = format!("{}/", dir.trim_end_matches('/'));
    let mut seen = BTreeMap::new();
    for (path, data) in files {
        let Some(rest) = path.strip_prefix(&prefix) else {
            continue;
        };
        let (name, is_dir) = match rest.split_once('/') {
            Some((d, _)) => (d, true),
            None => (rest, false),
        };
        seen.entry(name.to_string()).or_insert(FileEntry {
            name: name.to_string(),
            kind: if is_dir { "dir" } else { "file" }.into(),
            size: if is_dir { 0 } else { data.len() as u64 },
            mode: if is_dir { 0o755 } else { 0o644 },
            mtime: 0,
        });
    }
    if seen.is_empty() && dir != "/" {
        return None;
    }
    Some(seen.into_values().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_files_export_is_capped_and_imports_into_another_guest() {
        let rt = FakeRuntime::new();
        rt.create(&spec("a")).await.unwrap();
        rt.st().sandboxes["a"]
            .guest
            .files
            .lock()
            .unwrap()
            .insert("/f".into(), b"x".to_vec());
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("e");
        let err = rt.export_files("a", 0, &out, 4).await.unwrap_err();
        assert!(
            matches!(err, RuntimeError::TooLarge { limit: 4 }),
            "{err:?}"
        );
        assert!(!out.exists(), "nothing past the cap is written");
        let n = rt.export_files("a", 0, &out, 1 << 20).await.unwrap();
        assert_eq!(n, std::fs::metadata(&out).unwrap().len());
        rt.create(&spec("b")).await.unwrap();
        rt.import_files("b", &out).await.unwrap();
        assert_eq!(rt.file("b", "/f"), Some(b"x".to_vec()));
        assert!(rt.import_files("gone", &out).await.is_err());
    }

    fn spec(id: &str) -> SandboxSpec {
        SandboxSpec {
            id: id.into(),
            rootfs: "/nonexistent".into(),
            limits: crate::Limits {
                cpus: 1.0,
                memory_mb: 64,
                pids_max: 16,
                disk_mb: 16,
            },
            expires_at_ms: 1000,
            netns: None,
            background: false,
        }
    }

    async fn call(s: &mut AgentStream, f: Frame) -> Vec<Frame> {
        s.write_all(&f.encode()).await.unwrap();
        let mut out = Vec::new();
        loop {
            let g = read_frame(s).await.unwrap().unwrap();
            let last = !matches!(g.kind, Kind::Stdout | Kind::Stderr | Kind::FileChunk);
            out.push(g);
            if last {
                return out;
            }
        }
    }

    #[tokio::test]
    async fn agent_answers_ping_exec_and_files() {
        let rt = FakeRuntime::new();
        rt.on_exec("echo hi", ExecReply::stdout("hi\n"));
        rt.create(&spec("a")).await.unwrap();
        let mut s = rt.connect("a").await.unwrap();
        let got = call(&mut s, Frame::new(1, Kind::Ping, b"x".to_vec())).await;
        assert_eq!(got, vec![Frame::new(1, Kind::Pong, b"x".to_vec())]);
        let req = ExecRequest {
            argv: vec!["sh".into(), "-c".into(), "echo hi".into()],
            cwd: None,
            env: Default::default(),
            stdin: None,
            timeout_ms: 1000,
            max_output_bytes: 100,
            cpu_limit_ms: None,
        };
        let got = call(&mut s, Frame::json(2, Kind::Exec, &req)).await;
        assert_eq!(got[0], Frame::new(2, Kind::Stdout, b"hi\n".to_vec()));
        assert_eq!(got[1].kind, Kind::ExitResult);
        let w = FileWriteRequest {
            path: "/d/f".into(),
            mode: 0o644,
        };
        s.write_all(&Frame::json(3, Kind::FileWriteStart, &w).encode())
            .await
            .unwrap();
        s.write_all(&Frame::new(3, Kind::FileData, b"abc".to_vec()).encode())
            .await
            .unwrap();
        let got = call(&mut s, Frame::new(3, Kind::FileWriteEnd, vec![])).await;
        assert_eq!(got[0].kind, Kind::Ok);
        assert_eq!(rt.file("a", "/d/f").as_deref(), Some(&b"abc"[..]));
        assert_eq!(rt.execs("a")[0][2], "echo hi");
        let l = FileListRequest {
            path: "/".into(),
            max_entries: 10,
        };
        let got = call(&mut s, Frame::json(4, Kind::FileList, &l)).await;
        let e: Vec<FileEntry> = got[0].parse().unwrap();
        assert_eq!((e[0].name.as_str(), e[0].kind.as_str()), ("d", "dir"));
    }

    #[tokio::test]
    async fn kill_closes_the_connection_and_faults_follow_their_schedule() {
        let rt = FakeRuntime::new();
        rt.inject(Op::Create, Fault::Fail("boom".into()), Schedule::nth(1));
        rt.create(&spec("a")).await.unwrap();
        assert!(rt.create(&spec("b")).await.is_err());
        rt.create(&spec("b")).await.unwrap();
        let mut s = rt.connect("a").await.unwrap();
        assert!(rt.kill("a"));
        let mut buf = [0u8; 1];
        assert_eq!(s.read(&mut buf).await.unwrap(), 0, "EOF after kill");
        assert!(matches!(
            rt.connect("a").await,
            Err(RuntimeError::NotFound(_))
        ));
        assert_eq!(rt.leftovers("a").len(), 1);
        rt.destroy("a").await.unwrap();
        assert!(rt.leftovers("a").is_empty());
        assert_eq!(rt.ids(), vec!["b".to_string()]);
    }

    #[tokio::test]
    async fn restore_brings_back_files_unless_forgotten() {
        let rt = FakeRuntime::new();
        let dir = tempfile::tempdir().unwrap();
        rt.create(&spec("a")).await.unwrap();
        rt.guest("a")
            .unwrap()
            .files
            .lock()
            .unwrap()
            .insert("/f".into(), b"1".to_vec());
        rt.checkpoint("a", dir.path()).await.unwrap();
        rt.restore(&spec("b"), dir.path()).await.unwrap();
        assert_eq!(rt.file("b", "/f").as_deref(), Some(&b"1"[..]));
        assert!(rt.was_restored("b") && !rt.was_restored("a"));
        assert!(rt.forget_checkpoint(dir.path()));
        assert!(rt.restore(&spec("c"), dir.path()).await.is_err());
        assert!(!rt.ids().contains(&"c".to_string()));
    }
}
