//! The slot pool and the per-sandbox leases on it.
//!
//! Slots are made by a background filler so that a create only pops one
//! from a queue and swaps its nftables chain. A released slot is scrubbed
//! (policy back to deny-all, addresses and route laid down again,
//! conntrack entries dropped) and queued again; one that fails to scrub is
//! destroyed. At start, [`Network::reclaim`] keeps the slots of sandboxes
//! that survived a daemon crash and destroys every other slot of ours.

use crate::events::{self, EgressEvent};
use crate::nft::{self, SlotRules, Table};
use crate::policy::Compiled;
use crate::resolve::Resolver;
use crate::{plumbing, Cidr, NetError, Policy, PolicyLimits, SlotAddrs};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct NetworkConfig {
    /// Names everything of this daemon on the host: netns `<prefix>-<i>`,
    /// veths `<prefix>h<i>`/`<prefix>g<i>`, table `hatchery_<prefix>`.
    pub prefix: String,
    /// Where slot /30s are carved from; always blocked as a destination.
    pub range: Cidr,
    /// Slots kept made and waiting.
    pub ready_target: usize,
    pub limits: PolicyLimits,
    pub hosts_file: Option<PathBuf>,
}

impl NetworkConfig {
    pub fn validate(&self) -> Result<(), NetError> {
        let p = &self.prefix;
        if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_lowercase()) {
            return Err(NetError::Invalid(format!(
                "network prefix {p:?} must be 1-5 lowercase letters"
            )));
        }
        if self.range.slot_capacity() == 0 {
            return Err(NetError::Invalid(format!(
                "slot range {} is too small",
                self.range
            )));
        }
        Ok(())
    }
}

/// What a sandbox holds: its slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotLease {
    pub index: u32,
    pub netns: PathBuf,
    pub guest_ip: std::net::Ipv4Addr,
}

struct Lease {
    owner: String,
    policy: Policy,
    /// Addresses the policy's allowed host names were pinned to.
    pins: Pins,
}

/// Host name → the addresses it was resolved to when the policy was set.
pub type Pins = Vec<(String, Vec<std::net::Ipv4Addr>)>;

#[derive(Default)]
struct Inner {
    ready: VecDeque<u32>,
    /// Indexes below `next` that have no slot on the host.
    holes: BTreeSet<u32>,
    /// Indexes from `next` up were never made.
    next: u32,
    leases: HashMap<u32, Lease>,
    by_owner: HashMap<String, u32>,
    /// Slots being made by the filler right now.
    making: usize,
}

pub struct Metrics {
    pub denied: prometheus::IntCounter,
    pub ready: prometheus::IntGauge,
    pub leased: prometheus::IntGauge,
}

pub struct Network {
    cfg: NetworkConfig,
    table: Table,
    resolver: Resolver,
    inner: Mutex<Inner>,
    wake: Condvar,
    events: Mutex<HashMap<String, events::Ring>>,
    metrics: Metrics,
    closing: AtomicBool,
    lock: Mutex<Option<crate::host::PrefixLock>>,
}

impl Network {
    /// Takes this prefix's host-wide lock, turns on forwarding (guarded),
    /// and starts the event reader. Call [`Network::reclaim`] next.
    pub fn start(cfg: NetworkConfig, metrics: Metrics) -> Result<Arc<Network>, NetError> {
        cfg.validate()?;
        let lock = crate::host::PrefixLock::take(&cfg.prefix)?;
        let guard = crate::host::enable_forwarding(&lock)?;
        let table = Table::new(&cfg.prefix, cfg.range, guard);
        let net = Arc::new(Network {
            resolver: Resolver::with_overrides(cfg.hosts_file.as_deref())?,
            table,
            cfg,
            inner: Mutex::default(),
            wake: Condvar::new(),
            events: Mutex::default(),
            metrics,
            closing: AtomicBool::new(false),
            lock: Mutex::new(Some(lock)),
        });
        let weak = Arc::downgrade(&net);
        events::follow_kmsg(net.table.log_prefix(), move |d| {
            if let Some(n) = weak.upgrade() {
                n.record(d);
            }
        })?;
        Ok(net)
    }

