//! Builds and environment sessions against the in-memory sandboxes
//! ([`crate::sandbox::fake`]), real SQLite and a local git repository:
//! what the build asks of the sandboxes (the set-up's policy, then
//! deny-all, then the snapshot; the building sandbox deleted), what a
//! failed set-up leaves (nothing), and how a session starts from a
//! version (a fork of its snapshot, the delta files, the version pinned).

use crate::config::SessionsConfig;
use crate::environments::models::*;
use crate::environments::progress::{BuildEvent, Progress};
use crate::environments::store::EnvStore;
use crate::environments::{EnvError, Environments};
use crate::models::CreateSessionBody;
use crate::policy::BuiltinPolicies;
use crate::sandbox::fake::FakeSandboxes;
use crate::sandbox::ExecOutcome;
use crate::scheduler::LocalScheduler;
use crate::service::Sessions;
use crate::state::SessionState as S;
use crate::store::{SessionStore, SqliteStore};
use std::sync::Arc;
use std::time::Duration;

struct Env {
    sessions: Arc<Sessions>,
    envs: Arc<Environments>,
    fake: FakeSandboxes,
    src: std::path::PathBuf,
    repo: String,
    _dir: tempfile::TempDir,
}

fn git(dir: &std::path::Path, args: &[&str]) {
    let ok = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@t"])
        .args(args)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .status()
        .unwrap()
        .success();
    assert!(ok, "git {args:?}");
}

async fn env() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("repo");
    std::fs::create_dir(&src).unwrap();
    git(&src, &["init", "-q", "-b", "main"]);
    std::fs::write(src.join("README"), "hello").unwrap();
    git(&src, &["add", "."]);
    git(&src, &["commit", "-q", "-m", "one"]);
    let cfg = SessionsConfig {
        file_repo_roots: vec![dir.path().to_path_buf()],
        fetch_root: dir.path().join("fetch"),
        ..SessionsConfig::default()
    };
    let path = dir.path().join("hatchery.db");
    let store: Arc<dyn SessionStore> = Arc::new(SqliteStore::open(&path).unwrap());
    let envs_store = EnvStore::open(hatchery_db::Db::sqlite(&path).await.unwrap())
        .await
        .unwrap();
    let fake = FakeSandboxes::new();
    fake.add_template("code-interpreter");
    let sessions = Sessions::new(
        store,
        cfg.clone(),
        Arc::new(BuiltinPolicies),
        Arc::new(fake.clone()),
        Arc::new(LocalScheduler::new(4)),
    );
    let envs = Environments::new(envs_store, Arc::new(fake.clone()), cfg);
    sessions.set_environments(envs.clone());
    Env {
        sessions,
        envs,
        fake,
        repo: format!("file://{}", src.display()),
        src,
        _dir: dir,
    }
}

fn create_body(repo: &str, setup: &str) -> CreateEnvironment {
    serde_json::from_value(serde_json::json!({
        "name": "e", "repo": repo, "setup": setup,
        "setup_allow": [{"cidr": "10.1.2.3", "ports": [443]}]
    }))
    .unwrap()
}

