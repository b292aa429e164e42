use crate::layout::{GvisorConfig, Layout, ShimConfig};
use crate::shim::{ROLE_AGENT, ROLE_CONTROL};
use crate::{files, oci, teardown};
use async_trait::async_trait;
use hatchery_agent_proto::{Frame, Kind, ShimControl, MAX_FRAME};
use hatchery_runtime::{AgentStream, Runtime, RuntimeError, SandboxSpec};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::process::Command;

/// Longest a unix socket path may be (sun_path minus the NUL).
const MAX_SOCK_PATH: usize = 107;
const START_TIMEOUT: Duration = Duration::from_secs(30);
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);
const CHECKPOINT_TIMEOUT: Duration = Duration::from_secs(60);
/// The shim's deadline trails the real expiry: while the daemon runs, its
/// reaper stops the sandbox first (and records why); the shim's copy is
/// the backstop for when the daemon is down.
const SHIM_GRACE_MS: u64 = 2000;

/// In a sandbox's bundle while the idle parker has it frozen
/// (hatchery-core idle.rs): what `unpark` may thaw.
const IDLE_PARKED: &str = "idle-parked";

pub struct GvisorRuntime {
    layout: Layout,
}

impl GvisorRuntime {
    pub fn new(cfg: GvisorConfig) -> Result<Self, RuntimeError> {
        let layout = Layout { cfg };
        for d in [layout.runsc_root(), layout.sandboxes()] {
            std::fs::create_dir_all(&d)?;
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700))?;
        }
        let probe = layout.socket("sbx_0123456789abcdef0123");
        if probe.as_os_str().len() > MAX_SOCK_PATH {
            return Err(RuntimeError::Other(format!(
                "state directory {} is too long for unix socket paths; use a shorter --data-dir",
                layout.cfg.state_dir.display()
            )));
        }
        Ok(GvisorRuntime { layout })
    }

    async fn control(
        &self,
        id: &str,
        msg: &ShimControl,
        timeout: Duration,
    ) -> Result<(), RuntimeError> {
        let fut = async {
            let mut s = UnixStream::connect(self.layout.socket(id)).await?;
            s.write_all(&[ROLE_CONTROL]).await?;
            s.write_all(&Frame::json(0, Kind::Control, msg).encode())
                .await?;
            // The ack (or EOF if the shim exits first) says it is done.
            let mut buf = Vec::new();
            let _ = (&mut s).take(MAX_FRAME as u64).read_to_end(&mut buf).await;
            Ok::<_, std::io::Error>(())
        };
        match tokio::time::timeout(timeout, fut).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e))
                if e.kind() == std::io::ErrorKind::NotFound
                    || e.kind() == std::io::ErrorKind::ConnectionRefused =>
            {
                Err(RuntimeError::NotFound(id.to_string()))
            }
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(RuntimeError::Other(format!("shim of {id} did not answer"))),
        }
    }

    /// The rootfs sandbox `id` runs on, from the OCI spec written at its
    /// start (host-written: the guest cannot change it).
    fn rootfs_of(&self, id: &str) -> Result<std::path::PathBuf, RuntimeError> {
        let raw = std::fs::read(self.layout.bundle(id).join("config.json")).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                RuntimeError::NotFound(id.to_string())
            } else {
                e.into()
            }
        })?;
        let spec: serde_json::Value =
            serde_json::from_slice(&raw).map_err(|e| RuntimeError::Other(e.to_string()))?;
        spec["root"]["path"]
            .as_str()
            .map(Into::into)
            .ok_or_else(|| RuntimeError::Other(format!("no root path in {id}'s spec")))
    }

    fn shim_pid(&self, id: &str) -> Option<i32> {
        std::fs::read_to_string(self.layout.bundle(id).join("shim.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }
}

#[async_trait]
impl Runtime for GvisorRuntime {
    fn name(&self) -> &'static str {
        "gvisor"
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<(), RuntimeError> {
        self.start(spec, None).await
    }

    async fn checkpoint(&self, id: &str, dir: &Path) -> Result<(), RuntimeError> {
        let out = Command::new(&self.layout.cfg.runsc)
            .args(self.layout.runsc_flags())
            .arg("checkpoint")
            .arg(format!("--image-path={}", dir.display()))
            // Uncompressed (about 10 MB instead of 3 for an idle sandbox):
            // measured on this host, a snapshot took 199 ms p50 instead of
            // 240 and a fork plus its first exec 429 instead of 689, since
            // neither side deflates or inflates; the page cache holds it.
            // And memory: restoring a flate image left the Sentry about
            // 33 MiB more Go heap (43 MiB of anon instead of 10, the
            // decoder's garbage) for the minutes until its Go runtime gave
            // it back, in every pooled sandbox (docs/benchmarks.md,
            // 2026-12-07; tests/integration/test_density.py).
            .arg("--compression=none")
            // The sandbox keeps running (and keeps its agent pipes).
            .arg("--leave-running")
            .arg(id)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output();
        let out = tokio::time::timeout(CHECKPOINT_TIMEOUT, out)
            .await
            .map_err(|_| RuntimeError::Other(format!("checkpoint of {id} timed out")))??;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            let tail: String = err.lines().rev().take(3).collect::<Vec<_>>().join(" | ");
            if tail.contains("not found") || tail.contains("does not exist") {
                return Err(RuntimeError::NotFound(id.to_string()));
            }
            return Err(RuntimeError::Other(format!(
                "checkpoint of {id} failed: {tail}"
            )));
        }
        Ok(())
    }

    async fn restore(&self, spec: &SandboxSpec, dir: &Path) -> Result<(), RuntimeError> {
        self.start(spec, Some(dir)).await
    }

    async fn export_files(
        &self,
        id: &str,
        since_ms: u64,
        dest: &Path,
        max_bytes: u64,
    ) -> Result<u64, RuntimeError> {
        let flags = self.layout.runsc_flags();
        let rootfs = self.rootfs_of(id)?;
        files::export(
            &self.layout.cfg.runsc,
            &flags,
            id,
            &rootfs,
            since_ms,
            dest,
            max_bytes,
        )
        .await
    }

    async fn import_files(&self, id: &str, src: &Path) -> Result<(), RuntimeError> {
        let flags = self.layout.runsc_flags();
        files::import(&self.layout.cfg.runsc, &flags, id, src).await
    }

    async fn connect(&self, id: &str) -> Result<AgentStream, RuntimeError> {
        let mut s = UnixStream::connect(self.layout.socket(id))
            .await
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
                    RuntimeError::NotFound(id.into())
                }
                _ => e.into(),
            })?;
        s.write_all(&[ROLE_AGENT]).await?;
        Ok(Box::pin(s))
    }

    async fn set_expiry(&self, id: &str, expires_at_ms: u64) -> Result<(), RuntimeError> {
        self.control(
            id,
            &ShimControl::SetExpiry {
                unix_ms: expires_at_ms + SHIM_GRACE_MS,
            },
            Duration::from_secs(5),
        )
        .await
    }

    async fn destroy(&self, id: &str) -> Result<(), RuntimeError> {
        // Ask the shim first: it holds the pipes and knows the sandbox.
        let _ = self
            .control(id, &ShimControl::Shutdown, SHUTDOWN_TIMEOUT)
            .await;
        if let Some(pid) = self.shim_pid(id) {
            if teardown::pids_mentioning(id).contains(&(pid as u32)) {
                // SAFETY: signalling a pid we verified still names this sandbox.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        // Then make sure, whatever state the shim was in.
        let (runsc, flags, bundle, id2) = (
            self.layout.cfg.runsc.clone(),
            self.layout.runsc_flags(),
            self.layout.bundle(id),
            id.to_string(),
        );
        tokio::task::spawn_blocking(move || teardown::destroy(&runsc, &flags, &id2, &bundle))
            .await
            .map_err(|e| RuntimeError::Other(e.to_string()))?;
        let _ = std::fs::remove_file(self.layout.end_file(id));
        Ok(())
    }

    async fn list(&self) -> Result<Vec<String>, RuntimeError> {
        let mut ids = std::collections::BTreeSet::new();
        if let Ok(rd) = std::fs::read_dir(self.layout.sandboxes()) {
            for e in rd.flatten() {
                ids.insert(e.file_name().to_string_lossy().into_owned());
            }
        }
        let out = Command::new(&self.layout.cfg.runsc)
            .args(self.layout.runsc_flags())
            .args(["list", "--quiet"])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .await?;
        for l in String::from_utf8_lossy(&out.stdout).lines() {
            if !l.trim().is_empty() {
                ids.insert(l.trim().to_string());
            }
        }
        Ok(ids.into_iter().collect())
    }

    fn oom_kills(&self, id: &str) -> Option<u64> {
        crate::memcg::oom_kills(id, &self.layout.bundle(id))
    }

    fn end_cause(&self, id: &str) -> Option<hatchery_runtime::EndCause> {
        let b = std::fs::read(self.layout.end_file(id)).ok()?;
        serde_json::from_slice(&b).ok()
    }

    fn usage(&self, id: &str) -> Option<hatchery_runtime::Usage> {
        crate::memcg::usage(id)
    }

    async fn park(&self, id: &str) {
        let id2 = id.to_string();
        let r = tokio::task::spawn_blocking(move || crate::freezer::freeze(&id2)).await;
        match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(sandbox = %id, error = %e, "could not park a pooled sandbox; it stays running")
            }
            Err(e) => {
                tracing::warn!(sandbox = %id, error = %e, "parking a pooled sandbox panicked")
            }
        }
    }

    fn park_idle(&self, id: &str) -> bool {
        // Marked first, frozen second: a daemon that dies in between
        // leaves a mark on a running sandbox (harmless), never a frozen
        // sandbox without one. Only marked sandboxes are thawed by
        // `unpark`, so one frozen by someone else (an operator holding it
        // for inspection, a test simulating a hung guest) stays frozen.
        let mark = self.layout.bundle(id).join(IDLE_PARKED);
        if let Err(e) = std::fs::write(&mark, b"") {
            tracing::warn!(sandbox = %id, error = %e, "could not mark an idle sandbox; it stays running");
            return false;
        }
        match crate::freezer::freeze(id) {
            Ok(()) => true,
            Err(e) => {
                let _ = std::fs::remove_file(&mark);
                tracing::warn!(sandbox = %id, error = %e, "could not park an idle sandbox; it stays running");
                false
            }
        }
    }

    fn unpark(&self, id: &str) {
        let mark = self.layout.bundle(id).join(IDLE_PARKED);
        if !mark.exists() {
            return;
        }
        match crate::freezer::thaw(id) {
            Ok(()) => {
                let _ = std::fs::remove_file(&mark);
            }
            Err(e) => tracing::warn!(sandbox = %id, error = %e, "could not unpark an idle sandbox"),
        }
    }

    fn foreground(&self, id: &str) {
        // Thawed first: nothing else on the claim path can reach a parked
        // sandbox (freezer.rs).
        if let Err(e) = crate::freezer::thaw(id) {
            tracing::warn!(sandbox = %id, error = %e, "could not unpark a claimed sandbox");
        }
        // runsc made the cgroup with the spec's shares (oci.rs); only the
        // weight changes here, the CPU quota stays.
        let p = std::path::Path::new("/sys/fs/cgroup/cpu")
            .join(id)
            .join("cpu.shares");
        if let Err(e) = std::fs::write(&p, crate::oci::FOREGROUND_SHARES.to_string()) {
            tracing::warn!(sandbox = %id, error = %e, "could not give a claimed sandbox its CPU weight");
        }
    }

    fn image_compat(&self) -> String {
        // The agent's memory is inside every image: a rebuilt agent means
        // new images.
        let stamp = |p: &Path| {
            std::fs::metadata(p)
                .map(|m| format!("{}:{:?}", m.len(), m.modified().ok()))
                .unwrap_or_default()
        };
        format!(
            "gvisor|{}|net={}|disk=overlay-dir|{}|{}",
            self.layout.cfg.platform,
            self.layout.cfg.network,
            stamp(&self.layout.cfg.agent),
            stamp(&self.layout.cfg.runsc)
        )
    }

    fn leftovers(&self, id: &str) -> Vec<String> {
        teardown::leftovers(id, &self.layout.bundle(id), &self.layout.runsc_root())
    }
}

