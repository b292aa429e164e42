//! The manager's lifecycle logic against the in-memory runtime
//! (`hatchery_runtime::fake`) and the real SQLite store in a temporary
//! directory: no root, no runsc. What each test proves is in its name and
//! its first comment.

use crate::lease::take_host_lease;
use crate::metrics::Metrics;
use crate::store::{SandboxRow, SandboxState, Store};
use crate::{
    now_ms, Caps, CoreError, CreateRequest, ForkRequest, ImageConfig, Manager, PoolConfig,
};
use hatchery_runtime::fake::{checkpoint_file, ExecReply, FakeRuntime, Fault, Op, Schedule};
use hatchery_runtime::{Runtime, SandboxSpec};
use hatchery_store::DbStore;
use hatchery_templates::{ImageStore, Template, TemplateSpec, Templates};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

const HOST: &str = "host-a";
const TPL: &str = "py";
/// The template's setup command, recognisable in the guest's exec log.
const SETUP: &str = "echo setup-ran";

/// Polls `$cond` (which may `.await`) every 10 ms for up to 5 s.
macro_rules! eventually {
    ($what:expr, $cond:expr) => {{
        let mut ok = false;
        for _ in 0..500 {
            if $cond {
                ok = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(ok, "timed out waiting for {}", $what);
    }};
}

pub(crate) struct Rig {
    _dir: tempfile::TempDir,
    root: PathBuf,
    store: Arc<dyn Store>,
    pub(crate) rt: Arc<FakeRuntime>,
}

impl Rig {
    pub(crate) async fn new() -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let store: Arc<dyn Store> = Arc::new(DbStore::scratch().await.unwrap());
        let ts = Templates::new(root.join("templates"));
        let mut spec = TemplateSpec::named(TPL);
        spec.files.insert("/etc/motd".into(), "hello".into());
        spec.setup = vec![SETUP.into()];
        let rootfs = ts.rootfs_dir(&spec);
        std::fs::create_dir_all(&rootfs).unwrap();
        std::fs::write(rootfs.join(".complete"), "").unwrap();
        ts.activate(&spec).unwrap();
        Rig {
            _dir: dir,
            root,
            store,
            rt: FakeRuntime::new(),
        }
    }

    /// A daemon incarnation of `HOST` (each call takes the lease anew,
    /// fencing off the previous one), with no warm pool and background
    /// bakes held off.
    pub(crate) async fn manager(&self) -> Arc<Manager> {
        let m = self.manager_with(Caps::default(), 0).await;
        hold_bakes(&m);
        m
    }

    pub(crate) async fn manager_with(&self, caps: Caps, pool_size: usize) -> Arc<Manager> {
        let state = take_host_lease(Arc::clone(&self.store), HOST)
            .await
            .unwrap();
        let images = ImageConfig {
            template_images: ImageStore::new(self.root.join("images")).unwrap(),
            snapshots: ImageStore::new(self.root.join("snapshots")).unwrap(),
            shared_snapshots: None,
            pool: PoolConfig {
                size: pool_size,
                // Never drain for the test machine's memory.
                min_available_fraction: 0.0,
                ..Default::default()
            },
        };
        let rt: Arc<dyn Runtime> = self.rt.clone();
        Manager::new(
            caps,
            state,
            rt,
            Templates::new(self.root.join("templates")),
            images,
            None,
            Metrics::new(),
        )
    }

    async fn stop_reason(&self, id: &str) -> Option<String> {
        self.store
            .events(id)
            .await
            .unwrap()
            .into_iter()
            .find(|e| e.kind == "stopped")
            .map(|e| e.detail)
    }

    async fn unstopped(&self) -> Vec<SandboxRow> {
        self.store.list_unstopped(HOST).await.unwrap()
    }
}

fn template(m: &Manager) -> Template {
    m.templates().get(TPL).unwrap()
}

/// A cold create starts a background bake of the template, which would
/// add builder sandboxes to the runtime at times of its own choosing:
/// marking the bake as running keeps tests that do not bake exact.
pub(crate) fn hold_bakes(m: &Manager) {
    assert!(m.start_baking(&m.template_image_id(&template(m))));
}

fn allow_bakes(m: &Manager) {
    m.done_baking(&m.template_image_id(&template(m)));
}

async fn bake(m: &Manager) {
    let t = template(m);
    m.bake(&t, &m.template_image_id(&t), &mut |_| {})
        .await
        .unwrap();
    assert!(m.template_image(&t).is_some());
}

pub(crate) fn req() -> CreateRequest {
    CreateRequest {
        template: TPL.into(),
        ..Default::default()
    }
}

fn ran_setup(rt: &FakeRuntime, id: &str) -> bool {
    rt.execs(id)
        .iter()
        .any(|argv| argv.join(" ").contains(SETUP))
}

// --- create and its rollback ------------------------------------------------

#[tokio::test]
async fn cold_create_prepares_the_guest_and_registers_it() {
    // Without a checkpoint: the runtime creates, the template's files and
    // setup go in, the row is running and the runtime holds its expiry.
    let rig = Rig::new().await;
    let m = rig.manager().await;
    let info = m.create(req()).await.unwrap();
    assert_eq!(info.boot_mode, Some("cold"));
    assert_eq!(info.state, "running");
    assert_eq!(rig.rt.ids(), vec![info.id.clone()]);
    assert!(!rig.rt.was_restored(&info.id));
    assert_eq!(
        rig.rt.file(&info.id, "/etc/motd").as_deref(),
        Some(&b"hello"[..])
    );
    assert!(rig.rt.file(&info.id, "/etc/resolv.conf").is_some());
    assert!(ran_setup(&rig.rt, &info.id));
    assert_eq!(rig.rt.expiry(&info.id), Some(info.expires_at_ms));
    assert_eq!(m.get(&info.id).await.unwrap().state, "running");
    assert_eq!(m.live_count(), 1);
    // And it is usable through the agent.
    m.write_file(&info.id, "/work/a", b"x").await.unwrap();
    assert_eq!(m.read_file(&info.id, "/work/a").await.unwrap(), b"x");
}

#[tokio::test]
async fn create_rolls_back_when_the_runtime_cannot_create() {
    // Nothing stays behind: no sandbox in the runtime, the row stopped as
    // create_failed, the capacity reservation given back.
    let rig = Rig::new().await;
    let caps = Caps {
        max_live_sandboxes: 1,
        ..Default::default()
    };
    let m = rig.manager_with(caps, 0).await;
    hold_bakes(&m);
    rig.rt.fail(Op::Create);
    let err = m.create(req()).await.unwrap_err();
    assert!(matches!(err, CoreError::Runtime(_)), "{err:?}");
    let tried = rig.rt.calls(Op::Create);
    assert_eq!(tried.len(), 1);
    assert!(rig.rt.ids().is_empty());
    assert!(rig.unstopped().await.is_empty());
    assert_eq!(
        rig.stop_reason(&tried[0]).await.as_deref(),
        Some("create_failed")
    );
    assert_eq!(m.live_count(), 0);
    assert_eq!(m.metrics.create_failures.get(), 1);
    // The one slot of capacity is free again.
    rig.rt.clear(Op::Create);
    m.create(req()).await.unwrap();
}

#[tokio::test]
async fn create_rolls_back_when_the_agent_is_unreachable() {
    // The runtime made the sandbox but its agent cannot be reached: the
    // sandbox is destroyed, not left running unowned.
    let rig = Rig::new().await;
    let m = rig.manager().await;
    rig.rt.fail(Op::Connect);
    m.create(req()).await.unwrap_err();
    let id = rig.rt.calls(Op::Create).pop().unwrap();
    assert_eq!(rig.rt.calls(Op::Destroy), vec![id.clone()]);
    assert!(rig.rt.ids().is_empty());
    assert!(rig.unstopped().await.is_empty());
    assert_eq!(rig.stop_reason(&id).await.as_deref(), Some("create_failed"));
}

#[tokio::test]
async fn create_rolls_back_when_a_setup_command_fails() {
    // A cold boot whose template setup exits non-zero fails the create
    // and destroys the half-prepared sandbox.
    let rig = Rig::new().await;
    rig.rt.on_exec(SETUP, ExecReply::exit(3));
    let m = rig.manager().await;
    let err = m.create(req()).await.unwrap_err();
    assert!(
        matches!(err, CoreError::Invalid(ref s) if s.contains("exited with 3")),
        "{err:?}"
    );
    assert!(rig.rt.ids().is_empty());
    assert!(rig.unstopped().await.is_empty());
}

#[tokio::test]
async fn delete_during_a_hung_boot_is_not_undone_by_the_boot() {
    // A delete that lands while the runtime is still starting the sandbox
    // wins: when the start finally returns, the sandbox is destroyed and
    // the row stays stopped as deleted (never flipped to running).
    let rig = Rig::new().await;
    let m = rig.manager().await;
    let gate = rig.rt.hang(Op::Create);
    let creating = tokio::spawn({
        let m = Arc::clone(&m);
        async move { m.create(req()).await }
    });
    eventually!("the runtime create", rig.rt.calls(Op::Create).len() == 1);
    let id = rig.rt.calls(Op::Create)[0].clone();
    m.delete(&id).await;
    assert!(matches!(
        m.get(&id).await,
        Err(CoreError::SandboxNotFound(_))
    ));
    gate.release();
    let res = creating.await.unwrap();
    assert!(matches!(res, Err(CoreError::NotRunning(_))), "{res:?}");
    eventually!("teardown", rig.rt.ids().is_empty());
    assert_eq!(rig.stop_reason(&id).await.as_deref(), Some("deleted"));
    assert!(m.get(&id).await.is_err());
    assert_eq!(m.live_count(), 0);
}

#[tokio::test]
async fn a_guest_that_dies_is_stopped_and_destroyed() {
    // The adopt watcher: a sandbox whose agent connection ends on its own
    // (crash, the shim's TTL kill) is marked stopped and torn down.
    let rig = Rig::new().await;
    let m = rig.manager().await;
    let info = m.create(req()).await.unwrap();
    assert!(rig.rt.kill(&info.id));
    eventually!("the stop", m.get(&info.id).await.is_err());
    assert_eq!(
        rig.stop_reason(&info.id).await.as_deref(),
        Some("guest_exited")
    );
    eventually!("teardown", rig.rt.ids().is_empty());
    assert_eq!(m.live_count(), 0);
}

#[tokio::test]
async fn a_guest_killed_for_memory_says_so_in_its_state_its_metric_and_its_requests() {
    // The runtime tells why a guest ended (the gVisor shim notes it from
    // the cgroups' OOM counts before teardown): the stop reason, the
    // killed-sandboxes metric and a request that was running there all
    // carry it, after the teardown erased the runtime's own record too.
    use hatchery_runtime::EndCause;
    let rig = Rig::new().await;
    let m = rig.manager().await;
    for (cause, reason) in [
        (EndCause::HostOom, "host_oom"),
        (EndCause::GuestOom, "guest_oom"),
    ] {
        let id = m.create(req()).await.unwrap().id;
        assert!(rig.rt.kill_for(&id, cause));
        eventually!("the stop", m.get(&id).await.is_err());
        assert_eq!(rig.stop_reason(&id).await.as_deref(), Some(reason));
        eventually!("teardown", rig.rt.ids().is_empty());
        assert_eq!(
            m.metrics
                .sandboxes_killed
                .with_label_values(&[reason])
                .get(),
            1
        );
        match m.explain_gone(&id, CoreError::GuestUnresponsive("closed".into())) {
            CoreError::SandboxOom { id: i, reason: r } => {
                assert_eq!((i.as_str(), r), (id.as_str(), reason))
            }
            other => panic!("{other:?}"),
        }
    }
    // A guest that ended for no known reason stays what it was.
    let id = m.create(req()).await.unwrap().id;
    assert!(rig.rt.kill(&id));
    eventually!("the stop", m.get(&id).await.is_err());
    assert!(matches!(
        m.explain_gone(&id, CoreError::GuestUnresponsive("closed".into())),
        CoreError::GuestUnresponsive(_)
    ));
}

#[tokio::test]
async fn a_delete_answers_while_the_teardown_hangs() {
    // Stop is state first, teardown in the background: a runtime that
    // takes its time destroying does not hold the caller, and a graceful
    // shutdown waits for the teardown instead of cutting it off.
    let rig = Rig::new().await;
    let m = rig.manager().await;
    let id = m.create(req()).await.unwrap().id;
    let gate = rig.rt.hang(Op::Destroy);
    tokio::time::timeout(Duration::from_secs(2), m.delete(&id))
        .await
        .expect("delete does not wait for the teardown");
    assert!(matches!(
        m.get(&id).await,
        Err(CoreError::SandboxNotFound(_))
    ));
    assert_eq!(rig.rt.ids(), vec![id.clone()]);
    allow_bakes(&m);
    let stopping = tokio::spawn({
        let m = Arc::clone(&m);
        async move { m.shutdown().await }
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(!stopping.is_finished(), "shutdown waits for the teardown");
    gate.release();
    stopping.await.unwrap();
    assert!(rig.rt.ids().is_empty());
}

// --- template checkpoints and the warm pool ----------------------------------

#[tokio::test]
async fn baked_template_restores_without_rerunning_setup() {
    // Bake: a builder is booted, prepared, checkpointed and destroyed.
    // Creates then restore the image: files present, setup not rerun.
    let rig = Rig::new().await;
    let m = rig.manager().await;
    bake(&m).await;
    assert!(rig.rt.ids().is_empty(), "the builder is destroyed");
    assert_eq!(rig.rt.checkpoints_taken(), 1);
    let info = m.create(req()).await.unwrap();
    assert_eq!(info.boot_mode, Some("restore"));
    assert!(rig.rt.was_restored(&info.id));
    assert!(!ran_setup(&rig.rt, &info.id));
    assert_eq!(
        rig.rt.file(&info.id, "/etc/motd").as_deref(),
        Some(&b"hello"[..])
    );
}

/// A manager with a baked template and a filled pool of one; the filler
/// is stopped so the test decides when refills happen.
async fn pooled(rig: &Rig) -> (Arc<Manager>, String) {
    let m = rig.manager_with(Caps::default(), 1).await;
    hold_bakes(&m);
    bake(&m).await;
    let filler = m.spawn_pool_filler();
    eventually!("the pool fill", m.pool.len(TPL) == 1);
    filler.abort();
    let _ = filler.await;
    let id = m.pool.ids_of(TPL)[0].clone();
    (m, id)
}

#[tokio::test]
async fn create_claims_a_pooled_sandbox_and_the_pool_refills() {
    // A claim turns the pooled row into the caller's running sandbox with
    // the caller's deadline (told to the runtime too); the filler then
    // restores a replacement; shutdown destroys what is still pooled.
    let rig = Rig::new().await;
    let (m, pooled_id) = pooled(&rig).await;
    let rows = rig.unstopped().await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].state, SandboxState::Pooled);
    assert_eq!(
        rig.rt.is_background(&pooled_id),
        Some(true),
        "a refill starts with the least CPU weight"
    );
    assert_eq!(
        rig.rt.is_parked(&pooled_id),
        Some(true),
        "a warm pooled sandbox waits parked (no CPU)"
    );
    let info = m.create(req()).await.unwrap();
    assert_eq!(info.boot_mode, Some("pool"));
    assert_eq!(info.id, pooled_id);
    assert_eq!(
        rig.rt.is_background(&info.id),
        Some(false),
        "a claim gives it the normal weight"
    );
    assert_eq!(
        rig.rt.is_parked(&info.id),
        Some(false),
        "a claim unparks it"
    );
    assert_eq!(rig.rt.expiry(&info.id), Some(info.expires_at_ms));
    assert_eq!(m.get(&info.id).await.unwrap().state, "running");
    assert_eq!(m.pool.len(TPL), 0);
    let filler = m.spawn_pool_filler();
    eventually!("the refill", m.pool.len(TPL) == 1);
    filler.abort();
    let refill = m.pool.ids_of(TPL)[0].clone();
    assert_ne!(refill, info.id);
    assert!(rig.rt.was_restored(&refill));
    // Shutdown waits for running bakes, and `pooled` holds one off.
    allow_bakes(&m);
    m.shutdown().await;
    assert_eq!(rig.rt.ids(), vec![info.id.clone()]);
    assert_eq!(
        rig.stop_reason(&refill).await.as_deref(),
        Some("pool_discard")
    );
}

#[tokio::test]
async fn a_dead_pooled_sandbox_is_discarded_and_the_create_restores() {
    // A pooled sandbox that died while waiting is not handed out: it is
    // stopped and destroyed, and the create falls through to a restore.
    let rig = Rig::new().await;
    let (m, pooled_id) = pooled(&rig).await;
    rig.rt.kill(&pooled_id);
    eventually!(
        "the pool's client to see the end",
        m.pool.is_alive(&pooled_id) == Some(false)
    );
    let info = m.create(req()).await.unwrap();
    assert_eq!(info.boot_mode, Some("restore"));
    assert_ne!(info.id, pooled_id);
    assert_eq!(
        rig.stop_reason(&pooled_id).await.as_deref(),
        Some("pool_discard")
    );
    eventually!(
        "teardown of the dead one",
        rig.rt.ids() == vec![info.id.clone()]
    );
}

#[tokio::test]
async fn a_pooled_sandbox_with_a_broken_channel_is_discarded() {
    // The sandbox is still up (its deadline can be moved) but the agent
    // connection the pool holds is gone: it must not be handed out with
    // a dead client.
    let rig = Rig::new().await;
    let (m, pooled_id) = pooled(&rig).await;
    rig.rt.disconnect(&pooled_id);
    eventually!(
        "the pool's client to see the end",
        m.pool.is_alive(&pooled_id) == Some(false)
    );
    let info = m.create(req()).await.unwrap();
    assert_eq!(info.boot_mode, Some("restore"));
    assert_eq!(
        rig.stop_reason(&pooled_id).await.as_deref(),
        Some("pool_discard")
    );
    eventually!("teardown", rig.rt.ids() == vec![info.id.clone()]);
}

#[tokio::test]
async fn shutdown_lets_an_inflight_refill_finish_then_destroys_it() {
    // A refill whose restore is still running when shutdown starts is
    // neither cut off nor left behind: shutdown waits for it, then
    // destroys the pool, so no sandbox outlives the daemon unrecorded.
    let rig = Rig::new().await;
    let m = rig.manager_with(Caps::default(), 1).await;
    bake(&m).await;
    let gate = rig.rt.hang(Op::Restore);
    let filler = m.spawn_pool_filler();
    eventually!("the refill's restore", rig.rt.calls(Op::Restore).len() == 1);
    let stopping = tokio::spawn({
        let m = Arc::clone(&m);
        async move { m.shutdown().await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!stopping.is_finished(), "shutdown waits for the refill");
    gate.release();
    stopping.await.unwrap();
    let _ = filler.await;
    assert!(rig.rt.ids().is_empty());
    assert!(rig.unstopped().await.is_empty());
    assert_eq!(m.pool.len(TPL), 0);
}

#[tokio::test]
async fn the_lease_is_kept_until_shutdown_has_finished() {
    // A shutdown blocked on an in-flight refill (here held; on a loaded
    // machine runsc's 30 s timeout) can outlast the host lease. The keeper
    // renews through it, so the host is not swept as lost while still
    // stopping (its live sandboxes would be marked host_lost instead of
    // re-adopted at the restart), and it stops once the shutdown is done.
    let rig = Rig::new().await;
    let m = rig.manager_with(Caps::default(), 1).await;
    bake(&m).await;
    let gate = rig.rt.hang(Op::Restore);
    let filler = m.spawn_pool_filler();
    let keeper = m.spawn_lease_keeper();
    eventually!("the refill's restore", rig.rt.calls(Op::Restore).len() == 1);
    let stopping = tokio::spawn({
        let m = Arc::clone(&m);
        async move { m.shutdown().await }
    });
    // Past the keeper's 2 s check: it used to return at the first one
    // after shutdown began.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert!(!stopping.is_finished(), "shutdown waits for the refill");
    assert!(
        !keeper.is_finished(),
        "the keeper stopped while still stopping"
    );
    assert!(m.lease_held());
    gate.release();
    stopping.await.unwrap();
    let _ = filler.await;
    tokio::time::timeout(Duration::from_secs(5), keeper)
        .await
        .expect("the keeper ends once the shutdown is done")
        .unwrap();
}

#[tokio::test]
async fn a_refused_restore_falls_back_to_cold_and_is_rebaked() {
    // With an image that passes its checksum, a restore the runtime
    // refuses is not the create's failure: that attempt is stopped and
    // cleaned, the create boots cold (running setup), the image is dropped
    // and baked again, and the next create restores.
    let rig = Rig::new().await;
    let m = rig.manager().await;
    bake(&m).await;
    let t = template(&m);
    allow_bakes(&m);
    rig.rt.fail_once(Op::Restore);
    let info = m.create(req()).await.unwrap();
    assert_eq!(info.boot_mode, Some("cold"));
    assert!(ran_setup(&rig.rt, &info.id));
    let refused = rig.rt.calls(Op::Restore).pop().unwrap();
    assert_ne!(refused, info.id);
    assert_eq!(
        rig.stop_reason(&refused).await.as_deref(),
        Some("create_failed")
    );
    assert_eq!(m.metrics.restore_fallbacks.get(), 1);
    eventually!("the rebake", m.template_image(&t).is_some());
    eventually!("the bake to finish", m.baking.lock().unwrap().is_empty());
    assert_eq!(rig.rt.ids(), vec![info.id.clone()]);
    let next = m.create(req()).await.unwrap();
    assert_eq!(next.boot_mode, Some("restore"));
}

#[tokio::test]
async fn a_refused_restore_on_a_pool_refill_is_rebaked() {
    // The pool's own restore meets the same rule as a create's: the image
    // is dropped and baked again, and the pool fills from the new one.
    let rig = Rig::new().await;
    let m = rig.manager_with(Caps::default(), 1).await;
    bake(&m).await;
    let t = template(&m);
    allow_bakes(&m);
    rig.rt.fail_once(Op::Restore);
    let filler = m.spawn_pool_filler();
    eventually!("the pool fill", m.pool.len(TPL) == 1);
    filler.abort();
    let _ = filler.await;
    assert_eq!(m.metrics.restore_fallbacks.get(), 1);
    assert!(m.template_image(&t).is_some());
    let pooled = m.pool.ids_of(TPL)[0].clone();
    assert!(rig.rt.was_restored(&pooled));
    eventually!("the bake to finish", m.baking.lock().unwrap().is_empty());
    assert_eq!(
        rig.rt.calls(Op::Restore).len(),
        2,
        "refused once, then restored"
    );
}

#[tokio::test]
async fn a_restore_refused_again_after_the_fallback_still_creates() {
    // A runtime that refuses every restore: each create still succeeds
    // cold, and nothing of the refused attempts is left.
    let rig = Rig::new().await;
    let m = rig.manager().await;
    bake(&m).await;
    allow_bakes(&m);
    rig.rt.fail(Op::Restore);
    let a = m.create(req()).await.unwrap();
    assert_eq!(a.boot_mode, Some("cold"));
    eventually!("the bake to finish", m.baking.lock().unwrap().is_empty());
    let b = m.create(req()).await.unwrap();
    assert_eq!(b.boot_mode, Some("cold"));
    eventually!("the bake to finish", m.baking.lock().unwrap().is_empty());
    let mut live = rig.rt.ids();
    live.sort();
    let mut want = vec![a.id, b.id];
    want.sort();
    assert_eq!(live, want);
}

#[tokio::test]
async fn a_corrupt_template_image_falls_back_to_cold_and_is_rebaked() {
    // An image that fails its checksum is not restored: the create boots
    // cold (running setup) and a fresh image is baked for the next one.
    let rig = Rig::new().await;
    let m = rig.manager().await;
    bake(&m).await;
    let t = template(&m);
    let dir = m.template_image(&t).unwrap();
    std::fs::write(checkpoint_file(&dir), b"garbage").unwrap();
    assert!(m.template_image(&t).is_none());
    allow_bakes(&m);
    let info = m.create(req()).await.unwrap();
    assert_eq!(info.boot_mode, Some("cold"));
    assert!(ran_setup(&rig.rt, &info.id));
    eventually!("the rebake", m.template_image(&t).is_some());
    eventually!("the bake to finish", m.baking.lock().unwrap().is_empty());
    assert_eq!(rig.rt.ids(), vec![info.id.clone()]);
    let next = m.create(req()).await.unwrap();
    assert_eq!(next.boot_mode, Some("restore"));
}

// --- reconcile after a restart ------------------------------------------------

#[tokio::test]
async fn reconcile_after_a_restart_adopts_stops_and_destroys() {
    // A new incarnation of the host: the live sandbox is re-adopted (and
    // reachable), a dead one and an expired one are stopped and destroyed,
    // a pooled one is discarded, an orphan only the runtime knows is
    // destroyed, another host's row is left alone, and the old
    // incarnation's writes are fenced off.
    let rig = Rig::new().await;
    let old = rig.manager().await;
    let alive = old.create(req()).await.unwrap().id;
    let dead = old.create(req()).await.unwrap().id;
    let expired = old.create(req()).await.unwrap().id;
    old.write_file(&alive, "/work/keep", b"1").await.unwrap();
    let old_fence = old.fence.clone();
    assert!(rig
        .store
        .set_expiry(&old_fence, &expired, now_ms() - 1)
        .await
        .unwrap());
    let pooled = crate::new_sandbox_id();
    let now = now_ms();
    let pooled_row = SandboxRow {
        id: pooled.clone(),
        template: TPL.into(),
        state: SandboxState::Pooled,
        created_at_ms: now,
        expires_at_ms: now + 60_000,
        metadata: BTreeMap::new(),
        env: BTreeMap::new(),
        host_id: HOST.into(),
        template_version: String::new(),
        rootfs: String::new(),
        limits: String::new(),
    };
    rig.store
        .insert_sandbox(&old_fence, &pooled_row)
        .await
        .unwrap();
    let spec = |id: &str| SandboxSpec {
        id: id.into(),
        rootfs: template(&old).rootfs,
        limits: template(&old).limits(),
        expires_at_ms: now + 60_000,
        netns: None,
        background: false,
    };
    rig.rt.create(&spec(&pooled)).await.unwrap();
    let orphan = crate::new_sandbox_id();
    rig.rt.create(&spec(&orphan)).await.unwrap();
    // Another host's sandbox, in the same store.
    let other = take_host_lease(Arc::clone(&rig.store), "host-b")
        .await
        .unwrap();
    let mut other_row = pooled_row.clone();
    other_row.id = crate::new_sandbox_id();
    other_row.state = SandboxState::Running;
    other_row.host_id = "host-b".into();
    rig.store
        .insert_sandbox(&other.fence, &other_row)
        .await
        .unwrap();
    // The daemon goes away; one of its sandboxes dies meanwhile.
    drop(old);
    rig.rt.kill(&dead);

    let m = rig.manager().await;
    let report = m.reconcile().await.unwrap();
    assert_eq!(
        (report.adopted, report.stopped, report.orphans_destroyed),
        (1, 3, 1),
        "{report:?}"
    );
    assert_eq!(rig.rt.ids(), vec![alive.clone()]);
    assert_eq!(m.read_file(&alive, "/work/keep").await.unwrap(), b"1");
    assert_eq!(m.get(&alive).await.unwrap().state, "running");
    assert_eq!(rig.stop_reason(&dead).await.as_deref(), Some("lost"));
    assert_eq!(rig.stop_reason(&expired).await.as_deref(), Some("ttl"));
    assert_eq!(rig.stop_reason(&pooled).await.as_deref(), Some("lost"));
    assert!(rig.store.get_live(&other_row.id).await.unwrap().is_some());
    let fenced = rig.store.stop(&old_fence, &alive, "x", now_ms()).await;
    assert!(fenced.is_err_and(|e| e.is_fenced()));
    // The adopted sandbox is watched like a new one.
    rig.rt.kill(&alive);
    eventually!("the stop", m.get(&alive).await.is_err());
    assert_eq!(
        rig.stop_reason(&alive).await.as_deref(),
        Some("guest_exited")
    );
}

// --- TTL ----------------------------------------------------------------------

#[tokio::test]
async fn the_reaper_stops_expired_sandboxes_only() {
    let rig = Rig::new().await;
    let m = rig.manager().await;
    let old = m.create(req()).await.unwrap().id;
    let young = m.create(req()).await.unwrap().id;
    assert!(rig
        .store
        .set_expiry(&m.fence, &old, now_ms() - 1)
        .await
        .unwrap());
    let reaper = m.spawn_reaper();
    eventually!("the reap", m.get(&old).await.is_err());
    reaper.abort();
    assert_eq!(rig.stop_reason(&old).await.as_deref(), Some("ttl"));
    eventually!("teardown", rig.rt.ids() == vec![young.clone()]);
    assert_eq!(m.get(&young).await.unwrap().state, "running");
    assert_eq!(m.live_count(), 1);
}

#[tokio::test]
async fn set_ttl_moves_the_runtime_deadline_before_the_stored_one() {
    // If the runtime cannot be told, the stored expiry is not moved
    // either: the row never promises a lifetime the shim will not give.
    let rig = Rig::new().await;
    let m = rig.manager().await;
    let info = m.create(req()).await.unwrap();
    rig.rt.fail_once(Op::SetExpiry);
    m.set_ttl(&info.id, 1000).await.unwrap_err();
    assert_eq!(
        m.get(&info.id).await.unwrap().expires_at_ms,
        info.expires_at_ms
    );
    let moved = m.set_ttl(&info.id, 1000).await.unwrap();
    assert!(moved.expires_at_ms > info.expires_at_ms);
    assert_eq!(rig.rt.expiry(&info.id), Some(moved.expires_at_ms));
}

// --- snapshots and forks --------------------------------------------------------

async fn snapshotted(rig: &Rig) -> (Arc<Manager>, String, crate::SnapshotInfo) {
    let m = rig.manager().await;
    let src = m.create(req()).await.unwrap().id;
    m.write_file(&src, "/work/x", b"v1").await.unwrap();
    let snap = m.snapshot(&src, None, BTreeMap::new()).await.unwrap();
    (m, src, snap)
}

fn fork_req(count: usize) -> ForkRequest {
    ForkRequest {
        count,
        ..Default::default()
    }
}

#[tokio::test]
async fn snapshot_then_fork_gives_independent_copies() {
    // The snapshot is recorded and its image sealed; each fork restores
    // it (seeing the files written before the snapshot) and is its own.
    let rig = Rig::new().await;
    let (m, src, snap) = snapshotted(&rig).await;
    assert_eq!(snap.sandbox_id, src);
    assert!(snap.size_bytes > 0);
    assert_eq!(m.get_snapshot(&snap.id).await.unwrap(), snap);
    let forks = m.fork(&snap.id, fork_req(2)).await.unwrap();
    assert_eq!(forks.len(), 2);
    for f in &forks {
        assert_eq!(f.boot_mode, Some("fork"));
        assert!(rig.rt.was_restored(&f.id));
        assert_eq!(m.read_file(&f.id, "/work/x").await.unwrap(), b"v1");
    }
    m.write_file(&forks[0].id, "/work/x", b"v2").await.unwrap();
    assert_eq!(m.read_file(&src, "/work/x").await.unwrap(), b"v1");
    assert_eq!(m.read_file(&forks[1].id, "/work/x").await.unwrap(), b"v1");
    assert_eq!(m.live_count(), 3);
    m.delete_snapshot(&snap.id).await.unwrap();
    assert!(m.snapshots.local().ids().is_empty());
    assert!(m.fork(&snap.id, fork_req(1)).await.is_err());
}

#[tokio::test]
async fn a_fork_beyond_capacity_makes_none() {
    // Forks count against the live cap one by one; the one that does not
    // fit fails the fork and the ones made before it are stopped.
    let rig = Rig::new().await;
    let caps = Caps {
        max_live_sandboxes: 2,
        ..Default::default()
    };
    let m = rig.manager_with(caps, 0).await;
    hold_bakes(&m);
    let src = m.create(req()).await.unwrap().id;
    let snap = m.snapshot(&src, None, BTreeMap::new()).await.unwrap();
    let err = m.fork(&snap.id, fork_req(2)).await.unwrap_err();
    assert!(matches!(err, CoreError::Capacity(2)), "{err:?}");
    assert_eq!(rig.rt.calls(Op::Restore).len(), 1);
    eventually!("teardown", rig.rt.ids() == vec![src.clone()]);
    assert_eq!(m.live_count(), 1);
}

#[tokio::test]
async fn the_reaper_deletes_expired_snapshots() {
    // Retention: once a snapshot's time is up, the reaper removes its row
    // and its image. (Retention is whole seconds: this test waits one.)
    let rig = Rig::new().await;
    let m = rig.manager().await;
    let src = m.create(req()).await.unwrap().id;
    let short = m.snapshot(&src, Some(1), BTreeMap::new()).await.unwrap();
    let kept = m.snapshot(&src, Some(3600), BTreeMap::new()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1050)).await;
    let reaper = m.spawn_reaper();
    eventually!("the expiry", m.get_snapshot(&short.id).await.is_err());
    reaper.abort();
    assert_eq!(m.snapshots.local().ids(), vec![kept.id.clone()]);
    assert!(m.get_snapshot(&kept.id).await.is_ok());
    assert_eq!(m.get(&src).await.unwrap().state, "running");
}

#[tokio::test]
async fn a_files_only_snapshot_forks_into_the_template_with_the_files() {
    // No checkpoint is taken: the runtime exports the files, and a fork
    // boots (or restores the template's own checkpoint) and gets them
    // unpacked before it is handed out.
    let rig = Rig::new().await;
    let m = rig.manager().await;
    let src = m.create(req()).await.unwrap().id;
    m.write_file(&src, "/work/x", b"kept").await.unwrap();
    let snap = m.snapshot_files(&src, None, BTreeMap::new()).await.unwrap();
    assert_eq!(snap.kind, crate::store::SnapshotKind::Files);
    assert!(snap.size_bytes > 0);
    assert!(
        rig.rt.calls(Op::Checkpoint).is_empty(),
        "no memory is saved"
    );
    assert_eq!(rig.rt.calls(Op::ExportFiles), vec![src.clone()]);
    assert_eq!(m.get_snapshot(&snap.id).await.unwrap(), snap);
    assert_eq!(
        m.get(&src).await.unwrap().state,
        "running",
        "the source runs on"
    );
    let forks = m.fork(&snap.id, fork_req(1)).await.unwrap();
    let f = &forks[0];
    assert_eq!(f.boot_mode, Some("files"));
    assert!(
        !rig.rt.was_restored(&f.id),
        "booted, not restored (no template checkpoint)"
    );
    assert_eq!(rig.rt.calls(Op::ImportFiles), vec![f.id.clone()]);
    assert_eq!(m.read_file(&f.id, "/work/x").await.unwrap(), b"kept");
    m.delete_snapshot(&snap.id).await.unwrap();
    assert!(m.snapshots.local().ids().is_empty());
}

#[tokio::test]
async fn a_failed_export_or_import_leaves_nothing() {
    let rig = Rig::new().await;
    let m = rig.manager().await;
    let src = m.create(req()).await.unwrap().id;
    rig.rt.fail_once(Op::ExportFiles);
    m.snapshot_files(&src, None, BTreeMap::new())
        .await
        .unwrap_err();
    assert!(m.list_snapshots(&BTreeMap::new()).await.unwrap().is_empty());
    assert!(m.snapshots.local().ids().is_empty(), "no partial image");
    let snap = m.snapshot_files(&src, None, BTreeMap::new()).await.unwrap();
    // The files cannot be unpacked: the fork is not handed out, and
    // nothing of it remains.
    rig.rt.fail_once(Op::ImportFiles);
    m.fork(&snap.id, fork_req(1)).await.unwrap_err();
    eventually!("teardown", rig.rt.ids() == vec![src.clone()]);
    assert_eq!(m.live_count(), 1);
    assert!(
        m.get_snapshot(&snap.id).await.is_ok(),
        "the pause stays resumable"
    );
}

#[tokio::test]
async fn a_failed_checkpoint_leaves_no_snapshot() {
    let rig = Rig::new().await;
    let m = rig.manager().await;
    let src = m.create(req()).await.unwrap().id;
    rig.rt.fail(Op::Checkpoint);
    m.snapshot(&src, None, BTreeMap::new()).await.unwrap_err();
    assert!(m.list_snapshots(&BTreeMap::new()).await.unwrap().is_empty());
    assert!(m.snapshots.local().ids().is_empty(), "no partial image");
    // The source is untouched.
    assert_eq!(m.get(&src).await.unwrap().state, "running");
}

#[tokio::test]
async fn a_snapshot_past_the_store_cap_is_refused_and_leaves_nothing() {
    let rig = Rig::new().await;
    // One byte: the pre-check passes on an empty store, the image does
    // not fit once its size is known.
    let caps = Caps {
        max_snapshot_store_bytes: 1,
        ..Default::default()
    };
    let m = rig.manager_with(caps, 0).await;
    hold_bakes(&m);
    let src = m.create(req()).await.unwrap().id;
    let e = m.snapshot(&src, None, BTreeMap::new()).await.unwrap_err();
    assert!(
        matches!(e, CoreError::SnapshotStoreFull { used: 0, cap: 1, need } if need > 1),
        "{e:?}"
    );
    assert_eq!(rig.rt.calls(Op::Checkpoint).len(), 1);
    assert!(m.list_snapshots(&BTreeMap::new()).await.unwrap().is_empty());
    assert!(m.snapshots.local().ids().is_empty(), "no image kept");
    // A store already at its cap refuses before pausing the sandbox.
    let full = crate::store::SnapshotRow {
        id: "snap_fullfullfullfull".into(),
        sandbox_id: src.clone(),
        template: TPL.into(),
        created_at_ms: 1,
        expires_at_ms: u64::MAX / 4,
        size_bytes: 1,
        metadata: BTreeMap::new(),
        env: BTreeMap::new(),
        rootfs: String::new(),
        limits: String::new(),
        template_version: String::new(),
        host_id: String::new(),
        location: crate::store::SnapshotLocation::Local { host: HOST.into() },
        kind: crate::store::SnapshotKind::Memory,
    };
    rig.store.insert_snapshot(&m.fence, &full).await.unwrap();
    let e = m.snapshot(&src, None, BTreeMap::new()).await.unwrap_err();
    assert!(
        matches!(
            e,
            CoreError::SnapshotStoreFull {
                used: 1,
                need: 1,
                cap: 1
            }
        ),
        "{e:?}"
    );
    assert_eq!(rig.rt.calls(Op::Checkpoint).len(), 1, "never paused");
    assert_eq!(m.metrics.snapshot_store_full.get(), 2);
    assert_eq!(m.get(&src).await.unwrap().state, "running");
}

#[tokio::test]
async fn a_fork_is_all_or_nothing() {
    // The second of three restores fails: the first fork is stopped too,
    // and only the source remains.
    let rig = Rig::new().await;
    let (m, src, snap) = snapshotted(&rig).await;
    rig.rt
        .inject(Op::Restore, Fault::Fail("no room".into()), Schedule::nth(1));
    m.fork(&snap.id, fork_req(3)).await.unwrap_err();
    assert_eq!(rig.rt.calls(Op::Restore).len(), 2);
    let first = rig.rt.calls(Op::Restore)[0].clone();
    assert_eq!(
        rig.stop_reason(&first).await.as_deref(),
        Some("fork_failed")
    );
    eventually!("teardown", rig.rt.ids() == vec![src.clone()]);
    let live: Vec<String> = m
        .list(&BTreeMap::new())
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.id)
        .collect();
    assert_eq!(live, vec![src]);
    assert_eq!(m.live_count(), 1);
}

#[tokio::test]
async fn a_fork_of_a_lost_checkpoint_fails_cleanly() {
    // Lost on disk: the image fails verification and the runtime is not
    // even asked. Unreadable to the runtime: the restore fails and the
    // half-made fork is gone. Either way only the source remains.
    let rig = Rig::new().await;
    let (m, src, snap) = snapshotted(&rig).await;
    let dir = m.snapshots.local().verify(&snap.id).unwrap();
    assert!(rig.rt.forget_checkpoint(&dir));
    m.fork(&snap.id, fork_req(1)).await.unwrap_err();
    assert_eq!(rig.rt.calls(Op::Restore).len(), 1);
    assert!(rig.unstopped().await.iter().all(|r| r.id == src));

    std::fs::remove_file(checkpoint_file(&dir)).unwrap();
    let err = m.fork(&snap.id, fork_req(1)).await.unwrap_err();
    assert!(matches!(err, CoreError::SnapshotCorrupt(_)), "{err:?}");
    assert_eq!(rig.rt.calls(Op::Restore).len(), 1, "no restore attempted");
    eventually!("teardown", rig.rt.ids() == vec![src.clone()]);
    assert_eq!(m.live_count(), 1);
}

// --- the host lease -------------------------------------------------------------

#[tokio::test]
async fn a_superseded_incarnation_cannot_create() {
    // Once a new incarnation took the lease, the old one's create is
    // refused by the store before the runtime is asked for anything.
    let rig = Rig::new().await;
    let old = rig.manager().await;
    let _new = rig.manager().await;
    let err = old.create(req()).await.unwrap_err();
    assert!(
        matches!(err, CoreError::Store(ref e) if e.is_fenced()),
        "{err:?}"
    );
    assert!(rig.rt.calls(Op::Create).is_empty());
    assert!(rig.rt.ids().is_empty());
}

#[tokio::test]
async fn losing_the_lease_destroys_everything_and_refuses_work() {
    // Live and pooled sandboxes alike are destroyed on the host; new
    // work is refused from then on.
    let rig = Rig::new().await;
    let (m, pooled_id) = pooled(&rig).await;
    let a = m.create(req()).await.unwrap().id;
    assert_eq!(a, pooled_id);
    let b = m.create(req()).await.unwrap().id;
    let filler = m.spawn_pool_filler();
    eventually!("the refill", m.pool.len(TPL) == 1);
    filler.abort();
    let _ = filler.await;
    assert_eq!(rig.rt.ids().len(), 3);
    m.lose_lease().await;
    assert!(rig.rt.ids().is_empty());
    assert_eq!(m.live_count(), 0);
    assert_eq!(m.pool.len(TPL), 0);
    let err = m.create(req()).await.unwrap_err();
    assert!(
        matches!(err, CoreError::Store(ref e) if e.is_fenced()),
        "{err:?}"
    );
    // The rows are left for the lease's next holder to reconcile.
    assert!(rig.store.get_live(&b).await.unwrap().is_some());
}

// --- templates built at start ------------------------------------------------------

/// A spec of a new template whose rootfs is already there (no debootstrap).
fn seeded_spec(rig: &Rig, name: &str) -> TemplateSpec {
    let mut spec = TemplateSpec::named(name);
    spec.setup = vec!["echo built".into()];
    let rootfs = Templates::new(rig.root.join("templates")).rootfs_dir(&spec);
    std::fs::create_dir_all(&rootfs).unwrap();
    std::fs::write(rootfs.join(".complete"), "").unwrap();
    spec
}

#[tokio::test]
async fn a_template_queued_at_start_is_building_until_built_then_creates_use_it() {
    // Registered before the daemon serves: from then on a create naming it
    // is told to retry (not that it does not exist), an unknown name is
    // still NotFound, and after the build creates succeed.
    let rig = Rig::new().await;
    let m = rig.manager().await;
    let (a, b) = (seeded_spec(&rig, "tpl-a"), seeded_spec(&rig, "tpl-b"));
    let queued = m.queue_builds(vec![a.clone(), b.clone()]);
    let ids: Vec<String> = queued.builds().map(|b| b.id.clone()).collect();
    assert_eq!(ids.len(), 2);
    let names: Vec<String> = m.running_builds().iter().map(|b| b.name.clone()).collect();
    assert_eq!(names, ["tpl-a", "tpl-b"]);
    assert_eq!(
        m.running_build_of("tpl-b").unwrap().progress(),
        ("queued".to_string(), 0)
    );
    let create = |t: &str| CreateRequest {
        template: t.into(),
        ..Default::default()
    };
    let e = m.create(create("tpl-a")).await.unwrap_err();
    assert!(
        matches!(&e, CoreError::TemplateBuilding { name, step, .. } if name == "tpl-a" && step == "queued"),
        "{e:?}"
    );
    let e = m.create(create("tpl-none")).await.unwrap_err();
    assert!(
        matches!(
            e,
            CoreError::Template(hatchery_templates::TemplateError::NotFound(_))
        ),
        "{e:?}"
    );
    // A second build of a queued name (POST /v1/templates) is refused.
    assert!(matches!(
        m.build_template(a.clone()),
        Err(CoreError::Conflict(_))
    ));

    queued.spawn().await.unwrap();
    assert!(m.running_builds().is_empty());
    for (spec, id) in [(&a, &ids[0]), (&b, &ids[1])] {
        let build = m.get_build(&spec.name, id).unwrap();
        let (history, _) = build.subscribe();
        assert_eq!(history.last().unwrap().kind, "done", "{history:?}");
        let t = m.templates().get(&spec.name).unwrap();
        assert_eq!(t.version, spec.version());
        assert!(m.template_image(&t).is_some(), "baked by the build");
    }
    let info = m.create(create("tpl-b")).await.unwrap();
    assert_eq!(info.boot_mode, Some("restore"));

    // Queued again (the next start): current, so nothing to build.
    let again = m.queue_builds(vec![a, b]);
    assert_eq!(again.builds().count(), 0);
    assert!(m.running_builds().is_empty());
}

#[tokio::test]
async fn builds_at_start_run_one_at_a_time_in_order() {
    // The second's first step comes after the first's last event.
    let rig = Rig::new().await;
    let m = rig.manager().await;
    let (a, b) = (seeded_spec(&rig, "tpl-a"), seeded_spec(&rig, "tpl-b"));
    let queued = m.queue_builds(vec![a, b]);
    let builds: Vec<_> = queued.builds().cloned().collect();
    let (_, rx_a) = builds[0].subscribe();
    let (_, rx_b) = builds[1].subscribe();
    let (mut rx_a, mut rx_b) = (rx_a.unwrap(), rx_b.unwrap());
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (o1, o2) = (Arc::clone(&order), Arc::clone(&order));
    let ta = tokio::spawn(async move {
        while let Ok(ev) = rx_a.recv().await {
            o1.lock().unwrap().push(format!("a:{}", ev.kind));
            if ev.kind == "done" || ev.kind == "error" {
                break;
            }
        }
    });
    let tb = tokio::spawn(async move {
        while let Ok(ev) = rx_b.recv().await {
            o2.lock().unwrap().push(format!("b:{}", ev.kind));
            if ev.kind == "done" || ev.kind == "error" {
                break;
            }
        }
    });
    queued.spawn().await.unwrap();
    ta.await.unwrap();
    tb.await.unwrap();
    let order = order.lock().unwrap().clone();
    let a_done = order.iter().position(|e| e == "a:done").unwrap();
    let b_first = order.iter().position(|e| e.starts_with("b:")).unwrap();
    assert!(a_done < b_first, "{order:?}");
    assert_eq!(order.last().unwrap(), "b:done", "{order:?}");
}

mod snapshot_pools;
