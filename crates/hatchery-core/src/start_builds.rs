//! Templates built at start (`--build-template`): the daemon serves as
//! soon as it is ready and builds these behind it, one at a time, at low
//! CPU priority, through the same path as `POST /v1/templates`. Each is
//! registered before the daemon listens, so from the first request the
//! templates API shows it `building` and a create naming it is told to
//! retry (`CoreError::TemplateBuilding`) rather than that it does not exist.

use crate::builds::Build;
use crate::Manager;
use hatchery_templates::{BuildPriority, TemplateSpec};
use std::sync::Arc;

/// Builds registered and waiting for `spawn`.
#[must_use = "nothing is built until spawn() is called"]
pub struct QueuedBuilds {
    manager: Arc<Manager>,
    builds: Vec<(Arc<Build>, TemplateSpec)>,
}

impl QueuedBuilds {
    /// The builds queued, in the order they will run.
    pub fn builds(&self) -> impl Iterator<Item = &Arc<Build>> {
        self.builds.iter().map(|(b, _)| b)
    }

    /// Runs the queued builds in order, one at a time, in the background.
    pub fn spawn(self) -> tokio::task::JoinHandle<()> {
        let QueuedBuilds { manager, builds } = self;
        tokio::spawn(async move {
            for (b, spec) in builds {
                Arc::clone(&manager).run_to_end(b, spec).await;
            }
        })
    }
}

impl Manager {
    /// Registers a low-priority build of each spec whose version is not
    /// already the template's current one (that spec is built: nothing to
    /// do). A spec naming a template already queued is skipped.
    pub fn queue_builds(self: &Arc<Self>, specs: Vec<TemplateSpec>) -> QueuedBuilds {
        let mut builds = Vec::new();
        for spec in specs {
            if let Ok(t) = self.templates().get(&spec.name) {
                if t.version == spec.version() {
                    tracing::info!(template = %spec.name, version = %t.version, "template to build at start is current");
                    continue;
                }
            }
            match self.register_build(&spec, BuildPriority::Low) {
                Ok(b) => {
                    tracing::info!(template = %b.name, version = %b.version, build = %b.id, "template build queued");
                    builds.push((b, spec));
                }
                Err(e) => {
                    tracing::warn!(template = %spec.name, error = %e, "template build at start skipped")
                }
            }
        }
        QueuedBuilds {
            manager: Arc::clone(self),
            builds,
        }
    }
}
