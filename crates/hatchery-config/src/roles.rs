//! What a daemon is (`--role`) and whether its sandboxes have a network
//! (`--network`): enums, so a misspelling fails at start, not at a compare.

use clap::ValueEnum;

/// The daemon's part in a deployment (docs/operations.md, "Many hosts").
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Role {
    /// One daemon does everything.
    All,
    /// The public API and placement, no runtime (needs a postgres:// store).
    Control,
    /// Runtime, slots and pool on a shared postgres:// store, registered
    /// for a control plane to route to.
    Host,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::All => "all",
            Role::Control => "control",
            Role::Host => "host",
        }
    }
    /// Whether this role runs sandboxes (and so a runtime and a network).
    pub fn runs_sandboxes(self) -> bool {
        self != Role::Control
    }
    /// Whether this role serves interview rounds (a host leaves them to
    /// the control plane).
    pub fn serves_rounds(self) -> bool {
        self != Role::Host
    }
}

/// `on`: a network namespace and egress policy per sandbox; `off`: none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum NetworkMode {
    On,
    Off,
}

impl NetworkMode {
    pub fn is_on(self) -> bool {
        self == NetworkMode::On
    }
}
