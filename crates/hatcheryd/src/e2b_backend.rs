//! The E2B adapter's view of Hatchery: `hatchery_e2b::Backend` over the
//! manager's public API. Translation only; no behaviour of its own.

use async_trait::async_trait;
use hatchery_core::exec::{ExecEvent, ExecParams, Sink};
use hatchery_core::{CoreError, Manager};
use hatchery_e2b::backend::{
    BResult, Backend, BackendError, CodeDone, CodeEvent, CodeSpec, ContextView, CreateSpec,
    ExecOutput, FailKind, FileEntry, NetworkSpec, OutputChunk, ProcSpec, ProcView, Pty, PtyEvent,
    ResumeClaim, SandboxView, RESUME_CLAIM_TTL_S,
};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, Mutex};

pub struct ManagerBackend {
    pub manager: Arc<Manager>,
    pub api_key: String,
    /// The state store: resume claims are leases in it, so they hold
    /// across every daemon that shares it.
    pub store: Arc<dyn hatchery_core::store::Store>,
}

fn err(e: CoreError) -> BackendError {
    use hatchery_runtime::RuntimeError;
    let kind = match &e {
        CoreError::SandboxNotFound(_) | CoreError::Runtime(RuntimeError::NotFound(_)) => {
            FailKind::SandboxNotFound
        }
        CoreError::Template(hatchery_templates::TemplateError::NotFound(_)) => {
            FailKind::TemplateNotFound
        }
        CoreError::Template(
            hatchery_templates::TemplateError::InvalidName(_)
            | hatchery_templates::TemplateError::Invalid(_),
        ) => FailKind::Invalid,
        CoreError::Invalid(_) => FailKind::Invalid,
        CoreError::FileNotFound(_) => FailKind::FileNotFound,
        CoreError::FileConflict(_) => FailKind::WrongType,
        CoreError::TooLarge(m) if m.contains("disk full") => FailKind::NoSpace,
        CoreError::TooLarge(_) => FailKind::TooLarge,
        CoreError::Capacity(_) => FailKind::Capacity,
        CoreError::Conflict(_) => FailKind::Conflict,
        CoreError::TooManyTerminals(_)
        | CoreError::TooMany(_)
        | CoreError::TooManyConnections(_) => FailKind::TooMany,
        CoreError::NotRunning(_) => FailKind::NotRunning,
        CoreError::GuestUnresponsive(_) | CoreError::SandboxOom { .. } => FailKind::Unresponsive,
        CoreError::Guest { code, .. } if code == "not_found" => FailKind::FileNotFound,
        CoreError::Guest { code, .. } if code == "permission_denied" => FailKind::PermissionDenied,
        CoreError::Guest { code, .. } if code == "not_a_regular_file" => FailKind::WrongType,
        CoreError::Guest { .. } => FailKind::Invalid,
        CoreError::ContextNotFound(_) => FailKind::ContextNotFound,
        CoreError::ProcessNotFound(_) => FailKind::ProcessNotFound,
        CoreError::SnapshotNotFound(_) => FailKind::SnapshotNotFound,
        CoreError::Network(
            hatchery_net::NetError::Invalid(_) | hatchery_net::NetError::Resolve(..),
        ) => FailKind::Invalid,
        CoreError::PortClosed(_) => FailKind::PortClosed,
        CoreError::BadGateway(_) => FailKind::PortClosed,
        CoreError::ServiceWorkerRefused => FailKind::PermissionDenied,
        _ => FailKind::Internal,
    };
    let message = match &e {
        // The E2B side names the sandbox by its own id.
        CoreError::SandboxNotFound(id) => id.clone(),
        other => other.to_string(),
    };
    BackendError::new(kind, message)
}

impl ManagerBackend {
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
}

fn policy(n: NetworkSpec) -> hatchery_net::Policy {
    use hatchery_net::policy::{Egress, Rule};
    let rule = |d: String| {
        if d.chars().next().is_some_and(|c| c.is_ascii_digit()) {
            let cidr = if d.contains('/') {
                d
            } else {
                format!("{d}/32")
            };
            Rule {
                cidr: Some(cidr),
                host: None,
                ports: vec![],
            }
        } else {
            Rule {
                cidr: None,
                host: Some(d),
                ports: vec![],
            }
        }
    };
    hatchery_net::Policy {
        egress: if n.allow_all {
            Egress::Allow
        } else {
            Egress::Deny
        },
        allow: n.allow.into_iter().map(rule).collect(),
        deny: n.deny.into_iter().map(rule).collect(),
    }
}

