//! [`ManagerBackend`]: `hatchery_e2b::Backend` over the manager's public
//! API. Each method translates E2B's request to the core's, calls it,
//! and translates the answer back ([`crate::translate`], errors by
//! [`crate::error`]).

use crate::claims::{Claims, StoreLeases};
use crate::error::{fail, E2bBackendError};
use crate::headers::{Bound, EgressHeaders};
use crate::pty::TerminalPty;
use crate::translate::{context_view, exec_params, file_entry, policy, proc_view, reason};
use async_trait::async_trait;
use hatchery_core::exec::{ExecEvent, Sink};
use hatchery_core::Manager;
use hatchery_e2b::backend::TENANT_KEY;
use hatchery_e2b::backend::{
    BResult, Backend, BackendError, CodeDone, CodeEvent, CodeSpec, ContextView, CreateSpec,
    ExecOutput, FileEntry, NetworkSpec, OutputChunk, ProcSpec, ProcView, Pty, ResumeClaim,
    SandboxView,
};
use hatchery_serve::error_text::with_causes;
use hatchery_tenants::AdmitError;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// Where the proxy's CA is written before the install script copies it.
const STAGED_CA: &str = "/tmp/.hatchery-egress-ca.pem";
/// How often stored header values of sandboxes that are gone (expired,
/// deleted elsewhere, lost in a restart) are deleted.
const SWEEP: Duration = Duration::from_secs(30);

pub struct ManagerBackend {
    manager: Arc<Manager>,
    api_key: String,
    claims: Claims,
    /// Tenant keys and the live-sandbox gate; `None`: no tenants (the
    /// operator's key only).
    tenants: Option<Arc<hatchery_tenants::Tenants>>,
    /// The state store every host shares: whether a sandbox is live
    /// anywhere (the sweep of header values asks it).
    store: Option<Arc<dyn hatchery_core::store::Store>>,
    /// `network.rules`: the daemon's egress proxy and secrets store
    /// (`None`: the proxy is off, and `rules` are refused).
    headers: Option<Arc<dyn EgressHeaders>>,
    /// The header bindings of this daemon's sandboxes that have some (to
    /// bind again when their egress options change).
    attached: Arc<Mutex<HashMap<String, Vec<Bound>>>>,
}

impl ManagerBackend {
    /// E2B over `manager`, answering to `api_key`; resume claims are
    /// leases in `store`, so they hold across every daemon sharing it.
    pub fn new(
        manager: Arc<Manager>,
        api_key: String,
        store: Arc<dyn hatchery_core::store::Store>,
    ) -> Self {
        let claims = Claims::new(Arc::new(StoreLeases(store.clone())), manager.host_id());
        let mut b = Self::with_claims(manager, api_key, claims);
        b.store = Some(store);
        b
    }

    /// As [`ManagerBackend::new`], with resume claims of the caller's.
    pub fn with_claims(manager: Arc<Manager>, api_key: String, claims: Claims) -> Self {
        ManagerBackend {
            manager,
            api_key,
            claims,
            tenants: None,
            store: None,
            headers: None,
            attached: Arc::default(),
        }
    }

    /// `network.rules` are applied through `headers` (the daemon's egress
    /// proxy and secrets store). Starts the sweep that deletes the stored
    /// values of sandboxes that are gone; call within a Tokio runtime.
    pub fn with_headers(mut self, headers: Arc<dyn EgressHeaders>) -> Self {
        spawn_sweep(
            Arc::downgrade(&headers),
            self.manager.clone(),
            self.store.clone(),
            self.attached.clone(),
        );
        self.headers = Some(headers);
        self
    }

