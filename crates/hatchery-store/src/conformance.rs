//! The contract of a [`Store`], run against every backend: SQLite and
//! PostgreSQL (crates/hatchery-store/tests/conformance.rs starts a private
//! server). Ids are unique per run, so a database may be reused.

use crate::rows::{
    Fence, SandboxFilter, SandboxRow, SandboxState, SnapshotKind, SnapshotLocation, SnapshotRow,
};
use crate::{host_resource, HostHold, Store, StoreError};
use hatchery_db::race;
use std::collections::BTreeMap;
use std::sync::Arc;

const TTL: u64 = 30_000;

pub async fn run_all(s: Arc<dyn Store>) {
    let run = format!("{:08x}", rand::random::<u32>());
    lifecycle_is_guarded(&*s, &run).await;
    pooled_sandboxes_are_claimed_once(&*s, &run).await;
    expiry_and_reconcile_see_only_their_host(&*s, &run).await;
    metadata_filters_run_in_sql(&*s, &run).await;
    snapshots(&*s, &run).await;
    shared_snapshots_belong_to_every_host(&s, &run).await;
    network_slots(&*s, &run).await;
    snapshot_pools_are_per_host(&*s, &run).await;
    leases_grow_and_fence(&*s, &run).await;
    stale_epoch_writes_are_refused(&*s, &run).await;
    racing_takes_have_one_winner(&s, &run).await;
    no_write_lands_after_a_takeover(&s, &run).await;
    hosts_register_and_beat(&*s, &run).await;
    host_states_are_guarded(&*s, &run).await;
    stopped_rows_say_when_and_why(&*s, &run).await;
    live_counted_per_host(&*s, &run).await;
    the_first_secret_is_kept(&s, &run).await;
}

/// Daemons starting at once each offer a secret; all get the same one,
/// and a later offer never replaces it.
async fn the_first_secret_is_kept(s: &Arc<dyn Store>, run: &str) {
    let name = format!("daemon-key-{run}");
    let got = race(4, |n| {
        let (s, name) = (s.clone(), name.clone());
        async move {
            s.deployment_secret(&name, &format!("offer{n}"))
                .await
                .unwrap()
        }
    })
    .await;
    assert!(got[0].starts_with("offer"), "{got:?}");
    assert!(got.iter().all(|g| *g == got[0]), "{got:?}");
    assert_eq!(s.deployment_secret(&name, "later").await.unwrap(), got[0]);
    let other = format!("other-{run}");
    assert_eq!(s.deployment_secret(&other, "x").await.unwrap(), "x");
}

fn local(host: &str) -> SnapshotLocation {
    SnapshotLocation::Local { host: host.into() }
}

async fn host(s: &dyn Store, name: &str) -> Fence {
    Fence::of(&s.take_lease(&host_resource(name), name, TTL).await.unwrap())
}

/// Two hosts, named `a` and `b` in this run.
async fn hosts(s: &dyn Store, a: &str, b: &str, run: &str) -> (Fence, Fence) {
    let a = host(s, &format!("{a}{run}")).await;
    (a, host(s, &format!("{b}{run}")).await)
}

fn ids(rows: Vec<SandboxRow>) -> Vec<String> {
    rows.into_iter().map(|r| r.id).collect()
}

