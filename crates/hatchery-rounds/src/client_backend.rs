//! [`Sandboxes`] over the daemon's public HTTP API, through the typed
//! `hatchery-client`: rounds hold an API key like any other product and
//! never touch the core.

use crate::sandbox::*;
use async_trait::async_trait;
use futures::stream::BoxStream;
use futures::StreamExt;
use hatchery_client::{
    Client, ClientConfig, ClientError, CreateSandbox, CreateSnapshot, ExecReason, ExecRequest,
    ExecResponse, ForkRequest, NetworkPolicy,
};
use std::collections::BTreeMap;
use std::time::Duration;

pub struct ClientSandboxes {
    client: Client,
}

impl ClientSandboxes {
    pub fn new(base_url: &str, api_key: &str) -> Result<Self, SandboxError> {
        // Snapshots and cold creates can take longer than an ordinary call.
        let cfg = ClientConfig::default().call_timeout(Duration::from_secs(180));
        let client = Client::with_config(base_url, api_key, cfg).map_err(err)?;
        Ok(ClientSandboxes { client })
    }
}

fn err(e: ClientError) -> SandboxError {
    match &e {
        ClientError::Api {
            status,
            code,
            message,
            ..
        } => SandboxError::Api {
            status: *status,
            code: code.clone(),
            message: message.clone(),
        },
        ClientError::Stream { code, message, .. } => SandboxError::Api {
            status: 200,
            code: code.clone(),
            message: message.clone(),
        },
        _ => SandboxError::Transport(e.to_string()),
    }
}

fn reason(r: ExecReason) -> &'static str {
    match r {
        ExecReason::Exited => "exited",
        ExecReason::Signaled => "signaled",
        ExecReason::Timeout => "timeout",
        ExecReason::CpuLimit => "cpu_limit",
        ExecReason::Oom => "oom",
        ExecReason::OutputLimit => "output_limit",
        ExecReason::Cancelled => "cancelled",
        ExecReason::Unknown => "unknown",
    }
}

/// `on_host`: the limit was judged on the host's clock, so that is the
/// CPU the verdict reports.
fn outcome(r: ExecResponse, on_host: bool) -> ExecOutcome {
    ExecOutcome {
        exit_code: r.exit_code as i64,
        stdout: r.stdout,
        stderr: r.stderr,
        duration_ms: r.duration_ms,
        cpu_ms: match r.host_cpu_ms {
            Some(ms) if on_host => ms,
            _ => r.cpu_ms,
        },
        memory_peak_bytes: r.memory_peak_bytes.unwrap_or(0),
        reason: reason(r.reason).to_string(),
        truncated: r.truncated,
        oom_killed: r.oom_killed,
    }
}

fn request(spec: ExecSpec) -> ExecRequest {
    let mut req = ExecRequest::argv(spec.argv)
        .cwd(spec.cwd)
        .timeout_seconds(spec.timeout_seconds)
        .max_output_bytes(spec.max_output_bytes);
    if let Some(ms) = spec.cpu_limit_ms {
        req = req.cpu_limit_ms(ms);
        if spec.cpu_on_host {
            req = req.cpu_limit_on_host();
        }
    }
    for (k, v) in spec.env {
        req = req.env(k, v);
    }
    req
}

fn policy(v: serde_json::Value) -> Result<NetworkPolicy, SandboxError> {
    serde_json::from_value(v).map_err(|e| SandboxError::Api {
        status: 400,
        code: "invalid_network_policy".into(),
        message: e.to_string(),
    })
}

#[async_trait]
impl Sandboxes for ClientSandboxes {
    async fn template(&self, name: &str) -> Result<TemplateVersion, SandboxError> {
        let t = self.client.get_template(name).await.map_err(err)?;
        Ok(TemplateVersion {
            name: t.name,
            version: t.version,
            memory_mb: t.memory_mb,
        })
    }

    async fn create(&self, req: NewSandbox) -> Result<String, SandboxError> {
        let network = req.network.map(policy).transpose()?;
        let s = self
            .client
            .create_sandbox(&CreateSandbox {
                template: Some(req.template),
                ttl_seconds: Some(req.ttl_seconds),
                metadata: req.metadata,
                env: BTreeMap::new(),
                network: Some(network.unwrap_or_else(NetworkPolicy::deny_all)),
            })
            .await
            .map_err(err)?;
        Ok(s.id)
    }

    async fn delete(&self, id: &str) -> Result<(), SandboxError> {
        self.client.delete_sandbox(id).await.map_err(err)
    }

