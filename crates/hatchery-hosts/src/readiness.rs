//! `GET /readyz` on every role, without auth (what a load balancer or
//! systemd asks): a host is ready once it has reconciled, listens and
//! holds its lease; the control plane once its database answers and at
//! least one host is `ready`; the `all` role needs both. 200 with every
//! check, or 503 naming the failing ones.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use hatchery_store::{HostState, Store};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use utoipa::ToSchema;

/// Contract: whether this process still holds its host lease (it stops
/// serving when it does not).
pub trait LeaseHolder: Send + Sync {
    fn lease_held(&self) -> bool;
}

impl LeaseHolder for hatchery_core::Manager {
    fn lease_held(&self) -> bool {
        hatchery_core::Manager::lease_held(self)
    }
}

/// A host's own readiness: set by the daemon as it starts.
pub struct HostChecks {
    pub reconciled: AtomicBool,
    pub listening: AtomicBool,
    /// Told to stop (SIGTERM): not ready again in this process.
    pub stopping: AtomicBool,
    pub lease: Arc<dyn LeaseHolder>,
}

impl HostChecks {
    pub fn new(lease: Arc<dyn LeaseHolder>) -> Arc<HostChecks> {
        Arc::new(HostChecks {
            reconciled: AtomicBool::new(false),
            listening: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            lease,
        })
    }

    fn checks(&self) -> Vec<Check> {
        let flag = |name: &str, ok: bool, no: &str| Check::new(name, ok, if ok { "" } else { no });
        vec![
            flag(
                "reconciled",
                self.reconciled.load(Ordering::SeqCst),
                "still reconciling its sandboxes with the store",
            ),
            flag(
                "listening",
                self.listening.load(Ordering::SeqCst),
                "its API listener is not bound yet",
            ),
            flag(
                "not_stopping",
                !self.stopping.load(Ordering::SeqCst),
                "it was told to stop and is moving its sessions to other hosts",
            ),
            flag(
                "lease_held",
                self.lease.lease_held(),
                "its host lease was lost or taken over",
            ),
        ]
    }
}

/// The control plane's readiness: the shared store and its hosts.
#[derive(Clone)]
pub struct ControlChecks {
    pub store: Arc<dyn Store>,
    pub lease_ttl_ms: u64,
}

impl ControlChecks {
    async fn checks(&self) -> Vec<Check> {
        match self.store.list_hosts().await {
            Err(e) => vec![
                Check::new("database", false, &e.to_string()),
                Check::new("ready_host", false, "unknown: the database did not answer"),
            ],
            Ok(hosts) => {
                let ready = hosts
                    .iter()
                    .filter(|h| {
                        h.state(crate::alive(h.silent_for_ms, self.lease_ttl_ms))
                            == HostState::Ready
                    })
                    .count();
                let detail = format!("{ready} of {} registered hosts ready", hosts.len());
                vec![
                    Check::new("database", true, ""),
                    Check::new("ready_host", ready > 0, &detail),
                ]
            }
        }
    }
}

/// What `/readyz` checks: a host's own state, the control plane's, or
/// both (role `all`).
#[derive(Clone, Default)]
pub struct ReadyChecks {
    pub host: Option<Arc<HostChecks>>,
    pub control: Option<ControlChecks>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Check {
    pub name: String,
    pub ok: bool,
    /// Why it failed (or, for some, what was seen); empty otherwise.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

impl Check {
    fn new(name: &str, ok: bool, detail: &str) -> Check {
        Check {
            name: name.into(),
            ok,
            detail: detail.into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Readiness {
    pub ready: bool,
    pub checks: Vec<Check>,
    /// The names of the failing checks (empty when ready).
    pub failing: Vec<String>,
}

/// Ready when every check passes (and there is at least one).
pub fn judge(checks: Vec<Check>) -> (StatusCode, Readiness) {
    let failing: Vec<String> = checks
        .iter()
        .filter(|c| !c.ok)
        .map(|c| c.name.clone())
        .collect();
    let ready = failing.is_empty() && !checks.is_empty();
    let status = match ready {
        true => StatusCode::OK,
        false => StatusCode::SERVICE_UNAVAILABLE,
    };
    (
        status,
        Readiness {
            ready,
            checks,
            failing,
        },
    )
}

impl ReadyChecks {
    pub async fn run(&self) -> (StatusCode, Readiness) {
        let mut checks = Vec::new();
        if let Some(h) = &self.host {
            checks.extend(h.checks());
        }
        if let Some(c) = &self.control {
            checks.extend(c.checks().await);
        }
        judge(checks)
    }
}

pub fn router(st: ReadyChecks) -> Router {
    Router::new().route("/readyz", get(readyz)).with_state(st)
}

#[utoipa::path(get, path = "/readyz", tag = "hosts", security(()),
    description = "No auth. Host: reconciled, listening, not stopping, lease held. Control: database reachable and at least one ready host. Role `all`: both.",
    responses((status = 200, body = Readiness), (status = 503, body = Readiness)))]
pub async fn readyz(State(st): State<ReadyChecks>) -> Response {
    let (status, body) = st.run().await;
    if status != StatusCode::OK {
        tracing::debug!(failing = ?body.failing, "not ready");
    }
    (status, Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Lease(AtomicBool);
    impl LeaseHolder for Lease {
        fn lease_held(&self) -> bool {
            self.0.load(Ordering::SeqCst)
        }
    }

    #[test]
    fn ready_only_when_every_check_passes() {
        let (s, r) = judge(vec![Check::new("a", true, ""), Check::new("b", true, "")]);
        assert_eq!((s, r.ready, r.failing.len()), (StatusCode::OK, true, 0));
        let (s, r) = judge(vec![Check::new("a", true, ""), Check::new("b", false, "x")]);
        assert_eq!((s, r.ready), (StatusCode::SERVICE_UNAVAILABLE, false));
        assert_eq!(r.failing, ["b"]);
        // Nothing checked is not ready.
        assert_eq!(judge(vec![]).0, StatusCode::SERVICE_UNAVAILABLE);
    }

    #[tokio::test]
    async fn a_host_is_ready_once_reconciled_listening_and_holding_its_lease() {
        let lease = Arc::new(Lease(AtomicBool::new(true)));
        let h = HostChecks::new(lease.clone());
        let checks = ReadyChecks {
            host: Some(h.clone()),
            control: None,
        };
        let (_, r) = checks.run().await;
        assert_eq!(r.failing, ["reconciled", "listening"]);
        h.reconciled.store(true, Ordering::SeqCst);
        assert_eq!(checks.run().await.1.failing, ["listening"]);
        h.listening.store(true, Ordering::SeqCst);
        assert_eq!(checks.run().await.0, StatusCode::OK);
        h.stopping.store(true, Ordering::SeqCst);
        assert_eq!(checks.run().await.1.failing, ["not_stopping"]);
        h.stopping.store(false, Ordering::SeqCst);
        lease.0.store(false, Ordering::SeqCst);
        let (s, r) = checks.run().await;
        assert_eq!(
            (s, r.failing),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                vec!["lease_held".to_string()]
            )
        );
    }
}
