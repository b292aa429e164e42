//! HTTP routes. `POST /playground/run` refuses cheaply, in a fixed order,
//! before anything is spent: size (413), rate (429), in-flight cap (503),
//! template (400). A cache hit is answered before the in-flight cap, since it
//! spends nothing.

use crate::app::App;
use crate::assets;
use crate::cache::{key, Entry};
use crate::events::{cut, Exit};
use crate::limits::{client_ip, LimitError};
use crate::refusal::Refusal;
use crate::run::{self, Event, Job};
use crate::runs::Run;
use axum::body::Body;
use axum::extract::{ConnectInfo, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{self, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use futures::StreamExt;
use http_body_util::{BodyExt, Limited};
use rand::Rng;
use serde::Deserialize;
use serde_json::json;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const SESSION_COOKIE: &str = "hx_playground";

pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/playground/run", post(run_snippet).options(preflight))
        .route("/playground/stats", get(stats))
        .route(
            "/playground/widget.js",
            get(|| async { asset("text/javascript; charset=utf-8", assets::WIDGET_JS) }),
        )
        .route(
            "/playground/widget.css",
            get(|| async { asset("text/css; charset=utf-8", assets::WIDGET_CSS) }),
        )
        .route(
            "/playground/demo",
            get(|| async { asset("text/html; charset=utf-8", assets::DEMO_HTML) }),
        )
        .route("/metrics", get(metrics))
        .route(
            "/healthz",
            get(|| async { axum::Json(json!({"status": "ok"})) }),
        )
        .fallback(|| async { Refusal::NotFound })
        .method_not_allowed_fallback(|| async { Refusal::MethodNotAllowed })
        .layer(middleware::from_fn_with_state(app.clone(), cors))
        .with_state(app)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "public, max-age=300"),
        ],
        body,
    )
        .into_response()
}

/// CORS for docs sites on other origins: only origins listed with
/// `--allow-origin` (or any, with `*`) get the headers.
async fn cors(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let origin = req.headers().get(header::ORIGIN).cloned();
    let mut resp = next.run(req).await;
    if let Some(origin) = origin {
        let ok = origin
            .to_str()
            .map(|o| app.allow_origins.iter().any(|a| a == "*" || a == o))
            .unwrap_or(false);
        if ok {
            let h = resp.headers_mut();
            h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
            h.insert(
                header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
                HeaderValue::from_static("true"),
            );
            h.insert(
                header::ACCESS_CONTROL_EXPOSE_HEADERS,
                HeaderValue::from_static("retry-after"),
            );
            h.append(header::VARY, HeaderValue::from_static("origin"));
        }
    }
    resp
}

