//! What a session's log records of one gateway observation.

use hatchery_gateway::events::GatewayEvent;
use hatchery_sessions::events::cut;
use hatchery_sessions::model_events::{ModelEvent, MAX_MESSAGE, MAX_MODEL};

/// The session a gateway event belongs to and what its log records; `None`
/// for events with no session to log to.
pub fn model_event(e: GatewayEvent) -> Option<(String, ModelEvent)> {
    match e {
        GatewayEvent::Requested {
            caller,
            flavor,
            model,
            reservation,
            reserved,
        } => Some((
            caller.session,
            ModelEvent::Requested {
                api: flavor.name().into(),
                model: cut(&model, MAX_MODEL).into(),
                reservation,
                tokens: reserved.tokens,
                usd_cents: reserved.usd_cents,
            },
        )),
        GatewayEvent::Called {
            caller,
            flavor,
            model,
            input_tokens,
            output_tokens,
            charged,
            ..
        } => Some((
            caller.session,
            ModelEvent::Called {
                api: flavor.name().into(),
                model: cut(&model, MAX_MODEL).into(),
                input_tokens,
                output_tokens,
                tokens: charged.tokens,
                usd_cents: charged.usd_cents,
                joined: None,
            },
        )),
        // Its own event (and the end of the session) comes from
        // `Exhausted`, just before.
        GatewayEvent::Refused {
            code: "budget_exhausted",
            ..
        } => None,
        GatewayEvent::Refused {
            caller: Some(caller),
            flavor,
            code,
            message,
        } => Some((
            caller.session,
            ModelEvent::Refused {
                api: flavor.name().into(),
                code: code.into(),
                message: cut(&message, MAX_MESSAGE).into(),
            },
        )),
        // No caller: an unbound sandbox or a bad key; nothing to log it to.
        GatewayEvent::Refused { caller: None, .. } => None,
        // Charged again by nobody: what the janitor charged is the spend.
        GatewayEvent::Expired {
            caller,
            reservation,
            charged,
        } => Some((
            caller.session,
            ModelEvent::Expired {
                reservation,
                tokens: charged.tokens,
                usd_cents: charged.usd_cents,
            },
        )),
        GatewayEvent::Exhausted { caller, scope } => Some((
            caller.session,
            ModelEvent::Exhausted {
                scope,
                message: "the model budget is used up: a call's worst case did not fit in what \
                    is left, or the upstream reported more than a call reserved"
                    .into(),
            },
        )),
        // Its figures are in the call's `model_call` event (reported input
        // and output next to the capped charge); an exhaustion it causes
        // comes as `Exhausted`, just after.
        GatewayEvent::Overage { .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hatchery_gateway::budget::{Amount, Caller};
    use hatchery_gateway::usage::Flavor;

    fn caller() -> Caller {
        Caller {
            session: "ses_a".into(),
            tenant: None,
        }
    }

    #[test]
    fn events_convert_and_long_text_is_cut() {
        let (s, e) = model_event(GatewayEvent::Refused {
            caller: Some(caller()),
            flavor: Flavor::Anthropic,
            code: "upstream_unavailable",
            message: "é".repeat(MAX_MESSAGE),
        })
        .unwrap();
        assert_eq!(s, "ses_a");
        let ModelEvent::Refused { api, message, .. } = &e else {
            panic!("{e:?}")
        };
        assert_eq!(api, "anthropic");
        assert!(message.len() <= MAX_MESSAGE && message.len() > MAX_MESSAGE - 2);
        assert!(e.validate().is_ok());
        // The exhausted call's refusal is left to its `Exhausted` event.
        assert!(model_event(GatewayEvent::Refused {
            caller: Some(caller()),
            flavor: Flavor::OpenAi,
            code: "budget_exhausted",
            message: "m".into(),
        })
        .is_none());
        let (_, e) = model_event(GatewayEvent::Called {
            caller: caller(),
            flavor: Flavor::OpenAi,
            model: "m".into(),
            input_tokens: Some(1),
            output_tokens: Some(2),
            charged: Amount {
                tokens: 3,
                usd_cents: 4,
            },
            reserved: Amount {
                tokens: 9,
                usd_cents: 9,
            },
        })
        .unwrap();
        assert!(matches!(
            e,
            ModelEvent::Called {
                tokens: 3,
                usd_cents: 4,
                ..
            }
        ));
    }

    /// A refusal with no caller (an unbound sandbox, a bad key) has no
    /// session to go to.
    #[test]
    fn a_refusal_without_a_caller_is_not_logged() {
        assert!(model_event(GatewayEvent::Refused {
            caller: None,
            flavor: Flavor::OpenAi,
            code: "unauthorized",
            message: "m".into(),
        })
        .is_none());
        let (s, e) = model_event(GatewayEvent::Exhausted {
            caller: caller(),
            scope: "session:ses_a".into(),
        })
        .unwrap();
        assert_eq!(s, "ses_a");
        assert!(matches!(e, ModelEvent::Exhausted { scope, .. } if scope == "session:ses_a"));
    }

    /// An overage's figures are the call's own `model_call` event's; the
    /// session ends on the `Exhausted` that follows when its budget is gone.
    #[test]
    fn an_overage_is_not_a_second_event() {
        let a = |tokens| Amount {
            tokens,
            usd_cents: 1,
        };
        assert!(model_event(GatewayEvent::Overage {
            caller: caller(),
            flavor: Flavor::Anthropic,
            model: "m".into(),
            input_tokens: 5_000,
            output_tokens: 5_000,
            reported: a(10_000),
            reserved: a(465),
        })
        .is_none());
    }

    /// A reservation the janitor charged goes to its session as spend.
    #[test]
    fn an_expired_reservation_is_its_sessions_spend() {
        let e = GatewayEvent::Expired {
            caller: caller(),
            reservation: "rsv_1".into(),
            charged: Amount {
                tokens: 70,
                usd_cents: 3,
            },
        };
        assert_eq!(
            model_event(e),
            Some((
                "ses_a".to_string(),
                ModelEvent::Expired {
                    reservation: "rsv_1".into(),
                    tokens: 70,
                    usd_cents: 3
                }
            ))
        );
    }
}
