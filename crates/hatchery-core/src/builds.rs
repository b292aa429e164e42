//! Template builds: `POST /v1/templates` turns a spec into a new version.
//! Steps: rootfs (debootstrap of base + packages, reused when only setup or
//! shape changed), setup (files and commands in a build sandbox, then the
//! warm checkpoint), activate (atomic switch of the template's current
//! version). Progress is kept per build and streamed to any number of
//! subscribers; a late subscriber gets the history first.

use crate::ids::new_sandbox_id;
use crate::{CoreError, Manager};
use hatchery_templates::{
    build_rootfs, default_mirror, BuildPriority, Template, TemplateError, TemplateSpec,
};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::broadcast;

/// Events kept per build; a debootstrap log is a few hundred lines.
const MAX_EVENTS: usize = 5000;
/// Finished builds remembered for late subscribers.
const MAX_BUILDS: usize = 32;

#[derive(Debug, Clone, PartialEq)]
pub struct BuildEvent {
    /// `step`, `log`, `done` or `error`.
    pub kind: &'static str,
    pub data: Value,
}

pub struct Build {
    pub id: String,
    pub name: String,
    pub version: String,
    /// What is being built: the templates API shows a template that
    /// exists only as a build from it.
    pub spec: TemplateSpec,
    priority: BuildPriority,
    started_ms: u64,
    events: Mutex<Vec<BuildEvent>>,
    tx: broadcast::Sender<BuildEvent>,
    finished: AtomicBool,
}

impl Build {
    fn emit(&self, kind: &'static str, data: Value) {
        let ev = BuildEvent { kind, data };
        let mut evs = self.events.lock().unwrap_or_else(|p| p.into_inner());
        if evs.len() < MAX_EVENTS || kind != "log" {
            evs.push(ev.clone());
        }
        if kind == "done" || kind == "error" {
            self.finished.store(true, Ordering::SeqCst);
        }
        let _ = self.tx.send(ev);
    }

    fn step(&self, step: &str, percent: u32) {
        self.emit("step", json!({"step": step, "percent": percent}));
    }

    pub fn finished(&self) -> bool {
        self.finished.load(Ordering::SeqCst)
    }

    /// The last step reached and its percentage (`queued`, 0 before any).
    pub fn progress(&self) -> (String, u32) {
        let evs = self.events.lock().unwrap_or_else(|p| p.into_inner());
        evs.iter()
            .rev()
            .find(|e| e.kind == "step")
            .map(|e| {
                (
                    e.data["step"].as_str().unwrap_or_default().to_string(),
                    e.data["percent"].as_u64().unwrap_or(0) as u32,
                )
            })
            .unwrap_or_else(|| ("queued".into(), 0))
    }

    /// History so far plus a receiver for what comes next (none once the
    /// build has finished), taken atomically so no event is missed.
    pub fn subscribe(&self) -> (Vec<BuildEvent>, Option<broadcast::Receiver<BuildEvent>>) {
        let evs = self.events.lock().unwrap_or_else(|p| p.into_inner());
        let rx = (!self.finished()).then(|| self.tx.subscribe());
        (evs.clone(), rx)
    }
}

impl Manager {
    pub fn build_template(self: &Arc<Self>, spec: TemplateSpec) -> Result<Arc<Build>, CoreError> {
        let build = self.register_build(&spec, BuildPriority::Normal)?;
        tokio::spawn(Arc::clone(self).run_to_end(Arc::clone(&build), spec));
        Ok(build)
    }

    /// Records a build of `spec` (refused while another of its name has
    /// not finished); `run_to_end` does it.
    pub(crate) fn register_build(
        &self,
        spec: &TemplateSpec,
        priority: BuildPriority,
    ) -> Result<Arc<Build>, CoreError> {
        spec.validate()?;
        let mut builds = self.builds.lock().unwrap_or_else(|p| p.into_inner());
        if builds
            .values()
            .any(|b| b.name == spec.name && !b.finished())
        {
            return Err(CoreError::Conflict(format!(
                "template '{}' is already being built",
                spec.name
            )));
        }
        if builds.len() >= MAX_BUILDS {
            // Forget the oldest finished builds first.
            let mut done: Vec<(u64, String)> = builds
                .iter()
                .filter(|(_, b)| b.finished())
                .map(|(k, b)| (b.started_ms, k.clone()))
                .collect();
            done.sort();
            for (_, k) in done.into_iter().take(builds.len() + 1 - MAX_BUILDS) {
                builds.remove(&k);
            }
        }
        let build = Arc::new(Build {
            id: format!("bld_{}", &new_sandbox_id()[4..]),
            name: spec.name.clone(),
            version: spec.version(),
            spec: spec.clone(),
            priority,
            started_ms: crate::now_ms(),
            events: Mutex::new(Vec::new()),
            tx: broadcast::channel(1024).0,
            finished: AtomicBool::new(false),
        });
        builds.insert(build.id.clone(), Arc::clone(&build));
        Ok(build)
    }

