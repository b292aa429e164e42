//! `/v1/sessions` routes.

use crate::api_state::ApiState;
use crate::auth::{require_daemon_key, require_key};
use crate::error::SessionError;
use crate::events::{Event, EventKind};
use crate::extract::{Json, Query};
use crate::models::*;
use crate::service::Sessions;
use crate::state::SessionState;
use crate::store::{ListFilter, TenantLimits};
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use hatchery_tenants::Principal;
use serde::Deserialize;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

pub const MAX_JSON_BODY: usize = 256 << 10;
/// How long `:cancel` waits for the agent to be stopped and the review
/// snapshot taken before it answers with the state so far.
const CANCEL_WAIT: Duration = Duration::from_secs(90);
const PAGE_DEFAULT: usize = 100;
const PAGE_MAX: usize = 1000;
const SSE_BATCH: usize = 256;

/// `tenants`: resolves tenant keys, which then reach only their own
/// sessions (`None`: only the API key is let in).
pub fn router(
    sessions: Arc<Sessions>,
    api_key: Arc<str>,
    daemon_key: Arc<str>,
    tenants: Option<Arc<hatchery_tenants::Tenants>>,
) -> Router {
    let st = ApiState {
        sessions,
        api_key,
        daemon_key,
        tenants,
    };
    Router::new()
        .route("/v1/sessions", post(create).get(list))
        .route("/v1/sessions/{id}", get(get_one).post(colon_action))
        .route("/v1/sessions/{id}/cancel", post(cancel))
        .route("/v1/sessions/{id}/events", get(events))
        .route("/v1/sessions/{id}/messages", post(message))
        .route(
            "/v1/sessions/{id}/model-events",
            post(crate::model_events::post_model_event).route_layer(
                axum::middleware::from_fn_with_state(st.clone(), require_daemon_key),
            ),
        )
        .route(
            "/v1/sessions/{id}/broker-events",
            post(crate::broker_events::post_broker_events).route_layer(
                axum::middleware::from_fn_with_state(st.clone(), require_daemon_key),
            ),
        )
        .route("/v1/sessions/{id}/approvals/{aid}", post(approve))
        .route("/v1/sessions/{id}/blobs/{blob_ref}", get(blob))
        .route(
            "/v1/sessions/{id}/policy",
            post(crate::policy_move::move_policy),
        )
        .merge(crate::environment_routes::routes())
        .layer(axum::extract::DefaultBodyLimit::max(MAX_JSON_BODY))
        .route_layer(axum::middleware::from_fn_with_state(
            st.clone(),
            require_key,
        ))
        .with_state(st)
}

fn session_id(id: &str) -> Result<&str, SessionError> {
    if crate::ids::valid("ses", id) {
        Ok(id)
    } else {
        Err(SessionError::NotFound(id.to_string()))
    }
}

#[utoipa::path(post, path = "/v1/sessions", tag = "sessions", request_body = CreateSessionBody,
    responses((status = 201, body = CreatedSession), (status = 200, body = CreatedSession, description = "idempotent replay"),
              (status = 400, body = crate::error::ErrorBody), (status = 404, body = crate::error::ErrorBody),
              (status = 409, body = crate::error::ErrorBody),
              (status = 429, body = crate::error::ErrorBody, description = "tenant_budget_exhausted: a tenant key's session whose budget its tenant's limits (tokens, usd_cents, concurrent_sessions, wall_clock_seconds) have no room for; nothing is stored")))]
pub async fn create(
    State(st): State<ApiState>,
    Extension(who): Extension<Principal>,
    Json(body): Json<CreateSessionBody>,
) -> Result<Response, SessionError> {
    let limits = match who.tenant() {
        Some(t) => Some((t, tenant_limits(&st, t).await?)),
        None => None,
    };
    let tenant = limits.as_ref().map(|(t, l)| (*t, l));
    let (created, new) = st.sessions.create(body, tenant).await?;
    let status = if new {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, axum::Json(created)).into_response())
}

/// The limits a tenant's new session is reserved against.
async fn tenant_limits(st: &ApiState, tenant: &str) -> Result<TenantLimits, SessionError> {
    let Some(tenants) = &st.tenants else {
        return Err(SessionError::Internal(
            "a tenant principal without a tenant store".into(),
        ));
    };
    let l = tenants
        .limits(tenant)
        .await
        .map_err(SessionError::Tenants)?;
    Ok(TenantLimits {
        tokens: l.tokens,
        usd_cents: l.usd_cents,
        concurrent_sessions: l.concurrent_sessions,
        wall_s: l.wall_clock_seconds,
    })
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    pub state: Option<String>,
    pub repo: Option<String>,
    /// A session id: list sessions created after it.
    pub after: Option<String>,
    /// 1..1000 (default 100).
    pub limit: Option<usize>,
}

#[utoipa::path(get, path = "/v1/sessions", tag = "sessions", params(ListQuery),
    responses((status = 200, body = SessionList), (status = 400, body = crate::error::ErrorBody)))]
