//! The session lifecycle. Every store update names the states it may move
//! from, and those come from [`SessionState::valid_transition`].

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SessionState {
    /// Stored with its budget, waiting for the scheduler.
    Queued,
    /// Has a place: sandbox, repository checkout, agent start.
    Starting,
    /// The agent runs in its sandbox.
    Running,
    /// The agent is blocked on a human decision.
    WaitingApproval,
    /// Waited too long: the sandbox was snapshotted and freed.
    Idle,
    Completed,
    Failed,
    Cancelled,
}

use SessionState as S;

impl SessionState {
    pub const ALL: [SessionState; 8] = [
        S::Queued,
        S::Starting,
        S::Running,
        S::WaitingApproval,
        S::Idle,
        S::Completed,
        S::Failed,
        S::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            S::Queued => "queued",
            S::Starting => "starting",
            S::Running => "running",
            S::WaitingApproval => "waiting_approval",
            S::Idle => "idle",
            S::Completed => "completed",
            S::Failed => "failed",
            S::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|x| x.as_str() == s)
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, S::Completed | S::Failed | S::Cancelled)
    }

    /// The lifecycle graph: queued → starting → running ⇄ waiting_approval,
    /// running ⇄ idle (a session waiting for an approval may also go idle,
    /// and comes back as running), then completed | failed | cancelled.
    pub fn valid_transition(self, to: SessionState) -> bool {
        match (self, to) {
            (S::Queued, S::Starting) => true,
            (S::Starting, S::Running) => true,
            (S::Running, S::WaitingApproval) | (S::WaitingApproval, S::Running) => true,
            (S::Running, S::Idle) | (S::WaitingApproval, S::Idle) | (S::Idle, S::Running) => true,
            (S::Running, S::Completed) => true,
            (from, S::Failed) | (from, S::Cancelled) => !from.is_terminal(),
            _ => false,
        }
    }

    /// Every state that may move to `to`: what a store update names.
    pub fn sources_of(to: SessionState) -> Vec<SessionState> {
        Self::ALL
            .into_iter()
            .filter(|f| f.valid_transition(to))
            .collect()
    }

    /// Steering messages are accepted until the session ends; while idle
    /// one resumes it.
    pub fn can_message(self) -> bool {
        !self.is_terminal()
    }

    pub fn can_decide_approval(self) -> bool {
        matches!(self, S::WaitingApproval | S::Idle)
    }

    pub fn can_cancel(self) -> bool {
        !self.is_terminal()
    }

    /// States in which the session holds a sandbox (and a scheduler lease).
    pub fn holds_sandbox(self) -> bool {
        matches!(self, S::Starting | S::Running | S::WaitingApproval)
    }
}

impl std::fmt::Display for SessionState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn graph() {
        assert!(S::Queued.valid_transition(S::Starting));
        assert!(!S::Queued.valid_transition(S::Running));
        assert!(!S::Queued.valid_transition(S::Completed));
        assert!(S::Running.valid_transition(S::Idle));
        assert!(S::Idle.valid_transition(S::Running));
        assert!(!S::Idle.valid_transition(S::Completed));
        assert!(S::Idle.valid_transition(S::Cancelled));
        for t in [S::Completed, S::Failed, S::Cancelled] {
            for to in SessionState::ALL {
                assert!(!t.valid_transition(to), "{t} -> {to}");
            }
        }
        assert_eq!(SessionState::sources_of(S::Completed), vec![S::Running]);
    }

    #[test]
    fn names_round_trip() {
        for s in SessionState::ALL {
            assert_eq!(SessionState::parse(s.as_str()), Some(s));
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
        assert_eq!(SessionState::parse("nope"), None);
    }
}
