//! One model call through the gateway: who is calling, what it may cost at
//! most, the reservation, the upstream call with the real key, and the
//! settlement of what it actually cost, streamed or not.

use crate::budget::{Amount, BudgetError, Caller};
use crate::errors::CallError;
use crate::events::GatewayEvent;
use crate::pricing::input_tokens_upper_bound;
use crate::usage::{Flavor, SseData, Usage};
use crate::Gateway;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::time::Instant;

/// Most completions one OpenAI call may ask for (`n`); each is reserved.
pub const MAX_CHOICES: u64 = 8;
/// Largest non-streamed upstream answer passed on.
const MAX_ANSWER: usize = 16 << 20;

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
    let input_bound = input_tokens_upper_bound(&plan.body);
    let estimate = Amount {
        tokens: input_bound + plan.max_output,
        usd_cents: price.cents(input_bound, plan.max_output),
    };
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
            g.events.record(GatewayEvent::Exhausted {
                caller: caller.clone(),
                scope: scope.clone(),
            });
        }
        return Err(fail(CallError::Store(e)));
    }
    let settle = Settle {
        g: g.clone(),
        id,
        scopes,
        caller: caller.clone(),
        flavor,
        model: plan.model.clone(),
        price,
        estimate,
    };
    let answer = match upstream
        .post(path, plan.body.clone(), &pass_headers(flavor, headers))
        .await
    {
        Ok(a) => a,
        Err(e) => {
            // Nothing was generated: release the reservation in full.
            settle.finish(Some((0, 0))).await;
            return Err(fail(CallError::Upstream(e)));
        }
    };
    let status = answer.status();
    let content_type = answer.headers().get("content-type").cloned();
    if plan.stream && status.is_success() {
        return Ok(stream_through(
            settle,
            status,
            content_type,
            answer.into_body(),
        ));
    }
    let bytes = match Limited::new(answer.into_body(), MAX_ANSWER).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            settle.finish(None).await;
            return Err(fail(CallError::BadUpstreamAnswer));
        }
    };
    let usage = serde_json::from_slice::<Value>(&bytes)
        .map(|v| Usage::of_body(flavor, &v))
        .unwrap_or_default();
    // An upstream error generated nothing unless it says otherwise.
    let used = usage
        .complete()
        .or((!status.is_success()).then_some((0, 0)));
    // Settled off the response path: until it lands the reservation (an
    // upper bound) still counts, so budgets only err on the safe side.
    tokio::spawn(settle.finish(used));
    g.metrics.call(
        flavor,
        if status.is_success() {
            "ok"
        } else {
            "upstream_error"
        },
    );
    Ok(respond(status, content_type, Body::from(bytes)))
}

/// Request headers the upstream needs to see (the protocol's version and
/// beta flags); never the caller's key.
fn pass_headers(flavor: Flavor, h: &HeaderMap) -> Vec<(&'static str, String)> {
    let names: &[&'static str] = match flavor {
        Flavor::OpenAi => &["openai-organization", "openai-project"],
        Flavor::Anthropic => &["anthropic-version", "anthropic-beta"],
    };
    names
        .iter()
        .filter_map(|n| Some((*n, h.get(*n)?.to_str().ok()?.to_string())))
        .collect()
}

fn respond(status: StatusCode, content_type: Option<HeaderValue>, body: Body) -> Response {
    let mut r = Response::new(body);
    *r.status_mut() = status;
    if let Some(ct) = content_type {
        r.headers_mut().insert("content-type", ct);
    }
    r
}

/// Passes the upstream's stream on as it arrives, reading usage out of it
/// on the way, and settles when it ends (or the caller goes away).
fn stream_through(
    settle: Settle,
    status: StatusCode,
    content_type: Option<HeaderValue>,
    mut body: hyper::body::Incoming,
) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(16);
    let flavor = settle.flavor;
    tokio::spawn(async move {
        let (mut sse, mut usage) = (SseData::default(), Usage::default());
        let mut clean = false;
        loop {
            match body.frame().await {
                Some(Ok(f)) => {
                    let Ok(data) = f.into_data() else { continue };
                    sse.push(&data, |d| usage.feed_event(flavor, d));
                    if tx.send(Ok(data)).await.is_err() {
                        break; // the caller went away
                    }
                }
                Some(Err(e)) => {
                    let _ = tx.send(Err(std::io::Error::other(e.to_string()))).await;
                    break;
                }
                None => {
                    clean = true;
                    break;
                }
            }
        }
        // Without a usage report the worst case is what it cost.
        settle
            .g
            .metrics
            .call(flavor, if clean { "ok" } else { "interrupted" });
        settle.finish(usage.complete()).await;
    });
    respond(
        status,
        content_type,
        Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx)),
    )
}

/// Everything needed to settle one reservation.
struct Settle {
    g: Arc<Gateway>,
    id: String,
    scopes: Vec<String>,
    caller: Caller,
    flavor: Flavor,
    model: String,
    price: crate::pricing::Price,
    estimate: Amount,
}

impl Settle {
    /// `used`: (input, output) tokens, or None when unknown (then the
    /// reservation's estimate is recorded: it is an upper bound).
    async fn finish(self, used: Option<(u64, u64)>) {
        let actual = match used {
            Some((i, o)) => Amount {
                tokens: i + o,
                usd_cents: self.price.cents(i, o),
            },
            None => self.estimate,
        };
        let called = GatewayEvent::Called {
            caller: self.caller,
            flavor: self.flavor,
            model: self.model,
            input_tokens: used.map(|u| u.0),
            output_tokens: used.map(|u| u.1),
            charged: actual,
            reserved: self.estimate,
        };
        let settlement = crate::store::Settlement {
            id: self.id.clone(),
            scopes: self.scopes,
            actual,
            fresh: false,
        };
        if let Err(e) = self
            .g
            .events
            .settle(&*self.g.store, settlement, called)
            .await
        {
            // The janitor frees the reservation after its TTL; the spend
            // of this call is then missing, which the log records.
            tracing::error!(reservation = %self.id, error = %e, "settling a model call failed");
        }
    }
}