    fn slot(&self, i: u32) -> SlotAddrs {
        SlotAddrs::new(&self.cfg.prefix, self.cfg.range, i)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Rebuilds the table with exactly the slots in `keep` (slot, owner,
    /// policy) and destroys every other slot of this prefix on the host.
    /// Returns the owners whose slot could not be kept.
    pub fn reclaim(&self, keep: Vec<(u32, String, Policy)>) -> Result<Vec<String>, NetError> {
        let on_host: BTreeSet<u32> = plumbing::existing(&self.cfg.prefix)?.into_iter().collect();
        let mut kept = Vec::new();
        let mut lost = Vec::new();
        let mut chains = Vec::new();
        for (i, owner, policy) in keep {
            if !on_host.contains(&i) || i >= self.cfg.range.slot_capacity() {
                lost.push(owner);
                continue;
            }
            // Host names are pinned again as they resolve now.
            let (rules, pins) = self
                .compile_pinned(&policy)
                .or_else(|_| self.compile_pinned(&Policy::deny_all()))?;
            chains.push((self.slot(i), rules));
            kept.push((i, owner, policy, pins));
        }
        nft::apply(&self.table.rebuild_script(&chains))?;
        let kept_idx: BTreeSet<u32> = kept.iter().map(|k| k.0).collect();
        for i in on_host.difference(&kept_idx) {
            plumbing::destroy(&self.slot(*i));
        }
        let mut g = self.lock();
        *g = Inner::default();
        g.next = kept_idx.iter().next_back().map_or(0, |m| m + 1);
        g.holes = (0..g.next).filter(|i| !kept_idx.contains(i)).collect();
        for (i, owner, policy, pins) in kept {
            g.by_owner.insert(owner.clone(), i);
            g.leases.insert(
                i,
                Lease {
                    owner,
                    policy,
                    pins,
                },
            );
        }
        self.metrics.leased.set(g.leases.len() as i64);
        self.metrics.ready.set(0);
        Ok(lost)
    }

    /// Keeps `ready_target` slots made, in the background.
    pub fn spawn_filler(self: &Arc<Self>) {
        let me = Arc::clone(self);
        std::thread::Builder::new()
            .name("net-slot-filler".into())
            .spawn(move || me.fill_loop())
            .expect("spawn slot filler");
    }

    fn fill_loop(&self) {
        loop {
            let next = {
                let mut g = self.lock();
                loop {
                    if self.closing.load(Ordering::SeqCst) {
                        return;
                    }
                    if g.ready.len() + g.making < self.cfg.ready_target {
                        if let Some(i) = self.fresh_index(&mut g) {
                            g.making += 1;
                            break i;
                        }
                    }
                    g = self
                        .wake
                        .wait_timeout(g, Duration::from_secs(1))
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            };
            let made = self.make(next);
            let mut g = self.lock();
            g.making -= 1;
            match made {
                Ok(()) => g.ready.push_back(next),
                Err(e) => {
                    g.holes.insert(next);
                    drop(g);
                    tracing::warn!(slot = next, error = %e, "making a network slot failed");
                    std::thread::sleep(Duration::from_secs(1));
                    continue;
                }
            }
            self.metrics.ready.set(g.ready.len() as i64);
            self.wake.notify_all();
        }
    }

    fn fresh_index(&self, g: &mut Inner) -> Option<u32> {
        if let Some(i) = g.holes.pop_first() {
            return Some(i);
        }
        if g.next < self.cfg.range.slot_capacity() {
            g.next += 1;
            return Some(g.next - 1);
        }
        None
    }

    fn make(&self, i: u32) -> Result<(), NetError> {
        let s = self.slot(i);
        plumbing::create(&s)?;
        if let Err(e) = nft::apply(&self.table.add_slot_script(&s, &SlotRules::default())) {
            plumbing::destroy(&s);
            return Err(e);
        }
        Ok(())
    }

    fn compile_pinned(&self, p: &Policy) -> Result<(SlotRules, Pins), NetError> {
        p.validate(self.cfg.limits)?;
        let resolve = |h: &str| self.resolver.resolve(h);
        let all = |rules: &[crate::Rule]| -> Result<Vec<Compiled>, NetError> {
            rules.iter().map(|r| r.compile(&resolve)).collect()
        };
        let allow = all(&p.allow)?;
        let pins = p
            .allow
            .iter()
            .zip(&allow)
            .filter_map(|(r, c)| {
                let addrs = c.nets.iter().map(|n| n.addr).collect();
                r.host.clone().map(|h| (h, addrs))
            })
            .collect();
        let rules = SlotRules {
            egress: p.egress,
            allow,
            deny: all(&p.deny)?,
        };
        Ok((rules, pins))
    }

    /// Gives `owner` a slot enforcing `policy`. Blocking.
    pub fn claim(&self, owner: &str, policy: &Policy) -> Result<SlotLease, NetError> {
        let (rules, pins) = self.compile_pinned(policy)?;
        let i = self.take_ready()?;
        let s = self.slot(i);
        // A ready slot already denies everything: the default costs nothing.
        if *policy != Policy::deny_all() {
            if let Err(e) = nft::apply(&self.table.set_policy_script(&s, &rules)) {
                self.scrub_or_destroy(i);
                return Err(e);
            }
        }
        let mut g = self.lock();
        g.by_owner.insert(owner.to_string(), i);
        g.leases.insert(
            i,
            Lease {
                owner: owner.to_string(),
                policy: policy.clone(),
                pins,
            },
        );
        self.metrics.leased.set(g.leases.len() as i64);
        Ok(self.lease(i))
    }

    fn lease(&self, i: u32) -> SlotLease {
        let s = self.slot(i);
        SlotLease {
            index: i,
            netns: s.netns_path(),
            guest_ip: s.guest_ip,
        }
    }

    fn take_ready(&self) -> Result<u32, NetError> {
        let fresh = {
            let mut g = self.lock();
            if let Some(i) = g.ready.pop_front() {
                self.metrics.ready.set(g.ready.len() as i64);
                self.wake.notify_all();
                return Ok(i);
            }
            match self.fresh_index(&mut g) {
                Some(i) => i,
                None => return Err(NetError::Exhausted(g.leases.len())),
            }
        };
        // The filler is behind: pay for one slot now rather than fail.
        self.wake.notify_all();
        match self.make(fresh) {
            Ok(()) => Ok(fresh),
            Err(e) => {
                self.lock().holes.insert(fresh);
                Err(e)
            }
        }
    }

    /// Replaces `owner`'s policy; new and existing connections follow it
    /// as soon as this returns. Blocking.
    pub fn set_policy(&self, owner: &str, policy: &Policy) -> Result<(), NetError> {
        let (rules, pins) = self.compile_pinned(policy)?;
        let i = self.index_of(owner)?;
        nft::apply(&self.table.set_policy_script(&self.slot(i), &rules))?;
        if let Some(l) = self.lock().leases.get_mut(&i) {
            l.policy = policy.clone();
            l.pins = pins;
        }
        Ok(())
    }

    pub fn pins(&self, owner: &str) -> Pins {
        let g = self.lock();
        g.by_owner
            .get(owner)
            .and_then(|i| g.leases.get(i))
            .map(|l| l.pins.clone())
            .unwrap_or_default()
    }

    pub fn policy(&self, owner: &str) -> Option<Policy> {
        let g = self.lock();
        let i = g.by_owner.get(owner)?;
        g.leases.get(i).map(|l| l.policy.clone())
    }

    pub fn lease_of(&self, owner: &str) -> Option<SlotLease> {
        Some(self.lease(self.index_of(owner).ok()?))
    }

    fn index_of(&self, owner: &str) -> Result<u32, NetError> {
        self.lock()
            .by_owner
            .get(owner)
            .copied()
            .ok_or_else(|| NetError::Invalid(format!("{owner} holds no network slot")))
    }

    /// Returns `owner`'s slot once its sandbox is gone. Blocking; idempotent.
    pub fn release(&self, owner: &str) {
        let i = {
            let mut g = self.lock();
            let Some(i) = g.by_owner.remove(owner) else {
                return;
            };
            g.leases.remove(&i);
            self.metrics.leased.set(g.leases.len() as i64);
            i
        };
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(owner);
        self.scrub_or_destroy(i);
    }

    fn scrub_or_destroy(&self, i: u32) {
        let s = self.slot(i);
        let scrubbed = nft::apply(&self.table.scrub_script(&s))
            .and_then(|_| plumbing::configure_guest_end(&s));
        plumbing::flush_conntrack(&s);
        let mut g = self.lock();
        match scrubbed {
            Ok(()) if !self.closing.load(Ordering::SeqCst) => {
                g.ready.push_back(i);
                self.metrics.ready.set(g.ready.len() as i64);
            }
            res => {
                if let Err(e) = res {
                    tracing::warn!(slot = i, error = %e, "scrubbing a network slot failed; destroying it");
                }
                drop(g);
                self.destroy_slot(i);
                self.lock().holes.insert(i);
            }
        }
    }

    fn destroy_slot(&self, i: u32) {
        let s = self.slot(i);
        let _ = nft::apply(&self.table.remove_slot_script(&s));
        plumbing::destroy(&s);
    }

    fn record(&self, d: events::Denied) {
        let Some(i) = d
            .host_if
            .strip_prefix(&crate::addr::host_if_prefix(&self.cfg.prefix))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            return;
        };
        let Some(owner) = self.lock().leases.get(&i).map(|l| l.owner.clone()) else {
            return;
        };
        self.metrics.denied.inc();
        let e = EgressEvent {
            seq: 0,
            time_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            protocol: d.protocol,
            destination: d.destination,
            port: d.port,
        };
        let mut ev = self.events.lock().unwrap_or_else(|p| p.into_inner());
        events::push(ev.entry(owner).or_default(), e);
    }

    /// Denied attempts of `owner`, oldest first.
    pub fn events(&self, owner: &str) -> Vec<EgressEvent> {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(owner)
            .map(|q| q.events.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// How many new connections `owner`'s slot refused since it was
    /// leased: exact, where [`Self::events`] keeps what the rate-limited
    /// kernel log reported. `None` without a slot or a counter (a slot
    /// made by an older daemon and adopted).
    pub fn denied_total(&self, owner: &str) -> Option<u64> {
        let i = self.index_of(owner).ok()?;
        let args = self.table.counter_args(i);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        nft::parse_counter(&crate::cmd::output("nft", &args).ok()?)
    }

    pub fn ready_count(&self) -> usize {
        self.lock().ready.len()
    }

    pub fn leased_count(&self) -> usize {
        self.lock().leases.len()
    }

    /// Destroys the waiting slots. Slots of live sandboxes stay (the
    /// sandboxes outlive a daemon stop and are re-adopted); once none is
    /// left, the table goes and forwarding is put back. Blocking.
    pub fn shutdown(&self) {
        self.closing.store(true, Ordering::SeqCst);
        self.wake.notify_all();
        // Let an in-flight make finish so its slot is not orphaned.
        let mut waited = 0;
        while self.lock().making > 0 && waited < 100 {
            std::thread::sleep(Duration::from_millis(50));
            waited += 1;
        }
        let (ready, leased): (Vec<u32>, BTreeSet<u32>) = {
            let mut g = self.lock();
            (
                g.ready.drain(..).collect(),
                g.leases.keys().copied().collect(),
            )
        };
        for i in ready {
            self.destroy_slot(i);
        }
        // Whatever else carries our prefix and is not in use.
        if let Ok(rest) = plumbing::existing(&self.cfg.prefix) {
            for i in rest.into_iter().filter(|i| !leased.contains(i)) {
                self.destroy_slot(i);
            }
        }
        self.metrics.ready.set(0);
        if !leased.is_empty() {
            tracing::info!(slots = leased.len(), "network slots of live sandboxes kept");
            return;
        }
        let _ = nft::apply(&self.table.delete_script());
        if let Some(lock) = self.lock.lock().unwrap_or_else(|p| p.into_inner()).take() {
            crate::host::restore_forwarding(&lock);
            lock.release();
        }
    }
}
