//! The environments service: create, read, delete, and builds (one at a
//! time per environment on this host, in a task of their own so that a
//! client going away does not stop one).
//!
//! Template changes: every version records the template version it was
//! built from. When the template's version differs today the environment
//! is stale and this host rebuilds it itself (reason `template_changed`):
//! checked when a session asks for the environment (so an environment in
//! use is rebuilt as soon as the change can matter, without waiting for a
//! sweep), and by a sweep of all environments at daemon start and every
//! [`SWEEP_EVERY`] (so one nobody is using is fresh before the next
//! session, and a template rebuilt while nobody asks is noticed). Sessions
//! keep starting from the current version until the new one is ready.
//!
//! Snapshot retention: a version's snapshot is kept 90 days (the core's
//! most), so the same checks rebuild a version older than
//! [`REFRESH_AFTER`] (reason `snapshot_expiring`) before its snapshot is
//! deleted under the environment.

use super::build;
use super::models::*;
use super::progress::{BuildEvent, Progress};
use super::store::{EnvRecord, EnvStore, NewVersion};
use super::EnvError;
use crate::config::SessionsConfig;
use crate::sandbox::Sandboxes;
use crate::validate;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// How often every environment's template is compared with the one its
/// current version was built from (a `GET /v1/templates/{name}` per
/// distinct template).
pub const SWEEP_EVERY: Duration = Duration::from_secs(60);
/// The first sweep after daemon start waits this long, for the daemon's
/// own API (what the template versions are read from) to be up.
pub const FIRST_SWEEP_AFTER: Duration = Duration::from_secs(5);
/// The most a session's create waits for the template's version before
/// it goes on without the staleness check (the sweep catches it later).
const PIN_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

pub struct Environments {
    store: EnvStore,
    sandboxes: Arc<dyn Sandboxes>,
    cfg: SessionsConfig,
    /// Builds running on this host, by environment, with why they run.
    builds: Mutex<HashMap<String, (Arc<Progress>, BuildReason)>>,
    /// By environment: the template version a `template_changed` rebuild
    /// was last started for. It is not started again for that version, so
    /// a set-up that fails on the new template is retried only when the
    /// template changes again, on a requested build, or at a restart
    /// (never a rebuild every sweep).
    auto_tried: Mutex<HashMap<String, String>>,
}

/// The current version was built from another template version than
/// `now`. A version that did not record one, or a template whose
/// version cannot be read, is not stale: unknown is never a reason to
/// rebuild.
fn is_stale(r: &EnvRecord, now: Option<&str>) -> bool {
    match (r.current().and_then(|c| c.template_version.as_deref()), now) {
        (Some(built), Some(now)) => built != now,
        _ => false,
    }
}

/// A current version older than this is rebuilt (reason
/// `snapshot_expiring`): its snapshot was taken with the core's longest
/// retention ([`build::SNAPSHOT_RETENTION_S`], 90 days) and would be
/// deleted under the environment; a week ahead, so a rebuild that fails
/// has time to be seen and retried.
pub const REFRESH_AFTER: Duration =
    Duration::from_secs(build::SNAPSHOT_RETENTION_S - 7 * 24 * 3600);

/// The current version was built [`REFRESH_AFTER`] or longer before `at`.
/// A `built_at` that does not parse is not expiring (unknown is never a
/// reason to rebuild).
fn is_expiring(r: &EnvRecord, at: time::OffsetDateTime) -> bool {
    let rfc = time::format_description::well_known::Rfc3339;
    r.current()
        .and_then(|c| time::OffsetDateTime::parse(&c.built_at, &rfc).ok())
        .is_some_and(|built| at - built >= REFRESH_AFTER)
}

