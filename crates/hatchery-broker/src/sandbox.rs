//! The little the broker does inside a session's sandbox (export the work
//! tree for `git_push`), behind a narrow trait; the daemon's
//! implementation is its own public API through `hatchery-client`;
//! `fake` is an in-memory one for tests (`cfg(test)`, or the `fake`
//! feature for other crates' tests).

#[cfg(any(test, feature = "fake"))]
pub mod fake;

use async_trait::async_trait;

#[derive(Debug, thiserror::Error)]
#[error("sandbox: {0}")]
pub struct SandboxError(pub String);

pub struct Exec {
    pub exit_code: i32,
    pub stdout: String,
    pub stderr: String,
}

#[async_trait]
pub trait SandboxAccess: Send + Sync + 'static {
    async fn exec(
        &self,
        sandbox: &str,
        argv: Vec<String>,
        timeout_s: u64,
    ) -> Result<Exec, SandboxError>;
    async fn write_file(
        &self,
        sandbox: &str,
        path: &str,
        data: Vec<u8>,
    ) -> Result<(), SandboxError>;
    async fn read_file(&self, sandbox: &str, path: &str) -> Result<Vec<u8>, SandboxError>;
}

pub struct ClientSandboxes(pub hatchery_client::Client);

#[async_trait]
impl SandboxAccess for ClientSandboxes {
    async fn exec(
        &self,
        sandbox: &str,
        argv: Vec<String>,
        timeout_s: u64,
    ) -> Result<Exec, SandboxError> {
        let mut req = hatchery_client::ExecRequest::argv(argv);
        req.cwd = Some("/".into());
        req.timeout_seconds = Some(timeout_s);
        let r = self
            .0
            .exec(sandbox, &req)
            .await
            .map_err(|e| SandboxError(e.to_string()))?;
        Ok(Exec {
            exit_code: r.exit_code,
            stdout: r.stdout,
            stderr: r.stderr,
        })
    }
    async fn write_file(
        &self,
        sandbox: &str,
        path: &str,
        data: Vec<u8>,
    ) -> Result<(), SandboxError> {
        self.0
            .write_file(sandbox, path, data)
            .await
            .map_err(|e| SandboxError(e.to_string()))
    }
    async fn read_file(&self, sandbox: &str, path: &str) -> Result<Vec<u8>, SandboxError> {
        self.0
            .read_file(sandbox, path)
            .await
            .map(|b| b.to_vec())
            .map_err(|e| SandboxError(e.to_string()))
    }
}
