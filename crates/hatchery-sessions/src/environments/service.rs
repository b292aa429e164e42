//! The environments service: create, read, delete, and builds (one at a
//! time per environment on this host, in a task of their own so that a
//! client going away does not stop one).

use super::build;
use super::models::*;
use super::progress::{BuildEvent, Progress};
use super::store::{EnvRecord, EnvStore};
use super::EnvError;
use crate::config::SessionsConfig;
use crate::sandbox::Sandboxes;
use crate::validate;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

pub struct Environments {
    store: EnvStore,
    sandboxes: Arc<dyn Sandboxes>,
    cfg: SessionsConfig,
    /// Builds running on this host, by environment.
    builds: Mutex<HashMap<String, Arc<Progress>>>,
}

fn view(r: EnvRecord, building: bool) -> EnvironmentView {
    EnvironmentView {
        current: r.current().cloned(),
        environment_id: r.id,
        name: r.name,
        spec: r.spec,
        created_at: r.created_at,
        versions: r.versions,
        building,
        last_error: r.last_error,
    }
}

impl Environments {
    pub fn new(store: EnvStore, sandboxes: Arc<dyn Sandboxes>, cfg: SessionsConfig) -> Arc<Self> {
        Arc::new(Environments {
            store,
            sandboxes,
            cfg,
            builds: Mutex::new(HashMap::new()),
        })
    }

    fn building(&self, id: &str) -> bool {
        self.builds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(id)
    }

    /// Checks everything first; the row is written only when all of it
    /// holds, so a refused create leaves nothing.
    pub async fn create(&self, b: CreateEnvironment) -> Result<EnvironmentView, EnvError> {
        let name = b.name.trim().to_string();
        validate::text("name", &name, MAX_NAME_BYTES, false)?;
        validate::repo_url(&b.repo, &self.cfg)?;
        let git_ref = b.git_ref.unwrap_or_else(|| "main".into());
        validate::git_ref(&git_ref)?;
        let template = b
            .template
            .unwrap_or_else(|| crate::layout::DEFAULT_TEMPLATE.into());
        validate::template_name(&template)?;
        validate::text("setup", &b.setup, MAX_SETUP_BYTES, true)?;
        if b.setup_allow.len() > MAX_SETUP_ALLOW {
            return Err(EnvError::Invalid(format!(
                "setup_allow: at most {MAX_SETUP_ALLOW} rules"
            )));
        }
        if let Some(bad) = b.setup_allow.iter().find(|r| !r.is_object()) {
            return Err(EnvError::Invalid(format!(
                "setup_allow: each rule is a NetworkPolicy rule object, not {bad}"
            )));
        }
        let timeout = b.setup_timeout_s.unwrap_or(DEFAULT_SETUP_TIMEOUT_S);
        if !(1..=MAX_SETUP_TIMEOUT_S).contains(&timeout) {
            return Err(EnvError::Invalid(format!(
                "setup_timeout_s must be 1..{MAX_SETUP_TIMEOUT_S}"
            )));
        }
        if !self.sandboxes.template_exists(&template).await? {
            return Err(EnvError::UnknownTemplate(template));
        }
        let spec = EnvSpec {
            repo: b.repo,
            git_ref,
            template,
            setup: b.setup,
            setup_allow: b.setup_allow,
            setup_timeout_s: timeout,
        };
        let id = crate::ids::new_id("env");
        self.store.insert(&id, &name, &spec).await?;
        self.get(&id).await
    }

    async fn record(&self, id: &str) -> Result<EnvRecord, EnvError> {
        if !crate::ids::valid("env", id) {
            return Err(EnvError::NotFound(id.into()));
        }
        self.store
            .get(id)
            .await?
            .ok_or_else(|| EnvError::NotFound(id.into()))
    }

    pub async fn get(&self, id: &str) -> Result<EnvironmentView, EnvError> {
        let r = self.record(id).await?;
        let b = self.building(id);
        Ok(view(r, b))
    }

    pub async fn list(&self) -> Result<EnvironmentList, EnvError> {
        let all = self.store.list().await?;
        Ok(EnvironmentList {
            environments: all
                .into_iter()
                .map(|r| {
                    let b = self.building(&r.id);
                    view(r, b)
                })
                .collect(),
        })
    }