fn md(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn sbx(id: &str, state: SandboxState, pairs: &[(&str, &str)]) -> SandboxRow {
    SandboxRow {
        id: id.into(),
        template: "tpl".into(),
        state,
        created_at_ms: 1000,
        expires_at_ms: 5000,
        metadata: md(pairs),
        env: md(&[("E", "1")]),
        host_id: "ignored".into(),
        template_version: "v1".into(),
        rootfs: "/var/lib/hatchery/templates/t/v1/rootfs".into(),
        limits: "{}".into(),
    }
}

/// A snapshot of `sandbox_id` that expires at 10. The store records the
/// writer as its host, whatever `host_id` (and a local `location`) say.
fn snap(id: &str, sandbox_id: &str, location: SnapshotLocation) -> SnapshotRow {
    SnapshotRow {
        id: id.into(),
        sandbox_id: sandbox_id.into(),
        template: "t".into(),
        created_at_ms: 5,
        expires_at_ms: 10,
        size_bytes: 1,
        metadata: BTreeMap::new(),
        env: BTreeMap::new(),
        rootfs: "/r".into(),
        limits: "{}".into(),
        template_version: "v1".into(),
        host_id: String::new(),
        location,
        kind: SnapshotKind::Memory,
    }
}

async fn lifecycle_is_guarded(s: &dyn Store, run: &str) {
    use SandboxState::*;
    let f = host(s, &format!("h1{run}")).await;
    let id = format!("sbx_l{run}");
    let row = sbx(&id, Starting, &[("k", "v")]);
    s.insert_sandbox(&f, &row).await.unwrap();
    let got = s.get_live(&id).await.unwrap().expect("live");
    assert_eq!((got.state, &got.host_id), (Starting, &f.owner));
    assert_eq!(got.env["E"], "1");
    let booted_on = (&got.template_version, &got.rootfs, &got.limits);
    assert_eq!(booted_on, (&row.template_version, &row.rootfs, &row.limits));
    assert!(s.transition(&f, &id, &[Starting], Running).await.unwrap());
    let again = s.transition(&f, &id, &[Starting], Running).await;
    assert!(!again.unwrap(), "no longer starting");
    let back = s.transition(&f, &id, &[Running], Starting).await;
    assert!(matches!(back, Err(StoreError::InvalidTransition { .. })));
    assert!(s.set_expiry(&f, &id, 9000).await.unwrap());
    assert!(s.stop(&f, &id, "deleted", 2000).await.unwrap());
    let again = s.stop(&f, &id, "deleted", 2001).await;
    assert!(!again.unwrap(), "idempotent");
    // A late "running" (a boot that finished after the delete) is refused.
    let late = s.transition(&f, &id, &[Starting, Running], Running).await;
    assert!(!late.unwrap());
    assert!(!s.set_expiry(&f, &id, 9999).await.unwrap());
    assert!(s.get_live(&id).await.unwrap().is_none());
    let ev = s.events(&id).await.unwrap();
    let kinds: Vec<&str> = ev.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["created", "running", "ttl", "stopped"]);
    assert!(ev.windows(2).all(|w| w[0].seq < w[1].seq));
    assert!(ev.iter().all(|e| e.epoch == f.epoch));
    assert_eq!(ev[3].detail, "deleted");
}

async fn pooled_sandboxes_are_claimed_once(s: &dyn Store, run: &str) {
    use SandboxState::*;
    let f = host(s, &format!("h2{run}")).await;
    let id = format!("sbx_p{run}");
    let row = sbx(&id, Starting, &[]);
    s.insert_sandbox(&f, &row).await.unwrap();
    assert!(s.transition(&f, &id, &[Starting], Pooled).await.unwrap());
    let pooled = s.get_live(&id).await.unwrap();
    assert!(pooled.is_none(), "pooled is invisible");
    let mut claim = sbx(&id, Running, &[("owner", "me")]);
    claim.created_at_ms = 7000;
    claim.expires_at_ms = 8000;
    // A claim takes the pooled sandbox as it was booted.
    claim.rootfs = "/elsewhere".into();
    assert!(s.claim(&f, &claim).await.unwrap());
    assert!(!s.claim(&f, &claim).await.unwrap(), "only once");
    let got = s.get_live(&id).await.unwrap().unwrap();
    let times = (got.created_at_ms, got.expires_at_ms);
    assert_eq!((got.state, times), (Running, (7000, 8000)));
    assert_eq!(got.metadata["owner"], "me");
    assert_eq!(
        got.rootfs, row.rootfs,
        "the claim keeps what it was booted on"
    );
}

async fn expiry_and_reconcile_see_only_their_host(s: &dyn Store, run: &str) {
    use SandboxState::*;
    let (a, b) = hosts(s, "ha", "hb", run).await;
    let (ia, ib) = (format!("sbx_ea{run}"), format!("sbx_eb{run}"));
    s.insert_sandbox(&a, &sbx(&ia, Running, &[])).await.unwrap();
    s.insert_sandbox(&b, &sbx(&ib, Running, &[])).await.unwrap();
    assert!(s.expired(&a.owner, 4999).await.unwrap().is_empty());
    assert_eq!(s.expired(&a.owner, 5000).await.unwrap(), vec![ia.clone()]);
    assert_eq!(s.expired(&b.owner, 5000).await.unwrap(), vec![ib.clone()]);
    assert_eq!(ids(s.list_unstopped(&a.owner).await.unwrap()), vec![ia]);
    // Host a cannot touch host b's row, whatever it asks for.
    assert!(!s.stop(&a, &ib, "lost", 1).await.unwrap());
    assert!(!s.set_expiry(&a, &ib, 1).await.unwrap());
    assert!(!s.transition(&a, &ib, &[Running], Stopped).await.unwrap());
    assert!(s.get_live(&ib).await.unwrap().is_some());
    assert!(s.stop(&b, &ib, "ttl", 5001).await.unwrap());
    assert!(s.expired(&b.owner, 6000).await.unwrap().is_empty());
}