fn proc_view(p: hatchery_agent_proto::ProcInfo) -> ProcView {
    ProcView {
        id: p.id,
        pid: p.pid.max(0) as u32,
        argv: p.argv,
        running: p.running,
        exit_code: p.exit_code,
        reason: p
            .reason
            .and_then(|r| serde_json::to_value(r).ok())
            .and_then(|v| v.as_str().map(str::to_string)),
        stdin_open: p.stdin_open,
    }
}

fn reason(r: hatchery_agent_proto::EndReason) -> String {
    serde_json::to_value(r)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| "exited".into())
}

fn ctx(c: hatchery_agent_proto::ContextInfo) -> ContextView {
    ContextView {
        id: c.id,
        language: c.language,
        cwd: c.cwd,
    }
}

enum Cmd {
    Input(Vec<u8>, oneshot::Sender<Result<(), CoreError>>),
    Resize(u16, u16, oneshot::Sender<Result<(), CoreError>>),
}

/// A terminal driven by one task, which owns it: output and commands are
/// passed by channel, so reading never blocks typing.
struct TerminalPty {
    pid: u32,
    events: Mutex<mpsc::Receiver<BResult<PtyEvent>>>,
    cmds: mpsc::Sender<Cmd>,
    close: Mutex<Option<oneshot::Sender<()>>>,
}

impl TerminalPty {
    fn spawn(mut term: hatchery_core::pty::Terminal) -> Self {
        let pid = term.pid.max(0) as u32;
        let (etx, erx) = mpsc::channel(16);
        let (ctx, mut crx) = mpsc::channel::<Cmd>(16);
        let (close_tx, mut close_rx) = oneshot::channel::<()>();
        tokio::spawn(async move {
            enum Step {
                Ev(Result<hatchery_core::pty::TerminalEvent, CoreError>),
                Cmd(Option<Cmd>),
                Close,
            }
            loop {
                let step = tokio::select! {
                    ev = term.next() => Step::Ev(ev),
                    c = crx.recv() => Step::Cmd(c),
                    _ = &mut close_rx => Step::Close,
                };
                match step {
                    Step::Ev(Ok(hatchery_core::pty::TerminalEvent::Output(b))) => {
                        if etx.send(Ok(PtyEvent::Output(b))).await.is_err() {
                            // Nobody reads: the owner went away; keep serving
                            // input until closed.
                        }
                    }
                    Step::Ev(Ok(hatchery_core::pty::TerminalEvent::Exit(x))) => {
                        let signaled = x.signal.is_some();
                        let _ = etx
                            .send(Ok(PtyEvent::Exit {
                                exit_code: x.exit_code,
                                signaled,
                            }))
                            .await;
                        return;
                    }
                    // E2B's resize RPC answers once the request is sent;
                    // its protocol has no place for the guest's answer.
                    Step::Ev(Ok(hatchery_core::pty::TerminalEvent::Resized(_))) => {}
                    Step::Ev(Err(e)) => {
                        let _ = etx.send(Err(err(e))).await;
                        return;
                    }
                    Step::Cmd(Some(Cmd::Input(d, r))) => {
                        let _ = r.send(term.input(&d).await);
                    }
                    Step::Cmd(Some(Cmd::Resize(c, rows, r))) => {
                        let _ = r.send(term.resize(c, rows).await);
                    }
                    Step::Cmd(None) | Step::Close => {
                        term.close().await;
                        let _ = etx
                            .send(Ok(PtyEvent::Exit {
                                exit_code: 137,
                                signaled: true,
                            }))
                            .await;
                        return;
                    }
                }
            }
        });
        TerminalPty {
            pid,
            events: Mutex::new(erx),
            cmds: ctx,
            close: Mutex::new(Some(close_tx)),
        }
    }

    async fn cmd(
        &self,
        f: impl FnOnce(oneshot::Sender<Result<(), CoreError>>) -> Cmd,
    ) -> BResult<()> {
        let (tx, rx) = oneshot::channel();
        let gone = || BackendError::new(FailKind::ProcessNotFound, "the terminal has ended");
        self.cmds.send(f(tx)).await.map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?.map_err(err)
    }
}

