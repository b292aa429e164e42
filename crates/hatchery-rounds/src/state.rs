//! Lifecycles as enums. Every store update names the states it may move
//! from (`valid_transition` lists them), so two racing requests cannot both
//! win: the loser's guarded update changes nothing and it answers 409.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RoundState {
    /// Setup commands are running into the prepared snapshot.
    Preparing,
    /// Candidates can be invited.
    Ready,
    /// Setup failed; `error` says why. Nothing can be invited.
    Failed,
    /// No new sessions; existing ones carry on.
    Archived,
}

impl RoundState {
    pub fn as_str(self) -> &'static str {
        match self {
            RoundState::Preparing => "preparing",
            RoundState::Ready => "ready",
            RoundState::Failed => "failed",
            RoundState::Archived => "archived",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "preparing" => RoundState::Preparing,
            "ready" => RoundState::Ready,
            "failed" => RoundState::Failed,
            "archived" => RoundState::Archived,
            _ => return None,
        })
    }
    pub fn valid_transition(self, to: RoundState) -> bool {
        use RoundState::*;
        matches!(
            (self, to),
            (Preparing, Ready) | (Preparing, Failed) | (Ready, Archived) | (Failed, Archived)
        )
    }
    /// The states a move to `to` may start from.
    pub fn sources(to: RoundState) -> Vec<RoundState> {
        ALL_ROUND
            .iter()
            .copied()
            .filter(|s| s.valid_transition(to))
            .collect()
    }
    pub fn can_invite(self) -> bool {
        self == RoundState::Ready
    }
}

pub(crate) const ALL_ROUND: [RoundState; 4] = [
    RoundState::Preparing,
    RoundState::Ready,
    RoundState::Failed,
    RoundState::Archived,
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SessionState {
    /// The candidate's sandbox is being forked.
    Preparing,
    /// Invited; the candidate has not opened the room yet.
    Ready,
    /// The candidate is in the room.
    Live,
    /// A submission is captured and being graded. Run and Submit wait.
    Submitted,
    /// The last submission is graded. The candidate may keep working and
    /// submit again.
    Graded,
    /// The sandbox is gone (ended, expired or failed); a replay remains.
    Ended,
}

pub(crate) const ALL_SESSION: [SessionState; 6] = [
    SessionState::Preparing,
    SessionState::Ready,
    SessionState::Live,
    SessionState::Submitted,
    SessionState::Graded,
    SessionState::Ended,
];

impl SessionState {
    pub fn as_str(self) -> &'static str {
        match self {
            SessionState::Preparing => "preparing",
            SessionState::Ready => "ready",
            SessionState::Live => "live",
            SessionState::Submitted => "submitted",
            SessionState::Graded => "graded",
            SessionState::Ended => "ended",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        ALL_SESSION.iter().copied().find(|x| x.as_str() == s)
    }
    pub fn valid_transition(self, to: SessionState) -> bool {
        use SessionState::*;
        matches!(
            (self, to),
            (Preparing, Ready)
                | (Ready, Live)
                | (Live, Submitted)
                | (Graded, Submitted)
                | (Submitted, Graded)
                | (Preparing | Ready | Live | Submitted | Graded, Ended)
        )
    }
    pub fn sources(to: SessionState) -> Vec<SessionState> {
        ALL_SESSION
            .iter()
            .copied()
            .filter(|s| s.valid_transition(to))
            .collect()
    }
    /// Run and file access need the sandbox up and no grading in flight.
    pub fn can_run(self) -> bool {
        matches!(
            self,
            SessionState::Ready | SessionState::Live | SessionState::Graded
        )
    }
    pub fn can_submit(self) -> bool {
        self.valid_transition(SessionState::Submitted)
    }
    pub fn has_sandbox(self) -> bool {
        !matches!(self, SessionState::Preparing | SessionState::Ended)
    }
}

/// What a refused action says, so every route answers a state the same way.
pub fn refusal(state: SessionState, action: &str) -> crate::RoundsError {
    match state {
        SessionState::Submitted => crate::RoundsError::state(
            "grading_in_progress",
            format!("cannot {action}: a submission is being graded"),
        ),
        SessionState::Ended => crate::RoundsError::state(
            "session_ended",
            format!("cannot {action}: the session has ended"),
        ),
        SessionState::Preparing => crate::RoundsError::state(
            "session_not_ready",
            format!("cannot {action}: the session is still being prepared"),
        ),
        s => crate::RoundsError::state(
            "invalid_state",
            format!("cannot {action} in state {}", s.as_str()),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_transitions() {
        use SessionState::*;
        assert!(Live.valid_transition(Submitted));
        assert!(!Submitted.valid_transition(Submitted), "no double submit");
        assert!(!Ended.valid_transition(Submitted), "no submit after end");
        assert!(!Ended.valid_transition(Live));
        assert!(!Submitted.can_run());
        assert!(Graded.can_submit());
        assert_eq!(SessionState::sources(Submitted), vec![Live, Graded]);
        for s in ALL_SESSION {
            assert_eq!(SessionState::parse(s.as_str()), Some(s));
            assert!(!Ended.valid_transition(s));
        }
    }

    #[test]
    fn round_transitions() {
        use RoundState::*;
        assert!(Preparing.valid_transition(Ready));
        assert!(!Archived.valid_transition(Ready));
        assert!(Ready.can_invite() && !Archived.can_invite());
        assert_eq!(RoundState::sources(Archived), vec![Ready, Failed]);
    }
}