async fn metadata_filters_run_in_sql(s: &dyn Store, run: &str) {
    use SandboxState::*;
    let f = host(s, &format!("hm{run}")).await;
    let tag = format!("t{run}");
    let odd = "we\"ird.key'$[0]";
    let run_tag = ("run", tag.as_str());
    let teams = [("a", None), ("b", Some("x")), ("a", Some("y"))];
    let mut all = Vec::new();
    for (n, (team, odd_value)) in teams.into_iter().enumerate() {
        let mut pairs = vec![run_tag, ("team", team)];
        pairs.extend(odd_value.map(|v| (odd, v)));
        all.push(format!("sbx_m{n}{run}"));
        s.insert_sandbox(&f, &sbx(&all[n], Running, &pairs))
            .await
            .unwrap();
    }
    // The ids `filter` lists (with `template`, if given).
    let live = |pairs: &[(&str, &str)], template: Option<&str>| {
        let filter = SandboxFilter {
            metadata: md(pairs),
            template: template.map(Into::into),
        };
        async move { ids(s.list_live(&filter).await.unwrap()) }
    };
    assert_eq!(live(&[run_tag], None).await, all);
    let team_a = live(&[run_tag, ("team", "a")], None).await;
    assert_eq!(team_a, [all[0].clone(), all[2].clone()]);
    assert_eq!(live(&[run_tag, (odd, "x")], None).await, [all[1].clone()]);
    assert!(live(&[run_tag, ("team", "a'; --")], None).await.is_empty());
    assert!(live(&[run_tag], Some("other")).await.is_empty());
    assert_eq!(live(&[run_tag], Some("tpl")).await, all);
    s.stop(&f, &all[0], "deleted", 1).await.unwrap();
    assert_eq!(live(&[run_tag], None).await.len(), 2);
}

async fn snapshots(s: &dyn Store, run: &str) {
    let (a, b) = hosts(s, "hs", "ht", run).await;
    let tpl = format!("tpl{run}");
    let snap = |id: &str, exp: u64, pairs: &[(&str, &str)]| SnapshotRow {
        template: tpl.clone(),
        created_at_ms: exp - 10,
        expires_at_ms: exp,
        size_bytes: 1 << 40,
        metadata: md(pairs),
        limits: "{\"cpus\":1}".into(),
        // The store records the writer, not this.
        ..snap(id, &format!("sbx_s{run}"), local("someone-else"))
    };
    let (s1, s2) = (format!("snap_1{run}"), format!("snap_2{run}"));
    let (one, two) = (&[("r", run)][..], &[("r", run), ("k", "v")][..]);
    s.insert_snapshot(&a, &snap(&s1, 100, one)).await.unwrap();
    let files_only = SnapshotRow {
        kind: SnapshotKind::Files,
        ..snap(&s2, 200, two)
    };
    s.insert_snapshot(&b, &files_only).await.unwrap();
    let got2 = s.get_snapshot(&s2).await.unwrap().unwrap();
    assert_eq!(got2.kind, SnapshotKind::Files);
    let got = s.get_snapshot(&s1).await.unwrap().unwrap();
    assert_eq!(got.kind, SnapshotKind::Memory);
    assert_eq!((got.size_bytes, &*got.host_id), (1 << 40, &*a.owner));
    assert_eq!(got.limits, "{\"cpus\":1}");
    assert_eq!(got.location, local(&a.owner));
    assert_eq!(s.count_snapshots_of(&tpl).await.unwrap(), 2);
    // Each location's bytes, for its storage cap: a's and b's apart.
    assert_eq!(s.snapshot_bytes(&local(&a.owner)).await.unwrap(), 1 << 40);
    assert_eq!(s.snapshot_bytes(&local(&b.owner)).await.unwrap(), 1 << 40);
    assert_eq!(s.list_snapshots(&md(one)).await.unwrap().len(), 2);
    let l = s.list_snapshots(&md(two)).await.unwrap();
    assert_eq!(l.iter().map(|r| &r.id).collect::<Vec<_>>(), [&s2]);
    let expired = s.expired_snapshots(&a.owner, 1000).await.unwrap();
    assert_eq!(expired, vec![s1.clone()]);
    assert!(!s.delete_snapshot(&a, &s2).await.unwrap(), "not a's");
    assert!(s.delete_snapshot(&a, &s1).await.unwrap());
    assert!(!s.delete_snapshot(&a, &s1).await.unwrap());
    assert!(s.get_snapshot(&s1).await.unwrap().is_none());
    assert_eq!(s.snapshot_bytes(&local(&a.owner)).await.unwrap(), 0);
    assert!(s.delete_snapshot(&b, &s2).await.unwrap());
}

