use crate::agent_client::AgentClient;
use crate::exec::{ExecOutcome, ExecParams, Sink};
use crate::ids::{new_sandbox_id, valid_sandbox_id};
use crate::metrics::Metrics;
use crate::pool::{PoolConfig, WarmPool};
use crate::ratelimit::LogLimiter;
use crate::store::{Fence, SandboxFilter, SandboxRow, SandboxState, Store};
use crate::{files, now_ms, Caps, CoreError};
use hatchery_agent_proto::{FileEntry, Frame, Kind, ProcInfo};
use hatchery_runtime::{Runtime, SandboxSpec};
use hatchery_templates::{ImageStore, Template, Templates};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const PING_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Default)]
pub struct CreateRequest {
    pub template: String,
    pub ttl_seconds: Option<u64>,
    pub metadata: BTreeMap<String, String>,
    pub env: BTreeMap<String, String>,
    /// Egress policy; `None` is the default, deny-all.
    pub network: Option<hatchery_net::Policy>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SandboxInfo {
    pub id: String,
    pub template: String,
    pub state: String,
    pub created_at_ms: u64,
    pub expires_at_ms: u64,
    pub metadata: BTreeMap<String, String>,
    /// How it came up ("pool", "restore", "cold", "fork"); only on create.
    pub boot_mode: Option<&'static str>,
    pub boot_ms: Option<u64>,
}

impl From<SandboxRow> for SandboxInfo {
    fn from(r: SandboxRow) -> Self {
        SandboxInfo {
            id: r.id,
            template: r.template,
            state: r.state.as_str().to_string(),
            created_at_ms: r.created_at_ms,
            expires_at_ms: r.expires_at_ms,
            metadata: r.metadata,
            boot_mode: None,
            boot_ms: None,
        }
    }
}

pub(crate) struct Live {
    pub client: Arc<AgentClient>,
    pub env: BTreeMap<String, String>,
    /// Channels of the terminals attached now.
    pub terminals: Mutex<std::collections::HashSet<u32>>,
    /// What the host knows of its background processes (proc_oom.rs).
    pub procs: crate::proc_oom::ProcOoms,
    /// Parking while nobody uses it (idle.rs).
    pub idle: Arc<crate::idle_gate::IdleGate>,
}

/// Owns every sandbox of this daemon: the state store, the runtime, the
/// live agent connections and the deadlines.
pub struct Manager {
    pub caps: Caps,
    pub metrics: Metrics,
    pub(crate) store: Arc<dyn Store>,
    /// This host's lease: every state write carries it, and the store
    /// refuses it once another incarnation took the lease over.
    pub(crate) fence: Fence,
    /// Set when the lease was lost: the host stops serving.
    pub(crate) fenced_off: std::sync::atomic::AtomicBool,
    pub(crate) runtime: Arc<dyn Runtime>,
    templates: Templates,
    pub(crate) live: Mutex<HashMap<String, Arc<Live>>>,
    /// Creates in flight, counted against capacity before they are live.
    starting: Mutex<usize>,
    pub(crate) logs: LogLimiter,
    /// Warm checkpoints of templates, one per template version.
    pub(crate) template_images: ImageStore,
    pub(crate) snapshots: crate::snapshot_stores::SnapshotStores,
    pub(crate) pool: WarmPool,
    /// The snapshots whose forks are kept warm in `pool`, and how many.
    pub(crate) snapshot_pools: crate::snapshot_pool::Wanted,
    /// Templates whose checkpoint is being baked right now.
    pub(crate) baking: Mutex<std::collections::HashSet<String>>,
    pub(crate) closing: std::sync::atomic::AtomicBool,
    /// Set once `shutdown` has finished: only then does the lease keeper
    /// stop renewing. A shutdown can outlast the host lease (an in-flight
    /// refill, bakes, teardowns: up to about 90 s), and a host that went
    /// silent that long while still stopping would be swept as lost, its
    /// live sandboxes marked `host_lost` instead of re-adopted at restart.
    pub(crate) shut_down: std::sync::atomic::AtomicBool,
    pub(crate) builds: crate::builds::Builds,
    /// Held by the pool filler while it restores; shutdown takes it so no
    /// refill is cut off halfway (which would orphan a sandbox).
    pub(crate) filling: tokio::sync::Mutex<()>,
    /// Host teardowns running in the background.
    pub(crate) teardowns: Arc<std::sync::atomic::AtomicUsize>,
    /// Network slots and policies; `None` when networking is off.
    pub(crate) net: Option<Arc<hatchery_net::Network>>,
    /// Host services every sandbox reaches on its loopback.
    pub(crate) host_services: Arc<crate::host_services::Hub>,
    /// Why sandboxes ended on their own lately (ends.rs).
    pub(crate) recent_ends: crate::ends::RecentEnds,
}

/// Where checkpoint images live and how big the warm pool may get.
#[derive(Debug, Clone)]
pub struct ImageConfig {
    pub template_images: ImageStore,
    /// This host's snapshot directory (the `local` store).
    pub snapshots: ImageStore,
    /// The store every host mounts (`--snapshot-store shared:<dir>`):
    /// where new snapshots go when set.
    pub shared_snapshots: Option<Arc<dyn hatchery_templates::SnapshotStore>>,
    pub pool: PoolConfig,
}

impl Manager {
    pub fn new(
        caps: Caps,
        state: crate::lease::HostStore,
        runtime: Arc<dyn Runtime>,
        templates: Templates,
        images: ImageConfig,
        net: Option<Arc<hatchery_net::Network>>,
        metrics: Metrics,
    ) -> Arc<Manager> {
        Arc::new(Manager {
            host_services: crate::host_services::Hub::new(metrics.relay.clone()),
            recent_ends: Default::default(),
            net,
            template_images: images.template_images,
            snapshots: crate::snapshot_stores::SnapshotStores::new(
                images.snapshots,
                images.shared_snapshots,
            ),
            pool: WarmPool::new(
                images.pool,
                metrics.pool_ready.clone(),
                metrics.snapshot_pool_ready.clone(),
            ),
            snapshot_pools: Default::default(),
            filling: Default::default(),
            teardowns: Default::default(),
            baking: Mutex::new(Default::default()),
            closing: Default::default(),
            shut_down: Default::default(),
            builds: Default::default(),
            caps,
            metrics,
            store: state.store,
            fence: state.fence,
            fenced_off: Default::default(),
            runtime,
            templates,
            live: Mutex::new(HashMap::new()),
            starting: Mutex::new(0),
            logs: LogLimiter::new(Duration::from_secs(10), 5),
        })
    }