    /// Refused (409) while a build runs or an unfinished session uses it;
    /// else the rows go, then every version's snapshot.
    pub async fn delete(&self, id: &str) -> Result<(), EnvError> {
        self.record(id).await?;
        if self.building(id) {
            return Err(EnvError::Conflict(format!(
                "environment {id} is being built"
            )));
        }
        for snap in self.store.delete(id).await? {
            self.drop_snapshot(id, &snap).await;
        }
        Ok(())
    }

    async fn drop_snapshot(&self, id: &str, snap: &str) {
        if let Err(e) = self.sandboxes.delete_snapshot(snap).await {
            tracing::warn!(environment = %id, snapshot = %snap, error = %e, "deleting an environment's snapshot failed");
        }
    }

    /// Starts a build (409 when one of this environment runs here) and
    /// returns its progress; the build goes on if nobody listens.
    pub async fn start_build(self: &Arc<Self>, id: &str) -> Result<Arc<Progress>, EnvError> {
        let rec = self.record(id).await?;
        let p = {
            let mut b = self.builds.lock().unwrap_or_else(|p| p.into_inner());
            if b.contains_key(id) {
                return Err(EnvError::Conflict(format!(
                    "a build of environment {id} is running"
                )));
            }
            let p = Arc::new(Progress::default());
            b.insert(id.to_string(), p.clone());
            p
        };
        let me = self.clone();
        let progress = p.clone();
        tokio::spawn(async move {
            let end = me.build(&rec, &progress).await;
            me.builds
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&rec.id);
            progress.send(end);
        });
        Ok(p)
    }

    /// One build to its last event.
    async fn build(&self, rec: &EnvRecord, p: &Progress) -> BuildEvent {
        let t0 = std::time::Instant::now();
        let fail = |e: &EnvError| BuildEvent::Error {
            code: e.build_code(),
            message: e.full_message(),
        };
        let built = match build::run(&*self.sandboxes, &self.cfg, rec, p).await {
            Ok(b) => b,
            Err(e) => {
                tracing::info!(environment = %rec.id, error = %e.full_message(), "environment build failed");
                let ev = fail(&e);
                if let Err(se) = self.store.set_error(&rec.id, &e.full_message()).await {
                    tracing::warn!(environment = %rec.id, error = %se, "recording a build's failure failed");
                }
                return ev;
            }
        };
        let ms = t0.elapsed().as_millis() as u64;
        let added = self
            .store
            .add_version(
                &rec.id,
                &built.snapshot_id,
                &built.base_commit,
                &rec.spec.template,
                ms,
            )
            .await;
        let v = match added {
            Ok(Some(v)) => v,
            Ok(None) => {
                self.drop_snapshot(&rec.id, &built.snapshot_id).await;
                return fail(&EnvError::NotFound(rec.id.clone()));
            }
            Err(e) => {
                self.drop_snapshot(&rec.id, &built.snapshot_id).await;
                return fail(&e);
            }
        };
        match self.store.prune(&rec.id).await {
            Ok(old) => {
                for s in old {
                    self.drop_snapshot(&rec.id, &s).await;
                }
            }
            Err(e) => {
                tracing::warn!(environment = %rec.id, error = %e.full_message(), "pruning old versions failed")
            }
        }
        tracing::info!(environment = %rec.id, version = v.version, commit = %v.base_commit, build_ms = ms, "environment built");
        BuildEvent::Done {
            environment_id: rec.id.clone(),
            version: v.version,
            base_commit: v.base_commit,
            snapshot_id: v.snapshot_id,
        }
    }

    /// What a new session on environment `id` pins: its current version,
    /// with the repository and template it was built from.
    pub async fn pin(&self, id: &str) -> Result<(EnvSpec, EnvPin), EnvError> {
        let r = self.record(id).await?;
        let v = r.current().ok_or_else(|| EnvError::NotBuilt(id.into()))?;
        let pin = EnvPin {
            environment_id: r.id.clone(),
            version: v.version,
            snapshot_id: v.snapshot_id.clone(),
            base_commit: v.base_commit.clone(),
        };
        Ok((r.spec, pin))
    }
}
