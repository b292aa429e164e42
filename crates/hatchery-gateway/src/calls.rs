//! One model call through the gateway: who is calling, what it may cost at
//! most, the reservation, the upstream call with the real key, and the
//! settlement of what it actually cost, streamed or not.

use crate::answer::Exchange;
use crate::budget::{Amount, BudgetError, Caller};
use crate::errors::CallError;
use crate::estimate::{input_tokens_upper_bound, writes_cache};
use crate::events::GatewayEvent;
use crate::settle::{answer_deadline, Settle};
use crate::usage::Flavor;
use crate::Gateway;
use axum::body::Body;
use axum::http::HeaderMap;
use axum::response::Response;
use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most completions one OpenAI call may ask for (`n`); each is reserved.
pub const MAX_CHOICES: u64 = 8;

pub fn key_hash(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn presented_key(headers: &HeaderMap) -> Option<&str> {
    if let Some(v) = headers.get("authorization").and_then(|v| v.to_str().ok()) {
        return v.strip_prefix("Bearer ").map(str::trim);
    }
    headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
}

/// The header the daemon's host-service relay sets on every request from
/// a sandbox (hatchery-core `host_services.rs`), after removing any the
/// guest sent.
pub use hatchery_serve::headers::SANDBOX_HEADER;

/// Who is calling: with `trust_sandbox_header`, a request relayed from a
/// sandbox is charged to the caller its sandbox is bound to and needs no
/// key (the sandbox holds no credential at all); otherwise the gateway key.
async fn identify(g: &Gateway, headers: &HeaderMap) -> Result<Caller, CallError> {
    if g.trust_sandbox_header {
        if let Some(sbx) = headers.get(SANDBOX_HEADER) {
            let sbx = sbx.to_str().map_err(|_| CallError::Unauthorized)?;
            return g
                .keys
                .caller_of_sandbox(sbx)
                .await
                .map_err(CallError::Store)?
                .ok_or(CallError::UnboundSandbox);
        }
    }
    let key = presented_key(headers).ok_or(CallError::Unauthorized)?;
    g.keys
        .caller(&key_hash(key), crate::now_ms())
        .await
        .map_err(CallError::Store)?
        .ok_or(CallError::Unauthorized)
}

/// What the gateway needs from a request body, checked before anything is
/// reserved or sent.
struct Plan {
    model: String,
    stream: bool,
    /// Worst-case output tokens (max tokens × choices).
    max_output: u64,
    /// Upper bound of the input tokens (`estimate.rs`).
    input_bound: u64,
    /// The request writes a prompt cache (its input may cost twice).
    writes_cache: bool,
    /// The body to send upstream (with the gateway's additions).
    body: Bytes,
}

fn plan(g: &Gateway, flavor: Flavor, raw: &[u8]) -> Result<Plan, CallError> {
    let mut v: Map<String, Value> = match serde_json::from_slice(raw) {
        Ok(Value::Object(m)) => m,
        Ok(_) => {
            return Err(CallError::BadRequest(
                "the body must be a JSON object".into(),
            ))
        }
        Err(e) => return Err(CallError::BadRequest(format!("the body is not JSON: {e}"))),
    };
    let model = match v.get("model") {
        Some(Value::String(m)) if !m.is_empty() && m.len() <= 256 => m.clone(),
        _ => {
            return Err(CallError::BadRequest(
                "`model` must be a non-empty string".into(),
            ))
        }
    };
    let stream = match v.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(CallError::BadRequest("`stream` must be a boolean".into())),
    };
    let cap = g.max_output_tokens;
    let field =
        |v: &Map<String, Value>, k: &str| -> Result<Option<u64>, CallError> {
            match v.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(x) => x.as_u64().filter(|&n| n >= 1).map(Some).ok_or_else(|| {
                    CallError::BadRequest(format!("`{k}` must be a positive integer"))
                }),
            }
        };
    let asked = match flavor {
        Flavor::OpenAi => field(&v, "max_completion_tokens")?.or(field(&v, "max_tokens")?),
        Flavor::Anthropic => Some(
            field(&v, "max_tokens")?
                .ok_or_else(|| CallError::BadRequest("`max_tokens` is required".into()))?,
        ),
    };
    if let Some(n) = asked.filter(|&n| n > cap) {
        return Err(CallError::OverCap { asked: n, cap });
    }
    let max_tokens = match asked {
        Some(n) => n,
        None => {
            // Without a limit the upstream could write more than was
            // reserved; the gateway sets the operator's cap.
            v.insert("max_tokens".into(), json!(cap));
            cap
        }
    };
    let choices = match flavor {
        Flavor::OpenAi => field(&v, "n")?.unwrap_or(1),
        Flavor::Anthropic => 1,
    };
    if choices > MAX_CHOICES {
        return Err(CallError::BadRequest(format!(
            "`n` must be at most {MAX_CHOICES}"
        )));
    }
    if stream && flavor == Flavor::OpenAi {
        // Usage comes only in the last chunk, and only when asked for.
        let opts = v.entry("stream_options").or_insert_with(|| json!({}));
        match opts {
            Value::Object(o) => {
                o.insert("include_usage".into(), json!(true));
            }
            _ => {
                return Err(CallError::BadRequest(
                    "`stream_options` must be an object".into(),
                ))
            }
        }
    }
    let body = serde_json::to_vec(&v).map_err(|e| CallError::BadRequest(e.to_string()))?;
    Ok(Plan {
        model,
        stream,
        max_output: max_tokens * choices,
        input_bound: input_tokens_upper_bound(flavor, &v, body.len())?,
        writes_cache: writes_cache(&v),
        body: body.into(),
    })
}