/// A shared snapshot is any host's: any host may delete its row (exactly
/// one of several racing deleters wins), it is listed by the shared expiry
/// and not by its writer's local one, and a stale writer still cannot
/// touch it.
async fn shared_snapshots_belong_to_every_host(s: &Arc<dyn Store>, run: &str) {
    let (a, b) = hosts(&**s, "hu", "hv", run).await;
    let (sh, lo) = (format!("snap_sh{run}"), format!("snap_lo{run}"));
    let sbx = format!("sbx_u{run}");
    let shared = snap(&sh, &sbx, SnapshotLocation::Shared);
    s.insert_snapshot(&a, &shared).await.unwrap();
    let local_b = snap(&lo, &sbx, local(&b.owner));
    s.insert_snapshot(&a, &local_b).await.unwrap();
    let got = s.get_snapshot(&sh).await.unwrap().unwrap();
    assert_eq!(got.location, SnapshotLocation::Shared);
    assert_eq!(got.host_id, a.owner);
    // Counted with every shared snapshot (other runs' too), not a's local.
    let shared_bytes = s.snapshot_bytes(&SnapshotLocation::Shared).await.unwrap();
    assert!(shared_bytes >= got.size_bytes, "{shared_bytes}");
    let lrow = s.get_snapshot(&lo).await.unwrap().unwrap();
    assert_eq!(lrow.location.as_string(), format!("local:{}", a.owner));
    // Expiry: the writer's local sweep lists only its local one; every
    // host's shared sweep lists the shared one.
    let expired = s.expired_snapshots(&a.owner, 100).await.unwrap();
    assert_eq!(expired, vec![lo.clone()]);
    assert!(s.expired_snapshots(&b.owner, 100).await.unwrap().is_empty());
    let shared: Vec<String> = s.expired_shared_snapshots(100).await.unwrap();
    assert!(shared.contains(&sh) && !shared.contains(&lo), "{shared:?}");
    assert!(!s.expired_shared_snapshots(9).await.unwrap().contains(&sh));
    // b cannot delete a's local snapshot.
    assert!(!s.delete_snapshot(&b, &lo).await.unwrap());
    // A stale incarnation of b cannot delete the shared one either.
    let b_new = host(&**s, &b.owner).await;
    let stale = s.delete_snapshot(&b, &sh).await;
    assert!(matches!(stale, Err(StoreError::Fenced { .. })));
    // Hosts sweeping at once: exactly one delete removes the row.
    let won = race(4, |n| {
        let (s, id, f) = (Arc::clone(s), sh.clone(), [&a, &b_new][n % 2].clone());
        async move { s.delete_snapshot(&f, &id).await.unwrap() }
    })
    .await;
    assert_eq!(won.iter().filter(|w| **w).count(), 1, "one deleter wins");
    assert!(s.get_snapshot(&sh).await.unwrap().is_none());
    assert!(s.delete_snapshot(&a, &lo).await.unwrap());
}

async fn network_slots(s: &dyn Store, run: &str) {
    let (a, b) = hosts(s, "hn", "ho", run).await;
    let (x, y) = (format!("sbx_nx{run}"), format!("sbx_ny{run}"));
    s.set_net(&a, &x, 7, "{}", false).await.unwrap();
    s.set_net(&a, &x, 7, "{\"allow\":1}", true).await.unwrap();
    s.set_net(&b, &y, 3, "{}", false).await.unwrap();
    let na = s.all_net(&a.owner).await.unwrap();
    assert_eq!((na.len(), na[0].slot), (1, 7));
    assert_eq!(na[0].policy, "{\"allow\":1}");
    // One event, for the recorded policy change.
    let ev = s.events(&x).await.unwrap();
    assert_eq!((ev.len(), &*ev[0].kind), (1, "network_policy"));
    s.clear_net(&a, &y).await.unwrap(); // not a's: untouched
    assert_eq!(s.all_net(&b.owner).await.unwrap().len(), 1);
    s.clear_net(&a, &x).await.unwrap();
    assert!(s.all_net(&a.owner).await.unwrap().is_empty());
}

async fn snapshot_pools_are_per_host(s: &dyn Store, run: &str) {
    let (a, b) = hosts(s, "hp", "hq", run).await;
    let (x, y) = (format!("snp_px{run}"), format!("snp_py{run}"));
    s.set_snapshot_pool(&a, &x, 2, 10).await.unwrap();
    s.set_snapshot_pool(&a, &y, 1, 11).await.unwrap();
    s.set_snapshot_pool(&b, &x, 3, 12).await.unwrap();
    // Asked again: the newer size and time replace the row.
    s.set_snapshot_pool(&a, &x, 4, 20).await.unwrap();
    let pa = s.snapshot_pools(&a.owner).await.unwrap();
    let got: Vec<_> = pa
        .iter()
        .map(|p| (p.snapshot_id.as_str(), p.size, p.touched_at_ms))
        .collect();
    assert_eq!(got, [(x.as_str(), 4, 20), (y.as_str(), 1, 11)]);
    s.set_snapshot_pool(&a, &x, 0, 30).await.unwrap();
    let pa = s.snapshot_pools(&a.owner).await.unwrap();
    assert_eq!(pa.len(), 1);
    assert_eq!(pa[0].snapshot_id, y);
    // b's own wish is untouched by a's.
    assert_eq!(s.snapshot_pools(&b.owner).await.unwrap()[0].size, 3);
    // A replaced owner cannot write under the old fence.
    let b_new = Fence::of(&s.take_lease(&b.resource, &b.owner, 60_000).await.unwrap());
    let stale = s.set_snapshot_pool(&b, &x, 1, 40).await;
    assert!(matches!(stale, Err(StoreError::Fenced { .. })), "{stale:?}");
    s.set_snapshot_pool(&b_new, &x, 0, 41).await.unwrap();
    assert!(s.snapshot_pools(&b.owner).await.unwrap().is_empty());
}