    /// Runs a registered build and ends its event stream with `done` or
    /// `error`.
    pub(crate) async fn run_to_end(self: Arc<Self>, b: Arc<Build>, spec: TemplateSpec) {
        tracing::info!(template = %b.name, version = %b.version, build = %b.id, "template build started");
        match self.run_build(&b, spec).await {
            Ok(t) => {
                tracing::info!(template = %b.name, version = %t.version, "template build done");
                b.emit(
                    "done",
                    json!({"name": t.spec.name, "version": t.version, "percent": 100}),
                );
            }
            Err(e) => {
                tracing::warn!(template = %b.name, error = %e, "template build failed");
                b.emit(
                    "error",
                    json!({"error": {"code": "build_failed", "message": e.to_string()}}),
                );
            }
        }
    }

    /// The unfinished build of template `name`, if any.
    pub fn running_build_of(&self, name: &str) -> Option<Arc<Build>> {
        self.builds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .find(|b| b.name == name && !b.finished())
            .cloned()
    }

    /// Every unfinished build, by template name.
    pub fn running_builds(&self) -> Vec<Arc<Build>> {
        let mut out: Vec<Arc<Build>> = self
            .builds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|b| !b.finished())
            .cloned()
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// `TemplateBuilding` if a build of template `name` is in progress:
    /// what a create naming a template that does not exist yet is told.
    pub fn building_error(&self, name: &str) -> Option<CoreError> {
        let b = self.running_build_of(name)?;
        let (step, percent) = b.progress();
        Some(CoreError::TemplateBuilding {
            name: name.to_string(),
            step,
            percent,
        })
    }

    /// The current version of template `name`, for a create: one that
    /// exists only as a build in progress is `TemplateBuilding` (retry
    /// later), not `NotFound`.
    pub(crate) fn template_for_create(&self, name: &str) -> Result<Template, CoreError> {
        match self.templates().get(name) {
            Err(TemplateError::NotFound(n)) => Err(self
                .building_error(&n)
                .unwrap_or(TemplateError::NotFound(n).into())),
            other => Ok(other?),
        }
    }

    pub fn get_build(&self, name: &str, id: &str) -> Option<Arc<Build>> {
        let b = self
            .builds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()?;
        (b.name == name).then_some(b)
    }

    async fn run_build(
        self: &Arc<Self>,
        b: &Arc<Build>,
        spec: TemplateSpec,
    ) -> Result<Template, CoreError> {
        b.step("rootfs", 5);
        let rootfs = self.templates().rootfs_dir(&spec);
        let (b2, spec2, dest) = (Arc::clone(b), spec.clone(), rootfs.clone());
        let priority = b.priority;
        tokio::task::spawn_blocking(move || {
            let mut lines = 0u32;
            build_rootfs(&spec2, &dest, &default_mirror(), priority, &mut |line| {
                lines += 1;
                b2.emit("log", json!({"line": line}));
                if lines.is_multiple_of(20) {
                    b2.step("rootfs", (5 + lines / 10).min(55));
                }
            })
        })
        .await
        .map_err(|e| CoreError::Internal(e.to_string()))??;

        b.step("setup", 60);
        let template = Template {
            version: spec.version(),
            spec: spec.clone(),
            rootfs,
        };
        let image_id = self.template_image_id(&template);
        if self.start_baking(&image_id) {
            let b2 = Arc::clone(b);
            let res = self
                .bake(&template, &image_id, &mut move |line| {
                    b2.emit("log", json!({"line": line}))
                })
                .await;
            self.done_baking(&image_id);
            res?;
        } else {
            return Err(CoreError::Conflict(
                "a checkpoint of this version is being baked".into(),
            ));
        }

        b.step("activate", 95);
        let active = self.templates().activate(&spec)?;
        // New creates must get the new version: pooled sandboxes of the old
        // one go, as do checkpoints nothing will restore any more.
        for id in self.pool.ids_of(&spec.name) {
            self.stop(&id, "pool_discard").await;
        }
        for old in self.template_images_of(&spec.name) {
            if old != image_id {
                let _ = self.template_images.remove(&old);
            }
        }
        Ok(active)
    }

    /// Deletes a template no running sandbox uses.
    pub async fn delete_template(self: &Arc<Self>, name: &str) -> Result<(), CoreError> {
        self.templates().get(name)?;
        let filter = crate::store::SandboxFilter {
            metadata: Default::default(),
            template: Some(name.to_string()),
        };
        let users = self.store.list_live(&filter).await?.len();
        if users > 0 {
            return Err(CoreError::Conflict(format!(
                "{users} running sandboxes use template '{name}'"
            )));
        }
        let snaps = self.store.count_snapshots_of(name).await?;
        if snaps > 0 {
            return Err(CoreError::Conflict(format!(
                "{snaps} snapshots were taken on template '{name}'; delete them first"
            )));
        }
        for id in self.pool.ids_of(name) {
            self.stop(&id, "pool_discard").await;
        }
        for img in self.template_images_of(name) {
            let _ = self.template_images.remove(&img);
        }
        self.templates().remove(name)?;
        tracing::info!(template = %name, "template deleted");
        Ok(())
    }
}

pub type Builds = Mutex<HashMap<String, Arc<Build>>>;