    async fn list(&self, filter: BTreeMap<String, String>) -> Result<Vec<String>, SandboxError> {
        let l = self.client.list_sandboxes(&filter).await.map_err(err)?;
        Ok(l.into_iter().map(|s| s.id).collect())
    }

    async fn exists(&self, id: &str) -> Result<bool, SandboxError> {
        match self.client.get_sandbox(id).await {
            Ok(_) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(err(e)),
        }
    }

    async fn set_network(&self, id: &str, p: serde_json::Value) -> Result<(), SandboxError> {
        self.client
            .set_network(id, &policy(p)?)
            .await
            .map(|_| ())
            .map_err(err)
    }

    async fn write_file(&self, id: &str, path: &str, data: Vec<u8>) -> Result<(), SandboxError> {
        self.client.write_file(id, path, data).await.map_err(err)
    }

    async fn read_file(&self, id: &str, path: &str) -> Result<Vec<u8>, SandboxError> {
        self.client
            .read_file(id, path)
            .await
            .map(|b| b.to_vec())
            .map_err(err)
    }

    async fn list_dir(&self, id: &str, dir: &str) -> Result<Vec<FileEntry>, SandboxError> {
        let l = self.client.list_files(id, dir).await.map_err(err)?;
        let base = dir.trim_end_matches('/');
        Ok(l.entries
            .into_iter()
            .filter(|e| e.kind == "file" || e.kind == "dir")
            .map(|e| FileEntry {
                path: format!("{base}/{}", e.name),
                is_dir: e.kind == "dir",
                size: e.size,
            })
            .collect())
    }

    async fn exec(&self, id: &str, spec: ExecSpec) -> Result<ExecOutcome, SandboxError> {
        let on_host = spec.cpu_on_host;
        self.client
            .exec(id, &request(spec))
            .await
            .map(|r| outcome(r, on_host))
            .map_err(err)
    }

    async fn exec_stream(
        &self,
        id: &str,
        spec: ExecSpec,
    ) -> Result<BoxStream<'static, Result<ExecEvent, SandboxError>>, SandboxError> {
        let on_host = spec.cpu_on_host;
        let s = self
            .client
            .exec_stream(id, &request(spec))
            .await
            .map_err(err)?;
        Ok(futures::stream::unfold(Some(s), move |st| async move {
            let mut s = st?;
            match s.next().await {
                Ok(Some(hatchery_client::ExecEvent::Stdout(d))) => {
                    Some((Ok(ExecEvent::Stdout(d)), Some(s)))
                }
                Ok(Some(hatchery_client::ExecEvent::Stderr(d))) => {
                    Some((Ok(ExecEvent::Stderr(d)), Some(s)))
                }
                Ok(Some(hatchery_client::ExecEvent::Exit(r))) => {
                    Some((Ok(ExecEvent::Exit(outcome(r, on_host))), None))
                }
                Ok(None) => None,
                Err(e) => Some((Err(err(e)), None)),
            }
        })
        .boxed())
    }

    async fn snapshot(
        &self,
        id: &str,
        retention_seconds: u64,
        metadata: BTreeMap<String, String>,
    ) -> Result<String, SandboxError> {
        let s = self
            .client
            .create_snapshot(
                id,
                &CreateSnapshot {
                    retention_seconds: Some(retention_seconds),
                    metadata,
                    memory: None,
                },
            )
            .await
            .map_err(err)?;
        Ok(s.id)
    }

    async fn fork(
        &self,
        snapshot_id: &str,
        ttl_seconds: u64,
        metadata: BTreeMap<String, String>,
    ) -> Result<String, SandboxError> {
        let s = self
            .client
            .restore(
                snapshot_id,
                &ForkRequest {
                    count: Some(1),
                    ttl_seconds: Some(ttl_seconds),
                    metadata,
                    // Always deny-all, stated rather than left to a default.
                    network: Some(NetworkPolicy::deny_all()),
                },
            )
            .await
            .map_err(err)?;
        Ok(s.id)
    }

    async fn delete_snapshot(&self, id: &str) -> Result<(), SandboxError> {
        self.client.delete_snapshot(id).await.map_err(err)
    }

    async fn snapshot_exists(&self, id: &str) -> Result<bool, SandboxError> {
        match self.client.get_snapshot(id).await {
            Ok(_) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(err(e)),
        }
    }

    async fn pty_token(&self, id: &str) -> Result<(String, String), SandboxError> {
        let t = self.client.terminal_token(id).await.map_err(err)?;
        Ok((t.token, t.expires_at))
    }
}