    pub fn templates(&self) -> &Templates {
        &self.templates
    }

    pub fn runtime(&self) -> &Arc<dyn Runtime> {
        &self.runtime
    }

    /// The host this daemon runs as (`--host-id`).
    pub fn host_id(&self) -> &str {
        &self.fence.owner
    }

    /// Whether this host mounts the shared snapshot store (and so may
    /// serve any shared snapshot).
    pub fn has_shared_snapshots(&self) -> bool {
        self.snapshots.has_shared()
    }

    /// This host's lease epoch, as the store knows it.
    pub fn epoch(&self) -> u64 {
        self.fence.epoch
    }

    pub(crate) async fn live_get(&self, id: &str) -> Result<Arc<Live>, CoreError> {
        if let Some(l) = self.live.lock().unwrap_or_else(|p| p.into_inner()).get(id) {
            return Ok(Arc::clone(l));
        }
        match self.store.get_live(id).await? {
            Some(_) => Err(CoreError::NotRunning(id.to_string())),
            None => Err(CoreError::SandboxNotFound(id.to_string())),
        }
    }

    pub(crate) fn reserve(&self) -> Result<(), CoreError> {
        self.check_lease()?;
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner()).len();
        let mut s = self.starting.lock().unwrap_or_else(|p| p.into_inner());
        if live + *s >= self.caps.max_live_sandboxes {
            return Err(CoreError::Capacity(self.caps.max_live_sandboxes));
        }
        *s += 1;
        Ok(())
    }

    pub(crate) fn unreserve(&self) {
        let mut s = self.starting.lock().unwrap_or_else(|p| p.into_inner());
        *s = s.saturating_sub(1);
    }

    pub async fn create(self: &Arc<Self>, req: CreateRequest) -> Result<SandboxInfo, CoreError> {
        let template = self.template_for_create(&req.template)?;
        let ttl = req.ttl_seconds.unwrap_or(self.caps.default_ttl_s);
        crate::within("ttl_seconds", ttl, self.caps.max_ttl_s)?;
        if let Some(p) = &req.network {
            self.check_policy(p)?;
        }
        self.reserve()?;
        let res = self.create_reserved(req, template, ttl).await;
        self.unreserve();
        if res.is_err() {
            self.metrics.create_failures.inc();
        }
        res
    }