fn view(
    r: EnvRecord,
    building: Option<BuildReason>,
    template_version: Option<String>,
) -> EnvironmentView {
    EnvironmentView {
        stale: is_stale(&r, template_version.as_deref()),
        current: r.current().cloned(),
        environment_id: r.id,
        name: r.name,
        spec: r.spec,
        created_at: r.created_at,
        tenant: r.tenant,
        versions: r.versions,
        template_version,
        building: building.is_some(),
        building_reason: building,
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
            auto_tried: Mutex::new(HashMap::new()),
        })
    }

    fn building(&self, id: &str) -> Option<BuildReason> {
        self.builds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .map(|(_, r)| *r)
    }

    /// The template's version now, `None` when it cannot be read (logged:
    /// a read view and a sweep go on without it).
    async fn template_version(&self, template: &str) -> Option<String> {
        match self.sandboxes.template_version(template).await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(template = %template, error = %e, "reading a template's version failed");
                None
            }
        }
    }

    /// Checks everything first; the row is written only when all of it
    /// holds, so a refused create leaves nothing. `tenant`: the caller's
    /// (`None`: the operator), recorded as the environment's.
    pub async fn create(
        &self,
        b: CreateEnvironment,
        tenant: Option<&str>,
    ) -> Result<EnvironmentView, EnvError> {
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
        let pool_size = b.pool_size.unwrap_or(DEFAULT_POOL_SIZE);
        if pool_size > MAX_POOL_SIZE {
            return Err(EnvError::Invalid(format!(
                "pool_size must be 0..{MAX_POOL_SIZE}"
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
            pool_size,
        };
        let id = crate::ids::new_id("env");
        self.store.insert(&id, &name, &spec, tenant).await?;
        self.get(&id, tenant).await
    }

    /// Environment `id` as caller `tenant` may see it: a tenant (`Some`)
    /// reaches only its own; another's answers 404 exactly as a missing
    /// one, so a tenant cannot learn what others have. `None`: the
    /// operator, who reaches all.
    async fn record(&self, id: &str, tenant: Option<&str>) -> Result<EnvRecord, EnvError> {
        if !crate::ids::valid("env", id) {
            return Err(EnvError::NotFound(id.into()));
        }
        self.store
            .get(id)
            .await?
            .filter(|r| tenant.is_none() || r.tenant.as_deref() == tenant)
            .ok_or_else(|| EnvError::NotFound(id.into()))
    }

    pub async fn get(&self, id: &str, tenant: Option<&str>) -> Result<EnvironmentView, EnvError> {
        // Read before the record: a build records its outcome and only then
        // stops counting as running, so "not building" read first means the
        // record read after has that outcome (the other order could show a
        // finished build with neither its version nor its error).
        let b = self.building(id);
        let r = self.record(id, tenant).await?;
        let tv = self.template_version(&r.spec.template).await;
        Ok(view(r, b, tv))
    }

    /// The template versions of `all`'s templates, each read once.
    async fn template_versions(&self, all: &[EnvRecord]) -> HashMap<String, Option<String>> {
        let mut out = HashMap::new();
        for r in all {
            if !out.contains_key(&r.spec.template) {
                let v = self.template_version(&r.spec.template).await;
                out.insert(r.spec.template.clone(), v);
            }
        }
        out
    }

    /// Every environment for the operator (`tenant` `None`), a tenant's
    /// own for a tenant.
    pub async fn list(&self, tenant: Option<&str>) -> Result<EnvironmentList, EnvError> {
        let mut all = self.store.list().await?;
        if tenant.is_some() {
            all.retain(|r| r.tenant.as_deref() == tenant);
        }
        let tvs = self.template_versions(&all).await;
        Ok(EnvironmentList {
            environments: all
                .into_iter()
                .map(|r| {
                    let b = self.building(&r.id);
                    let tv = tvs.get(&r.spec.template).cloned().flatten();
                    view(r, b, tv)
                })
                .collect(),
        })
    }

    /// Refused (409) while a build runs or an unfinished session uses it;
    /// else the rows go, then every version's snapshot.
    pub async fn delete(&self, id: &str, tenant: Option<&str>) -> Result<(), EnvError> {
        self.record(id, tenant).await?;
        if self.building(id).is_some() {
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
    pub async fn start_build(
        self: &Arc<Self>,
        id: &str,
        tenant: Option<&str>,
    ) -> Result<Arc<Progress>, EnvError> {
        let rec = self.record(id, tenant).await?;
        self.start(rec, BuildReason::Requested)
    }

    fn start(
        self: &Arc<Self>,
        rec: EnvRecord,
        reason: BuildReason,
    ) -> Result<Arc<Progress>, EnvError> {
        let id = rec.id.as_str();
        let p = {
            let mut b = self.builds.lock().unwrap_or_else(|p| p.into_inner());
            if b.contains_key(id) {
                return Err(EnvError::Conflict(format!(
                    "a build of environment {id} is running"
                )));
            }
            let p = Arc::new(Progress::default());
            b.insert(id.to_string(), (p.clone(), reason));
            p
        };
        let me = self.clone();
        let progress = p.clone();
        tokio::spawn(async move {
            let end = me.build(&rec, &progress, reason).await;
            me.builds
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&rec.id);
            progress.send(end);
        });
        Ok(p)
    }

    /// One build to its last event.
    async fn build(&self, rec: &EnvRecord, p: &Progress, reason: BuildReason) -> BuildEvent {
        let t0 = std::time::Instant::now();
        // Read before the sandbox is made: a template rebuilt in between
        // makes the version look older than it is, so it is rebuilt once
        // more (never the other way round, a stale version looking fresh).
        let template_version = match self.sandboxes.template_version(&rec.spec.template).await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(environment = %rec.id, error = %e, "reading the template's version for a build failed");
                None
            }
        };
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
                NewVersion {
                    snapshot_id: &built.snapshot_id,
                    base_commit: &built.base_commit,
                    template: &rec.spec.template,
                    template_version: template_version.as_deref(),
                    reason,
                    build_ms: ms,
                },
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
        // The new version is what sessions start from now: its forks are
        // kept warm, the superseded one's go (its snapshot may stay, for
        // sessions still pinned to it).
        super::pool::warm(&self.sandboxes, &v.snapshot_id, rec.spec.pool_size);
        if let Some(old) = rec.current().filter(|c| c.snapshot_id != v.snapshot_id) {
            super::pool::warm(&self.sandboxes, &old.snapshot_id, 0);
        }
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
        tracing::info!(environment = %rec.id, version = v.version, commit = %v.base_commit, reason = reason.as_str(), build_ms = ms, "environment built");
        BuildEvent::Done {
            environment_id: rec.id.clone(),
            version: v.version,
            base_commit: v.base_commit,
            snapshot_id: v.snapshot_id,
        }
    }

    /// What a new session on environment `id` pins: its current version,
    /// with the repository and template it was built from. A stale
    /// environment is pinned all the same (the new version is not ready)
    /// and its rebuild is started if none runs. A session of `tenant`
    /// pins only its tenant's environments (another's is 404, and starts
    /// no rebuild).
    pub async fn pin(
        self: &Arc<Self>,
        id: &str,
        tenant: Option<&str>,
    ) -> Result<(EnvSpec, EnvPin), EnvError> {
        let r = self.record(id, tenant).await?;
        let v = r.current().ok_or_else(|| EnvError::NotBuilt(id.into()))?;
        let pin = EnvPin {
            environment_id: r.id.clone(),
            version: v.version,
            snapshot_id: v.snapshot_id.clone(),
            base_commit: v.base_commit.clone(),
        };
        let spec = r.spec.clone();
        // A session starts from it: hot. Asked again each time, so a pool
        // gone cold or lost with a daemon restart is warmed again.
        if spec.pool_size > 0 {
            super::pool::warm(&self.sandboxes, &pin.snapshot_id, spec.pool_size);
        }
        match tokio::time::timeout(PIN_CHECK_TIMEOUT, self.template_version(&spec.template)).await {
            Ok(tv) => {
                self.rebuild_if_due(r, tv.as_deref(), time::OffsetDateTime::now_utc());
            }
            Err(_) => {
                tracing::warn!(environment = %id, "the template's version did not come in time; the sweep checks it")
            }
        }
        Ok((spec, pin))
    }

    /// Starts a rebuild when one is due: `template_changed` when `r` is
    /// stale against the template's version `now`, else
    /// `snapshot_expiring` when its current version is older than
    /// [`REFRESH_AFTER`] at `at`; unless a build of it runs here or one was
    /// started for the same cause already (that template version, that
    /// environment version). True when started.
    fn rebuild_if_due(
        self: &Arc<Self>,
        r: EnvRecord,
        now: Option<&str>,
        at: time::OffsetDateTime,
    ) -> bool {
        let (reason, cause) = match now.filter(|_| is_stale(&r, now)) {
            Some(now) => (BuildReason::TemplateChanged, now.to_string()),
            None if is_expiring(&r, at) => (
                BuildReason::SnapshotExpiring,
                format!("expiring v{}", r.current_version.unwrap_or(0)),
            ),
            None => return false,
        };
        if self.building(&r.id).is_some() {
            return false;
        }
        {
            let mut tried = self.auto_tried.lock().unwrap_or_else(|p| p.into_inner());
            if tried.get(&r.id).is_some_and(|t| *t == cause) {
                return false;
            }
            tried.insert(r.id.clone(), cause.clone());
        }
        let id = r.id.clone();
        let built = r
            .current()
            .and_then(|c| c.template_version.clone())
            .unwrap_or_default();
        match self.start(r, reason) {
            Ok(_) => {
                tracing::info!(environment = %id, built_from = %built, cause = %cause, reason = reason.as_str(), "rebuilding the environment");
                true
            }
            // A requested build started in between: it builds from the
            // new template version, with a new snapshot, anyway.
            Err(_) => false,
        }
    }

    /// Compares every built environment with its template's version now,
    /// and its current version's age with [`REFRESH_AFTER`], and starts the
    /// rebuilds due; returns the environments rebuilt.
    pub async fn sweep(self: &Arc<Self>) -> Result<Vec<String>, EnvError> {
        self.sweep_at(time::OffsetDateTime::now_utc()).await
    }

    /// [`Self::sweep`] as if it were `at` (the tests' clock).
    pub(crate) async fn sweep_at(
        self: &Arc<Self>,
        at: time::OffsetDateTime,
    ) -> Result<Vec<String>, EnvError> {
        let all = self.store.list().await?;
        let tvs = self.template_versions(&all).await;
        let mut started = Vec::new();
        for r in all {
            let id = r.id.clone();
            let now = tvs.get(&r.spec.template).cloned().flatten();
            if self.rebuild_if_due(r, now.as_deref(), at) {
                started.push(id);
            }
        }
        Ok(started)
    }

    /// Sweeps at daemon start (after [`FIRST_SWEEP_AFTER`]) and every
    /// `every` after, until the service is dropped.
    pub fn spawn_sweeps(self: &Arc<Self>, every: Duration) {
        let me: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick =
                tokio::time::interval_at(tokio::time::Instant::now() + FIRST_SWEEP_AFTER, every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(me) = me.upgrade() else { return };
                if let Err(e) = me.sweep().await {
                    tracing::warn!(error = %e.full_message(), "sweeping environments for template changes failed");
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(built_from: Option<&str>) -> EnvRecord {
        EnvRecord {
            id: "env_a".into(),
            name: "a".into(),
            spec: crate::environments::store::tests::spec(),
            created_at: String::new(),
            tenant: None,
            current_version: Some(1),
            last_error: None,
            versions: vec![EnvVersion {
                version: 1,
                snapshot_id: "s".into(),
                base_commit: "c".into(),
                template: "code-interpreter".into(),
                template_version: built_from.map(str::to_string),
                reason: BuildReason::Requested,
                built_at: String::new(),
                build_ms: 1,
            }],
        }
    }

    #[test]
    fn only_a_known_difference_is_stale() {
        assert!(is_stale(&rec(Some("1")), Some("2")));
        assert!(!is_stale(&rec(Some("2")), Some("2")));
        // Built before versions were recorded, or the template's version
        // unreadable (deleted template, daemon not answering): unknown.
        assert!(!is_stale(&rec(None), Some("2")));
        assert!(!is_stale(&rec(Some("1")), None));
        let mut never = rec(Some("1"));
        never.current_version = None;
        assert!(!is_stale(&never, Some("2")));
    }
}
