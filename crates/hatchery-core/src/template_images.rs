//! Baking a template's warm checkpoint: boot a builder sandbox once, write
//! the template's files, run its setup commands, warm the interpreter,
//! checkpoint it, seal the image. Every create afterwards restores (or
//! claims a pooled restore of) that image instead of booting.

use crate::agent_client::AgentClient;
use crate::exec::{ExecParams, Sink};
use crate::ids::new_sandbox_id;
use crate::{now_ms, CoreError, Manager};
use hatchery_runtime::SandboxSpec;
use hatchery_templates::Template;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Loads the interpreter and common modules so their pages are in the
/// image, and the first `python3` in a new sandbox starts warm.
const WARM_UP: &str = "python3 -c 'import json, os, re, subprocess, sys' >/dev/null 2>&1; echo warm >/dev/null; /bin/echo warm >/dev/null; ls / >/dev/null; true";
/// Longest a single setup command may run.
const SETUP_TIMEOUT: Duration = Duration::from_secs(600);
/// Output of a setup command kept for the build log, per stream.
const SETUP_OUTPUT: u64 = 256 * 1024;

fn shell(cmd: &str, timeout: Duration, max_output_bytes: u64) -> ExecParams {
    ExecParams {
        argv: vec!["/bin/sh".into(), "-c".into(), cmd.into()],
        cwd: None,
        env: Default::default(),
        stdin: None,
        timeout,
        max_output_bytes,
        cpu_limit_ms: None,
        cpu_basis: crate::exec::CpuBasis::Guest,
    }
}

impl Manager {
    pub(crate) fn template_image_id(&self, t: &Template) -> String {
        t.image_id(&self.runtime.image_compat())
    }

    /// The verified checkpoint for this template version, if baked.
    pub fn template_image(&self, t: &Template) -> Option<PathBuf> {
        self.template_images.verify(&self.template_image_id(t)).ok()
    }

    /// Templates whose current checkpoint is on this host's disk, sealed:
    /// what the heartbeat reports, so placement prefers this host for them.
    pub fn warm_templates(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .templates()
            .list()
            .into_iter()
            .filter(|t| self.template_images.is_sealed(&self.template_image_id(t)))
            .map(|t| t.spec.name.clone())
            .collect();
        names.sort();
        names
    }

    /// Checkpoints of template `name`. Ids are `<name>-<16 hex>`; a prefix
    /// test alone would also match a template called `<name>-x`.
    pub(crate) fn template_images_of(&self, name: &str) -> Vec<String> {
        self.template_images
            .ids()
            .into_iter()
            .filter(|id| {
                id.strip_prefix(name)
                    .and_then(|r| r.strip_prefix('-'))
                    .is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
            })
            .collect()
    }