    async fn create_reserved(
        self: &Arc<Self>,
        req: CreateRequest,
        template: Template,
        ttl: u64,
    ) -> Result<SandboxInfo, CoreError> {
        let started = Instant::now();
        let now = now_ms();
        let policy = req.network.unwrap_or_default();
        let mut row = SandboxRow {
            id: new_sandbox_id(),
            template: template.spec.name.clone(),
            state: SandboxState::Starting,
            created_at_ms: now,
            expires_at_ms: now + ttl * 1000,
            metadata: req.metadata,
            env: req.env,
            host_id: self.fence.owner.clone(),
            template_version: template.version.clone(),
            rootfs: template.rootfs.to_string_lossy().into_owned(),
            limits: template.limits_json(),
        };
        while let Some((id, client)) = self.pool.take(&template.spec.name) {
            row.id = id;
            if let Some(info) = self.claim_pooled(&row, &policy, client, started).await? {
                return Ok(info);
            }
        }
        row.id = new_sandbox_id();
        let image = self.template_image(&template);
        if image.is_none() {
            // Missing, stale or failed its checksum: boot this one, and
            // have a fresh checkpoint for the next.
            self.spawn_bake(&template);
        }
        let Some(image) = image else {
            return self
                .boot_row(row, &policy, &template, None, None, "cold", started)
                .await;
        };
        let first = self
            .boot_row(
                row.clone(),
                &policy,
                &template,
                Some(&image),
                None,
                "restore",
                started,
            )
            .await;
        match first {
            // A checkpoint that passed its checksum but that the runtime
            // refuses to restore (a runsc upgrade, a host change the image
            // id does not capture): the failed attempt is already stopped
            // and cleaned; this create boots cold instead, and the image is
            // dropped and baked again, so the next create restores.
            Err(CoreError::Runtime(e)) => {
                tracing::warn!(template = %template.spec.name, error = %e,
                    "template checkpoint refused by the runtime; booting cold and baking it again");
                self.rebake_refused(&template);
                row.id = new_sandbox_id();
                self.boot_row(row, &policy, &template, None, None, "cold", started)
                    .await
            }
            other => other,
        }
    }

    /// The runtime refused to restore `template`'s checkpoint although it
    /// passed its checksum (a runsc upgrade, a host change the image id
    /// does not capture): drop it and bake it again, so the next restore
    /// (a create or a pool refill) has one the runtime takes.
    pub(crate) fn rebake_refused(self: &Arc<Self>, template: &Template) {
        self.metrics.restore_fallbacks.inc();
        let _ = self
            .template_images
            .remove(&self.template_image_id(template));
        self.spawn_bake(template);
    }

    /// Turns a pooled sandbox into the caller's. `None` if it turned out to
    /// be dead, in which case it has been cleaned up.
    pub(crate) async fn claim_pooled(
        self: &Arc<Self>,
        row: &SandboxRow,
        policy: &hatchery_net::Policy,
        client: Arc<AgentClient>,
        started: Instant,
    ) -> Result<Option<SandboxInfo>, CoreError> {
        // From here on it serves a caller: the normal CPU weight, before
        // anything else, so the claim's own steps do not run starved.
        self.runtime.foreground(&row.id);
        // Pooled sandboxes deny all egress; anything else is set before the
        // caller can run a single command.
        if *policy != hatchery_net::Policy::deny_all() {
            if let Err(e) = self.set_slot_policy(&row.id, policy).await {
                self.stop(&row.id, "pool_discard").await;
                return Err(e);
            }
        }
        let ok = client.is_alive()
            && self.store.claim(&self.fence, row).await.unwrap_or(false)
            && self
                .runtime
                .set_expiry(&row.id, row.expires_at_ms)
                .await
                .is_ok();
        if !ok {
            self.stop(&row.id, "pool_discard").await;
            return Ok(None);
        }
        if policy.has_hosts() {
            if let Err(e) = self.write_pins(&row.id, &client).await {
                self.stop(&row.id, "pool_discard").await;
                return Err(e);
            }
        }
        self.adopt(&row.id, client, row.env.clone());
        Ok(Some(self.created(row.clone(), "pool", started)))
    }