    fn attached(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Bound>>> {
        self.attached.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stores the header values of sandbox `id` sealed, installs the
    /// proxy's CA in it and binds it at the proxy. On error the caller
    /// deletes the sandbox and calls [`ManagerBackend::detach`].
    async fn attach(
        &self,
        h: &Arc<dyn EgressHeaders>,
        id: &str,
        rules: &[hatchery_e2b::backend::HeaderRule],
        net: Option<&NetworkSpec>,
    ) -> Result<(), E2bBackendError> {
        let list = crate::headers::bound(id, rules);
        // Recorded first, so a failure below deletes what was stored.
        self.attached().insert(
            id.to_string(),
            list.iter().map(|(b, _)| b.clone()).collect(),
        );
        for (b, value) in &list {
            h.seal(&b.secret, value)
                .await
                .map_err(E2bBackendError::HeaderSecret)?;
        }
        let bound: Vec<Bound> = list.into_iter().map(|(b, _)| b).collect();
        let policy =
            crate::headers::policy(id, net, &bound).map_err(E2bBackendError::HeaderPolicy)?;
        self.manager
            .write_file(id, STAGED_CA, h.ca_pem().as_bytes())
            .await?;
        let script = h.ca_install_script(STAGED_CA);
        let o = self
            .manager
            .exec(
                id,
                exec_params(
                    vec!["/bin/sh".into(), "-c".into(), script],
                    BTreeMap::new(),
                    None,
                    Duration::from_secs(60),
                    self.max_output_bytes(),
                ),
                Sink::Collect,
            )
            .await?;
        if o.exit_code != 0 {
            return Err(E2bBackendError::HeaderCa(
                String::from_utf8_lossy(&o.stderr).into_owned(),
            ));
        }
        h.bind(id, Arc::new(policy));
        Ok(())
    }

    /// Unbinds sandbox `id` at the proxy and deletes its stored header
    /// values (those this daemon recorded, or, after a restart, those the
    /// store holds under its names).
    async fn detach(&self, id: &str) {
        let Some(h) = &self.headers else { return };
        detach(h.as_ref(), &self.attached, id).await;
    }
}

async fn detach(h: &dyn EgressHeaders, attached: &Mutex<HashMap<String, Vec<Bound>>>, id: &str) {
    h.unbind(id);
    let known = attached
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(id);
    let names: Vec<String> = match known {
        Some(b) => b.into_iter().map(|b| b.secret).collect(),
        None => match h.sealed().await {
            Ok(all) => all
                .into_iter()
                .filter(|n| crate::headers::sandbox_of(n) == Some(id))
                .collect(),
            Err(e) => {
                tracing::warn!(sandbox = id, error = %with_causes(&e), "e2b: listing stored header values failed; the sweep deletes them later");
                return;
            }
        },
    };
    for n in names {
        h.forget(&n).await;
    }
}

/// Every [`SWEEP`]: the stored header values whose sandbox is live
/// nowhere (the shared store says; this host's manager when there is
/// none) are deleted, and the sandbox unbound. Ends when the proxy side
/// is dropped.
fn spawn_sweep(
    headers: std::sync::Weak<dyn EgressHeaders>,
    manager: Arc<Manager>,
    store: Option<Arc<dyn hatchery_core::store::Store>>,
    attached: Arc<Mutex<HashMap<String, Vec<Bound>>>>,
) {
    tokio::spawn(async move {
        let mut t = tokio::time::interval(SWEEP);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            t.tick().await;
            let Some(h) = headers.upgrade() else { break };
            let names = match h.sealed().await {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(error = %with_causes(&e), "e2b: header value sweep could not list the store");
                    continue;
                }
            };
            let mut ids: Vec<&str> = names
                .iter()
                .filter_map(|n| crate::headers::sandbox_of(n))
                .collect();
            ids.sort_unstable();
            ids.dedup();
            for id in ids {
                let live = match &store {
                    Some(s) => match s.get_live(id).await {
                        Ok(r) => r.is_some(),
                        // Unknown: kept until the store answers.
                        Err(_) => true,
                    },
                    None => manager.get(id).await.is_ok(),
                };
                if !live {
                    tracing::info!(
                        sandbox = id,
                        "e2b: deleting the header values of a sandbox that is gone"
                    );
                    detach(h.as_ref(), &attached, id).await;
                }
            }
        }
    });
}

impl ManagerBackend {
    /// Tenant keys are answered by `tenants`, and every sandbox that
    /// records a tenant is admitted by its live-sandbox limit.
    pub fn with_tenants(mut self, tenants: Arc<hatchery_tenants::Tenants>) -> Self {
        self.tenants = Some(tenants);
        self
    }