async fn preflight() -> Response {
    (
        StatusCode::NO_CONTENT,
        [
            (header::ACCESS_CONTROL_ALLOW_METHODS, "POST"),
            (header::ACCESS_CONTROL_ALLOW_HEADERS, "content-type"),
            (header::ACCESS_CONTROL_MAX_AGE, "600"),
        ],
    )
        .into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RunBody {
    code: String,
    #[serde(default = "default_template")]
    template: String,
}

fn default_template() -> String {
    "code-interpreter".into()
}

fn session_of(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == SESSION_COOKIE)
        .map(|(_, v)| v.to_string())
        .filter(|v| v.len() == 32 && v.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn random_hex(n: usize) -> String {
    let mut r = rand::thread_rng();
    (0..n)
        .map(|_| format!("{:x}", r.gen_range(0..16u8)))
        .collect()
}

struct Visitor {
    ip: IpAddr,
    ip_hash: String,
    session: Option<String>,
    new_session: Option<String>,
    at: SystemTime,
    t0: Instant,
}

impl Visitor {
    fn run_row(&self, run_id: &str, template: Option<String>) -> Run {
        Run {
            run_id: run_id.to_string(),
            at: self.at,
            ip_hash: self.ip_hash.clone(),
            template,
            duration_ms: None,
            exit_code: None,
            bytes_out: 0,
            cached: false,
            refused: None,
            outcome: "refused",
        }
    }
}

async fn run_snippet(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let t0 = Instant::now();
    // Several X-Forwarded-For lines read as one list, in order.
    let xff: Vec<&str> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    let xff = (!xff.is_empty()).then(|| xff.join(","));
    let ip = client_ip(peer.ip(), xff.as_deref(), &app.trusted);
    let cookie = session_of(&headers);
    let new_session = cookie.is_none().then(|| random_hex(32));
    // A newly issued session is charged too, so its first run counts.
    let session = cookie.or_else(|| new_session.clone());
    let v = Visitor {
        ip,
        ip_hash: app.runs.ip_hash(ip),
        session,
        new_session,
        at: SystemTime::now(),
        t0,
    };
    let run_id = format!("run_{}", random_hex(16));
    let mut resp = match admit(&app, &v, &run_id, body).await {
        Ok(r) => r,
        Err((refusal, template)) => {
            app.metrics
                .refusals
                .with_label_values(&[refusal.code()])
                .inc();
            let mut row = v.run_row(&run_id, template);
            row.refused = Some(refusal.code());
            app.runs.record(row);
            refusal.into_response()
        }
    };
    if let Some(s) = &v.new_session {
        let cookie = format!(
            "{SESSION_COOKIE}={s}; Path=/playground; HttpOnly; SameSite=Lax; Max-Age=86400"
        );
        if let Ok(h) = HeaderValue::from_str(&cookie) {
            resp.headers_mut().append(header::SET_COOKIE, h);
        }
    }
    resp
}

type Refused = (Refusal, Option<String>);

async fn admit(app: &Arc<App>, v: &Visitor, run_id: &str, body: Body) -> Result<Response, Refused> {
    // JSON escaping can grow a snippet up to 6x (\uXXXX); anything longer
    // than that cannot hold an acceptable snippet.
    let body_cap = app.max_code_bytes * 6 + 1024;
    let bytes = Limited::new(body, body_cap)
        .collect()
        .await
        .map_err(|_| (Refusal::TooLarge(app.max_code_bytes), None))?
        .to_bytes();
    let req: RunBody =
        serde_json::from_slice(&bytes).map_err(|e| (Refusal::InvalidJson(e.to_string()), None))?;
    // Visitor-supplied: bounded before it is logged, stored or echoed.
    let tpl = Some(cut(&req.template, 64).to_string());
    if req.code.len() > app.max_code_bytes {
        return Err((Refusal::TooLarge(app.max_code_bytes), tpl));
    }
    app.limiter
        .check(v.ip, v.session.as_deref())
        .map_err(|e| match e {
            LimitError::RateLimited(d) => (Refusal::RateLimited(d), tpl.clone()),
            LimitError::Busy => (Refusal::Busy, tpl.clone()),
        })?;
    let runner = app.templates.get(&req.template).cloned();
    let version = match runner {
        Some(_) => app.template_version(&req.template).await,
        None => None,
    };
    let cache_key = version
        .as_deref()
        .map(|ver| key(&req.template, ver, &req.code));
    if let Some(hit) = cache_key.as_deref().and_then(|k| app.cache.get(k)) {
        app.metrics.cache_hits.inc();
        return Ok(replay(app, v, run_id, &req.template, hit));
    }
    let permit = app
        .in_flight
        .try_acquire()
        .map_err(|_| (Refusal::Busy, tpl.clone()))?;
    let Some(runner) = runner else {
        return Err((
            Refusal::UnknownTemplate(cut(&req.template, 64).to_string()),
            tpl,
        ));
    };
    app.metrics.cache_misses.inc();
    let (tx, rx) = mpsc::channel::<Event>(16);
    let job = Job {
        run_id: run_id.to_string(),
        template: req.template,
        runner,
        code: req.code,
    };
    let app2 = app.clone();
    let mut row = v.run_row(run_id, Some(job.template.clone()));
    let t0 = v.t0;
    tokio::spawn(async move {
        let _permit = permit;
        let report = run::execute(&app2.daemon, &app2.limits, job, tx).await;
        let m = &app2.metrics;
        m.run_seconds.observe(t0.elapsed().as_secs_f64());
        if let Some(first) = report.first_output {
            m.first_byte_seconds
                .observe(first.duration_since(t0).as_secs_f64());
        }
        match report.outcome {
            "error" => m.errors.inc(),
            _ => m.runs.with_label_values(&["sandbox"]).inc(),
        }
        if let (Some(k), Some(entry)) = (cache_key, report.entry) {
            if let Err(e) = app2.cache.put(k, entry) {
                tracing::debug!(error = %e, "not cached");
            }
        }
        row.duration_ms = Some(t0.elapsed().as_millis() as u64);
        row.exit_code = report.exit.as_ref().and_then(|e| e.exit_code);
        row.bytes_out = report.bytes_out;
        row.outcome = report.outcome;
        tracing::info!(run = %row.run_id, template = ?row.template, outcome = row.outcome,
                       duration_ms = row.duration_ms, exit_code = ?row.exit_code, bytes_out = row.bytes_out,
                       "run finished");
        app2.runs.record(row);
    });
    Ok(sse_response(rx))
}

fn replay(app: &Arc<App>, v: &Visitor, run_id: &str, template: &str, hit: Arc<Entry>) -> Response {
    let mut events = Vec::with_capacity(hit.output.len() + 2);
    events.push(Event::Start {
        run_id: run_id.to_string(),
        cached: true,
    });
    events.extend(hit.output.iter().cloned().map(Event::Output));
    events.push(Event::Exit(Exit {
        cached: true,
        ..hit.exit.clone()
    }));
    let m = &app.metrics;
    m.runs.with_label_values(&["cache"]).inc();
    m.first_byte_seconds.observe(v.t0.elapsed().as_secs_f64());
    let mut row = v.run_row(run_id, Some(template.to_string()));
    row.cached = true;
    row.duration_ms = Some(v.t0.elapsed().as_millis() as u64);
    row.exit_code = hit.exit.exit_code;
    row.bytes_out = hit.output.iter().map(|o| o.data.len() as u64).sum();
    row.outcome = if hit.exit.timed_out {
        "timeout"
    } else if hit.exit.truncated {
        "truncated"
    } else {
        "ok"
    };
    app.runs.record(row);
    let stream = futures::stream::iter(events).map(|e| Ok::<_, Infallible>(to_sse(e)));
    with_stream_headers(Sse::new(stream).into_response())
}

fn to_sse(e: Event) -> sse::Event {
    let (name, data) = match e {
        Event::Start { run_id, cached } => ("start", json!({"run_id": run_id, "cached": cached})),
        Event::Output(o) => (o.stream.name(), json!({"data": o.data})),
        Event::Exit(x) => ("exit", serde_json::to_value(x).unwrap_or_default()),
        Event::Error { code, message } => (
            "error",
            json!({"error": {"code": code, "message": message}}),
        ),
    };
    sse::Event::default().event(name).data(data.to_string())
}

/// How often a quiet stream gets an SSE comment. It is also how a visitor
/// who left is noticed: the server learns of a closed connection only when
/// a write fails, which is the second write after the close (the first
/// draws the reset). So a run whose program prints nothing has its sandbox
/// deleted and its slot freed within about two of these after the visitor
/// leaves (at 5 s that was up to 10 s, past what the tests allow).
const KEEP_ALIVE: Duration = Duration::from_secs(1);

fn sse_response(rx: mpsc::Receiver<Event>) -> Response {
    let stream = ReceiverStream::new(rx).map(|e| Ok::<_, Infallible>(to_sse(e)));
    with_stream_headers(
        Sse::new(stream)
            .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
            .into_response(),
    )
}

fn with_stream_headers(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    // Tells nginx not to buffer the stream.
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    r
}

#[derive(Deserialize)]
struct StatsQuery {
    window_seconds: Option<u64>,
}

async fn stats(State(app): State<Arc<App>>, Query(q): Query<StatsQuery>) -> Response {
    let window = Duration::from_secs(q.window_seconds.unwrap_or(86400).clamp(1, 90 * 86400));
    match app.runs.stats(window).await {
        Ok(s) => {
            let live = json!({
                "in_flight": app.in_flight.current(),
                "cache_entries": app.cache.len(),
                "cache_bytes": app.cache.bytes(),
            });
            let mut v = serde_json::to_value(s).unwrap_or_default();
            v["live"] = live;
            axum::Json(v).into_response()
        }
        Err(e) => {
            tracing::error!(error = %e, "stats query failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                axum::Json(json!({"error": {"code": "internal", "message": "stats unavailable"}})),
            )
                .into_response()
        }
    }
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    let m = &app.metrics;
    m.in_flight.set(app.in_flight.current() as i64);
    m.cache_entries.set(app.cache.len() as i64);
    m.cache_bytes.set(app.cache.bytes() as i64);
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        m.render(),
    )
        .into_response()
}
