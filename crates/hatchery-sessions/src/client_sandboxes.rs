//! [`Sandboxes`] over the typed `hatchery-client`: the session runner uses
//! sandboxes through the daemon's public HTTP API, as any product would.

use crate::sandbox::*;
use async_trait::async_trait;
use base64::Engine;
use futures::stream::BoxStream;
use hatchery_client::{
    Client, ClientError, CodeRequest, CreateSandbox, CreateSnapshot, ExecReason, ExecRequest,
    ForkRequest, OutputEncoding, OutputOptions, ProcessEvent, ProcessInfo,
};
use std::collections::BTreeMap;

pub struct ClientSandboxes {
    client: Client,
}

impl ClientSandboxes {
    pub fn new(client: Client) -> Self {
        ClientSandboxes { client }
    }
}

fn map(e: ClientError) -> SandboxError {
    if e.is_not_found() {
        SandboxError::NotFound(e.to_string())
    } else if e.is_capacity() {
        SandboxError::Capacity(e.to_string())
    } else if e.code() == Some("snapshot_store_full") {
        SandboxError::StoreFull(e.message().unwrap_or_default().to_string())
    } else if e.code() == Some("invalid_network_policy") {
        SandboxError::InvalidNetwork(e.message().unwrap_or_default().to_string())
    } else {
        SandboxError::Other(e.to_string())
    }
}

/// A policy the caller built as JSON, in the client's type: one that
/// does not parse is the caller's mistake, said as such.
fn policy(v: serde_json::Value) -> Result<hatchery_client::NetworkPolicy, SandboxError> {
    serde_json::from_value(v).map_err(|e| SandboxError::InvalidNetwork(e.to_string()))
}

fn proc_state(p: &ProcessInfo) -> ProcState {
    if p.state == "running" {
        ProcState::Running
    } else {
        ProcState::Exited {
            exit_code: p.exit_code,
            reason: p.reason.as_ref().map(|r| format!("{r:?}").to_lowercase()),
        }
    }
}

#[async_trait]
impl Sandboxes for ClientSandboxes {
    async fn template_exists(&self, name: &str) -> Result<bool, SandboxError> {
        match self.client.get_template(name).await {
            Ok(_) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(map(e)),
        }
    }

    async fn template_version(&self, name: &str) -> Result<Option<String>, SandboxError> {
        match self.client.get_template(name).await {
            Ok(t) => Ok(Some(t.version)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(map(e)),
        }
    }

    async fn create(&self, req: NewSandbox) -> Result<SandboxInfo, SandboxError> {
        let s = self
            .client
            .create_sandbox(&CreateSandbox {
                template: Some(req.template.clone()),
                ttl_seconds: Some(req.ttl_s),
                metadata: req.metadata,
                env: req.env,
                network: req.network.map(policy).transpose()?,
            })
            .await
            .map_err(|e| {
                if e.is_not_found() {
                    SandboxError::TemplateNotFound(req.template.clone())
                } else {
                    map(e)
                }
            })?;
        Ok(SandboxInfo {
            id: s.id,
            boot_mode: s.boot_mode,
            boot_ms: s.boot_ms,
        })
    }

    async fn exists(&self, id: &str) -> Result<bool, SandboxError> {
        match self.client.get_sandbox(id).await {
            // A stopped sandbox (deleted, its record kept a while) is as
            // gone as one the daemon no longer knows.
            Ok(s) => Ok(s.state != "stopped"),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(map(e)),
        }
    }

    async fn delete(&self, id: &str) -> Result<(), SandboxError> {
        self.client.delete_sandbox(id).await.map_err(map)
    }

    async fn exec(
        &self,
        id: &str,
        argv: Vec<String>,
        cwd: &str,
        timeout_s: u64,
    ) -> Result<ExecOutcome, SandboxError> {
        let mut req = ExecRequest::argv(argv);
        req.cwd = Some(cwd.to_string());
        req.timeout_seconds = Some(timeout_s);
        let r = self.client.exec(id, &req).await.map_err(map)?;
        Ok(ExecOutcome {
            exit_code: r.exit_code,
            stdout: r.stdout,
            stderr: r.stderr,
        })
    }

    async fn write_file(&self, id: &str, path: &str, data: Vec<u8>) -> Result<(), SandboxError> {
        self.client.write_file(id, path, data).await.map_err(map)
    }

    async fn read_file(&self, id: &str, path: &str) -> Result<Vec<u8>, SandboxError> {
        Ok(self.client.read_file(id, path).await.map_err(map)?.to_vec())
    }

    async fn run_python(
        &self,
        id: &str,
        code: &str,
        timeout_s: u64,
    ) -> Result<PythonOutcome, SandboxError> {
        let mut req = CodeRequest::python(code);
        req.timeout_seconds = Some(timeout_s);
        let r = self.client.run_code(id, &req).await.map_err(map)?;
        let error = match (r.summary.error, r.summary.reason) {
            (Some(e), _) => Some(format!("{}: {}", e.name, e.value)),
            (None, ExecReason::Exited) => None,
            // Stopped by a limit or a deadline before it raised anything.
            (None, other) => Some(format!("stopped: {other:?}").to_lowercase()),
        };
        Ok(PythonOutcome {
            stdout: r.stdout,
            error,
        })
    }

    async fn start_process(
        &self,
        id: &str,
        argv: Vec<String>,
        cwd: &str,
        env: BTreeMap<String, String>,
    ) -> Result<String, SandboxError> {
        let mut req = ExecRequest::argv(argv);
        req.cwd = Some(cwd.to_string());
        req.env = env;
        Ok(self.client.start_process(id, &req).await.map_err(map)?.id)
    }

    async fn process_state(&self, id: &str, pid: &str) -> Result<ProcState, SandboxError> {
        Ok(proc_state(
            &self.client.get_process(id, pid).await.map_err(map)?,
        ))
    }

    async fn write_stdin(&self, id: &str, pid: &str, data: Vec<u8>) -> Result<(), SandboxError> {
        self.client.write_stdin(id, pid, data).await.map_err(map)
    }

    async fn follow_output(
        &self,
        id: &str,
        pid: &str,
        offset: u64,
    ) -> Result<BoxStream<'static, Result<OutputItem, SandboxError>>, SandboxError> {
        let stream = self
            .client
            .process_output(
                id,
                pid,
                &OutputOptions {
                    offset: Some(offset),
                    follow: Some(true),
                    // Raw bytes: line ends are computed on byte offsets.
                    encoding: Some(OutputEncoding::Base64),
                },
            )
            .await
            .map_err(map)?;
        let s = futures::stream::unfold(Some(stream), |st| async move {
            let mut st = st?;
            let item = match st.next().await {
                Ok(Some(ProcessEvent::Stdout(c))) | Ok(Some(ProcessEvent::Stderr(c)))
                    if c.data.is_empty() =>
                {
                    return Some((
                        Ok(OutputItem::Chunk {
                            stdout: false,
                            offset: c.offset,
                            data: vec![],
                        }),
                        Some(st),
                    ))
                }
                Ok(Some(ProcessEvent::Stdout(c))) => decode(true, c.offset, &c.data),
                Ok(Some(ProcessEvent::Stderr(c))) => decode(false, c.offset, &c.data),
                Ok(Some(ProcessEvent::Exit(p))) | Ok(Some(ProcessEvent::End(p))) => {
                    return Some((Ok(OutputItem::Exit(proc_state(&p))), None))
                }
                Ok(None) => return None,
                Err(e) => return Some((Err(map(e)), None)),
            };
            Some((item, Some(st)))
        });
        Ok(Box::pin(s))
    }