/// Serves one call of `flavor` at `path`.
pub async fn call(
    g: Arc<Gateway>,
    flavor: Flavor,
    path: &'static str,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match call_inner(&g, flavor, path, &headers, body).await {
        Ok(r) => r,
        Err((caller, e)) => {
            g.metrics.call(flavor, e.outcome());
            g.events.record(GatewayEvent::Refused {
                caller,
                flavor,
                code: e.code(),
                message: e.to_string(),
            });
            e.into_response(flavor)
        }
    }
}

type Failure = (Option<Caller>, CallError);

async fn call_inner(
    g: &Arc<Gateway>,
    flavor: Flavor,
    path: &'static str,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, Failure> {
    let upstream = match flavor {
        Flavor::OpenAi => g.openai.clone(),
        Flavor::Anthropic => g.anthropic.clone(),
    }
    .ok_or((None, CallError::NoUpstream))?;
    let caller = identify(g, headers).await.map_err(|e| (None, e))?;
    let fail = |e: CallError| (Some(caller.clone()), e);
    let raw = Limited::new(body, g.max_body)
        .collect()
        .await
        .map_err(|_| fail(CallError::TooLarge(g.max_body)))?
        .to_bytes();
    let plan = plan(g, flavor, &raw).map_err(fail)?;
    let price = g.prices.price(&plan.model).map_err(|e| fail(e.into()))?;
    let estimate = Amount {
        tokens: plan.input_bound + plan.max_output,
        // A cache write is priced at up to twice the input.
        usd_cents: price.cents(
            plan.input_bound * if plan.writes_cache { 2 } else { 1 },
            plan.max_output,
        ),
    };
    // The pinned policy decides on the estimate before anything is
    // reserved or sent (issue 36); a call it holds for a person's approval
    // waits here, holding no reservation.
    if let Some(p) = &g.policy {
        use crate::policy::Verdict;
        match p.model_call(&caller, &plan.model, estimate).await {
            Ok(Verdict::Allow) => {}
            Ok(Verdict::Deny { rule }) => return Err(fail(CallError::PolicyDenied(rule))),
            Ok(Verdict::RequireApproval { rule }) => {
                return Err(fail(CallError::ApprovalRequired(rule)))
            }
            Ok(Verdict::ApprovalTimedOut { rule, approval_id }) => {
                return Err(fail(CallError::ApprovalTimedOut { rule, approval_id }))
            }
            Ok(Verdict::TooManyApprovals { open }) => {
                return Err(fail(CallError::TooManyApprovals(open)))
            }
            Ok(Verdict::SessionGone) => {
                return Err(fail(CallError::Intent(
                    crate::events::IntentError::SessionEnded,
                )))
            }
            Err(e) => return Err(fail(CallError::Policy(e))),
        }
    }
    let id = format!("rsv_{:032x}", rand::random::<u128>());
    let scopes = caller.scopes();
    let t = Instant::now();
    // Stamped by the store's clock, which its janitor expires by.
    let reserved = match g.store.now_ms().await {
        Ok(now) => {
            g.store
                .reserve(&id, &scopes, estimate, now, g.reservation_ttl_ms)
                .await
        }
        Err(e) => Err(e),
    };
    g.metrics.reserve_seconds.observe(t.elapsed().as_secs_f64());
    if let Err(e) = reserved {
        if let BudgetError::Exhausted { scope, .. } = &e {
            g.events
                .record_first(GatewayEvent::Exhausted {
                    caller: caller.clone(),
                    scope: scope.clone(),
                })
                .await;
        }
        return Err(fail(CallError::Store(e)));
    }
    // The call's intent is in the session's log before the upstream is
    // dialled; a session that ended or a log that cannot take it keeps
    // the call from going out (and frees its reservation).
    let intent = GatewayEvent::Requested {
        caller: caller.clone(),
        flavor,
        model: plan.model.clone(),
        reservation: id.clone(),
        reserved: estimate,
    };
    if let Err(e) = g.events.intent(intent).await {
        if let Err(err) = g.store.settle(&id, &scopes, Amount::default()).await {
            tracing::error!(reservation = %id, error = %err, "freeing an unsent call's reservation failed");
        }
        return Err(fail(e.into()));
    }
    // From here the reservation is settled whatever happens to this
    // request: the exchange runs in a task of its own, which a caller that
    // hangs up does not cancel, within a deadline shorter than the
    // reservation's TTL (and `Settle` charges it whole if dropped).
    let settle = Settle::new(
        g.clone(),
        id,
        scopes,
        caller.clone(),
        flavor,
        plan.model.clone(),
        price,
        estimate,
    );
    let ttl = Duration::from_millis(g.reservation_ttl_ms);
    let exchange = Exchange {
        upstream,
        path,
        body: plan.body,
        headers: pass_headers(flavor, headers),
        stream: plan.stream,
        deadline: tokio::time::Instant::now() + answer_deadline(ttl),
        within: answer_deadline(ttl),
    };
    Ok(crate::answer::run(settle, exchange).await)
}

