//! [`ManagerBackend`] over a real manager on the in-memory runtime
//! (`hatchery_runtime::fake`) and the SQLite store in a temporary
//! directory: what E2B sees of sandboxes, files and errors, without root
//! or runsc.

use crate::claims::fake::FakeLeases;
use crate::claims::Claims;
use crate::ManagerBackend;
use hatchery_core::lease::take_host_lease;
use hatchery_core::metrics::Metrics;
use hatchery_core::store::Store;
use hatchery_core::{Caps, ImageConfig, Manager, PoolConfig};
use hatchery_e2b::backend::{Backend, CreateSpec, FailKind};
use hatchery_runtime::fake::FakeRuntime;
use hatchery_runtime::Runtime;
use hatchery_templates::{ImageStore, TemplateSpec, Templates};
use std::collections::BTreeMap;
use std::sync::Arc;

const HOST: &str = "host-a";
const TPL: &str = "py";

struct Rig {
    _dir: tempfile::TempDir,
    store: Arc<dyn Store>,
    manager: Arc<Manager>,
}

impl Rig {
    async fn new() -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let store: Arc<dyn Store> = Arc::new(hatchery_store::DbStore::scratch().await.unwrap());
        let ts = Templates::new(root.join("templates"));
        let mut spec = TemplateSpec::named(TPL);
        spec.cpus = 2.0;
        spec.memory_mb = 768;
        let rootfs = ts.rootfs_dir(&spec);
        std::fs::create_dir_all(&rootfs).unwrap();
        std::fs::write(rootfs.join(".complete"), "").unwrap();
        ts.activate(&spec).unwrap();
        let state = take_host_lease(store.clone(), HOST).await.unwrap();
        let images = ImageConfig {
            template_images: ImageStore::new(root.join("images")).unwrap(),
            snapshots: ImageStore::new(root.join("snapshots")).unwrap(),
            shared_snapshots: None,
            pool: PoolConfig {
                size: 0,
                min_available_fraction: 0.0,
                ..Default::default()
            },
        };
        let rt: Arc<dyn Runtime> = FakeRuntime::new();
        let manager = Manager::new(
            Caps::default(),
            state,
            rt,
            Templates::new(root.join("templates")),
            images,
            None,
            Metrics::new(),
        );
        Rig {
            _dir: dir,
            store,
            manager,
        }
    }

    fn backend(&self) -> ManagerBackend {
        ManagerBackend::new(self.manager.clone(), "key".into(), self.store.clone())
    }
}

fn spec(template: &str) -> CreateSpec {
    CreateSpec {
        template: template.into(),
        ttl_seconds: 300,
        metadata: BTreeMap::from([("k".into(), "v".into())]),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_sandbox_is_seen_with_its_templates_resources() {
    let rig = Rig::new().await;
    let b = rig.backend();
    assert_eq!(b.api_key(), "key");
    assert!(b.template_exists(TPL));
    assert!(!b.template_exists("nope"));
    let v = b.create(spec(TPL)).await.unwrap();
    assert_eq!((v.cpus, v.memory_mb), (2.0, 768));
    assert_eq!(v.metadata["k"], "v");
    assert_eq!(b.get(&v.id).await.unwrap(), v);
    let found = b
        .find(BTreeMap::from([("k".into(), "v".into())]))
        .await
        .unwrap();
    assert_eq!(found.iter().map(|s| &s.id).collect::<Vec<_>>(), [&v.id]);
    b.write_file(&v.id, "/work/a", b"x").await.unwrap();
    assert_eq!(b.read_file(&v.id, "/work/a").await.unwrap(), b"x");
    b.kill(&v.id).await;
    assert!(b.list().await.unwrap().is_empty());
}

#[tokio::test]
async fn the_cores_refusals_arrive_as_e2b_failure_kinds() {
    let rig = Rig::new().await;
    let b = rig.backend();
    let e = b.create(spec("nope")).await.unwrap_err();
    assert_eq!(e.kind, FailKind::TemplateNotFound);
    let e = b.get("sbx_missing").await.unwrap_err();
    assert_eq!(e.kind, FailKind::SandboxNotFound);
    // The protocol names the sandbox itself; the message is its id.
    assert_eq!(e.message, "sbx_missing");
    let e = b.read_file("sbx_missing", "/x").await.unwrap_err();
    assert_eq!(e.kind, FailKind::SandboxNotFound);
    let e = b
        .write_stdin("sbx_missing", "p", &vec![0; 1024 * 1024 + 1])
        .await
        .unwrap_err();
    assert_eq!(e.kind, FailKind::TooLarge);
}

#[tokio::test]
async fn resume_claims_are_the_hosts_leases() {
    let rig = Rig::new().await;
    // Through the store: owned by this host.
    let b = rig.backend();
    let c = b.claim_resume("e2b_x").await.unwrap().unwrap();
    assert_eq!(c.owner, HOST);
    let other = ManagerBackend::with_claims(
        rig.manager.clone(),
        "key".into(),
        Claims::new(
            Arc::new(crate::claims::StoreLeases(rig.store.clone())),
            "host-b",
        ),
    );
    assert_eq!(other.claim_resume("e2b_x").await.unwrap(), None);
    b.release_resume(c).await;
    assert!(other.claim_resume("e2b_x").await.unwrap().is_some());
    // Or the caller's leases.
    let fake = Arc::new(FakeLeases::default());
    let f = ManagerBackend::with_claims(
        rig.manager.clone(),
        "key".into(),
        Claims::new(fake.clone(), HOST),
    );
    f.claim_resume("e2b_y").await.unwrap().unwrap();
    assert!(fake.held.lock().unwrap().contains_key("e2b-resume:e2b_y"));
}
