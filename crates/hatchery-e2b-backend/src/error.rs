//! What can fail under the E2B backend, and which of E2B's failure kinds
//! (`hatchery_e2b::backend::FailKind`) each is: the protocol answers by
//! kind (404, 409, 507, ...) and sends the message to the client.

use hatchery_core::store::StoreError;
use hatchery_core::CoreError;
use hatchery_e2b::backend::{BackendError, FailKind};
use hatchery_runtime::RuntimeError;
use hatchery_templates::TemplateError;
use hatchery_tenants::{AdmitError, StoreError as TenantStoreError};

#[derive(Debug, thiserror::Error)]
pub enum E2bBackendError {
    /// What the manager refused or failed at.
    #[error(transparent)]
    Core(#[from] CoreError),
    /// The state store, taking a resume claim's lease.
    #[error("resume claim: {0}")]
    ResumeClaim(#[source] StoreError),
    /// A restore (a fork of one) returned no sandbox.
    #[error("fork made no sandbox")]
    ForkMadeNone,
    /// A terminal's driving task is gone (the terminal exited or closed).
    #[error("the terminal has ended")]
    TerminalEnded,
    /// One stdin write over `hatchery_core::procs::MAX_STDIN_WRITE`.
    #[error("stdin write over 1 MiB")]
    StdinTooLarge,
    /// The tenant a new sandbox records has no room for it, or its
    /// limits could not be read.
    #[error(transparent)]
    Tenant(#[from] hatchery_tenants::AdmitError),
    /// A tenant key could not be resolved (the tenant store failed).
    #[error("resolving a tenant key")]
    TenantKey(#[source] hatchery_tenants::StoreError),
    /// `network.rules` on a daemon whose egress proxy is off.
    #[error("network option \"rules\" (header transforms) needs the egress proxy, which is off on this daemon (--egress-guest-port 0)")]
    HeadersUnavailable,
    /// The policy the header rules make did not compile (the edge's
    /// checks should have refused it first).
    #[error("network.rules: {0}")]
    HeaderPolicy(#[source] hatchery_policy::ValidationError),
    /// A header value could not be stored sealed.
    #[error("storing a network.rules header value")]
    HeaderSecret(#[source] crate::headers::HeaderError),
    /// The proxy's CA could not be installed in the sandbox.
    #[error("installing the egress proxy's CA in the sandbox: {0}")]
    HeaderCa(String),
}

impl E2bBackendError {
    pub fn kind(&self) -> FailKind {
        match self {
            E2bBackendError::Core(e) => core_kind(e),
            E2bBackendError::ResumeClaim(_) | E2bBackendError::ForkMadeNone => FailKind::Internal,
            E2bBackendError::TerminalEnded => FailKind::ProcessNotFound,
            E2bBackendError::StdinTooLarge => FailKind::TooLarge,
            E2bBackendError::Tenant(AdmitError::Limit { .. }) => FailKind::TooMany,
            E2bBackendError::Tenant(AdmitError::Store(TenantStoreError::Unavailable(_)))
            | E2bBackendError::TenantKey(TenantStoreError::Unavailable(_)) => FailKind::Capacity,
            E2bBackendError::Tenant(_) | E2bBackendError::TenantKey(_) => FailKind::Internal,
            E2bBackendError::HeadersUnavailable | E2bBackendError::HeaderPolicy(_) => {
                FailKind::Invalid
            }
            E2bBackendError::HeaderSecret(crate::headers::HeaderError::Full(_)) => {
                FailKind::TooMany
            }
            E2bBackendError::HeaderSecret(_) | E2bBackendError::HeaderCa(_) => FailKind::Internal,
        }
    }

    /// What the client is told.
    pub fn message(&self) -> String {
        match self {
            // The E2B side names the sandbox by its own id.
            E2bBackendError::Core(CoreError::SandboxNotFound(id)) => id.clone(),
            // As before this crate existed: the store's words alone.
            E2bBackendError::ResumeClaim(e) => e.to_string(),
            other => other.to_string(),
        }
    }
}

impl From<E2bBackendError> for BackendError {
    fn from(e: E2bBackendError) -> Self {
        BackendError::caused_by(e.kind(), e.message(), e)
    }
}

/// For `map_err`: any of this crate's errors as the protocol's.
pub(crate) fn fail(e: impl Into<E2bBackendError>) -> BackendError {
    e.into().into()
}

/// The kind of a core error, as E2B's SDKs expect to tell them apart.
pub fn core_kind(e: &CoreError) -> FailKind {
    match e {
        CoreError::SandboxNotFound(_) | CoreError::Runtime(RuntimeError::NotFound(_)) => {
            FailKind::SandboxNotFound
        }
        CoreError::Template(TemplateError::NotFound(_)) => FailKind::TemplateNotFound,
        CoreError::TemplateBuilding { .. } => FailKind::TemplateBuilding,
        CoreError::Template(TemplateError::InvalidName(_) | TemplateError::Invalid(_)) => {
            FailKind::Invalid
        }
        CoreError::Invalid(_) => FailKind::Invalid,
        CoreError::FileNotFound(_) => FailKind::FileNotFound,
        CoreError::FileConflict(_) => FailKind::WrongType,
        // The guest's write ran out of disk: E2B answers 507, not 413.
        CoreError::TooLarge(m) if m.contains("disk full") => FailKind::NoSpace,
        CoreError::TooLarge(_) => FailKind::TooLarge,
        CoreError::Capacity(_) => FailKind::Capacity,
        CoreError::Conflict(_) => FailKind::Conflict,
        CoreError::TooManyTerminals(_)
        | CoreError::TooMany(_)
        | CoreError::TooManyConnections(_) => FailKind::TooMany,
        CoreError::NotRunning(_) => FailKind::NotRunning,
        CoreError::GuestUnresponsive(_) | CoreError::SandboxOom { .. } => FailKind::Unresponsive,
        CoreError::Guest { code, .. } if code == "not_found" => FailKind::FileNotFound,
        CoreError::Guest { code, .. } if code == "permission_denied" => FailKind::PermissionDenied,
        CoreError::Guest { code, .. } if code == "not_a_regular_file" => FailKind::WrongType,
        CoreError::Guest { .. } => FailKind::Invalid,
        CoreError::ContextNotFound(_) => FailKind::ContextNotFound,
        CoreError::ProcessNotFound(_) => FailKind::ProcessNotFound,
        CoreError::SnapshotNotFound(_) => FailKind::SnapshotNotFound,
        // A pause that would overfill the snapshot store: out of space.
        CoreError::SnapshotStoreFull { .. } => FailKind::NoSpace,
        CoreError::Network(
            hatchery_net::NetError::Invalid(_) | hatchery_net::NetError::Resolve(..),
        ) => FailKind::Invalid,
        CoreError::PortClosed(_) => FailKind::PortClosed,
        CoreError::BadGateway(_) => FailKind::PortClosed,
        CoreError::ServiceWorkerRefused => FailKind::PermissionDenied,
        _ => FailKind::Internal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    fn guest(code: &str) -> CoreError {
        CoreError::Guest {
            code: code.into(),
            message: "m".into(),
        }
    }

    #[test]
    fn core_errors_map_to_the_kinds_e2b_tells_apart() {
        let cases = [
            (
                CoreError::SandboxNotFound("s".into()),
                FailKind::SandboxNotFound,
            ),
            (
                CoreError::Runtime(RuntimeError::NotFound("s".into())),
                FailKind::SandboxNotFound,
            ),
            (
                CoreError::Template(TemplateError::NotFound("t".into())),
                FailKind::TemplateNotFound,
            ),
            (
                CoreError::Template(TemplateError::InvalidName("t".into())),
                FailKind::Invalid,
            ),
            (
                CoreError::TemplateBuilding {
                    name: "t".into(),
                    step: "setup".into(),
                    percent: 60,
                },
                FailKind::TemplateBuilding,
            ),
            (CoreError::FileConflict("d".into()), FailKind::WrongType),
            (CoreError::TooLarge("disk full".into()), FailKind::NoSpace),
            (CoreError::TooLarge("over 1 GiB".into()), FailKind::TooLarge),
            (CoreError::Capacity(3), FailKind::Capacity),
            (
                CoreError::SnapshotStoreFull {
                    used: 9,
                    need: 2,
                    cap: 10,
                },
                FailKind::NoSpace,
            ),
            (CoreError::TooManyTerminals(8), FailKind::TooMany),
            (CoreError::TooManyConnections("c".into()), FailKind::TooMany),
            (CoreError::NotRunning("s".into()), FailKind::NotRunning),
            (
                CoreError::SandboxOom {
                    id: "s".into(),
                    reason: "guest_oom",
                },
                FailKind::Unresponsive,
            ),
            (guest("not_found"), FailKind::FileNotFound),
            (guest("permission_denied"), FailKind::PermissionDenied),
            (guest("not_a_regular_file"), FailKind::WrongType),
            (guest("anything_else"), FailKind::Invalid),
            (
                CoreError::ContextNotFound("c".into()),
                FailKind::ContextNotFound,
            ),
            (
                CoreError::ProcessNotFound("p".into()),
                FailKind::ProcessNotFound,
            ),
            (
                CoreError::SnapshotNotFound("n".into()),
                FailKind::SnapshotNotFound,
            ),
            (
                CoreError::Network(hatchery_net::NetError::Invalid("x".into())),
                FailKind::Invalid,
            ),
            (CoreError::BadGateway("b".into()), FailKind::PortClosed),
            (CoreError::ServiceWorkerRefused, FailKind::PermissionDenied),
            (CoreError::Internal("i".into()), FailKind::Internal),
        ];
        for (e, kind) in cases {
            assert_eq!(core_kind(&e), kind, "{e:?}");
        }
    }

    #[test]
    fn a_missing_sandbox_is_named_by_its_id_alone() {
        let b = BackendError::from(E2bBackendError::from(CoreError::SandboxNotFound(
            "sbx_1".into(),
        )));
        assert_eq!(b.kind, FailKind::SandboxNotFound);
        assert_eq!(b.message, "sbx_1");
        let b = fail(CoreError::NotRunning("sbx_1".into()));
        assert_eq!(b.message, "sandbox sbx_1 is not running");
    }

    #[test]
    fn the_cause_is_kept_behind_the_protocols_error() {
        let b = fail(E2bBackendError::ResumeClaim(StoreError::Unavailable(
            "pool exhausted".into(),
        )));
        assert_eq!(b.kind, FailKind::Internal);
        let cause = b.source().expect("a source");
        let store = cause.source().expect("the store's error");
        assert_eq!(b.message, store.to_string());
        assert!(cause.to_string().starts_with("resume claim: "));
    }
}
