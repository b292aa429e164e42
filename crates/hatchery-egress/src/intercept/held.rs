//! Requests held for a person on an intercepted connection (docs/sessions.md,
//! "Egress approvals"): when a `require_approval` rule decides a
//! destination the proxy intercepts, the connection is let through and
//! each request waits, before it goes upstream, for a decision on its
//! host, port, method and path. A refusal is the proxy's own 403 on that
//! request (the connection stays usable) and an `egress_denied` event
//! naming the method, path and approval.

use super::{text, Body, Plan};
use crate::approval::{strip_query, ApprovalAsk, Approver};
use crate::events::{EgressEvent, EventSink, Verdict};
use hyper::{Response, StatusCode};
use std::sync::Arc;
use std::time::Duration;

/// The rule that holds each request of an intercepted connection, and who
/// decides.
pub(crate) struct RequestHold {
    pub rule_id: String,
    pub timeout: Duration,
    pub approver: Arc<dyn Approver>,
    /// The proxy's gauge of held questions.
    pub held: prometheus::IntGauge,
}

/// Asks about one request and waits: `Ok` lets it go upstream; `Err` is
/// the answer the guest gets instead (its refusal event already sent).
pub(crate) async fn approve(
    h: &RequestHold,
    plan: &Plan,
    events: &EventSink,
    method: &str,
    target: &str,
) -> Result<(), Response<Body>> {
    let path = strip_query(target).to_string();
    let ask = ApprovalAsk {
        session: plan.session.clone(),
        host: plan.host.clone(),
        port: plan.port,
        method: Some(method.to_string()),
        path: Some(path.clone()),
        per_request: true,
        rule_id: h.rule_id.clone(),
        policy_version: plan.policy_version,
        timeout: h.timeout,
    };
    h.held.inc();
    let answer = h.approver.ask(ask).await;
    h.held.dec();
    let crate::approval::Refused {
        status,
        why,
        approval_id,
    } = match crate::approval::decided(answer, h.timeout, &h.rule_id) {
        Ok(_) => return Ok(()),
        Err(r) => r,
    };
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::FORBIDDEN);
    let reason = format!("{method} {path}: {why}");
    events.denied(EgressEvent {
        verdict: Verdict::Denied,
        session: Some(plan.session.clone()),
        peer: plan.peer,
        host: Some(plan.host.clone()),
        port: Some(plan.port),
        ip: Some(plan.ip),
        rule_id: Some(h.rule_id.clone()),
        status: status.as_u16(),
        reason: reason.clone(),
        policy_version: plan.policy_version,
        approval_id,
    });
    Err(text(status, reason))
}