    /// Admits one new sandbox with `metadata` against the limit of the
    /// tenant it records (whoever starts it: a create, a fork, a resume),
    /// to be held until it exists. A name that is no tenant's is a plain
    /// label (E2B users' own metadata may say `tenant`), not limited.
    async fn admit(
        &self,
        metadata: &BTreeMap<String, String>,
    ) -> BResult<Option<hatchery_tenants::Admission>> {
        let (Some(tenants), Some(t)) = (&self.tenants, metadata.get(TENANT_KEY)) else {
            return Ok(None);
        };
        match tenants.admit_sandboxes(t, 1).await {
            Ok(a) => Ok(Some(a)),
            Err(AdmitError::Store(hatchery_tenants::StoreError::NotFound(_))) => Ok(None),
            Err(e) => {
                if !matches!(e, AdmitError::Limit { .. }) {
                    tracing::error!(tenant = %t, error = ?e, "e2b: admitting a tenant's sandbox");
                }
                Err(fail(e))
            }
        }
    }

    fn view(&self, i: hatchery_core::SandboxInfo) -> SandboxView {
        self.view_of(
            i.id,
            i.template,
            i.created_at_ms,
            i.expires_at_ms,
            i.metadata,
        )
    }

    /// A view with the template's resources (a sandbox's, or a
    /// snapshot's: what a restore of it would get).
    fn view_of(
        &self,
        id: String,
        template: String,
        created_at_ms: u64,
        expires_at_ms: u64,
        metadata: BTreeMap<String, String>,
    ) -> SandboxView {
        let spec = self.manager.templates().get(&template).ok().map(|t| t.spec);
        SandboxView {
            id,
            template,
            created_at_ms,
            expires_at_ms,
            metadata,
            cpus: spec.as_ref().map_or(1.0, |s| s.cpus),
            memory_mb: spec.as_ref().map_or(0, |s| s.memory_mb),
            disk_mb: spec.as_ref().map_or(0, |s| s.disk_mb),
            lifecycle: Default::default(),
        }
    }

    /// The most output one exec or cell may collect (the daemon's cap).
    fn max_output_bytes(&self) -> u64 {
        self.manager.caps.max_output_bytes
    }
}

#[async_trait]
impl Backend for ManagerBackend {
    fn api_key(&self) -> &str {
        &self.api_key
    }

    async fn tenant_of_key(&self, key: &str) -> BResult<Option<String>> {
        let Some(tenants) = &self.tenants else {
            return Ok(None);
        };
        match tenants.resolve(key).await {
            Ok(p) => Ok(p.and_then(|p| p.tenant().map(str::to_string))),
            Err(e) => Err(fail(E2bBackendError::TenantKey(e))),
        }
    }

    fn template_exists(&self, name: &str) -> bool {
        self.manager.templates().get(name).is_ok()
    }

    fn template_building(&self, name: &str) -> Option<BackendError> {
        self.manager.building_error(name).map(fail)
    }

    async fn create(&self, spec: CreateSpec) -> BResult<SandboxView> {
        let headers = if spec.header_rules.is_empty() {
            None
        } else {
            let h = self.headers.clone();
            Some(h.ok_or_else(|| fail(E2bBackendError::HeadersUnavailable))?)
        };
        let env = match &headers {
            // The proxy's variables and CA trust, the sandbox's own first.
            Some(h) => h.guest_env(&spec.env),
            None => spec.env,
        };
        let req = hatchery_core::CreateRequest {
            template: spec.template,
            ttl_seconds: Some(spec.ttl_seconds),
            metadata: spec.metadata,
            env,
            network: spec.network.clone().map(policy),
        };
        let _admitted = self.admit(&req.metadata).await?;
        let info = self.manager.create(req).await.map_err(fail)?;
        if let Some(h) = &headers {
            if let Err(e) = self
                .attach(h, &info.id, &spec.header_rules, spec.network.as_ref())
                .await
            {
                tracing::warn!(sandbox = %info.id, error = %with_causes(&e), "e2b: network.rules could not be applied; deleting the sandbox");
                self.manager.delete(&info.id).await;
                self.detach(&info.id).await;
                return Err(fail(e));
            }
        }
        Ok(self.view(info))
    }