pub async fn list(
    State(st): State<ApiState>,
    Extension(who): Extension<Principal>,
    Query(q): Query<ListQuery>,
) -> Result<axum::Json<SessionList>, SessionError> {
    let state =
        match q.state.as_deref() {
            None => None,
            Some(s) => Some(SessionState::parse(s).ok_or_else(|| {
                SessionError::bad("invalid_query", format!("unknown state {s:?}"))
            })?),
        };
    let limit = q.limit.unwrap_or(PAGE_DEFAULT);
    if !(1..=PAGE_MAX).contains(&limit) {
        return Err(SessionError::bad(
            "invalid_query",
            format!("limit must be 1..{PAGE_MAX}"),
        ));
    }
    let rows = st
        .sessions
        .core
        .store
        .list(&ListFilter {
            state,
            repo: q.repo,
            after_id: q.after,
            // A tenant lists its own sessions only.
            tenant: who.tenant().map(str::to_string),
            limit: limit + 1,
        })
        .await?;
    let more = rows.len() > limit;
    let mut sessions = Vec::new();
    for s in rows.into_iter().take(limit) {
        let p = st.sessions.core.store.pending_approval(&s.id).await?;
        sessions.push(SessionView::new(s, p));
    }
    let next_after = more
        .then(|| sessions.last().map(|s| s.session_id.clone()))
        .flatten();
    Ok(axum::Json(SessionList {
        sessions,
        next_after,
    }))
}

#[utoipa::path(get, path = "/v1/sessions/{id}", tag = "sessions",
    responses((status = 200, body = SessionView), (status = 404, body = crate::error::ErrorBody)))]
pub async fn get_one(
    State(st): State<ApiState>,
    Path(id): Path<String>,
) -> Result<axum::Json<SessionView>, SessionError> {
    Ok(axum::Json(st.sessions.view(session_id(&id)?).await?))
}

/// `POST /v1/sessions/{id}:cancel`: the router sees `{id}` = `ses_…:cancel`.
async fn colon_action(
    st: State<ApiState>,
    Path(id): Path<String>,
) -> Result<axum::Json<SessionView>, SessionError> {
    match id.split_once(':') {
        Some((sid, "cancel")) => cancel(st, Path(sid.to_string())).await,
        _ => Err(SessionError::bad(
            "invalid_request",
            "POST /v1/sessions/{id} takes an action: {id}:cancel",
        )),
    }
}

#[utoipa::path(post, path = "/v1/sessions/{id}:cancel", tag = "sessions",
    description = "Stops the agent, keeps a snapshot of the sandbox for review, and ends the session as cancelled. Idempotent; `/v1/sessions/{id}/cancel` is an alias. Waits up to 90 s for the runner.",
    responses((status = 200, body = SessionView), (status = 404, body = crate::error::ErrorBody), (status = 409, body = crate::error::ErrorBody)))]
pub async fn cancel(
    State(st): State<ApiState>,
    Path(id): Path<String>,
) -> Result<axum::Json<SessionView>, SessionError> {
    Ok(axum::Json(
        st.sessions.cancel(session_id(&id)?, CANCEL_WAIT).await?,
    ))
}

#[utoipa::path(post, path = "/v1/sessions/{id}/messages", tag = "sessions", request_body = MessageBody,
    responses((status = 202, body = MessageAccepted), (status = 404, body = crate::error::ErrorBody), (status = 409, body = crate::error::ErrorBody)))]
pub async fn message(
    State(st): State<ApiState>,
    Path(id): Path<String>,
    Json(body): Json<MessageBody>,
) -> Result<(StatusCode, axum::Json<MessageAccepted>), SessionError> {
    let r = st.sessions.message(session_id(&id)?, &body.text).await?;
    Ok((StatusCode::ACCEPTED, axum::Json(r)))
}

#[utoipa::path(post, path = "/v1/sessions/{id}/approvals/{aid}", tag = "sessions", request_body = ApprovalBody,
    responses((status = 200, body = ApprovalDecided), (status = 400, body = crate::error::ErrorBody),
              (status = 404, body = crate::error::ErrorBody), (status = 409, body = crate::error::ErrorBody)))]
pub async fn approve(
    State(st): State<ApiState>,
    Path((id, aid)): Path<(String, String)>,
    Json(body): Json<ApprovalBody>,
) -> Result<axum::Json<ApprovalDecided>, SessionError> {
    Ok(axum::Json(
        st.sessions.decide(session_id(&id)?, &aid, &body).await?,
    ))
}

#[utoipa::path(get, path = "/v1/sessions/{id}/blobs/{blob_ref}", tag = "sessions",
    description = "The whole text of an event field that was cut (`output_ref`, `content_ref`, `text_ref`).",
    responses((status = 200, content_type = "text/plain"), (status = 404, body = crate::error::ErrorBody)))]
pub async fn blob(
    State(st): State<ApiState>,
    Path((id, r)): Path<(String, String)>,
) -> Result<Response, SessionError> {
    let data = st.sessions.blob(session_id(&id)?, &r).await?;
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; charset=utf-8",
        )],
        data,
    )
        .into_response())
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// Events with seq greater than this (default 0; `Last-Event-ID` is
    /// used when absent). Beyond the newest seq: 400.
    pub after: Option<u64>,
    /// JSON page size, 1..1000 (default 100).
    pub limit: Option<usize>,
    /// `sse` or `json`; default from `Accept` (`text/event-stream` → SSE).
    pub format: Option<String>,
}

