//! The idle parker through a whole manager, on the fake runtime (whose
//! parked guest reads nothing until unparked, as a frozen cgroup).

use crate::caps::Caps;
use crate::manager_tests::{hold_bakes, req, Rig};
use std::time::Duration;

async fn parked_within(rig: &Rig, id: &str, d: Duration) -> bool {
    let end = tokio::time::Instant::now() + d;
    while tokio::time::Instant::now() < end {
        if rig.rt.is_parked(id) == Some(true) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test]
async fn an_unused_sandbox_is_parked_and_the_next_request_runs_it_again() {
    // Fails if an idle sandbox is never parked, if a request to a parked
    // one is not served (the fake guest reads nothing while parked), or
    // if a busy guest is parked.
    let rig = Rig::new().await;
    let caps = Caps {
        idle_park_ms: 500,
        ..Default::default()
    };
    let m = rig.manager_with(caps, 0).await;
    hold_bakes(&m);
    let _parker = m.spawn_idle_parker().expect("on");
    let info = m.create(req()).await.unwrap();
    assert!(parked_within(&rig, &info.id, Duration::from_secs(5)).await);
    assert_eq!(m.metrics.idle.parked.get(), 1);
    let read = tokio::time::timeout(Duration::from_secs(2), m.write_file(&info.id, "/w", b"x"));
    read.await
        .expect("a request to a parked sandbox hung")
        .unwrap();
    assert_eq!(rig.rt.is_parked(&info.id), Some(false));
    assert_eq!(m.metrics.idle.unparks.get(), 1);
    // A guest with work in it is left running, however long.
    rig.rt.set_busy(&info.id, true);
    assert!(!parked_within(&rig, &info.id, Duration::from_millis(1500)).await);
    rig.rt.set_busy(&info.id, false);
    assert!(parked_within(&rig, &info.id, Duration::from_secs(5)).await);
    // Stopping a parked sandbox takes it off the gauge.
    m.stop(&info.id, "deleted").await;
    assert_eq!(m.metrics.idle.parked.get(), 0);
}

#[tokio::test]
async fn zero_turns_parking_off() {
    let rig = Rig::new().await;
    let caps = Caps {
        idle_park_ms: 0,
        ..Default::default()
    };
    let m = rig.manager_with(caps, 0).await;
    assert!(m.spawn_idle_parker().is_none());
}
