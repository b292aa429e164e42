//! What the directory asks of this host's own manager (roles `all` and
//! `host`): whether a sandbox runs here, answered without a query.

/// Contract: `runs_here` is true only for a sandbox this process runs
/// right now; `has_shared_snapshots` is whether this host mounts the
/// shared snapshot store (then any shared snapshot is servable here).
pub trait LocalSandboxes: Send + Sync {
    fn runs_here(&self, id: &str) -> bool;
    fn has_shared_snapshots(&self) -> bool;
}

impl LocalSandboxes for hatchery_core::Manager {
    fn runs_here(&self, id: &str) -> bool {
        hatchery_core::Manager::runs_here(self, id)
    }
    fn has_shared_snapshots(&self) -> bool {
        hatchery_core::Manager::has_shared_snapshots(self)
    }
}

/// A fixed set of sandboxes, for tests.
#[cfg(test)]
pub(crate) mod fake {
    pub struct FakeLocal {
        pub running: Vec<String>,
        pub shared_snapshots: bool,
    }

    impl super::LocalSandboxes for FakeLocal {
        fn runs_here(&self, id: &str) -> bool {
            self.running.iter().any(|r| r == id)
        }
        fn has_shared_snapshots(&self) -> bool {
            self.shared_snapshots
        }
    }
}
