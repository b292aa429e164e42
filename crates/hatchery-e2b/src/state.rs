//! What this adapter remembers beyond Hatchery: E2B ids of resumed
//! sandboxes (a resume is a restore into a new Hatchery sandbox, but E2B
//! clients keep the old id), paused sandboxes (a snapshot and what to
//! report about them), and per-process details E2B has and Hatchery does
//! not (tags, the config a process was started with, open terminals).
//!
//! It lives in memory: after a daemon restart paused sandboxes are no
//! longer listed (their snapshots stay, see docs/e2b.md).

use crate::backend::{Backend, Pty, SandboxView};
use crate::pb::process::ProcessConfig;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

/// Most paused sandboxes remembered at once; pausing more is refused.
pub const MAX_PAUSED: usize = 256;
/// Most processes whose E2B details are remembered per sandbox; the
/// oldest are forgotten first (Hatchery keeps 64 exited ones).
pub const MAX_PROC_DETAILS: usize = 256;

#[derive(Debug, Clone)]
pub struct Paused {
    pub snapshot: String,
    pub view: SandboxView,
}

/// One process's E2B details.
#[derive(Clone)]
pub struct ProcDetails {
    pub proc_id: Option<String>,
    pub config: ProcessConfig,
    pub tag: Option<String>,
    pub pty: Option<Arc<dyn Pty>>,
    /// Where a terminal's output goes (see `process::PtyTap`).
    pub tap: Option<Arc<crate::process::PtyTap>>,
    pub seq: u64,
}

#[derive(Default)]
struct Inner {
    /// E2B id -> Hatchery id, for resumed sandboxes only.
    alias: HashMap<String, String>,
    /// Hatchery id -> E2B id, the other way round.
    reverse: HashMap<String, String>,
    paused: HashMap<String, Paused>,
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

pub struct Shared {
    pub backend: Arc<dyn Backend>,
    inner: Mutex<Inner>,
    token_key: Vec<u8>,
}

impl Shared {
    pub fn new(backend: Arc<dyn Backend>) -> Arc<Self> {
        let token_key = format!("hatchery-e2b-envd:{}", backend.api_key()).into_bytes();
        Arc::new(Shared {
            backend,
            inner: Mutex::new(Inner::default()),
            token_key,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The envd access token of an E2B sandbox id: an HMAC under the API
    /// key, so it survives restarts and cannot be guessed without the key.
    pub fn access_token(&self, e2b_id: &str) -> String {
        use hmac::{Hmac, Mac};
        let mut m = Hmac::<sha2::Sha256>::new_from_slice(&self.token_key).expect("any key length");
        m.update(e2b_id.as_bytes());
        let tag = m.finalize().into_bytes();
        tag[..24].iter().map(|b| format!("{b:02x}")).collect()
    }

    pub fn check_token(&self, e2b_id: &str, token: &str) -> bool {
        use hmac::{Hmac, Mac};
        let Ok(raw) = hex(token) else { return false };
        let mut m = Hmac::<sha2::Sha256>::new_from_slice(&self.token_key).expect("any key length");
        m.update(e2b_id.as_bytes());
        m.verify_truncated_left(&raw).is_ok() && raw.len() == 24
    }

    /// The Hatchery sandbox behind an E2B id.
    pub fn resolve(&self, e2b_id: &str) -> String {
        self.lock()
            .alias
            .get(e2b_id)
            .cloned()
            .unwrap_or_else(|| e2b_id.to_string())
    }

    /// The E2B id of a Hatchery sandbox.
    pub fn e2b_id(&self, hatchery_id: &str) -> String {
        self.lock()
            .reverse
            .get(hatchery_id)
            .cloned()
            .unwrap_or_else(|| hatchery_id.to_string())
    }

    pub fn paused(&self, e2b_id: &str) -> Option<Paused> {
        self.lock().paused.get(e2b_id).cloned()
    }

    pub fn all_paused(&self) -> Vec<(String, Paused)> {
        self.lock()
            .paused
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    pub fn paused_count(&self) -> usize {
        self.lock().paused.len()
    }

    /// Records a pause: the Hatchery sandbox is gone, the snapshot stands in.
    pub fn set_paused(&self, e2b_id: &str, p: Paused) {
        let mut g = self.lock();
        let old = g.alias.remove(e2b_id);
        if let Some(h) = old {
            g.reverse.remove(&h);
        }
        g.paused.insert(e2b_id.to_string(), p);
    }

    /// Takes the pause record for a resume (so two resumes cannot race).
    pub fn take_paused(&self, e2b_id: &str) -> Option<Paused> {
        self.lock().paused.remove(e2b_id)
    }

    pub fn put_back_paused(&self, e2b_id: &str, p: Paused) {
        self.lock().paused.insert(e2b_id.to_string(), p);
    }

    pub fn set_alias(&self, e2b_id: &str, hatchery_id: &str) {
        if e2b_id == hatchery_id {
            return;
        }
        let mut g = self.lock();
        g.alias.insert(e2b_id.to_string(), hatchery_id.to_string());
        g.reverse
            .insert(hatchery_id.to_string(), e2b_id.to_string());
    }

    /// Forgets a sandbox entirely (killed): its alias, pause record and
    /// process details. Returns the snapshot of a paused one.
    pub fn forget(&self, e2b_id: &str) -> Option<String> {
        let mut g = self.lock();
        let h = g.alias.remove(e2b_id).unwrap_or_else(|| e2b_id.to_string());
        g.reverse.remove(&h);
        g.procs.retain(|(sid, _), _| *sid != h);
        g.watchers.retain(|_, w| w.sandbox != h);
        g.paused.remove(e2b_id).map(|p| p.snapshot)
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