    async fn kill_process(&self, id: &str, pid: &str) -> Result<(), SandboxError> {
        self.client
            .kill_process(id, pid)
            .await
            .map(|_| ())
            .map_err(map)
    }

    async fn snapshot(
        &self,
        id: &str,
        retention_s: u64,
        metadata: BTreeMap<String, String>,
    ) -> Result<String, SandboxError> {
        let s = self
            .client
            .create_snapshot(
                id,
                &CreateSnapshot {
                    retention_seconds: Some(retention_s),
                    metadata,
                    memory: None,
                },
            )
            .await
            .map_err(map)?;
        Ok(s.id)
    }

    async fn set_snapshot_pool(&self, snapshot_id: &str, size: u64) -> Result<(), SandboxError> {
        self.client
            .set_snapshot_pool(snapshot_id, size)
            .await
            .map(|_| ())
            .map_err(map)
    }

    async fn snapshot_metadata(&self, id: &str) -> Result<BTreeMap<String, String>, SandboxError> {
        Ok(self.client.get_snapshot(id).await.map_err(map)?.metadata)
    }

    async fn fork(
        &self,
        snapshot_id: &str,
        ttl_s: u64,
        metadata: BTreeMap<String, String>,
    ) -> Result<SandboxInfo, SandboxError> {
        let s = self
            .client
            .restore(
                snapshot_id,
                &ForkRequest {
                    count: None,
                    ttl_seconds: Some(ttl_s),
                    metadata,
                    network: None,
                },
            )
            .await
            .map_err(map)?;
        Ok(SandboxInfo {
            id: s.id,
            boot_mode: s.boot_mode,
            boot_ms: s.boot_ms,
        })
    }

    async fn set_network(&self, id: &str, p: serde_json::Value) -> Result<(), SandboxError> {
        self.client
            .set_network(id, &policy(p)?)
            .await
            .map(|_| ())
            .map_err(map)
    }

    async fn kernel_denials(&self, id: &str) -> Result<KernelDenials, SandboxError> {
        let got = self.client.network_event_list(id).await.map_err(map)?;
        Ok(KernelDenials {
            list: got
                .events
                .into_iter()
                .map(|e| KernelDenial {
                    seq: e.seq,
                    protocol: e.protocol,
                    destination: e.destination,
                    port: e.port,
                })
                .collect(),
            total: got.denied_total,
        })
    }

    async fn delete_snapshot(&self, id: &str) -> Result<(), SandboxError> {
        self.client.delete_snapshot(id).await.map_err(map)
    }
}

fn decode(stdout: bool, offset: u64, b64: &str) -> Result<OutputItem, SandboxError> {
    let data = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| SandboxError::Other(format!("process output is not base64: {e}")))?;
    Ok(OutputItem::Chunk {
        stdout,
        offset,
        data,
    })
}