impl GvisorRuntime {
    /// Boots (`runsc run`) or restores (`runsc restore`) a sandbox under a
    /// new shim. On error nothing is left behind.
    async fn start(
        &self,
        spec: &SandboxSpec,
        restore_from: Option<&Path>,
    ) -> Result<(), RuntimeError> {
        let bundle = self.layout.bundle(&spec.id);
        std::fs::create_dir(&bundle)?;
        std::fs::set_permissions(&bundle, std::fs::Permissions::from_mode(0o700))?;
        let config = oci::config(spec, &self.layout.cfg.agent, &Layout::tmp_lower(&bundle));
        let shim_cfg = ShimConfig {
            id: spec.id.clone(),
            runsc: self.layout.cfg.runsc.clone(),
            runsc_flags: self.layout.start_flags(&spec.id),
            expires_at_ms: spec.expires_at_ms + SHIM_GRACE_MS,
            restore_from: restore_from.map(Path::to_path_buf),
            mask_proc_sys_net: self.layout.cfg.network,
            disk_mb: spec.limits.disk_mb,
            memory_mb: spec.limits.memory_mb,
        };
        if self.layout.cfg.network != spec.netns.is_some() {
            let _ = std::fs::remove_dir_all(&bundle);
            return Err(RuntimeError::Start(
                "a sandbox needs a network namespace exactly when networking is on".into(),
            ));
        }
        let write = || -> std::io::Result<()> {
            std::fs::write(
                bundle.join("config.json"),
                serde_json::to_vec_pretty(&config)?,
            )?;
            std::fs::write(
                ShimConfig::path(&bundle),
                serde_json::to_vec_pretty(&shim_cfg)?,
            )?;
            Ok(())
        };
        if let Err(e) = write() {
            let _ = std::fs::remove_dir_all(&bundle);
            return Err(e.into());
        }
        let mut cmd = Command::new(&self.layout.cfg.shim);
        cmd.arg(&bundle)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        // The shim makes itself a session leader (so it outlives the
        // daemon and gets no terminal signals). Not a pre_exec setsid here:
        // that would make std fork() this multi-threaded daemon instead of
        // using posix_spawn, which costs milliseconds on every create.
        let mut child = cmd.spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| RuntimeError::Start("no shim stdout".into()))?;
        let mut line = String::new();
        let read =
            tokio::time::timeout(START_TIMEOUT, BufReader::new(stdout).read_line(&mut line)).await;
        // The shim keeps running after it says ready; reap it in the
        // background whenever it exits.
        tokio::spawn(async move {
            let _ = child.wait().await;
        });
        match read {
            Ok(Ok(_)) if line.trim() == "ready" => Ok(()),
            other => {
                let why = match other {
                    Ok(Ok(_)) => line.trim().trim_start_matches("error: ").to_string(),
                    Ok(Err(e)) => e.to_string(),
                    Err(_) => "timed out waiting for runsc".into(),
                };
                self.destroy(&spec.id).await.ok();
                Err(RuntimeError::Start(why))
            }
        }
    }
}