#[async_trait]
impl Pty for TerminalPty {
    fn pid(&self) -> u32 {
        self.pid
    }
    async fn next(&self) -> BResult<PtyEvent> {
        self.events.lock().await.recv().await.unwrap_or_else(|| {
            Err(BackendError::new(
                FailKind::ProcessNotFound,
                "the terminal has ended",
            ))
        })
    }
    async fn input(&self, data: &[u8]) -> BResult<()> {
        let d = data.to_vec();
        self.cmd(|tx| Cmd::Input(d, tx)).await
    }
    async fn resize(&self, cols: u16, rows: u16) -> BResult<()> {
        self.cmd(|tx| Cmd::Resize(cols, rows, tx)).await
    }
    async fn close(&self) {
        if let Some(tx) = self.close.lock().await.take() {
            let _ = tx.send(());
        }
    }
}

fn exec_params(
    argv: Vec<String>,
    env: BTreeMap<String, String>,
    stdin: Option<String>,
    timeout: Duration,
    max_out: u64,
) -> ExecParams {
    ExecParams {
        argv,
        cwd: None,
        env,
        stdin,
        timeout,
        max_output_bytes: max_out,
        cpu_limit_ms: None,
        cpu_basis: Default::default(),
    }
}

#[async_trait]
impl Backend for ManagerBackend {
    fn api_key(&self) -> &str {
        &self.api_key
    }

    fn template_exists(&self, name: &str) -> bool {
        self.manager.templates().get(name).is_ok()
    }

    async fn create(&self, spec: CreateSpec) -> BResult<SandboxView> {
        let req = hatchery_core::CreateRequest {
            template: spec.template,
            ttl_seconds: Some(spec.ttl_seconds),
            metadata: spec.metadata,
            env: spec.env,
            network: spec.network.map(policy),
        };
        let info = self.manager.create(req).await.map_err(err)?;
        Ok(self.view(info))
    }

    async fn get(&self, id: &str) -> BResult<SandboxView> {
        self.manager
            .get(id)
            .await
            .map(|i| self.view(i))
            .map_err(err)
    }

    async fn usage(&self, id: &str) -> BResult<Option<hatchery_e2b::backend::Usage>> {
        let u = self.manager.usage(id).await.map_err(err)?;
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
            .map_err(err)?
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
            .map_err(err)?
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
    }

    async fn set_ttl(&self, id: &str, ttl_seconds: u64) -> BResult<SandboxView> {
        self.manager
            .set_ttl(id, ttl_seconds)
            .await
            .map(|i| self.view(i))
            .map_err(err)
    }

    async fn set_network(&self, id: &str, net: NetworkSpec) -> BResult<()> {
        self.manager
            .set_network_policy(id, policy(net))
            .await
            .map(drop)
            .map_err(err)
    }

    async fn snapshot(&self, id: &str, metadata: BTreeMap<String, String>) -> BResult<String> {
        self.manager
            .snapshot(id, None, metadata)
            .await
            .map(|s| s.id)
            .map_err(err)
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
        let mut v = self.manager.fork(snapshot, req).await.map_err(err)?;
        let i = v
            .pop()
            .ok_or_else(|| BackendError::new(FailKind::Internal, "fork made no sandbox"))?;
        Ok(self.view(i))
    }

    async fn delete_snapshot(&self, snapshot: &str) {
        if let Err(e) = self.manager.delete_snapshot(snapshot).await {
            tracing::warn!(snapshot, error = %e, "e2b: could not delete a resumed sandbox's snapshot");
        }
    }

    async fn claim_resume(&self, e2b_id: &str) -> BResult<Option<ResumeClaim>> {
        use hatchery_core::store::StoreError;
        let resource = format!("e2b-resume:{e2b_id}");
        match self
            .store
            .take_lease(&resource, self.manager.host_id(), RESUME_CLAIM_TTL_S * 1000)
            .await
        {
            Ok(l) => Ok(Some(ResumeClaim {
                resource: l.resource,
                owner: l.owner,
                epoch: l.epoch,
            })),
            Err(StoreError::LeaseHeld { .. }) => Ok(None),
            Err(e) => Err(BackendError::new(FailKind::Internal, e.to_string())),
        }
    }

    async fn release_resume(&self, c: ResumeClaim) {
        let f = hatchery_core::store::Fence {
            resource: c.resource,
            owner: c.owner,
            epoch: c.epoch,
        };
        // Not released: it lapses after RESUME_CLAIM_TTL_S.
        if let Err(e) = self.store.release_lease(&f).await {
            tracing::warn!(resource = %f.resource, error = %e, "e2b: resume claim not released");
        }
    }

