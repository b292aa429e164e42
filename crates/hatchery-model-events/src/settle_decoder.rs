//! How a session's owning host reads the settle the control role's
//! gateway posts with a call's event: only of a reservation charged to
//! that session, so that a post for one session cannot settle (and, with
//! it, commit spend against) another's budget.

use hatchery_gateway::store::Settlement;
use hatchery_sessions::broker_hooks::RemoteJoined;

/// Why a posted settle is refused.
#[derive(Debug, thiserror::Error)]
pub enum SettleRefused {
    #[error("not a settle")]
    Unreadable(#[source] serde_json::Error),
    #[error("the settle is not charged to {0}")]
    NotCharged(String),
}

pub struct SettleDecoder;

impl SettleDecoder {
    /// The settle in `write`, if it is `session`'s own.
    pub fn settle_of(
        &self,
        session: &str,
        write: serde_json::Value,
    ) -> Result<Settlement, SettleRefused> {
        let s: Settlement = serde_json::from_value(write).map_err(SettleRefused::Unreadable)?;
        let own = format!("session:{session}");
        if !s.scopes.contains(&own) {
            return Err(SettleRefused::NotCharged(own));
        }
        Ok(s)
    }
}

impl RemoteJoined for SettleDecoder {
    fn decode(
        &self,
        session: &str,
        write: serde_json::Value,
    ) -> Result<Box<dyn hatchery_db::Joined>, hatchery_sessions::broker_hooks::JoinedRefused> {
        Ok(Box::new(self.settle_of(session, write)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hatchery_gateway::budget::Amount;

    /// The owner commits a posted settle only for a reservation charged to
    /// the session it is posted to.
    #[test]
    fn a_posted_settle_is_only_the_sessions_own() {
        let s = |scopes: &[&str]| {
            serde_json::to_value(Settlement {
                id: "rsv_1".into(),
                scopes: scopes.iter().map(|x| x.to_string()).collect(),
                actual: Amount {
                    tokens: 3,
                    usd_cents: 1,
                },
                overage: Amount::default(),
                fresh: true,
            })
            .unwrap()
        };
        let own = s(&["session:ses_a", "tenant:t"]);
        assert!(own.get("fresh").is_none(), "{own}");
        assert!(SettleDecoder.decode("ses_a", own.clone()).is_ok());
        let e = SettleDecoder.decode("ses_b", own).err().unwrap();
        assert!(e.to_string().contains("session:ses_b"), "{e}");
        assert!(SettleDecoder.decode("ses_a", s(&["tenant:t"])).is_err());
        let junk = serde_json::json!({"id": "rsv_1", "scopes": ["session:ses_a"], "actual": {"tokens": 1, "usd_cents": 0}, "extra": 1});
        assert!(SettleDecoder.decode("ses_a", junk).is_err());
    }

    #[test]
    fn refusals_say_why() {
        let e = SettleDecoder
            .settle_of("ses_a", serde_json::json!({"id": 1}))
            .unwrap_err();
        assert!(matches!(e, SettleRefused::Unreadable(_)), "{e}");
        assert!(std::error::Error::source(&e).is_some());
    }
}