    async fn get(&self, id: &str) -> BResult<SandboxView> {
        self.manager
            .get(id)
            .await
            .map(|i| self.view(i))
            .map_err(fail)
    }

    async fn usage(&self, id: &str) -> BResult<Option<hatchery_e2b::backend::Usage>> {
        let u = self.manager.usage(id).await.map_err(fail)?;
        Ok(u.map(|u| hatchery_e2b::backend::Usage { cpu_ns: u.cpu_ns }))
    }

    async fn list(&self) -> BResult<Vec<SandboxView>> {
        self.find(BTreeMap::new()).await
    }

    async fn find(&self, filter: BTreeMap<String, String>) -> BResult<Vec<SandboxView>> {
        Ok(self
            .manager
            .list(&filter)
            .await
            .map_err(fail)?
            .into_iter()
            .map(|i| self.view(i))
            .collect())
    }

    async fn find_snapshots(
        &self,
        filter: BTreeMap<String, String>,
    ) -> BResult<Vec<(String, SandboxView)>> {
        Ok(self
            .manager
            .list_snapshots(&filter)
            .await
            .map_err(fail)?
            .into_iter()
            .map(|s| {
                let v = self.view_of(
                    s.sandbox_id,
                    s.template,
                    s.created_at_ms,
                    s.expires_at_ms,
                    s.metadata,
                );
                (s.id, v)
            })
            .collect())
    }

    async fn kill(&self, id: &str) {
        self.manager.delete(id).await;
        self.detach(id).await;
    }

    async fn set_ttl(&self, id: &str, ttl_seconds: u64) -> BResult<SandboxView> {
        self.manager
            .set_ttl(id, ttl_seconds)
            .await
            .map(|i| self.view(i))
            .map_err(fail)
    }

    async fn set_network(&self, id: &str, net: NetworkSpec) -> BResult<()> {
        self.manager
            .set_network_policy(id, policy(net.clone()))
            .await
            .map_err(fail)?;
        // A sandbox with header bindings: the proxy's mirror of its
        // egress follows (the proxy dials from the host).
        let bound = self.attached().get(id).cloned();
        if let (Some(h), Some(bound)) = (&self.headers, bound) {
            let p = crate::headers::policy(id, Some(&net), &bound)
                .map_err(|e| fail(E2bBackendError::HeaderPolicy(e)))?;
            h.bind(id, Arc::new(p));
        }
        Ok(())
    }

    async fn snapshot(&self, id: &str, metadata: BTreeMap<String, String>) -> BResult<String> {
        self.manager
            .snapshot(id, None, metadata)
            .await
            .map(|s| s.id)
            .map_err(fail)
    }

    async fn snapshot_files(
        &self,
        id: &str,
        metadata: BTreeMap<String, String>,
    ) -> BResult<String> {
        self.manager
            .snapshot_files(id, None, metadata)
            .await
            .map(|s| s.id)
            .map_err(fail)
    }

    async fn restore(
        &self,
        snapshot: &str,
        ttl_seconds: u64,
        metadata: BTreeMap<String, String>,
        network: Option<NetworkSpec>,
    ) -> BResult<SandboxView> {
        let req = hatchery_core::ForkRequest {
            ttl_seconds: Some(ttl_seconds),
            metadata,
            count: 1,
            network: network.map(policy).unwrap_or_default(),
        };
        let _admitted = self.admit(&req.metadata).await?;
        let mut v = self.manager.fork(snapshot, req).await.map_err(fail)?;
        let i = v.pop().ok_or_else(|| fail(E2bBackendError::ForkMadeNone))?;
        Ok(self.view(i))
    }

    async fn delete_snapshot(&self, snapshot: &str) {
        if let Err(e) = self.manager.delete_snapshot(snapshot).await {
            tracing::warn!(snapshot, error = %e, "e2b: could not delete a resumed sandbox's snapshot");
        }
    }