    fn created(&self, row: SandboxRow, mode: &'static str, started: Instant) -> SandboxInfo {
        let ms = started.elapsed().as_millis() as u64;
        self.metrics.sandboxes_created.inc();
        self.metrics
            .create_seconds
            .observe(started.elapsed().as_secs_f64());
        tracing::info!(sandbox = %row.id, template = %row.template, boot_mode = mode, ms, "sandbox created");
        let mut info = SandboxInfo::from(row);
        info.state = SandboxState::Running.as_str().into();
        info.boot_mode = Some(mode);
        info.boot_ms = Some(ms);
        info
    }

    /// Starts a sandbox for `row`, from `image` if given, else by booting,
    /// then unpacks `files` (a files-only snapshot's export) into it if
    /// given, and registers it. On failure nothing is left but a stopped
    /// row.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn boot_row(
        self: &Arc<Self>,
        row: SandboxRow,
        policy: &hatchery_net::Policy,
        template: &Template,
        image: Option<&Path>,
        files: Option<&Path>,
        mode: &'static str,
        started: Instant,
    ) -> Result<SandboxInfo, CoreError> {
        let client = self.start_row(&row, policy, template, image, files).await?;
        crate::steps::mark("files");
        // Guarded: a delete that came in while it booted has stopped the
        // row (and torn the sandbox down), and must not be overwritten.
        match self
            .store
            .transition(
                &self.fence,
                &row.id,
                &[SandboxState::Starting],
                SandboxState::Running,
            )
            .await
        {
            Ok(true) => {}
            res => {
                // Torn down here, not by the stop's teardown: that one
                // may have run before the boot finished.
                drop(client);
                let _ = self.runtime.destroy(&row.id).await;
                self.release_slot(&row.id).await;
                let _ = self
                    .store
                    .stop(&self.fence, &row.id, "create_failed", now_ms())
                    .await;
                return Err(match res {
                    Err(e) => e.into(),
                    _ => CoreError::NotRunning(row.id),
                });
            }
        }
        crate::steps::mark("running_row");
        self.adopt(&row.id, client, row.env.clone());
        crate::steps::mark("adopt");
        Ok(self.created(row, mode, started))
    }

    /// Records `row`, then boots or restores its sandbox (and unpacks
    /// `files` into it). On failure the row is stopped and the host
    /// cleaned, so nothing half-made remains.
    pub(crate) async fn start_row(
        &self,
        row: &SandboxRow,
        policy: &hatchery_net::Policy,
        template: &Template,
        image: Option<&Path>,
        files: Option<&Path>,
    ) -> Result<Arc<AgentClient>, CoreError> {
        self.store.insert_sandbox(&self.fence, row).await?;
        crate::steps::mark("row");
        let netns = match self.claim_slot(&row.id, policy).await {
            Ok(n) => n,
            Err(e) => {
                self.store
                    .stop(&self.fence, &row.id, "create_failed", now_ms())
                    .await?;
                return Err(e);
            }
        };
        let spec = SandboxSpec {
            id: row.id.clone(),
            rootfs: template.rootfs.clone(),
            limits: template.limits(),
            expires_at_ms: row.expires_at_ms,
            netns,
            // A pool refill: least CPU weight until claimed (pool.rs).
            background: row.state == SandboxState::Pooled,
        };
        crate::steps::mark("slot");
        let booted = async {
            let client = self.boot(&spec, image, template).await?;
            if let Some(f) = files {
                // Before the row runs: nobody sees the sandbox without
                // its files.
                self.runtime.import_files(&spec.id, f).await?;
            }
            if policy.has_hosts() {
                self.write_pins(&row.id, &client).await?;
            }
            Ok(client)
        }
        .await;
        match booted {
            Ok(c) => Ok(c),
            Err(e) => {
                tracing::warn!(sandbox = %row.id, error = %e, "create failed");
                let _ = self.runtime.destroy(&row.id).await;
                self.release_slot(&row.id).await;
                self.store
                    .stop(&self.fence, &row.id, "create_failed", now_ms())
                    .await?;
                Err(e)
            }
        }
    }

    async fn boot(
        &self,
        spec: &SandboxSpec,
        image: Option<&Path>,
        template: &Template,
    ) -> Result<Arc<AgentClient>, CoreError> {
        match image {
            Some(dir) => self.runtime.restore(spec, dir).await?,
            None => self.runtime.create(spec).await?,
        }
        crate::steps::mark("restore");
        let client = self.connect_agent(&spec.id).await?;
        crate::steps::mark("agent");
        if image.is_none() {
            // A checkpoint would already hold the template's files and setup.
            self.prepare_guest(&client, template, &mut |_| {}).await?;
        }
        Ok(client)
    }

    /// Registers a connected sandbox and watches its channel: if the guest
    /// goes away on its own (TTL kill by the shim, crash), the sandbox is
    /// marked stopped and cleaned up.
    pub(crate) fn adopt(
        self: &Arc<Self>,
        id: &str,
        client: Arc<AgentClient>,
        env: BTreeMap<String, String>,
    ) {
        let mut closed = client.closed();
        let idle = crate::idle_gate::IdleGate::new(
            id,
            Arc::clone(&self.runtime),
            self.metrics.idle.clone(),
        );
        client.set_gate(Arc::clone(&idle));
        self.live.lock().unwrap_or_else(|p| p.into_inner()).insert(
            id.to_string(),
            Arc::new(Live {
                client,
                env,
                terminals: Default::default(),
                procs: Default::default(),
                idle,
            }),
        );
        self.metrics.sandboxes_live.inc();
        let me = Arc::downgrade(self);
        let id = id.to_string();
        tokio::spawn(async move {
            let _ = closed.wait_for(|c| *c).await;
            if let Some(m) = me.upgrade() {
                let reason = m.recent_ends.ended_on_its_own(&*m.runtime, &id);
                m.stop(&id, reason).await;
            }
        });
    }

    /// Stops a sandbox: state first (so the API answers at once), host
    /// teardown in the background. Idempotent.
    pub async fn stop(self: &Arc<Self>, id: &str, reason: &str) {
        let was_live = match self
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id)
        {
            Some(l) => {
                l.idle.retire();
                true
            }
            None => false,
        };
        let was_pooled = self.pool.remove(id);
        if was_live {
            self.metrics.sandboxes_live.dec();
        }
        let changed = match self.store.stop(&self.fence, id, reason, now_ms()).await {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(sandbox = %id, error = %e, "could not record a stop");
                false
            }
        };
        if changed {
            self.metrics
                .sandboxes_killed
                .with_label_values(&[reason])
                .inc();
            tracing::info!(sandbox = %id, reason, "sandbox stopped");
        }
        if was_live || was_pooled || changed {
            let me = Arc::clone(self);
            let id = id.to_string();
            // Counted, so that a graceful stop can wait for teardowns
            // instead of cutting them off halfway.
            let guard = TeardownGuard::new(&self.teardowns);
            tokio::spawn(async move {
                let _guard = guard;
                if let Err(e) = me.runtime.destroy(&id).await {
                    tracing::warn!(sandbox = %id, error = %e, "teardown failed");
                }
                me.release_slot(&id).await;
            });
        }
    }

    pub async fn delete(self: &Arc<Self>, id: &str) {
        if valid_sandbox_id(id) {
            self.stop(id, "deleted").await;
        }
    }

    /// A live sandbox's resource use as the host accounts it (`None`:
    /// the runtime cannot tell, or the sandbox runs on another host).
    pub async fn usage(&self, id: &str) -> Result<Option<hatchery_runtime::Usage>, CoreError> {
        self.get(id).await?;
        Ok(self.runtime.usage(id))
    }

    pub async fn get(&self, id: &str) -> Result<SandboxInfo, CoreError> {
        if !valid_sandbox_id(id) {
            return Err(CoreError::SandboxNotFound(id.to_string()));
        }
        self.store
            .get_live(id)
            .await?
            .map(Into::into)
            .ok_or_else(|| CoreError::SandboxNotFound(id.to_string()))
    }

    pub async fn list(
        &self,
        filter: &BTreeMap<String, String>,
    ) -> Result<Vec<SandboxInfo>, CoreError> {
        let filter = SandboxFilter {
            metadata: filter.clone(),
            template: None,
        };
        Ok(self
            .store
            .list_live(&filter)
            .await?
            .into_iter()
            .map(Into::into)
            .collect())
    }

    /// Sandboxes of every host stopped for `reason` (e.g.
    /// `hatchery_store::HOST_LOST`) whose metadata matches `filter`, the
    /// latest ended first, at most `limit`; each with when and why it
    /// ended and on which host.
    pub async fn list_stopped(
        &self,
        reason: &str,
        filter: &BTreeMap<String, String>,
        limit: usize,
    ) -> Result<Vec<(SandboxInfo, hatchery_store::StoppedRow)>, CoreError> {
        let filter = SandboxFilter {
            metadata: filter.clone(),
            template: None,
        };
        Ok(self
            .store
            .list_stopped(reason, &filter, limit)
            .await?
            .into_iter()
            .map(|(row, end)| (row.into(), end))
            .collect())
    }

    pub(crate) async fn live_client(&self, id: &str) -> Result<Arc<AgentClient>, CoreError> {
        Ok(Arc::clone(&self.live_get(id).await?.client))
    }

    pub async fn set_ttl(&self, id: &str, ttl: u64) -> Result<SandboxInfo, CoreError> {
        crate::within("ttl_seconds", ttl, self.caps.max_ttl_s)?;
        self.live_get(id).await?;
        let at = now_ms() + ttl * 1000;
        // Runtime first: if the shim cannot be told, the stored expiry must
        // not claim a lifetime the sandbox will not get.
        self.runtime.set_expiry(id, at).await?;
        if !self.store.set_expiry(&self.fence, id, at).await? {
            return Err(CoreError::SandboxNotFound(id.to_string()));
        }
        self.get(id).await
    }

    pub async fn exec(
        &self,
        id: &str,
        mut p: ExecParams,
        sink: Sink,
    ) -> Result<ExecOutcome, CoreError> {
        let live = self.live_get(id).await?;
        let mut env = live.env.clone();
        env.append(&mut p.env);
        p.env = env;
        let ooms_before = self.runtime.oom_kills(id);
        self.metrics.execs.inc();
        let runtime = self.runtime.clone();
        let rid = id.to_string();
        let host_cpu: crate::exec::HostCpuReader =
            Arc::new(move || runtime.usage(&rid).map(|u| u.cpu_ns));
        let res = crate::exec::run(&live.client, p, sink, Some(host_cpu)).await;
        let mut out = match res {
            Ok(o) => o,
            Err(e) => {
                let e = self.explain_gone(id, e);
                crate::limited_warn!(self.logs, &format!("{id}/exec"), sandbox = %id, error = %e, "exec failed");
                return Err(e);
            }
        };
        if let (Some(a), Some(b)) = (ooms_before, self.runtime.oom_kills(id)) {
            out.oom_killed = b > a;
        }
        // Only the host sees OOM kills; a command killed for memory reads
        // from inside as signaled, or (the shim's kill of its stub,
        // runtime-gvisor oom.rs) as exited with code 1.
        if out.oom_killed && out.exit_code != 0 && oom_readable(out.reason) {
            out.reason = hatchery_agent_proto::EndReason::Oom;
        }
        self.metrics
            .exec_seconds
            .observe(out.duration_ms as f64 / 1000.0);
        if out.timed_out {
            self.metrics.exec_timeouts.inc();
            crate::limited_warn!(self.logs, &format!("{id}/timeout"), sandbox = %id, "exec hit its deadline");
        }
        if out.oom_killed {
            self.metrics.exec_ooms.inc();
            crate::limited_warn!(self.logs, &format!("{id}/oom"), sandbox = %id, "OOM kill during exec");
        }
        if out.truncated {
            self.metrics.exec_truncated.inc();
        }
        Ok(out)
    }

    /// Runs code in one of the sandbox's interpreter contexts. The
    /// sandbox's create-time env applies, under the run's own.
    pub async fn run_code(
        &self,
        id: &str,
        mut p: crate::code::CodeParams,
        sink: Sink,
    ) -> Result<crate::code::CodeOutcome, CoreError> {
        let live = self.live_get(id).await?;
        let mut env = live.env.clone();
        env.append(&mut p.env);
        p.env = env;
        let ooms_before = self.runtime.oom_kills(id);
        self.metrics.code_runs.inc();
        let mut out = crate::code::run(&live.client, p, sink)
            .await
            .map_err(|e| self.explain_gone(id, e))
            .inspect_err(|e| {
                crate::limited_warn!(self.logs, &format!("{id}/code"), sandbox = %id, error = %e, "code run failed");
            })?;
        if let (Some(a), Some(b)) = (ooms_before, self.runtime.oom_kills(id)) {
            out.oom_killed = b > a;
        }
        if out.oom_killed && out.reason == hatchery_agent_proto::EndReason::Signaled {
            out.reason = hatchery_agent_proto::EndReason::Oom;
        }
        if out.reason == hatchery_agent_proto::EndReason::Timeout {
            self.metrics.exec_timeouts.inc();
        }
        Ok(out)
    }

    /// Starts a background process; the sandbox's create-time env applies.
    pub async fn start_process(
        &self,
        id: &str,
        mut p: ExecParams,
        timeout: Option<Duration>,
    ) -> Result<hatchery_agent_proto::ProcInfo, CoreError> {
        let live = self.live_get(id).await?;
        let mut env = live.env.clone();
        env.append(&mut p.env);
        p.env = env;
        self.metrics.execs.inc();
        let ooms = self.runtime.oom_kills(id);
        let info = crate::procs::start(&live.client, p, timeout).await?;
        if let Some(c) = ooms {
            live.procs.started(&info.id, c);
        }
        Ok(info)
    }

    /// A caller is about to SIGKILL a background process: its end is not
    /// memory's doing, whatever else the sandbox's OOM count did.
    pub async fn note_process_kill(&self, id: &str, proc_id: &str) -> Result<(), CoreError> {
        self.live_get(id).await?.procs.killed_by_caller(proc_id);
        Ok(())
    }

    /// A background process's state, with `reason: oom` when memory ended
    /// it (proc_oom.rs).
    pub async fn explain_process(&self, id: &str, info: ProcInfo) -> ProcInfo {
        match self.live_get(id).await {
            Ok(live) => live.procs.explain(info, self.runtime.oom_kills(id)),
            Err(_) => info,
        }
    }

    /// An error from a request whose guest stopped answering, told more
    /// precisely when the sandbox died of memory (ends.rs).
    pub(crate) fn explain_gone(&self, id: &str, e: CoreError) -> CoreError {
        self.recent_ends.explain(&*self.runtime, id, e)
    }

    /// The agent connection of a running sandbox, for operations that need
    /// nothing else from the manager (process control, reads).
    pub async fn agent(&self, id: &str) -> Result<Arc<AgentClient>, CoreError> {
        Ok(Arc::clone(&self.live_get(id).await?.client))
    }

    /// `make_cwd`: create `cwd` if it is missing rather than refuse.
    pub async fn create_context(
        &self,
        id: &str,
        language: &str,
        cwd: Option<String>,
        make_cwd: bool,
    ) -> Result<hatchery_agent_proto::ContextInfo, CoreError> {
        if let Some(c) = &cwd {
            files::validate_path(c, self.caps.max_path_bytes)?;
        }
        let client = &self.live_get(id).await?.client;
        crate::code::create_context(client, language, cwd, make_cwd).await
    }

    pub async fn list_contexts(
        &self,
        id: &str,
    ) -> Result<Vec<hatchery_agent_proto::ContextInfo>, CoreError> {
        crate::code::list_contexts(&self.live_get(id).await?.client).await
    }

    pub async fn restart_context(
        &self,
        id: &str,
        ctx: &str,
    ) -> Result<hatchery_agent_proto::ContextInfo, CoreError> {
        crate::code::restart_context(&self.live_get(id).await?.client, ctx).await
    }

    pub async fn delete_context(&self, id: &str, ctx: &str) -> Result<(), CoreError> {
        crate::code::delete_context(&self.live_get(id).await?.client, ctx).await
    }

    pub async fn write_file(&self, id: &str, path: &str, data: &[u8]) -> Result<(), CoreError> {
        files::validate_path(path, self.caps.max_path_bytes)?;
        if data.len() as u64 > self.caps.max_file_bytes {
            return Err(CoreError::TooLarge(format!(
                "file over {} bytes",
                self.caps.max_file_bytes
            )));
        }
        files::write(&self.live_get(id).await?.client, path, data).await
    }

    pub async fn read_file(&self, id: &str, path: &str) -> Result<Vec<u8>, CoreError> {
        files::validate_path(path, self.caps.max_path_bytes)?;
        files::read(
            &self.live_get(id).await?.client,
            path,
            self.caps.max_file_bytes,
        )
        .await
    }

    pub async fn list_files(&self, id: &str, path: &str) -> Result<Vec<FileEntry>, CoreError> {
        files::validate_path(path, self.caps.max_path_bytes)?;
        files::list(
            &self.live_get(id).await?.client,
            path,
            self.caps.max_list_entries,
        )
        .await
    }

    pub async fn remove_file(&self, id: &str, path: &str) -> Result<(), CoreError> {
        files::validate_path(path, self.caps.max_path_bytes)?;
        if path == "/" {
            return Err(CoreError::Invalid("refusing to remove /".into()));
        }
        files::remove(&self.live_get(id).await?.client, path).await
    }

    /// Connects to a sandbox's agent, checks it answers, and attaches the
    /// host services (which also drops relays of any earlier connection).
    pub(crate) async fn connect_agent(&self, id: &str) -> Result<Arc<AgentClient>, CoreError> {
        // A sandbox an earlier daemon parked while idle (idle.rs) answers
        // nothing until it runs again.
        self.runtime.unpark(id);
        let client = AgentClient::new(self.runtime.connect(id).await?);
        // The ping and the host services' listeners are two round trips
        // to the same agent: sent together, a boot waits about one (a
        // fork's `agent` step). A failed ping returns at once, dropping
        // the attach; what it registered is weak and goes with the client.
        let attach = async {
            self.host_services.attach(&client, id).await;
            Ok(())
        };
        tokio::try_join!(ping(&client), attach)?;
        Ok(client)
    }

    /// A TCP connection to `127.0.0.1:port` inside the sandbox, relayed
    /// over its agent channel (the sandbox has no route to the host).
    /// At most `Caps::max_relays_per_sandbox` are open per sandbox.
    pub async fn open_port(
        &self,
        id: &str,
        port: u16,
    ) -> Result<crate::relay::RelayStream, CoreError> {
        if port == 0 {
            return Err(CoreError::Invalid(
                "port must be between 1 and 65535".into(),
            ));
        }
        let client = self.live_client(id).await?;
        let relay = &self.metrics.relay;
        let res =
            crate::relay::open_port(&client, port, self.caps.max_relays_per_sandbox, relay).await;
        match &res {
            Err(CoreError::TooManyConnections(_)) => {
                relay.reject("port", "capacity");
                crate::limited_warn!(self.logs, &format!("{id}/relay-cap"), sandbox = %id, "relayed connection refused: per-sandbox cap reached");
            }
            Err(CoreError::PortClosed(_)) => relay.reject("port", "port_closed"),
            Err(e @ CoreError::GuestUnresponsive(_)) => {
                relay.reject("port", "guest");
                crate::limited_warn!(self.logs, &format!("{id}/relay"), sandbox = %id, error = %e, "relayed connect failed");
            }
            _ => {}
        }
        res
    }

    /// The host services every sandbox can reach (see `host_services`).
    pub fn host_services(&self) -> Vec<crate::host_services::HostService> {
        self.host_services.list()
    }

    /// Registers a host service: sandboxes connected from now on listen for
    /// it, and every connected one is told at once.
    pub fn add_host_service(
        &self,
        svc: crate::host_services::HostService,
    ) -> Result<(), CoreError> {
        tracing::info!(service = %svc.name, guest_port = svc.guest_port, addr = %svc.addr, identity = ?svc.identity, "host service registered");
        self.host_services.insert(svc)?;
        self.host_services.broadcast();
        Ok(())
    }

    /// Removes a host service; guest listeners for it close, connections
    /// already relayed stay up until they end.
    pub fn remove_host_service(&self, name: &str) -> Result<(), CoreError> {
        self.host_services.remove(name)?;
        self.host_services.broadcast();
        Ok(())
    }

    /// Whether this host runs live sandbox `id` (no store query).
    pub fn runs_here(&self, id: &str) -> bool {
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(id)
    }

    pub fn live_count(&self) -> usize {
        self.live.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// Counts a teardown in flight for as long as it lives.
pub(crate) struct TeardownGuard(Arc<std::sync::atomic::AtomicUsize>);

impl TeardownGuard {
    fn new(n: &Arc<std::sync::atomic::AtomicUsize>) -> Self {
        n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        TeardownGuard(Arc::clone(n))
    }
}

impl Drop for TeardownGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Whether the agent behind `client` answers a ping.
async fn ping(client: &AgentClient) -> Result<(), CoreError> {
    let mut ch = client.open();
    client
        .send(&Frame::new(ch.id, Kind::Ping, vec![]))
        .await
        .map_err(|e| CoreError::GuestUnresponsive(e.to_string()))?;
    match tokio::time::timeout(PING_TIMEOUT, ch.rx.recv()).await {
        Ok(Some(f)) if f.kind == Kind::Pong => Ok(()),
        Ok(_) => Err(CoreError::GuestUnresponsive(
            "agent did not answer ping".into(),
        )),
        Err(_) => Err(CoreError::GuestUnresponsive("agent ping timed out".into())),
    }
}

/// End reasons an OOM kill can hide behind, as the guest saw it.
pub(crate) fn oom_readable(r: hatchery_agent_proto::EndReason) -> bool {
    use hatchery_agent_proto::EndReason::*;
    matches!(r, Signaled | Exited)
}
