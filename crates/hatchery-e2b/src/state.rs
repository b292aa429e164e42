//! What this adapter keeps beyond Hatchery: E2B ids of resumed
//! sandboxes (a resume is a restore into a new Hatchery sandbox, but E2B
//! clients keep the old id), paused sandboxes (a snapshot and what to
//! report about them), and per-process details E2B has and Hatchery does
//! not (tags, the config a process was started with, open terminals).
//!
//! Pauses and resumes are kept in Hatchery's own records, so they survive
//! a daemon restart and every host of a deployment sees them: a pause is a
//! snapshot whose metadata names the E2B id ([`PAUSED_KEY`]) and the times
//! to report; a resumed sandbox carries its E2B id in its metadata
//! ([`ALIAS_KEY`]). These keys are never shown to E2B clients. Process
//! details and watchers are per daemon, in memory.

use crate::backend::{BResult, Backend, FailKind, Pty, SandboxView};
use crate::lifecycle::{self, Lifecycle};
use crate::pb::process::ProcessConfig;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// Most paused sandboxes at once; pausing more is refused.
pub const MAX_PAUSED: usize = 256;
/// Most processes whose E2B details are remembered per sandbox; the
/// oldest are forgotten first (Hatchery keeps 64 exited ones).
pub const MAX_PROC_DETAILS: usize = 256;

/// Snapshot metadata: this snapshot is the paused E2B sandbox named.
pub const PAUSED_KEY: &str = "e2b_paused_sandbox";
/// Snapshot metadata of a pause: when the sandbox started, and its end
/// time then (ms since the epoch), reported while it is paused.
pub const PAUSED_STARTED_KEY: &str = "e2b_started_at_ms";
pub const PAUSED_END_KEY: &str = "e2b_end_at_ms";
/// Sandbox metadata: this Hatchery sandbox answers to that E2B id (it was
/// resumed from a pause of it).
pub const ALIAS_KEY: &str = "e2b_sandbox_id";
/// Snapshot metadata of a fork's snapshot.
pub const FORK_KEY: &str = "e2b_fork_of";
/// Snapshot metadata of `create_snapshot`: the E2B id it was taken of,
/// and the name it was given.
pub const SNAPSHOT_OF_KEY: &str = "e2b_snapshot_of";
pub const SNAPSHOT_NAME_KEY: &str = "e2b_snapshot_name";
/// Pause record metadata: the pause kept files only (`memory: false`), so
/// a resume boots the template with them and no process survives.
pub const PAUSED_FILES_KEY: &str = "e2b_paused_files";
/// Keys this adapter writes; stripped from what clients see and from
/// what a pause, resume or fork copies (the lifecycle's are carried over
/// explicitly, see `lifecycle`).
const SYSTEM_KEYS: [&str; 12] = [
    PAUSED_KEY,
    PAUSED_FILES_KEY,
    PAUSED_STARTED_KEY,
    PAUSED_END_KEY,
    ALIAS_KEY,
    FORK_KEY,
    SNAPSHOT_OF_KEY,
    SNAPSHOT_NAME_KEY,
    lifecycle::KEYS[0],
    lifecycle::KEYS[1],
    lifecycle::KEYS[2],
    lifecycle::KEYS[3],
];