    async fn claim_resume(&self, e2b_id: &str) -> BResult<Option<ResumeClaim>> {
        self.claims.claim(e2b_id).await.map_err(fail)
    }

    async fn release_resume(&self, c: ResumeClaim) {
        self.claims.release(c).await
    }

    async fn exec(
        &self,
        id: &str,
        argv: Vec<String>,
        stdin: Option<String>,
        timeout: Duration,
    ) -> BResult<ExecOutput> {
        let max = self.max_output_bytes();
        let o = self
            .manager
            .exec(
                id,
                exec_params(argv, BTreeMap::new(), stdin, timeout, max),
                Sink::Collect,
            )
            .await
            .map_err(fail)?;
        Ok(ExecOutput {
            exit_code: o.exit_code,
            stdout: o.stdout,
            stderr: o.stderr,
        })
    }

    async fn start_process(&self, id: &str, spec: ProcSpec) -> BResult<ProcView> {
        let p = exec_params(
            spec.argv,
            spec.env,
            None,
            spec.timeout.unwrap_or(Duration::ZERO),
            self.max_output_bytes(),
        );
        self.manager
            .start_process(id, p, spec.timeout)
            .await
            .map(proc_view)
            .map_err(fail)
    }

    async fn list_processes(&self, id: &str) -> BResult<Vec<ProcView>> {
        let a = self.manager.agent(id).await.map_err(fail)?;
        Ok(hatchery_core::procs::list(&a)
            .await
            .map_err(fail)?
            .into_iter()
            .map(proc_view)
            .collect())
    }

    async fn read_process(
        &self,
        id: &str,
        proc_id: &str,
        offset: u64,
        follow: bool,
        tx: mpsc::Sender<OutputChunk>,
    ) -> BResult<ProcView> {
        let a = self.manager.agent(id).await.map_err(fail)?;
        let (ctx, mut crx) = mpsc::channel(16);
        let fwd = async {
            while let Some(c) = crx.recv().await {
                let c: hatchery_core::procs::ProcChunk = c;
                if tx
                    .send(OutputChunk {
                        offset: c.offset,
                        stderr: c.stderr,
                        data: c.data,
                    })
                    .await
                    .is_err()
                {
                    break;
                }
            }
        };
        let (res, ()) = tokio::join!(
            hatchery_core::procs::read(&a, proc_id, offset, follow, ctx),
            fwd
        );
        res.map(proc_view).map_err(fail)
    }

    async fn write_stdin(&self, id: &str, proc_id: &str, data: &[u8]) -> BResult<()> {
        if data.len() > hatchery_core::procs::MAX_STDIN_WRITE {
            return Err(fail(E2bBackendError::StdinTooLarge));
        }
        let a = self.manager.agent(id).await.map_err(fail)?;
        hatchery_core::procs::write_stdin(&a, proc_id, data)
            .await
            .map_err(fail)
    }

    async fn close_stdin(&self, id: &str, proc_id: &str) -> BResult<()> {
        let a = self.manager.agent(id).await.map_err(fail)?;
        hatchery_core::procs::close_stdin(&a, proc_id)
            .await
            .map_err(fail)
    }

    async fn signal_process(&self, id: &str, proc_id: &str, signal: i32) -> BResult<()> {
        let a = self.manager.agent(id).await.map_err(fail)?;
        if signal == 9 {
            // A kill takes the process's whole unit, as E2B's does.
            return hatchery_core::procs::kill(&a, proc_id)
                .await
                .map(drop)
                .map_err(fail);
        }
        hatchery_core::procs::signal(&a, proc_id, signal)
            .await
            .map(drop)
            .map_err(fail)
    }

    async fn read_file(&self, id: &str, path: &str) -> BResult<Vec<u8>> {
        self.manager.read_file(id, path).await.map_err(fail)
    }

    async fn write_file(&self, id: &str, path: &str, data: &[u8]) -> BResult<()> {
        self.manager.write_file(id, path, data).await.map_err(fail)
    }