async fn leases_grow_and_fence(s: &dyn Store, run: &str) {
    let r = format!("session:l{run}");
    let l1 = s.take_lease(&r, "A", 60_000).await.unwrap();
    assert_eq!((l1.epoch, l1.owner.as_str()), (1, "A"));
    assert!((50_001..=60_000).contains(&l1.valid_for_ms), "{l1:?}");
    match s.take_lease(&r, "B", 60_000).await {
        Err(StoreError::LeaseHeld { owner, for_ms, .. }) => {
            assert_eq!(owner, "A");
            assert!(for_ms > 0);
        }
        other => panic!("B took a held lease: {other:?}"),
    }
    let renewed = s.renew_lease(&Fence::of(&l1), 90_000).await.unwrap();
    assert_eq!(renewed.epoch, 1);
    assert!(renewed.expires_at_ms >= l1.expires_at_ms);
    // A restarted A takes it again: a new epoch fences the old incarnation.
    let l2 = s.take_lease(&r, "A", 60_000).await.unwrap();
    assert_eq!(l2.epoch, 2);
    let renewed = s.renew_lease(&Fence::of(&l1), 1000).await;
    assert!(renewed.unwrap_err().is_fenced());
    assert!(!s.release_lease(&Fence::of(&l1)).await.unwrap());
    assert!(s.release_lease(&Fence::of(&l2)).await.unwrap());
    // Released: B may take it, and the epoch still grows.
    let l3 = s.take_lease(&r, "B", 60_000).await.unwrap();
    assert_eq!((l3.epoch, l3.owner.as_str()), (3, "B"));
    assert_eq!(s.get_lease(&r).await.unwrap().unwrap().epoch, 3);
    // An expired lease (by the database's clock) is free for anyone.
    let r2 = format!("session:x{run}");
    let e1 = s.take_lease(&r2, "A", 1).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    let e2 = s.take_lease(&r2, "B", 60_000).await.unwrap();
    assert_eq!((e1.epoch, e2.epoch, &*e2.owner), (1, 2, "B"));
    let none = s.get_lease(&format!("session:none{run}")).await;
    assert!(none.unwrap().is_none());
}

async fn stale_epoch_writes_are_refused(s: &dyn Store, run: &str) {
    use SandboxState::*;
    let name = format!("hf{run}");
    let old = host(s, &name).await;
    let id = format!("sbx_f{run}");
    let row = sbx(&id, Starting, &[]);
    s.insert_sandbox(&old, &row).await.unwrap();
    let new = host(s, &name).await; // the host restarted
    assert_eq!(new.epoch, old.epoch + 1);
    let (e, o, idx) = ((old.epoch, new.epoch), &old, format!("{id}x"));
    let inserted = s.insert_sandbox(o, &sbx(&idx, Starting, &[])).await;
    refused(e, inserted, "insert");
    let moved = s.transition(o, &id, &[Starting], Running).await;
    refused(e, moved, "transition");
    refused(e, s.stop(o, &id, "late", 1).await, "stop");
    refused(e, s.claim(o, &sbx(&id, Running, &[])).await, "claim");
    refused(e, s.set_expiry(o, &id, 1).await, "set_expiry");
    refused(e, s.append_event(o, &id, "late", "").await, "event");
    refused(e, s.set_net(o, &id, 1, "{}", true).await, "set_net");
    refused(e, s.clear_net(o, &id).await, "clear_net");
    let snap = snap(&format!("snap_f{run}"), &id, SnapshotLocation::Shared);
    refused(e, s.insert_snapshot(o, &snap).await, "insert_snapshot");
    refused(e, s.delete_snapshot(o, &snap.id).await, "delete_snapshot");
    refused(e, s.renew_lease(o, 1000).await, "renew");
    // Nothing of the refused writes is visible.
    assert!(s.get_live(&idx).await.unwrap().is_none());
    assert_eq!(s.get_live(&id).await.unwrap().unwrap().state, Starting);
    assert_eq!(s.events(&id).await.unwrap().len(), 1);
    assert!(s.all_net(&name).await.unwrap().is_empty());
    assert!(s.get_snapshot(&snap.id).await.unwrap().is_none());
    // The new incarnation writes as usual.
    assert!(s.transition(&new, &id, &[Starting], Running).await.unwrap());
}