/// The user's metadata: `m` without this adapter's keys.
pub fn user_metadata(m: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    m.iter()
        .filter(|(k, _)| !SYSTEM_KEYS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// A view as clients see it: its E2B id, the user's metadata, its
/// lifecycle, and its E2B end time.
pub fn present(mut v: SandboxView) -> (String, SandboxView) {
    let e2b_id = v.metadata.get(ALIAS_KEY).cloned().unwrap_or(v.id.clone());
    v.lifecycle = Lifecycle::of(&v.metadata);
    v.expires_at_ms = v.lifecycle.e2b_end_ms(v.expires_at_ms);
    v.metadata = user_metadata(&v.metadata);
    (e2b_id, v)
}

#[derive(Debug, Clone)]
pub struct Paused {
    pub snapshot: String,
    pub view: SandboxView,
    /// A filesystem-only pause (no memory).
    pub files_only: bool,
}

impl Paused {
    /// The snapshot's metadata for a pause of `view` under `e2b_id`.
    pub fn record(e2b_id: &str, view: &SandboxView, memory: bool) -> BTreeMap<String, String> {
        let mut m = user_metadata(&view.metadata);
        m.extend(view.lifecycle.keys());
        m.insert(PAUSED_KEY.into(), e2b_id.into());
        if !memory {
            m.insert(PAUSED_FILES_KEY.into(), "1".into());
        }
        m.insert(PAUSED_STARTED_KEY.into(), view.created_at_ms.to_string());
        m.insert(PAUSED_END_KEY.into(), view.expires_at_ms.to_string());
        m
    }

    /// A pause record read back from a snapshot (id, and a view built
    /// from the snapshot's template and metadata); `None` for snapshots
    /// that are not pauses.
    fn from_snapshot(snapshot: String, mut view: SandboxView) -> Option<(String, Paused)> {
        let e2b_id = view.metadata.get(PAUSED_KEY)?.clone();
        let ms = |k: &str, or: u64| {
            view.metadata
                .get(k)
                .and_then(|v| v.parse().ok())
                .unwrap_or(or)
        };
        view.created_at_ms = ms(PAUSED_STARTED_KEY, view.created_at_ms);
        view.expires_at_ms = ms(PAUSED_END_KEY, view.expires_at_ms);
        view.lifecycle = Lifecycle::of(&view.metadata);
        let files_only = view
            .metadata
            .get(PAUSED_FILES_KEY)
            .is_some_and(|v| v == "1");
        view.metadata = user_metadata(&view.metadata);
        view.id = e2b_id.clone();
        Some((
            e2b_id,
            Paused {
                snapshot,
                view,
                files_only,
            },
        ))
    }
}

/// One process's E2B details.
#[derive(Clone)]
pub struct ProcDetails {
    pub proc_id: Option<String>,
    pub config: ProcessConfig,
    pub tag: Option<String>,
    pub pty: Option<Arc<dyn Pty>>,
    /// Where a terminal's output goes.
    pub tap: Option<Arc<crate::pty_tap::PtyTap>>,
    pub seq: u64,
}

#[derive(Default)]
struct Inner {
    /// E2B id -> Hatchery id of resumed sandboxes seen by this daemon: a
    /// cache of what their metadata says (ALIAS_KEY).
    alias: HashMap<String, String>,
    /// E2B ids being resumed here now (two resumes at once: one wins).
    resuming: HashSet<String>,
    /// E2B ids being paused here now (a pause and the auto-pause sweep).
    pausing: HashSet<String>,
    /// (Hatchery sandbox id, pid) -> details.
    procs: HashMap<(String, u32), ProcDetails>,
    seq: u64,
    watchers: HashMap<String, Watcher>,
}

/// A polled directory watcher (`CreateWatcher`): the background process
/// that watches, and how far its output has been read.
#[derive(Debug, Clone)]
pub struct Watcher {
    pub sandbox: String,
    pub proc_id: String,
    pub offset: u64,
    /// A line not yet ended.
    pub partial: Vec<u8>,
}

/// Most polled watchers per daemon.
pub const MAX_WATCHERS: usize = 256;

/// The label of the traffic token's MAC (the envd token's is empty; E2B
/// ids have no colon, so no id's input is another's traffic input).
const TRAFFIC: &[u8] = b"traffic:";

fn hex_of(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

pub struct Shared {
    pub backend: Arc<dyn Backend>,
    inner: Mutex<Inner>,
    token_key: Vec<u8>,
    /// Wakes the auto-pause sweep (`auto_pause::sweep`) early.
    pub sweep_wake: Arc<tokio::sync::Notify>,
}

impl Shared {
    pub fn new(backend: Arc<dyn Backend>) -> Arc<Self> {
        let token_key = format!("hatchery-e2b-envd:{}", backend.api_key()).into_bytes();
        Arc::new(Shared {
            backend,
            inner: Mutex::new(Inner::default()),
            token_key,
            sweep_wake: Arc::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The envd access token of an E2B sandbox id: an HMAC under the API
    /// key, so it survives restarts and cannot be guessed without the key.
    pub fn access_token(&self, e2b_id: &str) -> String {
        hex_of(&self.tag(b"", e2b_id))
    }

    pub fn check_token(&self, e2b_id: &str, token: &str) -> bool {
        self.check_tag(b"", e2b_id, token)
    }

    /// The traffic access token (`trafficAccessToken` of a create or
    /// connect): what the code interpreter's SDK sends to its `/contexts`
    /// routes (`E2B-Traffic-Access-Token`), which get no envd token. A tag
    /// of its own, so it opens those routes and nothing of envd's.
    pub fn traffic_token(&self, e2b_id: &str) -> String {
        hex_of(&self.tag(TRAFFIC, e2b_id))
    }

    pub fn check_traffic_token(&self, e2b_id: &str, token: &str) -> bool {
        self.check_tag(TRAFFIC, e2b_id, token)
    }

    fn mac(&self, label: &[u8], e2b_id: &str) -> hmac::Hmac<sha2::Sha256> {
        use hmac::Mac;
        let mut m =
            hmac::Hmac::<sha2::Sha256>::new_from_slice(&self.token_key).expect("any key length");
        // The envd token (empty label) keeps the MAC it always had.
        m.update(label);
        m.update(e2b_id.as_bytes());
        m
    }

    fn tag(&self, label: &[u8], e2b_id: &str) -> Vec<u8> {
        use hmac::Mac;
        self.mac(label, e2b_id).finalize().into_bytes()[..24].to_vec()
    }

    fn check_tag(&self, label: &[u8], e2b_id: &str, token: &str) -> bool {
        use hmac::Mac;
        let Ok(raw) = hex(token) else { return false };
        raw.len() == 24 && self.mac(label, e2b_id).verify_truncated_left(&raw).is_ok()
    }

    /// The running Hatchery sandbox behind an E2B id, and its view as
    /// clients see it; `None` if none runs (it may be paused).
    pub async fn live(&self, e2b_id: &str) -> BResult<Option<(String, SandboxView)>> {
        let cached = self.lock().alias.get(e2b_id).cloned();
        for h in [Some(e2b_id.to_string()), cached].into_iter().flatten() {
            match self.backend.get(&h).await {
                Ok(v) => return Ok(Some((h, present(v).1))),
                Err(e) if e.kind == FailKind::SandboxNotFound => {}
                Err(e) => return Err(e),
            }
        }
        // Resumed under this id, by this daemon before a restart or by
        // another host: its metadata says so.
        let filter = BTreeMap::from([(ALIAS_KEY.to_string(), e2b_id.to_string())]);
        let Some(v) = self.backend.find(filter).await?.into_iter().next() else {
            return Ok(None);
        };
        self.set_alias(e2b_id, &v.id);
        Ok(Some((v.id.clone(), present(v).1)))
    }

    /// The pause record of an E2B id, if it is paused.
    pub async fn paused(&self, e2b_id: &str) -> BResult<Option<Paused>> {
        let filter = BTreeMap::from([(PAUSED_KEY.to_string(), e2b_id.to_string())]);
        Ok(self
            .backend
            .find_snapshots(filter)
            .await?
            .into_iter()
            .filter_map(|(snap, v)| Paused::from_snapshot(snap, v))
            .map(|(_, p)| p)
            .next())
    }

    /// Every paused sandbox, by E2B id.
    pub async fn all_paused(&self) -> BResult<Vec<(String, Paused)>> {
        Ok(self
            .backend
            .find_snapshots(BTreeMap::new())
            .await?
            .into_iter()
            .filter_map(|(snap, v)| Paused::from_snapshot(snap, v))
            .collect())
    }

    /// Marks a resume of `e2b_id` as under way here; `false` if one is.
    pub fn begin_resume(&self, e2b_id: &str) -> bool {
        self.lock().resuming.insert(e2b_id.to_string())
    }

    pub fn end_resume(&self, e2b_id: &str) {
        self.lock().resuming.remove(e2b_id);
    }

    /// Marks a pause of `e2b_id` as under way here; `false` if one is.
    pub fn begin_pause(&self, e2b_id: &str) -> bool {
        self.lock().pausing.insert(e2b_id.to_string())
    }

    pub fn end_pause(&self, e2b_id: &str) {
        self.lock().pausing.remove(e2b_id);
    }

    pub fn set_alias(&self, e2b_id: &str, hatchery_id: &str) {
        if e2b_id == hatchery_id {
            return;
        }
        self.lock()
            .alias
            .insert(e2b_id.to_string(), hatchery_id.to_string());
    }

    /// Forgets what this daemon keeps of a sandbox that stopped (killed or
    /// paused): its alias, process details and watchers.
    pub fn forget(&self, e2b_id: &str, hatchery_id: &str) {
        let mut g = self.lock();
        g.alias.remove(e2b_id);
        g.procs.retain(|(sid, _), _| sid != hatchery_id);
        g.watchers.retain(|_, w| w.sandbox != hatchery_id);
    }

    pub fn add_watcher(&self, id: &str, w: Watcher) -> bool {
        let mut g = self.lock();
        if g.watchers.len() >= MAX_WATCHERS {
            return false;
        }
        g.watchers.insert(id.to_string(), w);
        true
    }

    pub fn watcher(&self, id: &str) -> Option<Watcher> {
        self.lock().watchers.get(id).cloned()
    }

    pub fn update_watcher(&self, id: &str, offset: u64, partial: Vec<u8>) {
        if let Some(w) = self.lock().watchers.get_mut(id) {
            w.offset = offset;
            w.partial = partial;
        }
    }

    pub fn remove_watcher(&self, id: &str) -> Option<Watcher> {
        self.lock().watchers.remove(id)
    }

    pub fn remember_proc(&self, sandbox: &str, pid: u32, mut d: ProcDetails) {
        let mut g = self.lock();
        g.seq += 1;
        d.seq = g.seq;
        g.procs.insert((sandbox.to_string(), pid), d);
        let mine = g.procs.keys().filter(|(s, _)| s == sandbox).count();
        if mine > MAX_PROC_DETAILS {
            let oldest = g
                .procs
                .iter()
                .filter(|((s, _), d)| s == sandbox && d.pty.is_none())
                .min_by_key(|(_, d)| d.seq)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                g.procs.remove(&k);
            }
        }
    }

    pub fn proc_details(&self, sandbox: &str, pid: u32) -> Option<ProcDetails> {
        self.lock().procs.get(&(sandbox.to_string(), pid)).cloned()
    }

    pub fn drop_proc(&self, sandbox: &str, pid: u32) {
        self.lock().procs.remove(&(sandbox.to_string(), pid));
    }

    pub fn pid_for_tag(&self, sandbox: &str, tag: &str) -> Option<u32> {
        self.lock()
            .procs
            .iter()
            .find(|((s, _), d)| s == sandbox && d.tag.as_deref() == Some(tag))
            .map(|((_, pid), _)| *pid)
    }

    /// Terminals open in a sandbox, by pid.
    pub fn ptys(&self, sandbox: &str) -> BTreeMap<u32, ProcDetails> {
        self.lock()
            .procs
            .iter()
            .filter(|((s, _), d)| s == sandbox && d.pty.is_some())
            .map(|((_, pid), d)| (*pid, d.clone()))
            .collect()
    }
}

fn hex(s: &str) -> Result<Vec<u8>, ()> {
    if s.len() & 1 == 1 || s.len() > 128 {
        return Err(());
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2).ok_or(())?, 16).map_err(|_| ()))
        .collect()
}
