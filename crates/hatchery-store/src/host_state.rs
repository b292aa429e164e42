//! A host's state, as the API and placement see it: `starting`, `ready`,
//! `draining`, `cordoned` or `lost`. It is made of three things kept
//! apart because different parties write them:
//!
//! - the host's own lifecycle (`core_hosts.state`: `starting` from its
//!   registration until it has reconciled and listens, then `ready`,
//!   then `stopping` once it was told to stop (SIGTERM) and hands its
//!   sessions to other hosts; the next registration makes it `starting`),
//!   written only under its lease (fenced, so a stale incarnation cannot
//!   mark itself ready);
//! - the operator's hold (`core_hosts.hold`: none, `cordoned` or
//!   `draining`), written through the API by a process that holds no
//!   lease, so guarded by the hold it moves from instead; a restart keeps
//!   it (an operator's cordon outlives a reboot);
//! - whether it is alive: its heartbeat's age by the database's clock,
//!   never stored (a dead host cannot write that it died).

use serde::{Deserialize, Serialize};
use std::fmt;

/// What the operator asked of a host. Stored as its name (`""` for none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HostHold {
    None,
    /// No new sandboxes or sessions placed there; existing ones still
    /// routed to it.
    Cordoned,
    /// Cordoned, and on its way out: the host hands its sessions to
    /// other hosts (docs/operations.md, "Draining a host").
    Draining,
}

impl HostHold {
    pub const ALL: [HostHold; 3] = [HostHold::None, HostHold::Cordoned, HostHold::Draining];

    pub fn as_str(self) -> &'static str {
        match self {
            HostHold::None => "",
            HostHold::Cordoned => "cordoned",
            HostHold::Draining => "draining",
        }
    }

    pub fn parse(s: &str) -> Option<HostHold> {
        Self::ALL.into_iter().find(|h| h.as_str() == s)
    }

    /// The moves an operator makes: cordon, drain (also of a cordoned
    /// host), uncordon (of either). A drain is not walked back to a
    /// cordon: uncordon it, then cordon.
    pub fn valid_transition(self, to: HostHold) -> bool {
        use HostHold::*;
        matches!(
            (self, to),
            (None, Cordoned) | (None | Cordoned, Draining) | (Cordoned | Draining, None)
        )
    }

    /// What an operator's verb moves from, for `to`: every hold with a
    /// valid move to it, and `to` itself (asking twice is no error).
    pub fn sources(to: HostHold) -> Vec<HostHold> {
        Self::ALL
            .into_iter()
            .filter(|h| *h == to || h.valid_transition(to))
            .collect()
    }
}

/// A host's state as the API shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HostState {
    /// Registered, not yet reconciled or not yet listening: neither
    /// placed on nor routed to.
    Starting,
    Ready,
    Draining,
    Cordoned,
    /// No heartbeat within the lease TTL.
    Lost,
}

impl HostState {
    pub const ALL: [HostState; 5] = [
        HostState::Starting,
        HostState::Ready,
        HostState::Draining,
        HostState::Cordoned,
        HostState::Lost,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            HostState::Starting => "starting",
            HostState::Ready => "ready",
            HostState::Draining => "draining",
            HostState::Cordoned => "cordoned",
            HostState::Lost => "lost",
        }
    }

    /// Lost before anything else (a lost host's hold does not make it
    /// serve); then a starting host is starting whatever its hold (it
    /// serves nothing yet); then a stopping host is draining whatever
    /// its hold (it still serves what it runs, takes nothing new); then
    /// the hold.
    pub fn of(ready: bool, stopping: bool, hold: HostHold, alive: bool) -> HostState {
        match (alive, ready, hold) {
            (false, _, _) => HostState::Lost,
            (true, false, _) => HostState::Starting,
            (true, true, _) if stopping => HostState::Draining,
            (true, true, HostHold::None) => HostState::Ready,
            (true, true, HostHold::Cordoned) => HostState::Cordoned,
            (true, true, HostHold::Draining) => HostState::Draining,
        }
    }

    /// Requests for the sandboxes it runs are forwarded to it.
    pub fn routed(self) -> bool {
        matches!(
            self,
            HostState::Ready | HostState::Cordoned | HostState::Draining
        )
    }

    /// New sandboxes and sessions may be placed on it.
    pub fn placeable(self) -> bool {
        self == HostState::Ready
    }
}

impl fmt::Display for HostState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for HostHold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HostHold::None => "none",
            h => h.as_str(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::HostHold::*;
    use super::*;

    #[test]
    fn holds_move_only_as_an_operator_does() {
        assert!(None.valid_transition(Cordoned));
        assert!(None.valid_transition(Draining));
        assert!(Cordoned.valid_transition(Draining));
        assert!(Cordoned.valid_transition(None));
        assert!(Draining.valid_transition(None));
        assert!(!Draining.valid_transition(Cordoned));
        for h in HostHold::ALL {
            assert!(!h.valid_transition(h), "{h} -> {h}");
            assert_eq!(HostHold::parse(h.as_str()), Some(h));
        }
        assert_eq!(HostHold::parse("lost"), Option::None);
        assert_eq!(HostHold::sources(None), [None, Cordoned, Draining]);
        assert_eq!(HostHold::sources(Cordoned), [None, Cordoned]);
        assert_eq!(HostHold::sources(Draining), [None, Cordoned, Draining]);
    }

    #[test]
    fn the_state_shown_is_lost_then_starting_then_the_hold() {
        use HostState as S;
        for h in HostHold::ALL {
            for stopping in [false, true] {
                assert_eq!(S::of(true, stopping, h, false), S::Lost);
                assert_eq!(S::of(false, stopping, h, false), S::Lost);
                assert_eq!(S::of(false, stopping, h, true), S::Starting);
            }
            // Told to stop: draining, whatever the operator's hold.
            assert_eq!(S::of(true, true, h, true), S::Draining);
        }
        assert_eq!(S::of(true, false, None, true), S::Ready);
        assert_eq!(S::of(true, false, Cordoned, true), S::Cordoned);
        assert_eq!(S::of(true, false, Draining, true), S::Draining);
        let placeable: Vec<S> = S::ALL.into_iter().filter(|s| s.placeable()).collect();
        assert_eq!(placeable, [S::Ready]);
        let routed: Vec<S> = S::ALL.into_iter().filter(|s| s.routed()).collect();
        assert_eq!(routed, [S::Ready, S::Draining, S::Cordoned]);
    }
}