fn is_end(e: &Event) -> bool {
    matches!(&e.kind, EventKind::StateChanged { to, .. } if to.is_terminal())
}

#[utoipa::path(get, path = "/v1/sessions/{id}/events", tag = "sessions", params(EventsQuery),
    description = "The ordered event log. As SSE (`Accept: text/event-stream` or `format=sse`): each event's SSE id is its seq, `Last-Event-ID` is honoured, comments every 15 s keep the connection alive, and the stream ends after the session's final state change. Otherwise a JSON page.",
    responses((status = 200, body = EventPage), (status = 400, body = crate::error::ErrorBody),
              (status = 404, body = crate::error::ErrorBody), (status = 503, body = crate::error::ErrorBody)))]
pub async fn events(
    State(st): State<ApiState>,
    Path(id): Path<String>,
    Query(q): Query<EventsQuery>,
    headers: HeaderMap,
) -> Result<Response, SessionError> {
    let id = session_id(&id)?.to_string();
    let sse = match q.format.as_deref() {
        Some("sse") => true,
        Some("json") => false,
        Some(o) => {
            return Err(SessionError::bad(
                "invalid_query",
                format!("format {o:?} is not sse or json"),
            ))
        }
        None => headers
            .get(axum::http::header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|a| a.contains("text/event-stream")),
    };
    let after = match q.after {
        Some(a) => a,
        None => match headers
            .get("last-event-id")
            .map(|v| v.to_str().map(|s| s.trim().parse::<u64>()))
        {
            None => 0,
            Some(Ok(Ok(n))) => n,
            Some(_) => {
                return Err(SessionError::bad(
                    "invalid_request",
                    "Last-Event-ID must be an event seq",
                ))
            }
        },
    };
    let s = st.sessions.core.store.get(&id).await?;
    if after > s.last_seq {
        return Err(SessionError::bad(
            "after_beyond_end",
            format!("after={after} is beyond the newest event ({})", s.last_seq),
        ));
    }
    if !sse {
        let limit = q.limit.unwrap_or(PAGE_DEFAULT);
        if !(1..=PAGE_MAX).contains(&limit) {
            return Err(SessionError::bad(
                "invalid_query",
                format!("limit must be 1..{PAGE_MAX}"),
            ));
        }
        let events = st.sessions.core.store.events(&id, after, limit).await?;
        let has_more = events.last().is_some_and(|e| e.seq < s.last_seq);
        return Ok(axum::Json(EventPage {
            events,
            last_seq: s.last_seq,
            has_more,
        })
        .into_response());
    }
    let Some(slot) = st.sessions.streams.try_take() else {
        st.sessions.core.metrics.streams_refused.inc();
        return Err(SessionError::TooManyStreams(st.sessions.streams.open()));
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<SseEvent, Infallible>>(64);
    let svc = st.sessions.clone();
    svc.core.metrics.open_streams.inc();
    tokio::spawn(async move {
        let _slot = slot;
        let r = tokio::select! {
            r = pump(&svc, &id, after, &tx) => r,
            _ = tx.closed() => Ok(()),
        };
        if let Err(e) = r {
            tracing::warn!(session = %id, error = %e, "event stream ended on a store error");
        }
        svc.core.metrics.open_streams.dec();
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}

fn sse_event(e: &Event) -> SseEvent {
    SseEvent::default()
        .id(e.seq.to_string())
        .event(e.kind.type_name())
        .data(serde_json::to_string(e).unwrap_or_default())
}

/// Catch up from the store, then follow the bus; back to the store on any
/// gap or lag. Ends after the final state change.
async fn pump(
    svc: &Arc<Sessions>,
    id: &str,
    mut last: u64,
    tx: &tokio::sync::mpsc::Sender<Result<SseEvent, Infallible>>,
) -> Result<(), SessionError> {
    use tokio::sync::broadcast::error::RecvError;
    let mut rx = svc.core.bus.subscribe(id);
    loop {
        loop {
            let page = svc.core.store.events(id, last, SSE_BATCH).await?;
            let n = page.len();
            for e in page {
                if tx.send(Ok(sse_event(&e))).await.is_err() {
                    return Ok(());
                }
                last = e.seq;
                if is_end(&e) {
                    return Ok(());
                }
            }
            if n < SSE_BATCH {
                break;
            }
        }
        let s = svc.core.store.get(id).await?;
        if s.state.is_terminal() && last >= s.last_seq {
            return Ok(());
        }
        loop {
            match rx.recv().await {
                Ok(e) if e.seq <= last => continue,
                Ok(e) if e.seq == last + 1 => {
                    if tx.send(Ok(sse_event(&e))).await.is_err() {
                        return Ok(());
                    }
                    last = e.seq;
                    if is_end(&e) {
                        return Ok(());
                    }
                }
                Ok(_) | Err(RecvError::Lagged(_)) => break,
                Err(RecvError::Closed) => return Ok(()),
            }
        }
    }
}