    async fn exec(
        &self,
        id: &str,
        argv: Vec<String>,
        stdin: Option<String>,
        timeout: Duration,
    ) -> BResult<ExecOutput> {
        let max = self.manager.caps.max_output_bytes;
        let o = self
            .manager
            .exec(
                id,
                exec_params(argv, BTreeMap::new(), stdin, timeout, max),
                Sink::Collect,
            )
            .await
            .map_err(err)?;
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
            self.manager.caps.max_output_bytes,
        );
        self.manager
            .start_process(id, p, spec.timeout)
            .await
            .map(proc_view)
            .map_err(err)
    }

    async fn list_processes(&self, id: &str) -> BResult<Vec<ProcView>> {
        let a = self.manager.agent(id).await.map_err(err)?;
        Ok(hatchery_core::procs::list(&a)
            .await
            .map_err(err)?
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
        let a = self.manager.agent(id).await.map_err(err)?;
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
        res.map(proc_view).map_err(err)
    }

    async fn write_stdin(&self, id: &str, proc_id: &str, data: &[u8]) -> BResult<()> {
        if data.len() > hatchery_core::procs::MAX_STDIN_WRITE {
            return Err(BackendError::new(
                FailKind::TooLarge,
                "stdin write over 1 MiB",
            ));
        }
        let a = self.manager.agent(id).await.map_err(err)?;
        hatchery_core::procs::write_stdin(&a, proc_id, data)
            .await
            .map_err(err)
    }

    async fn close_stdin(&self, id: &str, proc_id: &str) -> BResult<()> {
        let a = self.manager.agent(id).await.map_err(err)?;
        hatchery_core::procs::close_stdin(&a, proc_id)
            .await
            .map_err(err)
    }

    async fn signal_process(&self, id: &str, proc_id: &str, signal: i32) -> BResult<()> {
        let a = self.manager.agent(id).await.map_err(err)?;
        if signal == 9 {
            // A kill takes the process's whole unit, as E2B's does.
            return hatchery_core::procs::kill(&a, proc_id)
                .await
                .map(drop)
                .map_err(err);
        }
        hatchery_core::procs::signal(&a, proc_id, signal)
            .await
            .map(drop)
            .map_err(err)
    }

    async fn read_file(&self, id: &str, path: &str) -> BResult<Vec<u8>> {
        self.manager.read_file(id, path).await.map_err(err)
    }

    async fn write_file(&self, id: &str, path: &str, data: &[u8]) -> BResult<()> {
        self.manager.write_file(id, path, data).await.map_err(err)
    }

    async fn list_dir(&self, id: &str, path: &str) -> BResult<Vec<FileEntry>> {
        Ok(self
            .manager
            .list_files(id, path)
            .await
            .map_err(err)?
            .into_iter()
            .map(|e| FileEntry {
                name: e.name,
                kind: e.kind,
                size: e.size,
                mode: e.mode,
                mtime: e.mtime,
            })
            .collect())
    }

    async fn remove(&self, id: &str, path: &str) -> BResult<()> {
        self.manager.remove_file(id, path).await.map_err(err)
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
            max_output_bytes: self.manager.caps.max_output_bytes,
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
        let o = res.map_err(err)?;
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
            .map(ctx)
            .map_err(err)
    }

    async fn list_contexts(&self, id: &str) -> BResult<Vec<ContextView>> {
        Ok(self
            .manager
            .list_contexts(id)
            .await
            .map_err(err)?
            .into_iter()
            .map(ctx)
            .collect())
    }

    async fn restart_context(&self, id: &str, c: &str) -> BResult<()> {
        self.manager
            .restart_context(id, c)
            .await
            .map(drop)
            .map_err(err)
    }

    async fn delete_context(&self, id: &str, c: &str) -> BResult<()> {
        self.manager.delete_context(id, c).await.map_err(err)
    }

    async fn proxy_port(
        &self,
        id: &str,
        port: u16,
        req: axum::extract::Request,
        path_and_query: String,
    ) -> BResult<axum::response::Response> {
        let stream = self.manager.open_port(id, port).await.map_err(err)?;
        let fwd = hatchery_core::proxy::Forward {
            path_and_query,
            prefix: String::new(),
            strip_authorization: true,
        };
        let resp = hatchery_core::proxy::forward(stream, req, &fwd)
            .await
            .map_err(err)?;
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
        let t = self.manager.open_terminal(id, p).await.map_err(err)?;
        Ok(Box::new(TerminalPty::spawn(t)))
    }
}