    async fn list_dir(&self, id: &str, path: &str) -> BResult<Vec<FileEntry>> {
        Ok(self
            .manager
            .list_files(id, path)
            .await
            .map_err(fail)?
            .into_iter()
            .map(file_entry)
            .collect())
    }

    async fn remove(&self, id: &str, path: &str) -> BResult<()> {
        self.manager.remove_file(id, path).await.map_err(fail)
    }

    async fn run_code(
        &self,
        id: &str,
        spec: CodeSpec,
        tx: mpsc::Sender<CodeEvent>,
    ) -> BResult<CodeDone> {
        let p = hatchery_core::code::CodeParams {
            language: spec.language,
            context: spec.context,
            code: spec.code,
            env: spec.env,
            timeout: spec.timeout,
            cpu_limit_ms: None,
            max_output_bytes: self.max_output_bytes(),
            initial_cwd: spec.initial_cwd,
        };
        let (etx, mut erx) = mpsc::channel::<ExecEvent>(32);
        // Owns the receiver: when the caller stops listening (its client
        // went away), even while the cell prints nothing, the receiver is
        // dropped here and the run is killed (`exec::drive`).
        let fwd = async move {
            loop {
                let e = tokio::select! {
                    e = erx.recv() => e,
                    _ = tx.closed() => None,
                };
                let Some(e) = e else { break };
                let ev = match e {
                    ExecEvent::Stdout(b) => CodeEvent::Stdout(b),
                    ExecEvent::Stderr(b) => CodeEvent::Stderr(b),
                    ExecEvent::Rich(v) => CodeEvent::Rich(v),
                };
                if tx.send(ev).await.is_err() {
                    break;
                }
            }
        };
        let (res, ()) = tokio::join!(self.manager.run_code(id, p, Sink::Stream(etx)), fwd);
        let o = res.map_err(fail)?;
        Ok(CodeDone {
            execution_count: o.execution_count,
            reason: reason(o.reason),
            error: o.error,
        })
    }

    async fn create_context(
        &self,
        id: &str,
        language: &str,
        cwd: String,
        make_cwd: bool,
    ) -> BResult<ContextView> {
        self.manager
            .create_context(id, language, Some(cwd), make_cwd)
            .await
            .map(context_view)
            .map_err(fail)
    }

    async fn list_contexts(&self, id: &str) -> BResult<Vec<ContextView>> {
        Ok(self
            .manager
            .list_contexts(id)
            .await
            .map_err(fail)?
            .into_iter()
            .map(context_view)
            .collect())
    }

    async fn restart_context(&self, id: &str, c: &str) -> BResult<()> {
        self.manager
            .restart_context(id, c)
            .await
            .map(drop)
            .map_err(fail)
    }

    async fn delete_context(&self, id: &str, c: &str) -> BResult<()> {
        self.manager.delete_context(id, c).await.map_err(fail)
    }

    async fn proxy_port(
        &self,
        id: &str,
        port: u16,
        req: axum::extract::Request,
        path_and_query: String,
    ) -> BResult<axum::response::Response> {
        let stream = self.manager.open_port(id, port).await.map_err(fail)?;
        let fwd = hatchery_core::proxy::Forward {
            path_and_query,
            prefix: String::new(),
            strip_authorization: true,
        };
        let resp = hatchery_core::proxy::forward(stream, req, &fwd)
            .await
            .map_err(fail)?;
        Ok(resp.map(axum::body::Body::new))
    }

    async fn open_pty(
        &self,
        id: &str,
        argv: Vec<String>,
        mut env: BTreeMap<String, String>,
        cols: u16,
        rows: u16,
    ) -> BResult<Box<dyn Pty>> {
        env.entry("TERM".into())
            .or_insert_with(|| "xterm-256color".into());
        let p = hatchery_core::pty::TerminalParams {
            argv,
            cwd: None,
            env,
            cols,
            rows,
        };
        let t = self.manager.open_terminal(id, p).await.map_err(fail)?;
        Ok(Box::new(TerminalPty::spawn(t)))
    }
}