/// `r` is a stale writer's, refused as `Fenced` at `epochs` (held, current).
fn refused<T: std::fmt::Debug>(epochs: (u64, u64), r: Result<T, StoreError>, what: &str) {
    match r {
        Err(StoreError::Fenced { held, current, .. }) => {
            assert_eq!((held, current), epochs, "{what}");
        }
        other => panic!("{what}: a stale writer got {other:?}"),
    }
}

async fn racing_takes_have_one_winner(s: &Arc<dyn Store>, run: &str) {
    let r = format!("session:race{run}");
    let takes = race(8, |n| {
        let (s, r) = (Arc::clone(s), r.clone());
        async move { s.take_lease(&r, &format!("host{n}"), 60_000).await }
    });
    let mut won = Vec::new();
    for t in takes.await {
        match t {
            Ok(l) => won.push(l),
            Err(StoreError::LeaseHeld { .. }) => {}
            // SQLite's one writer can time out under a pile-up; that is a
            // refusal, never a second winner.
            Err(StoreError::Unavailable(_)) => {}
            Err(e) => panic!("take: {e}"),
        }
    }
    assert_eq!(won.len(), 1, "{won:?}");
    assert_eq!(won[0].epoch, 1);
}

/// Host A appends events as fast as it can while B takes A's lease over.
/// Every event A committed must come before B's first, and none of A's
/// writes may succeed once B's take has returned.
async fn no_write_lands_after_a_takeover(s: &Arc<dyn Store>, run: &str) {
    let r = format!("session:t{run}");
    let id = format!("sbx_t{run}");
    let a = Fence::of(&s.take_lease(&r, "A", 1).await.unwrap());
    let taken = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (s, a, id, taken) = (Arc::clone(s), a.clone(), id.clone(), Arc::clone(&taken));
        tokio::spawn(async move {
            let (mut ok, mut ok_after) = (0, 0);
            for n in 0..10_000 {
                let seen_taken = taken.load(std::sync::atomic::Ordering::SeqCst);
                match s.append_event(&a, &id, "a", &n.to_string()).await {
                    Ok(_) => (ok, ok_after) = (ok + 1, ok_after + seen_taken as usize),
                    Err(e) if e.is_fenced() => return (ok, ok_after),
                    Err(StoreError::Unavailable(_)) => {}
                    Err(e) => panic!("append: {e}"),
                }
                tokio::task::yield_now().await;
            }
            (ok, ok_after)
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let b = loop {
        match s.take_lease(&r, "B", 60_000).await {
            Ok(l) => break Fence::of(&l),
            Err(StoreError::Unavailable(_)) => continue,
            Err(e) => panic!("takeover: {e}"),
        }
    };
    taken.store(true, std::sync::atomic::Ordering::SeqCst);
    s.append_event(&b, &id, "b", "").await.unwrap();
    let (ok, ok_after) = writer.await.unwrap();
    assert!(ok > 0, "A wrote nothing before the takeover");
    assert_eq!(ok_after, 0, "A wrote after B's take returned");
    let ev = s.events(&id).await.unwrap();
    let first_b = ev.iter().position(|e| e.kind == "b").unwrap();
    assert!(ev[..first_b].iter().all(|e| e.epoch == a.epoch));
    assert!(ev[first_b..].iter().all(|e| e.epoch == b.epoch));
    assert!(b.epoch > a.epoch);
    assert_eq!(ev.len(), ok + 1, "every acknowledged write is there");
}

async fn hosts_register_and_beat(s: &dyn Store, run: &str) {
    let name = format!("reg-{run}");
    let f = host(s, &name).await;
    let beat = s.heartbeat(&f, 0, &[]).await;
    assert!(!beat.unwrap(), "not registered yet");
    s.register_host(&f, "127.0.0.1:7423", 64, "1.0")
        .await
        .unwrap();
    let mine = |v: Vec<crate::HostRow>| v.into_iter().find(|h| h.id == name).expect("listed");
    let h = mine(s.list_hosts().await.unwrap());
    let expect = ("127.0.0.1:7423", 64, 0, f.epoch);
    assert_eq!((&*h.address, h.capacity, h.live, h.epoch), expect);
    assert_eq!(
        (h.ready, h.hold, &*h.version),
        (false, HostHold::None, "1.0")
    );
    tokio::time::sleep(std::time::Duration::from_millis(60)).await;
    let h = mine(s.list_hosts().await.unwrap());
    assert!(h.silent_for_ms >= 40, "{h:?}");
    assert!(h.warm_templates.is_empty(), "{h:?}");
    let warm = vec!["code-interpreter".to_string(), "node".to_string()];
    assert!(s.heartbeat(&f, 5, &warm).await.unwrap());
    let h = mine(s.list_hosts().await.unwrap());
    assert_eq!((h.live, &h.warm_templates), (5, &warm));
    assert!(h.silent_for_ms < 40, "{h:?}");
    // Not a host lease, or another host's name: refused before any SQL.
    let session = s.take_lease(&format!("session:r{run}"), &name, TTL).await;
    let session = Fence::of(&session.unwrap());
    assert!(s.register_host(&session, "x", 1, "").await.is_err());
    let other = Fence {
        resource: host_resource(&name),
        owner: format!("other-{run}"),
        epoch: f.epoch,
    };
    assert!(s.register_host(&other, "x", 1, "").await.is_err());
    let bad = s.take_lease("host:Bad Name", "Bad Name", TTL).await;
    let bad = Fence::of(&bad.unwrap());
    assert!(s.register_host(&bad, "x", 1, "").await.is_err());
    // A restarted incarnation re-registers; the old one is fenced off.
    let f2 = host(s, &name).await;
    assert!(s.heartbeat(&f, 1, &[]).await.unwrap_err().is_fenced());
    assert!(s
        .register_host(&f, "x", 1, "")
        .await
        .unwrap_err()
        .is_fenced());
    s.register_host(&f2, "127.0.0.1:7424", 32, "1.1")
        .await
        .unwrap();
    let h = mine(s.list_hosts().await.unwrap());
    assert_eq!((h.address.as_str(), h.epoch), ("127.0.0.1:7424", f2.epoch));
}

async fn live_counted_per_host(s: &dyn Store, run: &str) {
    use SandboxState::*;
    let (a, b) = hosts(s, "cnt-a", "cnt-b", run).await;
    let acme: &[(&str, &str)] = &[("tenant", "acme"), ("x", "1")];
    for (f, id, st, md) in [
        (&a, "1", Starting, acme),
        (&a, "2", Running, &[][..]),
        (&a, "3", Pooled, acme),
        (&b, "4", Running, acme),
        (&b, "5", Running, acme),
    ] {
        let row = sbx(&format!("sbx_c{id}{run}"), st, md);
        s.insert_sandbox(f, &row).await.unwrap();
    }
    let stopped = s.stop(&b, &format!("sbx_c5{run}"), "test", 1).await;
    assert!(stopped.unwrap());
    let n = s.live_per_host(&SandboxFilter::default()).await.unwrap();
    // Pooled and stopped ones do not count.
    assert_eq!((n.get(&a.owner), n.get(&b.owner)), (Some(&2), Some(&1)));
    assert_eq!(n.get(&format!("cnt-none{run}")), None);
    // One tenant's, by metadata (what placement spreads).
    let tenant = |v: &str| SandboxFilter {
        metadata: md(&[("tenant", v)]),
        template: None,
    };
    let n = s.live_per_host(&tenant("acme")).await.unwrap();
    assert_eq!((n.get(&a.owner), n.get(&b.owner)), (Some(&1), Some(&1)));
    assert!(s.live_per_host(&tenant("other")).await.unwrap().is_empty());
}

/// A host is `starting` until it says it is ready (under its own lease);
/// the operator's hold moves only along valid transitions, guarded by
/// the hold it moves from, and outlives the host's restart.
async fn host_states_are_guarded(s: &dyn Store, run: &str) {
    use HostHold::*;
    let name = format!("st-{run}");
    let f = host(s, &name).await;
    let mine = |v: Vec<crate::HostRow>| v.into_iter().find(|h| h.id == name).expect("listed");
    // Not registered: nothing to mark or hold.
    assert!(!s.host_ready(&f).await.unwrap());
    assert!(!s.hold_host(&name, &[None], Cordoned).await.unwrap());
    s.register_host(&f, "127.0.0.1:1", 4, "v1").await.unwrap();
    assert!(!mine(s.list_hosts().await.unwrap()).ready);
    assert!(s.host_ready(&f).await.unwrap());
    assert!(!s.host_ready(&f).await.unwrap(), "already ready");
    let h = mine(s.list_hosts().await.unwrap());
    assert_eq!((h.ready, h.state(true)), (true, crate::HostState::Ready));
    assert_eq!(h.state(false), crate::HostState::Lost);

    // Cordon, guarded by the hold it moves from.
    assert!(s.hold_host(&name, &[None], Cordoned).await.unwrap());
    assert!(!s.hold_host(&name, &[None], Cordoned).await.unwrap());
    assert!(s
        .hold_host(&name, &HostHold::sources(Cordoned), Cordoned)
        .await
        .unwrap());
    let h = mine(s.list_hosts().await.unwrap());
    assert_eq!(h.state(true), crate::HostState::Cordoned);
    // An invalid move is refused before any SQL.
    let bad = s.hold_host(&name, &[Draining], Cordoned).await;
    assert!(
        matches!(bad, Err(StoreError::InvalidHold { .. })),
        "{bad:?}"
    );
    assert!(s.hold_host(&name, &[Cordoned], Draining).await.unwrap());
    // A restart: starting again, the hold kept, the old epoch fenced.
    let f2 = host(s, &name).await;
    assert!(s.host_ready(&f).await.unwrap_err().is_fenced());
    s.register_host(&f2, "127.0.0.1:2", 4, "v2").await.unwrap();
    let h = mine(s.list_hosts().await.unwrap());
    assert_eq!((h.ready, h.hold, &*h.version), (false, Draining, "v2"));
    assert_eq!(h.state(true), crate::HostState::Starting);
    assert!(s.host_ready(&f2).await.unwrap());
    assert_eq!(
        mine(s.list_hosts().await.unwrap()).state(true),
        crate::HostState::Draining
    );
    assert!(s
        .hold_host(&name, &HostHold::sources(None), None)
        .await
        .unwrap());
    assert_eq!(
        mine(s.list_hosts().await.unwrap()).state(true),
        crate::HostState::Ready
    );
    assert!(!s
        .hold_host(&format!("nobody-{run}"), &[None], Cordoned)
        .await
        .unwrap());

    // Told to stop: draining whatever its hold, still routed (ready),
    // never placed on; the next registration makes it starting again.
    assert!(s.host_stopping(&f2).await.unwrap());
    let h = mine(s.list_hosts().await.unwrap());
    assert_eq!((h.ready, h.stopping), (true, true));
    assert_eq!(h.state(true), crate::HostState::Draining);
    assert!(h.state(true).routed() && !h.state(true).placeable());
    assert_eq!(h.state(false), crate::HostState::Lost);
    let f3 = host(s, &name).await;
    assert!(s.host_stopping(&f2).await.unwrap_err().is_fenced());
    s.register_host(&f3, "127.0.0.1:3", 4, "v3").await.unwrap();
    let h = mine(s.list_hosts().await.unwrap());
    assert_eq!((h.ready, h.stopping), (false, false));
}

async fn stopped_rows_say_when_and_why(s: &dyn Store, run: &str) {
    let f = host(s, &format!("end-{run}")).await;
    let id = format!("sbx_end{run}");
    s.insert_sandbox(&f, &sbx(&id, SandboxState::Running, &[]))
        .await
        .unwrap();
    assert_eq!(s.get_stopped(&id).await.unwrap(), None, "live");
    assert!(s.stop(&f, &id, "host_lost", 1234).await.unwrap());
    let (row, got) = s.get_stopped(&id).await.unwrap().expect("stopped");
    assert_eq!(row.id, id);
    assert_eq!(
        (&*got.host_id, got.ended_at_ms, &*got.end_reason),
        (&*f.owner, 1234, "host_lost")
    );
    assert_eq!(
        s.get_stopped(&format!("sbx_none{run}")).await.unwrap(),
        None
    );
    // Listed by reason and metadata, the latest ended first, capped.
    let tag = format!("t{run}");
    let mine = SandboxFilter {
        metadata: md(&[("lostrun", &tag)]),
        template: None,
    };
    for (n, at, why) in [
        (1, 10, "host_lost"),
        (2, 30, "host_lost"),
        (3, 20, "deleted"),
        (4, 40, "host_lost"),
    ] {
        let id = format!("sbx_ls{n}{run}");
        s.insert_sandbox(&f, &sbx(&id, SandboxState::Running, &[("lostrun", &tag)]))
            .await
            .unwrap();
        if n != 4 {
            assert!(s.stop(&f, &id, why, at).await.unwrap());
        }
    }
    let got = s.list_stopped(crate::HOST_LOST, &mine, 10).await.unwrap();
    let ids: Vec<_> = got
        .iter()
        .map(|(r, e)| (r.id.clone(), e.ended_at_ms))
        .collect();
    assert_eq!(
        ids,
        [(format!("sbx_ls2{run}"), 30), (format!("sbx_ls1{run}"), 10)],
        "only stopped host_lost rows, latest first; the live one is not"
    );
    let (row, end) = &got[0];
    assert_eq!(
        (&*row.template, &*end.end_reason, &*end.host_id),
        ("tpl", "host_lost", &*f.owner)
    );
    assert_eq!(
        s.list_stopped(crate::HOST_LOST, &mine, 1)
            .await
            .unwrap()
            .len(),
        1
    );
    let deleted = s.list_stopped("deleted", &mine, 10).await.unwrap();
    assert_eq!(deleted.len(), 1);
}