/// Runs a build to its last event.
async fn build(e: &Env, id: &str) -> Vec<BuildEvent> {
    let p: Arc<Progress> = e.envs.start_build(id, None).await.unwrap();
    for _ in 0..5000 {
        let (h, _) = p.subscribe();
        if h.last().is_some_and(BuildEvent::is_last) {
            return h;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("the build did not end");
}

/// Waits for the environment's running build (if any) to end; its view then.
async fn settled(e: &Env, id: &str) -> EnvironmentView {
    for _ in 0..5000 {
        let v = e.envs.get(id, None).await.unwrap();
        if !v.building {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("the build did not end");
}

/// Every later `make` (the tests' set-up) exits `code` with `stderr`.
fn make_exits(e: &Env, code: i32, stderr: &'static str) {
    e.fake.on_exec(
        |argv| argv.get(2).is_some_and(|c| c == "make"),
        move |_, _| ExecOutcome {
            exit_code: code,
            stdout: String::new(),
            stderr: stderr.into(),
        },
    );
}

#[tokio::test]
async fn a_build_closes_the_setup_egress_and_sessions_fork_it_with_the_delta() {
    let e = env().await;
    let v = e
        .envs
        .create(create_body(&e.repo, "pip install -r req.txt"), None)
        .await
        .unwrap();
    let id = v.environment_id;
    let h = build(&e, &id).await;
    let BuildEvent::Done {
        version,
        snapshot_id,
        base_commit,
        ..
    } = h.last().unwrap().clone()
    else {
        panic!("{h:?}")
    };
    assert_eq!(version, 1);
    // The building sandbox: made with the set-up's holes, closed before
    // the snapshot, then deleted.
    let b = &e.fake.all()[0];
    assert_eq!(b.metadata["hatchery_environment"], id);
    assert_eq!(b.network, Some(serde_json::json!({"egress": "deny"})));
    assert!(!b.alive);
    let snap = e.fake.snapshot_of(&snapshot_id).unwrap();
    assert_eq!(snap.source, b.id);
    assert_eq!(snap.files["/opt/hatchery/env-tracked"], b"README\0");
    assert_eq!(
        snap.metadata["hatchery_environment_commit"],
        base_commit.clone()
    );

    // main moves on: one file changed, one added.
    std::fs::write(e.src.join("README"), "hello again").unwrap();
    std::fs::write(e.src.join("NEW"), "new").unwrap();
    git(&e.src, &["add", "."]);
    git(&e.src, &["commit", "-q", "-m", "two"]);
    let body: CreateSessionBody = serde_json::from_value(serde_json::json!({
        "environment_id": id, "task": "fix"
    }))
    .unwrap();
    let sid = e.sessions.create(body, None).await.unwrap().0.session_id;
    let mut s = e.sessions.core.store.get(&sid).await.unwrap();
    for _ in 0..5000 {
        if s.state == S::Running {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
        s = e.sessions.core.store.get(&sid).await.unwrap();
    }
    assert_eq!(s.state, S::Running, "{:?}", s.reason);
    let pin = s.spec.environment.clone().unwrap();
    assert_eq!((pin.version, &pin.base_commit), (1, &base_commit));
    assert_eq!(s.spec.repo, e.repo);
    let sb = e.fake.sandbox(s.sandbox_id.as_deref().unwrap()).unwrap();
    assert_eq!(sb.forked_from.as_deref(), Some(snapshot_id.as_str()));
    // A fork starts deny-all; the set-up's policy never reaches it.
    assert_eq!(sb.network, None);
    assert_eq!(sb.files["/opt/hatchery/delta-paths"], b"NEW\0README\0");
    // Applied in the warm interpreter: no script file, no process.
    assert!(!sb.files.contains_key("/opt/hatchery/env_delta.py"));
    assert!(
        sb.files.contains_key("/opt/hatchery/env-tracked"),
        "from the snapshot"
    );

    // In use: not deleted.
    assert!(matches!(
        e.envs.delete(&id, None).await,
        Err(EnvError::Conflict(_))
    ));
}

#[tokio::test]
async fn a_failed_setup_leaves_no_version_and_says_why() {
    let e = env().await;
    e.fake.on_exec(
        |argv| argv.get(2).is_some_and(|c| c.contains("exit 3")),
        |_, _| ExecOutcome {
            exit_code: 3,
            stdout: String::new(),
            stderr: "no such package\n".into(),
        },
    );
    let id = e
        .envs
        .create(create_body(&e.repo, "exit 3"), None)
        .await
        .unwrap()
        .environment_id;
    let h = build(&e, &id).await;
    match h.last().unwrap() {
        BuildEvent::Error { code, message } => {
            assert_eq!(*code, "setup_failed");
            assert!(message.contains("exited with 3") && message.contains("no such package"));
        }
        other => panic!("{other:?}"),
    }
    let v = e.envs.get(&id, None).await.unwrap();
    assert!(v.current.is_none() && v.versions.is_empty());
    assert!(v.last_error.unwrap().contains("no such package"));
    assert!(e.fake.live().is_empty(), "the building sandbox is gone");
    assert_eq!(
        e.fake.calls(crate::sandbox::fake::Op::Snapshot),
        0,
        "no snapshot of a failed set-up"
    );
    let body: CreateSessionBody = serde_json::from_value(serde_json::json!({
        "environment_id": id, "task": "fix"
    }))
    .unwrap();
    assert!(matches!(
        e.sessions.create(body, None).await,
        Err(crate::error::SessionError::Environment(EnvError::NotBuilt(
            _
        )))
    ));
    e.envs.delete(&id, None).await.unwrap();
}

#[tokio::test]
async fn bad_input_is_refused_before_anything_is_written() {
    let e = env().await;
    let ok = serde_json::json!({"name": "x", "repo": e.repo});
    let bad = [
        serde_json::json!({"name": ""}),
        serde_json::json!({"name": "n".repeat(MAX_NAME_BYTES + 1)}),
        serde_json::json!({"repo": "ssh://h/r.git"}),
        serde_json::json!({"ref": "-x"}),
        serde_json::json!({"setup": "x".repeat(MAX_SETUP_BYTES + 1)}),
        serde_json::json!({"setup_allow": vec![serde_json::json!({"cidr": "10.0.0.1"}); MAX_SETUP_ALLOW + 1]}),
        serde_json::json!({"setup_allow": ["10.0.0.1"]}),
        serde_json::json!({"setup_timeout_s": 0}),
        serde_json::json!({"setup_timeout_s": MAX_SETUP_TIMEOUT_S + 1}),
        serde_json::json!({"template": "nope"}),
    ];
    for patch in bad {
        let mut b = ok.clone();
        for (k, v) in patch.as_object().unwrap() {
            b[k] = v.clone();
        }
        let body: CreateEnvironment = serde_json::from_value(b.clone()).unwrap();
        assert!(e.envs.create(body, None).await.is_err(), "{b}");
    }
    assert!(e.envs.list(None).await.unwrap().environments.is_empty());
    let mut edge = ok.clone();
    edge["name"] = "n".repeat(MAX_NAME_BYTES).into();
    edge["setup"] = "x".repeat(MAX_SETUP_BYTES).into();
    edge["setup_allow"] = vec![serde_json::json!({"cidr": "10.0.0.1"}); MAX_SETUP_ALLOW].into();
    edge["setup_timeout_s"] = MAX_SETUP_TIMEOUT_S.into();
    let body: CreateEnvironment = serde_json::from_value(edge).unwrap();
    e.envs.create(body, None).await.unwrap();
}

/// A session on environment `id`, waited for until it runs.
async fn running_session(e: &Env, id: &str) -> crate::store::Session {
    let body: CreateSessionBody = serde_json::from_value(serde_json::json!({
        "environment_id": id, "task": "fix"
    }))
    .unwrap();
    let sid = e.sessions.create(body, None).await.unwrap().0.session_id;
    for _ in 0..5000 {
        let s = e.sessions.core.store.get(&sid).await.unwrap();
        if s.state == S::Running {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("session {sid} did not start");
}

async fn until(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..5000 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("{what}");
}

#[tokio::test]
async fn a_changed_template_rebuilds_while_sessions_keep_the_old_version() {
    use crate::sandbox::fake::{Effect, Fault, Op};
    let e = env().await;
    let id = e
        .envs
        .create(create_body(&e.repo, "true"), None)
        .await
        .unwrap()
        .environment_id;
    build(&e, &id).await;
    let v = e.envs.get(&id, None).await.unwrap();
    let cur = v.current.clone().unwrap();
    assert_eq!(
        (cur.template_version.as_deref(), cur.reason),
        (Some("1"), BuildReason::Requested)
    );
    assert_eq!(v.template_version.as_deref(), Some("1"));
    assert!(!v.stale && !v.building && v.building_reason.is_none());
    // Nothing changed: a sweep starts nothing.
    assert!(e.envs.sweep().await.unwrap().is_empty());

    // The template is rebuilt; the next build will hang at its snapshot.
    e.fake.set_template_version("code-interpreter", "2");
    e.fake
        .inject(Fault::on(Op::Snapshot, Effect::Hang).times(1));
    let v = e.envs.get(&id, None).await.unwrap();
    assert!(v.stale && !v.building, "{v:?}");
    assert_eq!(v.template_version.as_deref(), Some("2"));

    // A session asks for it: it gets version 1 at once, and the rebuild
    // starts (reason template_changed).
    let s1 = running_session(&e, &id).await;
    assert_eq!(s1.spec.environment.as_ref().unwrap().version, 1);
    let v = e.envs.get(&id, None).await.unwrap();
    assert!(v.stale && v.building, "{v:?}");
    assert_eq!(v.building_reason, Some(BuildReason::TemplateChanged));
    until("the rebuild did not reach its snapshot", || {
        e.fake.hung() == 1
    })
    .await;
    // Sessions keep starting from version 1 while it builds; neither they
    // nor a sweep start a second build.
    let s2 = running_session(&e, &id).await;
    assert_eq!(s2.spec.environment.as_ref().unwrap().version, 1);
    assert!(e.envs.sweep().await.unwrap().is_empty());
    assert!(matches!(
        e.envs.start_build(&id, None).await,
        Err(EnvError::Conflict(_))
    ));

    e.fake.release();
    let v = settled(&e, &id).await;
    let cur = v.current.clone().unwrap();
    assert_eq!(cur.version, 2);
    assert_eq!(cur.reason, BuildReason::TemplateChanged);
    assert_eq!(cur.template_version.as_deref(), Some("2"));
    assert!(!v.stale && !v.building, "{v:?}");
    assert_eq!(
        v.versions.iter().map(|x| x.version).collect::<Vec<_>>(),
        [2, 1],
        "version 1 is kept"
    );
    // New sessions start from version 2; the ones on version 1 keep it
    // and their snapshot.
    let s3 = running_session(&e, &id).await;
    let pin = s3.spec.environment.clone().unwrap();
    assert_eq!(pin.version, 2);
    let sb = e.fake.sandbox(s3.sandbox_id.as_deref().unwrap()).unwrap();
    assert_eq!(sb.forked_from.as_deref(), Some(cur.snapshot_id.as_str()));
    for s in [&s1, &s2] {
        let now = e.sessions.core.store.get(&s.id).await.unwrap();
        assert_eq!(now.state, S::Running, "{:?}", now.reason);
        let pin = now.spec.environment.unwrap();
        assert_eq!(pin.version, 1);
        assert!(e.fake.snapshot_of(&pin.snapshot_id).is_some());
    }
}

#[tokio::test]
async fn a_failed_template_rebuild_is_not_retried_for_the_same_template_version() {
    let e = env().await;
    let id = e
        .envs
        .create(create_body(&e.repo, "make"), None)
        .await
        .unwrap()
        .environment_id;
    build(&e, &id).await;
    // On the new template the set-up fails.
    make_exits(&e, 2, "no make on v2\n");
    e.fake.set_template_version("code-interpreter", "2");
    // The sweep (what runs at daemon start and every minute) finds it.
    assert_eq!(e.envs.sweep().await.unwrap(), vec![id.clone()]);
    let v = settled(&e, &id).await;
    // No version made; version 1 stays current and sessions get it.
    assert_eq!(v.current.as_ref().unwrap().version, 1);
    assert!(v.stale && v.last_error.as_deref().unwrap().contains("no make on v2"));
    assert_eq!(
        running_session(&e, &id)
            .await
            .spec
            .environment
            .unwrap()
            .version,
        1
    );
    // Not retried for template version 2 (a session's ask did not start
    // one either), only when the template changes again.
    assert!(e.envs.sweep().await.unwrap().is_empty());
    assert!(!e.envs.get(&id, None).await.unwrap().building);
    e.fake.set_template_version("code-interpreter", "3");
    assert_eq!(e.envs.sweep().await.unwrap(), vec![id.clone()]);
}

#[tokio::test]
async fn an_environment_never_built_is_not_rebuilt_for_its_template() {
    let e = env().await;
    let id = e
        .envs
        .create(create_body(&e.repo, ""), None)
        .await
        .unwrap()
        .environment_id;
    e.fake.set_template_version("code-interpreter", "2");
    assert!(e.envs.sweep().await.unwrap().is_empty());
    let v = e.envs.get(&id, None).await.unwrap();
    assert!(!v.stale && !v.building && v.current.is_none());
}

/// Issue 36: an environment records the tenant whose key made it; a
/// tenant reaches (lists, reads, builds, deletes, starts sessions from)
/// only its own, another's (the operator's included) answering exactly as
/// a missing one; the operator reaches all.
#[tokio::test]
async fn a_tenant_reaches_only_its_own_environments() {
    let e = env().await;
    let mk = |t: Option<&'static str>| e.envs.create(create_body(&e.repo, "true"), t);
    let a = mk(Some("ten_a")).await.unwrap();
    let b = mk(Some("ten_b")).await.unwrap();
    let op = mk(None).await.unwrap();
    assert_eq!(a.tenant.as_deref(), Some("ten_a"));
    assert_eq!(op.tenant, None);
    // Built, so that only the tenant check can refuse a session.
    for id in [&b.environment_id, &op.environment_id] {
        assert!(matches!(
            build(&e, id).await.last(),
            Some(BuildEvent::Done { .. })
        ));
    }
    let ids = |l: EnvironmentList| {
        let mut v: Vec<String> = l
            .environments
            .into_iter()
            .map(|x| x.environment_id)
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        ids(e.envs.list(Some("ten_a")).await.unwrap()),
        vec![a.environment_id.clone()]
    );
    let mut all = vec![
        a.environment_id.clone(),
        b.environment_id.clone(),
        op.environment_id.clone(),
    ];
    all.sort();
    assert_eq!(ids(e.envs.list(None).await.unwrap()), all);
    let limits = crate::store::TenantLimits::default();
    let nf = |r: Result<(), EnvError>, what: &str| {
        assert!(matches!(r, Err(EnvError::NotFound(_))), "{what}: {r:?}");
    };
    for other in [&b.environment_id, &op.environment_id] {
        let t = Some("ten_a");
        nf(e.envs.get(other, t).await.map(drop), "get");
        nf(e.envs.start_build(other, t).await.map(drop), "build");
        nf(e.envs.pin(other, t).await.map(drop), "pin");
        nf(e.envs.delete(other, t).await, "delete");
        let body: CreateSessionBody = serde_json::from_value(serde_json::json!({
            "environment_id": other, "task": "fix"
        }))
        .unwrap();
        let r = e.sessions.create(body, Some(("ten_a", &limits))).await;
        assert!(
            matches!(
                r,
                Err(crate::error::SessionError::Environment(EnvError::NotFound(
                    _
                )))
            ),
            "session from another's environment: {r:?}"
        );
        // Untouched, and the operator reaches it.
        assert_eq!(e.envs.get(other, None).await.unwrap().versions.len(), 1);
    }
    // The tenant's own, and the operator on a tenant's.
    e.envs.get(&a.environment_id, Some("ten_a")).await.unwrap();
    e.envs.get(&b.environment_id, None).await.unwrap();
    e.envs
        .delete(&b.environment_id, Some("ten_b"))
        .await
        .unwrap();
    e.envs.delete(&a.environment_id, None).await.unwrap();
    assert_eq!(
        ids(e.envs.list(None).await.unwrap()),
        vec![op.environment_id.clone()]
    );
}

fn done_snapshot(h: &[BuildEvent]) -> String {
    match h.last() {
        Some(BuildEvent::Done { snapshot_id, .. }) => snapshot_id.clone(),
        other => panic!("{other:?}"),
    }
}

/// The events' `sandbox_ready` boot mode of session `s`.
async fn ready_mode(e: &Env, s: &crate::store::Session) -> String {
    let evs = e.sessions.core.store.events(&s.id, 0, 1000).await.unwrap();
    evs.iter()
        .find_map(|ev| match &ev.kind {
            crate::events::EventKind::SandboxReady { boot_mode, .. } => boot_mode.clone(),
            _ => None,
        })
        .unwrap()
}

#[tokio::test]
async fn the_current_version_is_kept_warm_and_a_rebuild_drops_the_old_pool() {
    // A build makes its version's pool (the environment's size); a session
    // is served from it (the daemon says `pool`, the event says so); a
    // rebuild warms the new version and drops the superseded one's.
    let e = env().await;
    let id = e
        .envs
        .create(create_body(&e.repo, ""), None)
        .await
        .unwrap()
        .environment_id;
    let v1 = done_snapshot(&build(&e, &id).await);
    until("the pool of v1", || e.fake.snapshot_pool(&v1) == Some(2)).await;
    let s = running_session(&e, &id).await;
    assert_eq!(
        ready_mode(&e, &s).await,
        format!("environment {id} v1 pool")
    );

    let v2 = done_snapshot(&build(&e, &id).await);
    until("the pool of v2", || e.fake.snapshot_pool(&v2) == Some(2)).await;
    until("v1's dropped", || e.fake.snapshot_pool(&v1) == Some(0)).await;
}

#[tokio::test]
async fn an_environment_with_pool_size_0_is_never_pooled() {
    let e = env().await;
    let mut body = create_body(&e.repo, "");
    body.pool_size = Some(0);
    let id = e.envs.create(body, None).await.unwrap().environment_id;
    let v1 = done_snapshot(&build(&e, &id).await);
    let s = running_session(&e, &id).await;
    assert_eq!(
        ready_mode(&e, &s).await,
        format!("environment {id} v1 fork")
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(e.fake.snapshot_pool(&v1).unwrap_or(0), 0, "never warmed");
    let mut big = create_body(&e.repo, "");
    big.pool_size = Some(9);
    assert!(matches!(
        e.envs.create(big, None).await,
        Err(EnvError::Invalid(_))
    ));
}

#[tokio::test]
async fn a_version_near_its_snapshots_retention_is_rebuilt_once() {
    use crate::environments::service::REFRESH_AFTER;
    let e = env().await;
    let id = e
        .envs
        .create(create_body(&e.repo, "make"), None)
        .await
        .unwrap()
        .environment_id;
    build(&e, &id).await;
    let v1 = e.envs.get(&id, None).await.unwrap().current.unwrap();
    let now = time::OffsetDateTime::now_utc();
    // Young: nothing to do.
    let young = now + (REFRESH_AFTER - Duration::from_secs(3600));
    assert!(e.envs.sweep_at(young).await.unwrap().is_empty());
    // Within a week of its snapshot's retention: rebuilt. The set-up
    // fails this time: version 1 stays, and is not retried every sweep.
    make_exits(&e, 2, "index down\n");
    let old = now + REFRESH_AFTER + Duration::from_secs(60);
    assert_eq!(e.envs.sweep_at(old).await.unwrap(), vec![id.clone()]);
    let v = e.envs.get(&id, None).await.unwrap();
    assert_eq!(v.building_reason, Some(BuildReason::SnapshotExpiring));
    let v = settled(&e, &id).await;
    assert_eq!(v.current.as_ref().unwrap().version, 1);
    assert!(
        v.last_error.as_deref().unwrap().contains("index down"),
        "{v:?}"
    );
    assert!(e.envs.sweep_at(old).await.unwrap().is_empty());
    // A requested build is the retry; then the new version is young.
    make_exits(&e, 0, "");
    build(&e, &id).await;
    let v2 = e.envs.get(&id, None).await.unwrap().current.unwrap();
    assert_eq!((v2.version, v2.reason), (2, BuildReason::Requested));
    assert_ne!(
        v2.snapshot_id, v1.snapshot_id,
        "a new snapshot, new retention"
    );
    assert!(e.envs.sweep_at(young).await.unwrap().is_empty());
}