    /// Claims the right to bake `id`; false if a bake of it is running or
    /// the daemon is stopping.
    pub(crate) fn start_baking(&self, id: &str) -> bool {
        !self.closing.load(Ordering::SeqCst)
            && self
                .baking
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id.to_string())
    }

    pub(crate) fn done_baking(&self, id: &str) {
        self.baking
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
    }

    /// Bakes in the background, unless the checkpoint is already good or
    /// a bake of it is running.
    pub fn spawn_bake(self: &Arc<Self>, t: &Template) {
        let id = self.template_image_id(t);
        if self.template_image(t).is_some() || !self.start_baking(&id) {
            return;
        }
        let (me, t) = (Arc::clone(self), t.clone());
        tokio::spawn(async move {
            // A create may have found the image bad while this bake ran (and
            // so could not start another): check again after each attempt.
            for _ in 0..3 {
                match me.bake(&t, &id, &mut |_| {}).await {
                    Ok(()) => {
                        tracing::info!(template = %t.spec.name, image = %id, "template checkpoint baked")
                    }
                    Err(e) => {
                        tracing::error!(template = %t.spec.name, error = %e, "template checkpoint failed")
                    }
                }
                if me.template_image(&t).is_some() || me.closing.load(Ordering::SeqCst) {
                    break;
                }
            }
            me.done_baking(&id);
        });
    }

    /// Writes the template's files and runs its setup commands in a fresh
    /// guest (their output goes to `log`, line by line): what a checkpoint
    /// captures, and what a cold boot must redo.
    pub(crate) async fn prepare_guest(
        &self,
        client: &AgentClient,
        t: &Template,
        log: &mut (dyn FnMut(String) + Send),
    ) -> Result<(), CoreError> {
        // Before the template's files, so a template can ship its own.
        crate::files::write(
            client,
            "/etc/resolv.conf",
            crate::network::DEFAULT_RESOLV_CONF.as_bytes(),
        )
        .await?;
        for (path, content) in &t.spec.files {
            log(format!("file {path}"));
            crate::files::write(client, path, content.as_bytes()).await?;
        }
        for (i, cmd) in t.spec.setup.iter().enumerate() {
            log(format!("setup[{i}]: {cmd}"));
            let out = crate::exec::run(
                client,
                shell(cmd, SETUP_TIMEOUT, SETUP_OUTPUT),
                Sink::Collect,
                None,
            )
            .await?;
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                log(line.to_string());
            }
            for line in String::from_utf8_lossy(&out.stderr).lines() {
                log(line.to_string());
            }
            if out.exit_code != 0 {
                let why = if out.timed_out { " (timed out)" } else { "" };
                return Err(CoreError::Invalid(format!(
                    "setup[{i}] exited with {}{why}",
                    out.exit_code
                )));
            }
        }
        Ok(())
    }

    /// Boots `t` cold, prepares it, warms the interpreter and checkpoints
    /// the result as `image_id`.
    pub async fn bake(
        &self,
        t: &Template,
        image_id: &str,
        log: &mut (dyn FnMut(String) + Send),
    ) -> Result<(), CoreError> {
        let id = new_sandbox_id();
        // The builder has no egress: packages come from the host-side
        // rootfs build, and setup steps run offline.
        let netns = self.claim_slot(&id, &Default::default()).await?;
        let spec = SandboxSpec {
            id,
            rootfs: t.rootfs.clone(),
            limits: t.limits(),
            // Short: if the daemon dies mid-bake, the builder goes soon.
            expires_at_ms: now_ms()
                + 120_000
                + t.spec.setup.len() as u64 * SETUP_TIMEOUT.as_millis() as u64,
            netns,
            background: false,
        };
        if let Err(e) = self.runtime.create(&spec).await {
            self.release_slot(&spec.id).await;
            return Err(e.into());
        }
        let res = async {
            let client = self.connect_agent(&spec.id).await?;
            self.prepare_guest(&client, t, log).await?;
            crate::exec::run(
                &client,
                shell(WARM_UP, Duration::from_secs(60), 4096),
                Sink::Collect,
                None,
            )
            .await?;
            wait_interpreters_ready(&client).await;
            let dir = self.template_images.prepare(image_id).map_err(image_err)?;
            self.runtime.checkpoint(&spec.id, &dir).await?;
            self.template_images.seal(image_id).map_err(image_err)?;
            Ok::<_, CoreError>(())
        }
        .await;
        if res.is_err() {
            let _ = self.template_images.remove(image_id);
        }
        let destroyed = self.runtime.destroy(&spec.id).await;
        self.release_slot(&spec.id).await;
        destroyed?;
        if res.is_ok() {
            // Counted once the builder is gone: "baked" means done.
            self.metrics.template_images_baked.inc();
        }
        res
    }
}

/// The default code context starts with the agent; the checkpoint must
/// catch it ready, so that every restored sandbox runs code at once. A
/// template without Python has no contexts and nothing to wait for.
async fn wait_interpreters_ready(client: &crate::agent_client::AgentClient) {
    let end = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::time::Instant::now() < end {
        match crate::code::list_contexts(client).await {
            Ok(all) if all.iter().all(|c| c.state == "ready") => return,
            Ok(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(_) => return,
        }
    }
}

pub(crate) fn image_err(e: hatchery_templates::ImageError) -> CoreError {
    use hatchery_templates::ImageError as E;
    match e {
        E::NotFound(id) => CoreError::SnapshotNotFound(id),
        E::Corrupt { .. } => CoreError::SnapshotCorrupt(e.to_string()),
        E::InvalidId(id) => CoreError::SnapshotNotFound(id),
        E::Io(e) => CoreError::Internal(format!("image store: {e}")),
    }
}
