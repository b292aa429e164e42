//! Baking a template's warm checkpoint: boot a builder sandbox once, warm
//! the interpreter, checkpoint it, seal the image. Every create afterwards
//! restores (or claims a pooled restore of) that image instead of booting.

use crate::exec::{ExecParams, Sink};
use crate::ids::new_sandbox_id;
use crate::manager::connect_and_ping;
use crate::{now_ms, CoreError, Manager};
use hatchery_runtime::SandboxSpec;
use hatchery_templates::Template;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Loads the interpreter and common modules so their pages are in the
/// image, and the first `python3` in a new sandbox starts warm.
const WARM_UP: &str = "python3 -c 'import json, os, re, subprocess, sys' >/dev/null 2>&1; true";

impl Manager {
    pub(crate) fn template_image_id(&self, t: &Template) -> String {
        format!(
            "{}-{}",
            t.spec.name,
            t.version(&self.runtime.image_compat())
        )
    }

    /// The verified checkpoint for this template version, if baked.
    pub fn template_image(&self, t: &Template) -> Option<PathBuf> {
        self.template_images.verify(&self.template_image_id(t)).ok()
    }

    /// Bakes in the background unless a bake for this version is running.
    pub fn spawn_bake(self: &Arc<Self>, t: &Template) {
        let id = self.template_image_id(t);
        if self.closing.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        if !self
            .baking
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.clone())
        {
            return;
        }
        let (me, t) = (Arc::clone(self), t.clone());
        tokio::spawn(async move {
            match me.bake(&t, &id).await {
                Ok(()) => {
                    me.metrics.template_images_baked.inc();
                    tracing::info!(template = %t.spec.name, image = %id, "template checkpoint baked")
                }
                Err(e) => {
                    tracing::error!(template = %t.spec.name, error = %e, "template checkpoint failed")
                }
            }
            me.baking
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
        });
    }

    pub async fn bake(&self, t: &Template, image_id: &str) -> Result<(), CoreError> {
        let spec = SandboxSpec {
            id: new_sandbox_id(),
            rootfs: t.rootfs.clone(),
            limits: t.limits(),
            expires_at_ms: now_ms() + 600_000,
        };
        self.runtime.create(&spec).await?;
        let res = async {
            let client = connect_and_ping(self.runtime.as_ref(), &spec.id).await?;
            let warm = ExecParams {
                argv: vec!["/bin/sh".into(), "-c".into(), WARM_UP.into()],
                cwd: None,
                env: Default::default(),
                stdin: None,
                timeout: Duration::from_secs(60),
                max_output_bytes: 4096,
            };
            crate::exec::run(&client, warm, Sink::Collect).await?;
            let dir = self.template_images.prepare(image_id).map_err(image_err)?;
            self.runtime.checkpoint(&spec.id, &dir).await?;
            self.template_images.seal(image_id).map_err(image_err)?;
            // Older versions of this template are no longer restored.
            for old in self.template_images.ids() {
                if old != image_id && old.starts_with(&format!("{}-", t.spec.name)) {
                    let _ = self.template_images.remove(&old);
                }
            }
            Ok::<_, CoreError>(())
        }
        .await;
        if res.is_err() {
            let _ = self.template_images.remove(image_id);
        }
        self.runtime.destroy(&spec.id).await?;
        res
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