/// The `anthropic-beta` flags passed to the upstream: those that change
/// nothing a reservation does not already cover (docs/gateway.md, "Beta
/// flags"). Any other flag is dropped: a beta can change what a call
/// costs beyond its estimate (`context-1m-…` prices a long prompt at
/// twice the rate, `output-128k-…` lifts the output ceiling) or bring
/// input the gateway cannot bound (files, MCP, code execution).
pub const ANTHROPIC_BETAS: [&str; 4] = [
    "prompt-caching-2024-07-31",
    "extended-cache-ttl-2025-04-11",
    "token-efficient-tools-2025-02-19",
    "fine-grained-tool-streaming-2025-05-14",
];

/// Request headers the upstream needs to see (the protocol's version, and
/// the allowed beta flags); never the caller's key.
fn pass_headers(flavor: Flavor, h: &HeaderMap) -> Vec<(&'static str, String)> {
    let names: &[&'static str] = match flavor {
        Flavor::OpenAi => &["openai-organization", "openai-project"],
        Flavor::Anthropic => &["anthropic-version"],
    };
    let mut out: Vec<(&'static str, String)> = names
        .iter()
        .filter_map(|n| Some((*n, h.get(*n)?.to_str().ok()?.to_string())))
        .collect();
    if flavor == Flavor::Anthropic {
        // Comma-separated, possibly over several header lines.
        let allowed: Vec<&str> = h
            .get_all("anthropic-beta")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|f| ANTHROPIC_BETAS.contains(f))
            .collect();
        if !allowed.is_empty() {
            out.push(("anthropic-beta", allowed.join(",")));
        }
    }
    out
}

#[cfg(test)]
#[path = "calls_tests.rs"]
mod tests;
