//! E2B's control plane (`E2B_API_URL`): the REST calls the SDKs make to
//! create, find, time out, pause, resume and kill sandboxes, with E2B's
//! shapes, status codes and `{"code": <status>, "message"}` errors.

use crate::api_error::{ApiError, ApiResult, Body};
use crate::backend::{BackendError, Caller, CreateSpec, FailKind, NetworkSpec, SandboxView};
use crate::lifecycle::Lifecycle;
use crate::network::{
    header_rules, network_spec, refuse_rules_update, refuse_unsupported, NetworkBody,
};
use crate::pause_resume::{pause_live, resume_paused, Resumed};
use crate::query::{form_pairs, pct_decode, MAX_PAGE};
use crate::state::{self, present, Shared, FORK_KEY};
use crate::template_alias::template_alias;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The envd version reported for every sandbox: the SDKs turn features on
/// by it (`e2b/envd/versions.py`, `versions.ts`). 0.6.4 has everything
/// they gate: the default user (0.4.0), stdin control, `CloseStdin`,
/// octet-stream and gzip uploads (0.5.7), file metadata (0.6.2), entry
/// info in watch events (0.6.3) and watches of network mounts (0.6.4).
/// envd's own routes no SDK calls (`/files/compose`, `/metrics`, `/envs`,
/// `/init`) are not served.
pub const ENVD_VERSION: &str = "0.6.4";
/// E2B's default timeout for `POST /v2/sandboxes` and connects.
pub const DEFAULT_TIMEOUT_S: u64 = 300;

fn rfc3339(ms: u64) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

fn sandbox_json(s: &Shared, e2b_id: &str, v: &SandboxView) -> Value {
    json!({
        "templateID": v.template,
        "alias": v.template,
        "sandboxID": e2b_id,
        "clientID": "hatchery",
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": s.access_token(e2b_id),
        "domain": null,
        "trafficAccessToken": s.traffic_token(e2b_id),
    })
}

fn detail_json(e2b_id: &str, v: &SandboxView, state: &str) -> Value {
    json!({
        "templateID": v.template,
        "alias": v.template,
        "sandboxID": e2b_id,
        "clientID": "hatchery",
        "startedAt": rfc3339(v.created_at_ms),
        "endAt": rfc3339(v.expires_at_ms),
        "cpuCount": (v.cpus.ceil() as i64).max(1),
        "memoryMB": v.memory_mb,
        "diskSizeMB": v.disk_mb,
        "envdVersion": ENVD_VERSION,
        "state": state,
        "metadata": v.metadata,
        "lifecycle": v.lifecycle.json(),
    })
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: String,
    timeout: Option<i64>,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
    #[serde(default)]
    env_vars: BTreeMap<String, String>,
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    network: Option<NetworkBody>,
    auto_pause: Option<bool>,
    /// `false`: the auto-pause keeps files only (a filesystem-only pause).
    auto_pause_memory: Option<bool>,
    /// `{"enabled": bool}` (a bare bool from older SDKs).
    auto_resume: Option<Value>,
    /// Accepted and ignored: every Hatchery sandbox's envd is authenticated.
    #[serde(default)]
    #[allow(dead_code)]
    secure: Option<bool>,
    #[serde(flatten)]
    rest: BTreeMap<String, Value>,
}

fn timeout_of(t: Option<i64>, default: u64) -> ApiResult<u64> {
    match t {
        None => Ok(default),
        Some(t) if t <= 0 => Err(ApiError::bad(
            "timeout must be a positive number of seconds",
        )),
        Some(t) => Ok(t as u64),
    }
}

/// `autoPause`, `autoPauseMemory` and `autoResume` of a create.
fn lifecycle_of(b: &NewSandbox, timeout_s: u64) -> ApiResult<Lifecycle> {
    let auto_pause = b.auto_pause == Some(true);
    let auto_resume = match &b.auto_resume {
        None | Some(Value::Null) => false,
        Some(Value::Bool(e)) => *e,
        Some(Value::Object(o)) => match o.get("enabled") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(e)) => *e,
            Some(other) => {
                return Err(ApiError::bad(format!(
                    "autoResume.enabled must be a boolean, not {other}"
                )))
            }
        },
        Some(other) => {
            return Err(ApiError::bad(format!(
                "autoResume must be {{\"enabled\": bool}}, not {other}"
            )))
        }
    };
    if auto_resume && !auto_pause {
        return Err(ApiError::bad(
            "autoResume can be enabled only with autoPause (onTimeout: pause)",
        ));
    }
    let files_only = auto_pause && b.auto_pause_memory == Some(false);
    // As E2B: a filesystem-only pause is resumed by connect, never by
    // traffic (its processes are gone, so a request would find nothing).
    if files_only && auto_resume {
        return Err(ApiError::bad(
            "autoResume cannot be enabled with autoPauseMemory: false \
             (a filesystem-only pause is resumed with connect)",
        ));
    }
    Ok(Lifecycle {
        auto_pause,
        auto_resume,
        timeout_s,
        files_only,
    })
}

/// Wakes the auto-pause sweep for a sandbox that now exists. Only once it
/// does: a sweep woken while the create was still running found nothing,
/// went back to its idle tick (15 s) and paused a 3 s sandbox 12 s late.
fn wake_sweep_for(s: &Shared, lifecycle: &crate::lifecycle::Lifecycle) {
    if lifecycle.auto_pause {
        s.sweep_wake.notify_one();
    }
}

async fn do_create(
    s: &Shared,
    caller: &Caller,
    b: NewSandbox,
    default_timeout: u64,
) -> ApiResult<Response> {
    refuse_unsupported(&b.rest, "sandbox")?;
    let template = template_alias(&b.template_id).to_string();
    let timeout_s = timeout_of(b.timeout, default_timeout)?;
    let lifecycle = lifecycle_of(&b, timeout_s)?;
    let ttl_seconds = lifecycle.hatchery_ttl(timeout_s);
    let mut metadata = state::user_metadata(&b.metadata);
    metadata.extend(lifecycle.keys());
    crate::tenancy::stamp(caller, &mut metadata);
    let network = network_spec(b.allow_internet_access, b.network.as_ref())?;
    let header_rules = header_rules(b.network.as_ref())?;
    if !s.backend.template_exists(&template) {
        // Not yet: built at start (or through the API) and not done.
        if let Some(e) = s.backend.template_building(&template) {
            return Err(e.into());
        }
        // `Sandbox.create(snapshot_id)`: E2B's snapshots are templates.
        let Some(snap) = crate::snapshots::resolve(s, caller, &b.template_id).await? else {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!("template '{}' not found", b.template_id),
            ));
        };
        if !header_rules.is_empty() {
            // A restore keeps the snapshot's env and trust store as they
            // were, so the proxy's variables and CA could not be added.
            return Err(ApiError::bad(
                "network option \"rules\" (header transforms) is not supported by Hatchery on a \
                 sandbox created from a snapshot (see docs/e2b.md)",
            ));
        }
        if !b.env_vars.is_empty() {
            // The snapshot's processes, and the env a Hatchery sandbox
            // gives its commands, are restored as they were.
            return Err(ApiError::bad(
                "envVars cannot be set on a sandbox created from a snapshot (see docs/e2b.md)",
            ));
        }
        let v = s
            .backend
            .restore(&snap, ttl_seconds, metadata, network)
            .await?;
        wake_sweep_for(s, &lifecycle);
        return Ok((StatusCode::CREATED, Json(sandbox_json(s, &v.id, &v))).into_response());
    }
    let spec = CreateSpec {
        template,
        ttl_seconds,
        metadata,
        env: b.env_vars,
        network,
        header_rules,
    };
    let v = s.backend.create(spec).await?;
    wake_sweep_for(s, &lifecycle);
    Ok((StatusCode::CREATED, Json(sandbox_json(s, &v.id, &v))).into_response())
}

pub async fn create_v1(
    State(s): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Body(b): Body<NewSandbox>,
) -> ApiResult<Response> {
    // v1 defaults to 15 s, as E2B's.
    do_create(&s, &caller, b, 15).await
}

pub async fn create_v2(
    State(s): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Body(b): Body<NewSandbox>,
) -> ApiResult<Response> {
    do_create(&s, &caller, b, DEFAULT_TIMEOUT_S).await
}

pub async fn get(State(s): State<Arc<Shared>>, Path(id): Path<String>) -> ApiResult<Json<Value>> {
    if let Some((_, v)) = s.live(&id).await? {
        let mut d = detail_json(&id, &v, "running");
        d["envdAccessToken"] = json!(s.access_token(&id));
        return Ok(Json(d));
    }
    match s.paused(&id).await? {
        Some(p) => Ok(Json(detail_json(&id, &p.view, "paused"))),
        None => Err(ApiError::not_found(&id)),
    }
}

pub async fn kill(State(s): State<Arc<Shared>>, Path(id): Path<String>) -> ApiResult<StatusCode> {
    if let Some((h, _)) = s.live(&id).await? {
        s.backend.kill(&h).await;
        s.forget(&id, &h);
        return Ok(StatusCode::NO_CONTENT);
    }
    match s.paused(&id).await? {
        Some(p) => {
            s.backend.delete_snapshot(&p.snapshot).await;
            Ok(StatusCode::NO_CONTENT)
        }
        None => Err(ApiError::not_found(&id)),
    }
}

#[derive(Deserialize)]
pub struct TimeoutBody {
    timeout: i64,
}

pub async fn set_timeout(
    State(s): State<Arc<Shared>>,
    Path(id): Path<String>,
    Body(b): Body<TimeoutBody>,
) -> ApiResult<StatusCode> {
    if b.timeout < 0 {
        return Err(ApiError::bad("timeout must not be negative"));
    }
    let Some((h, v)) = s.live(&id).await? else {
        return Err(ApiError::not_found(&id));
    };
    // 0 is "time out now": an auto-pausing sandbox is paused by the sweep
    // at once, any other is killed.
    if b.timeout == 0 && !v.lifecycle.auto_pause {
        s.backend.kill(&h).await;
        s.forget(&id, &h);
        return Ok(StatusCode::NO_CONTENT);
    }
    s.backend
        .set_ttl(&h, v.lifecycle.hatchery_ttl(b.timeout as u64))
        .await?;
    if v.lifecycle.auto_pause {
        s.sweep_wake.notify_one();
    }
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, Default)]
pub struct RefreshBody {
    duration: Option<i64>,
}

pub async fn refresh(
    State(s): State<Arc<Shared>>,
    Path(id): Path<String>,
    Body(b): Body<RefreshBody>,
) -> ApiResult<StatusCode> {
    let t = timeout_of(b.duration, 60)?;
    let Some((h, v)) = s.live(&id).await? else {
        return Err(ApiError::not_found(&id));
    };
    // A refresh only extends.
    let now = crate::now_ms();
    if v.expires_at_ms < now + t * 1000 {
        s.backend.set_ttl(&h, v.lifecycle.hatchery_ttl(t)).await?;
    }
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, Default)]
pub struct ConnectBody {
    timeout: Option<i64>,
    /// `false` (the SDK's `on_resume="reboot"`: a cold boot from the
    /// files): what resuming a filesystem-only pause does anyway, and
    /// nothing for a running sandbox; refused for a memory pause, whose
    /// files alone Hatchery does not keep.
    memory: Option<bool>,
    #[serde(rename = "autoPause")]
    #[allow(dead_code)]
    auto_pause: Option<bool>,
}

/// `memory: false` on a resume of a pause that kept memory: Hatchery has
/// no files-only copy of it to boot from.
async fn refuse_reboot_of_memory(s: &Shared, id: &str, b: &ConnectBody) -> ApiResult<()> {
    if b.memory != Some(false) {
        return Ok(());
    }
    match s.paused(id).await? {
        Some(p) if !p.files_only => Err(ApiError::bad(
            "memory=false (a reboot from disk) is supported only for a filesystem-only pause \
             (pause with memory: false); this sandbox was paused with its memory",
        )),
        _ => Ok(()),
    }
}

/// Connect: the sandbox as it is (200), resumed first if paused (201).
/// The TTL is only ever extended.
async fn do_connect(s: &Shared, id: &str, b: ConnectBody, default: u64) -> ApiResult<Response> {
    let ttl = timeout_of(b.timeout, default)?;
    if let Some((h, v)) = s.live(id).await? {
        let v = if v.expires_at_ms < crate::now_ms() + ttl * 1000 {
            s.backend.set_ttl(&h, v.lifecycle.hatchery_ttl(ttl)).await?
        } else {
            v
        };
        return Ok((StatusCode::OK, Json(sandbox_json(s, id, &v))).into_response());
    }
    refuse_reboot_of_memory(s, id, &b).await?;
    Ok(match resume_paused(s, id, ttl).await? {
        Resumed::Restored(v) => (StatusCode::CREATED, Json(sandbox_json(s, id, &v))),
        Resumed::AlreadyRunning(v) => (StatusCode::OK, Json(sandbox_json(s, id, &v))),
    }
    .into_response())
}

pub async fn connect_v1(
    State(s): State<Arc<Shared>>,
    Path(id): Path<String>,
    Body(b): Body<ConnectBody>,
) -> ApiResult<Response> {
    do_connect(&s, &id, b, 15).await
}

pub async fn connect_v2(
    State(s): State<Arc<Shared>>,
    Path(id): Path<String>,
    Body(b): Body<ConnectBody>,
) -> ApiResult<Response> {
    do_connect(&s, &id, b, DEFAULT_TIMEOUT_S).await
}

pub async fn resume(
    State(s): State<Arc<Shared>>,
    Path(id): Path<String>,
    Body(b): Body<ConnectBody>,
) -> ApiResult<Response> {
    if s.live(&id).await?.is_some() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("sandbox \"{id}\" is already running"),
        ));
    }
    refuse_reboot_of_memory(&s, &id, &b).await?;
    match resume_paused(&s, &id, timeout_of(b.timeout, 15)?).await? {
        Resumed::Restored(v) => {
            Ok((StatusCode::CREATED, Json(sandbox_json(&s, &id, &v))).into_response())
        }
        Resumed::AlreadyRunning(_) => Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("sandbox \"{id}\" is already running"),
        )),
    }
}

#[derive(Deserialize, Default)]
pub struct PauseBody {
    /// `true` or absent: memory, processes and files (a Hatchery
    /// snapshot). `false`: files only (a filesystem-only pause; the
    /// resume boots the template with them, no process survives).
    memory: Option<bool>,
    #[serde(flatten)]
    rest: BTreeMap<String, Value>,
}

/// Whether the pause keeps memory, or why the body is refused.
fn pause_memory(b: &PauseBody) -> Result<bool, String> {
    // `mode` ("full" / "filesystem") is the newer spelling of `memory`.
    let mode = match b.rest.get("mode") {
        None | Some(Value::Null) => None,
        Some(v) if v == "memory" || v == "full" => Some(true),
        Some(v) if v == "filesystem" => Some(false),
        Some(v) => {
            return Err(format!(
                "pause option \"mode\"={v} is not supported by Hatchery"
            ))
        }
    };
    if let (Some(m), Some(md)) = (b.memory, mode) {
        if m != md {
            return Err("memory and mode disagree".into());
        }
    }
    // `requireHealthyGuest` (the SDK's `strict`) and `strict`: a snapshot
    // needs a responding guest anyway.
    for (k, v) in &b.rest {
        let fine = match k.as_str() {
            "strict" | "requireHealthyGuest" => v.is_null() || v.is_boolean(),
            "mode" => true,
            _ => v.is_null(),
        };
        if !fine {
            return Err(format!(
                "pause option {k:?}={v} is not supported by Hatchery"
            ));
        }
    }
    Ok(b.memory.or(mode).unwrap_or(true))
}

/// Pause: a snapshot of the running sandbox (with its memory, or of its
/// files only), then the sandbox is stopped; a resume restores the
/// snapshot under the same E2B id.
pub async fn pause(
    State(s): State<Arc<Shared>>,
    Path(id): Path<String>,
    Body(b): Body<PauseBody>,
) -> ApiResult<StatusCode> {
    let memory = pause_memory(&b).map_err(ApiError::bad)?;
    let Some((h, v)) = s.live(&id).await? else {
        return Err(match s.paused(&id).await? {
            Some(_) => ApiError::new(
                StatusCode::CONFLICT,
                format!("sandbox \"{id}\" is already paused"),
            ),
            None => ApiError::not_found(&id),
        });
    };
    pause_live(&s, &id, &h, &v, memory).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Most forks per request (E2B's SDK allows 1..20).
pub const MAX_FORKS: i64 = 20;

#[derive(Deserialize, Default)]
pub struct ForkBody {
    count: Option<i64>,
    timeout: Option<i64>,
}

/// Fork: one snapshot of the running sandbox (which keeps running), then
/// `count` sandboxes restored from it, each reported on its own; the
/// snapshot is deleted afterwards.
pub async fn fork(
    State(s): State<Arc<Shared>>,
    Path(id): Path<String>,
    Body(b): Body<ForkBody>,
) -> ApiResult<Response> {
    let count = b.count.unwrap_or(1);
    if !(1..=MAX_FORKS).contains(&count) {
        return Err(ApiError::bad(format!(
            "count must be between 1 and {MAX_FORKS}"
        )));
    }
    let ttl = timeout_of(b.timeout, 15)?;
    let Some((h, v)) = s.live(&id).await? else {
        return Err(ApiError::not_found(&id));
    };
    let mut meta = v.metadata.clone();
    meta.insert(FORK_KEY.into(), id.clone());
    let snap = s.backend.snapshot(&h, meta).await?;
    let mut out = vec![];
    for _ in 0..count {
        match s
            .backend
            .restore(&snap, ttl, v.metadata.clone(), None)
            .await
        {
            Ok(f) => out.push(json!({"sandbox": sandbox_json(&s, &f.id, &f)})),
            Err(e) => {
                let e = ApiError::from(e);
                out.push(json!({"error": {"code": e.status.as_u16(), "message": e.message}}));
            }
        }
    }
    s.backend.delete_snapshot(&snap).await;
    Ok((StatusCode::CREATED, Json(Value::Array(out))).into_response())
}

pub async fn set_network(
    State(s): State<Arc<Shared>>,
    Path(id): Path<String>,
    Body(b): Body<NetworkBody>,
) -> ApiResult<StatusCode> {
    let Some((h, _)) = s.live(&id).await? else {
        return Err(ApiError::not_found(&id));
    };
    refuse_rules_update(&b)?;
    let spec = network_spec(None, Some(&b))?.unwrap_or(NetworkSpec {
        allow_all: true,
        ..Default::default()
    });
    s.backend.set_network(&h, spec).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `metadata=k1%3Dv1%26k2%3Dv2`: a query string inside one parameter.
fn parse_query(q: Option<&str>) -> ApiResult<ListQuery> {
    let mut out = ListQuery::default();
    for (k, v) in form_pairs(q.unwrap_or(""))? {
        match k.as_str() {
            "metadata" => {
                // The SDKs percent-encode each key and value before
                // building this inner query string: one more decode.
                for (mk, mv) in form_pairs(&v)? {
                    out.metadata.insert(pct_decode(&mk)?, pct_decode(&mv)?);
                }
            }
            "state" => {
                for st in v.split(',').filter(|x| !x.is_empty()) {
                    match st {
                        "running" | "paused" => out.states.push(st.to_string()),
                        other => return Err(ApiError::bad(format!("unknown state {other:?}"))),
                    }
                }
            }
            "limit" => {
                let n: usize = v
                    .parse()
                    .map_err(|_| ApiError::bad("limit must be a number"))?;
                if n == 0 || n > MAX_PAGE {
                    return Err(ApiError::bad(format!(
                        "limit must be between 1 and {MAX_PAGE}"
                    )));
                }
                out.limit = Some(n);
            }
            "nextToken" => out.next = Some(v),
            "startedAfter" => {
                // A `+` offset sent unencoded arrives as a space.
                let v = v.replace(' ', "+");
                let t =
                    time::OffsetDateTime::parse(&v, &time::format_description::well_known::Rfc3339)
                        .map_err(|e| {
                            ApiError::bad(format!(
                                "startedAfter must be an RFC 3339 date-time ({v:?}: {e})"
                            ))
                        })?;
                out.started_after_ns = Some(t.unix_timestamp_nanos());
            }
            "template" if v.is_empty() => {
                return Err(ApiError::bad("template must not be empty"));
            }
            "template" => out.template = Some(template_alias(&v).to_string()),
            "order" if v == "asc" || v == "desc" => out.asc = v == "asc",
            _ => return Err(ApiError::bad(format!("unsupported query parameter {k:?}"))),
        }
    }
    Ok(out)
}

#[derive(Default)]
struct ListQuery {
    metadata: BTreeMap<String, String>,
    states: Vec<String>,
    limit: Option<usize>,
    next: Option<String>,
    asc: bool,
    /// Sandboxes started at or after this instant (ns since the epoch).
    started_after_ns: Option<i128>,
    /// One template (E2B aliases resolved).
    template: Option<String>,
}

impl ListQuery {
    /// Whether a sandbox passes the metadata, start-time and template
    /// filters (the state filter is the caller's).
    fn admits(&self, v: &SandboxView) -> bool {
        self.metadata
            .iter()
            .all(|(k, x)| v.metadata.get(k) == Some(x))
            && self
                .started_after_ns
                .is_none_or(|t| v.created_at_ms as i128 * 1_000_000 >= t)
            && self.template.as_ref().is_none_or(|t| &v.template == t)
    }
}

/// Every sandbox, running and paused, with its E2B id and state.
async fn everything(s: &Shared) -> ApiResult<Vec<(String, SandboxView, &'static str)>> {
    let mut all: Vec<_> = s
        .backend
        .list()
        .await?
        .into_iter()
        .map(|v| {
            let (id, v) = present(v);
            (id, v, "running")
        })
        .collect();
    all.extend(
        s.all_paused()
            .await?
            .into_iter()
            .map(|(id, p)| (id, p.view, "paused")),
    );
    Ok(all)
}

pub async fn list_v1(
    State(s): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    RawQuery(q): RawQuery,
) -> ApiResult<Json<Value>> {
    let mut q = parse_query(q.as_deref())?;
    crate::tenancy::stamp(&caller, &mut q.metadata);
    let out: Vec<Value> = everything(&s)
        .await?
        .into_iter()
        .filter(|(_, v, st)| *st == "running" && q.admits(v))
        .map(|(id, v, st)| detail_json(&id, &v, st))
        .collect();
    Ok(Json(Value::Array(out)))
}

pub async fn list_v2(
    State(s): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    RawQuery(q): RawQuery,
) -> ApiResult<Response> {
    let mut q = parse_query(q.as_deref())?;
    // A tenant's list is its own, whatever metadata filter it sent.
    crate::tenancy::stamp(&caller, &mut q.metadata);
    let mut all: Vec<_> = everything(&s)
        .await?
        .into_iter()
        .filter(|(_, v, st)| {
            (q.states.is_empty() || q.states.iter().any(|x| x == st)) && q.admits(v)
        })
        .collect();
    // Newest first by default; the id breaks ties so pages are stable.
    all.sort_by(|a, b| (a.1.created_at_ms, &a.0).cmp(&(b.1.created_at_ms, &b.0)));
    if !q.asc {
        all.reverse();
    }
    let running = all.iter().filter(|x| x.2 == "running").count();
    let start = match &q.next {
        None => 0,
        Some(tok) => {
            let (ms, id) = tok
                .split_once('_')
                .and_then(|(ms, id)| Some((ms.parse::<u64>().ok()?, id)))
                .ok_or_else(|| ApiError::bad("malformed nextToken"))?;
            all.iter()
                .position(|(i, v, _)| {
                    let k = (v.created_at_ms, i.as_str());
                    if q.asc {
                        k > (ms, id)
                    } else {
                        k < (ms, id)
                    }
                })
                .unwrap_or(all.len())
        }
    };
    let limit = q.limit.unwrap_or(MAX_PAGE);
    let page: Vec<_> = all.iter().skip(start).take(limit).collect();
    let more = start + page.len() < all.len();
    let body: Vec<Value> = page
        .iter()
        .map(|(id, v, st)| detail_json(id, v, st))
        .collect();
    let mut r = Json(Value::Array(body)).into_response();
    r.headers_mut()
        .insert("x-total-running", HeaderValue::from(running));
    if more {
        if let Some((id, v, _)) = page.last() {
            if let Ok(h) = HeaderValue::from_str(&format!("{}_{}", v.created_at_ms, id)) {
                r.headers_mut().insert("x-next-token", h);
            }
        }
    }
    Ok(r)
}

/// How long `get_metrics` watches the CPU to report its use.
pub const CPU_SAMPLE: std::time::Duration = std::time::Duration::from_millis(200);
const MIB: u64 = 1 << 20;

/// CPU use over a window, in percent of the sandbox's CPUs (0..=100).
fn cpu_pct(before: u64, after: u64, window_ns: u64, cpus: f64) -> f64 {
    if window_ns == 0 || cpus <= 0.0 {
        return 0.0;
    }
    let pct = after.saturating_sub(before) as f64 * 100.0 / (window_ns as f64 * cpus);
    (pct.clamp(0.0, 100.0) * 100.0).round() / 100.0
}

/// Bytes used on the filesystems of `df -P -B1` output, each mount once.
fn df_used(out: &str) -> Option<u64> {
    let mut seen = std::collections::BTreeSet::new();
    let mut total = 0u64;
    for l in out.lines().skip(1).filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = l.split_whitespace().collect();
        let (used, mount) = (f.get(2)?.parse::<u64>().ok()?, *f.last()?);
        if seen.insert(mount.to_string()) {
            total = total.saturating_add(used);
        }
    }
    (!seen.is_empty()).then_some(total)
}

/// Memory in use and page cache, in bytes, from `/proc/meminfo`
/// (`MemTotal - MemAvailable`, as envd reports it).
fn meminfo(out: &str) -> Option<(u64, u64)> {
    let kb = |name: &str| {
        out.lines().find_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix(':')?;
            rest.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()
        })
    };
    let (total, avail) = (kb("MemTotal")?, kb("MemAvailable")?);
    Some((
        total.saturating_sub(avail) * 1024,
        kb("Cached").unwrap_or(0) * 1024,
    ))
}

/// What `get_metrics` reads in the guest: its memory, as the Sentry (the
/// guest's kernel) accounts it, and its writable filesystems.
const GUEST_READINGS: &str = "cat /proc/meminfo; echo ---; df -P -B1 / /tmp";

/// One E2B `SandboxMetric`.
fn metric_json(now_ms: u64, v: &SandboxView, cpu: f64, mem: (u64, u64), disk_used: u64) -> Value {
    json!({
        "timestamp": rfc3339(now_ms),
        "timestampUnix": now_ms / 1000,
        "cpuCount": (v.cpus.ceil() as i64).max(1),
        "cpuUsedPct": cpu,
        "memUsed": mem.0,
        "memTotal": v.memory_mb * MIB,
        "memCache": mem.1,
        "diskUsed": disk_used,
        "diskTotal": v.disk_mb * MIB,
    })
}

/// `get_metrics`: one sample taken now (E2B keeps a series; Hatchery
/// reads when asked). CPU from the sandbox's cgroup over [`CPU_SAMPLE`]
/// (the guest's `/proc/stat` is all zeros under gVisor); memory from the
/// guest's `/proc/meminfo` (the Sentry's accounting, what envd reports in
/// E2B) against the template's memory; disk used from `df` of the guest's
/// writable layers against the template's disk. `[]` when `start`..`end`
/// (Unix seconds) does not overlap the request's arrival..now, for a
/// paused sandbox, or where this host cannot read the cgroup.
pub async fn metrics(
    State(s): State<Arc<Shared>>,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> ApiResult<Json<Value>> {
    let (mut start, mut end) = (None, None);
    for (k, v) in form_pairs(q.as_deref().unwrap_or(""))? {
        let t = || {
            v.parse::<i64>()
                .map_err(|_| ApiError::bad(format!("{k} must be a Unix time in seconds")))
        };
        match k.as_str() {
            "start" => start = Some(t()?),
            "end" => end = Some(t()?),
            _ => return Err(ApiError::bad(format!("unsupported query parameter {k:?}"))),
        }
    }
    let arrived_s = (crate::now_ms() / 1000) as i64;
    let Some((h, v)) = s.live(&id).await? else {
        return match s.paused(&id).await? {
            Some(_) => Ok(Json(json!([]))),
            None => Err(ApiError::not_found(&id)),
        };
    };
    let t0 = std::time::Instant::now();
    let Some(before) = s.backend.usage(&h).await? else {
        return Ok(Json(json!([])));
    };
    tokio::time::sleep(CPU_SAMPLE).await;
    let Some(after) = s.backend.usage(&h).await? else {
        return Ok(Json(json!([])));
    };
    let window = t0.elapsed().as_nanos() as u64;
    let out = s
        .backend
        .exec(
            &h,
            vec!["/bin/sh".into(), "-c".into(), GUEST_READINGS.into()],
            None,
            std::time::Duration::from_secs(10),
        )
        .await?;
    let out = String::from_utf8_lossy(&out.stdout);
    let (mem_part, df_part) = out.split_once("---\n").unwrap_or((&out, ""));
    let (Some(mem), Some(disk)) = (meminfo(mem_part), df_used(df_part)) else {
        return Err(ApiError::from(BackendError::new(
            FailKind::Internal,
            format!("the guest's /proc/meminfo or df in sandbox {h} gave no usable output"),
        )));
    };
    // The sample covers the request's arrival to now: it is in a window
    // that overlaps that span (the SDKs send whole seconds, so `end` is
    // often the second the request was sent in).
    let now = crate::now_ms();
    let now_s = (now / 1000) as i64;
    if start.is_some_and(|t| now_s < t) || end.is_some_and(|t| arrived_s > t) {
        return Ok(Json(json!([])));
    }
    let cpu = cpu_pct(before.cpu_ns, after.cpu_ns, window, v.cpus);
    Ok(Json(json!([metric_json(now, &v, cpu, mem, disk)])))
}

/// `Template.exists`: 200 `{"templateID", "public"}` when the name (or an
/// E2B name for a Hatchery template) is a template here, else 404. Every
/// template on the daemon is the caller's, so none is `public`.
pub async fn template_alias_get(
    State(s): State<Arc<Shared>>,
    Path(alias): Path<String>,
) -> ApiResult<Json<Value>> {
    let name = template_alias(&alias);
    if alias.is_empty() || !s.backend.template_exists(name) {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("template alias '{alias}' not found"),
        ));
    }
    Ok(Json(json!({"templateID": name, "public": false})))
}

/// Unknown control-plane routes, in E2B's error shape.
pub async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "no such route (see docs/e2b.md for what is supported)",
    )
}

/// The daemon's key, as `X-API-KEY` (or `e2b_` + its hex, for clients
/// that insist on E2B's key shape), or a Bearer token.
pub fn key_ok(headers: &HeaderMap, key: &str) -> bool {
    hatchery_serve::headers::api_key_ok(headers, key)
}

/// The operator's key or a tenant's ([`crate::tenancy`]); a tenant's
/// request for a sandbox not its own is 404 here, before the handler.
pub async fn require_key(
    State(s): State<Arc<Shared>>,
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let caller = match crate::tenancy::caller(&s, req.headers()).await {
        Ok(Some(c)) => c,
        Ok(None) => return crate::tenancy::unauthorized().into_response(),
        Err(e) => return e.into_response(),
    };
    if let Err(e) = crate::tenancy::check(&s, &caller, req.method(), req.uri().path()).await {
        return e.into_response();
    }
    req.extensions_mut().insert(caller);
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_query_is_decoded_twice() {
        let q = parse_query(Some(
            "metadata=user%3Dabc%26app%3Dprod%2520x&state=running,paused&limit=5",
        ))
        .unwrap();
        assert_eq!(q.metadata.get("user").map(String::as_str), Some("abc"));
        assert_eq!(q.metadata.get("app").map(String::as_str), Some("prod x"));
        assert_eq!(q.states, vec!["running", "paused"]);
        assert_eq!(q.limit, Some(5));
        assert!(parse_query(Some("limit=0")).is_err());
        assert!(parse_query(Some("state=dead")).is_err());
        assert!(parse_query(Some("bogus=1")).is_err());
        assert!(parse_query(Some("metadata=%zz")).is_err());
    }

    fn view(template: &str, created_at_ms: u64) -> SandboxView {
        SandboxView {
            id: "x".into(),
            template: template.into(),
            created_at_ms,
            expires_at_ms: created_at_ms + 1000,
            metadata: BTreeMap::new(),
            cpus: 1.0,
            memory_mb: 512,
            disk_mb: 512,
            lifecycle: Default::default(),
        }
    }

    #[test]
    fn started_after_and_template_filters() {
        // 2023-11-14T22:13:20Z is 1_700_000_000 s; the SDKs send offsets
        // and microseconds (Python) or Z and milliseconds (JS).
        let q = parse_query(Some(
            "startedAfter=2023-11-14T22%3A13%3A20.000500%2B00%3A00",
        ))
        .unwrap();
        assert!(!q.admits(&view("base", 1_700_000_000_000)));
        assert!(q.admits(&view("base", 1_700_000_000_001)));
        let q = parse_query(Some("startedAfter=2023-11-14T23:13:20.001+01:00")).unwrap();
        assert!(
            q.admits(&view("base", 1_700_000_000_001)),
            "at the instant itself"
        );
        assert!(!q.admits(&view("base", 1_700_000_000_000)));
        let q = parse_query(Some("startedAfter=2023-11-14T22:13:20Z&template=base")).unwrap();
        assert!(q.admits(&view("base", 1_700_000_000_000)));
        assert!(!q.admits(&view("code-interpreter", 1_700_000_000_000)));
        let q = parse_query(Some("template=code-interpreter-v1")).unwrap();
        assert!(q.admits(&view("code-interpreter", 1)));
        assert!(!q.admits(&view("base", 1)));
        for bad in ["startedAfter=yesterday", "startedAfter=", "template="] {
            assert!(parse_query(Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn metrics_pieces() {
        // 0.1 s of CPU in 0.2 s on 2 CPUs is 25 %.
        assert_eq!(cpu_pct(1_000, 100_001_000, 200_000_000, 2.0), 25.0);
        assert_eq!(cpu_pct(5, 5, 200_000_000, 1.0), 0.0);
        assert_eq!(cpu_pct(0, u64::MAX, 1, 1.0), 100.0);
        assert_eq!(
            cpu_pct(10, 5, 100, 1.0),
            0.0,
            "a counter going back is no use"
        );
        assert_eq!(cpu_pct(0, 5, 0, 1.0), 0.0);
        let df = "Filesystem 1-blocks Used Available Capacity Mounted on\n\
                  none 9223372036854771712 57344 9223372036854714368 1% /\n\
                  none 9223372036854771712 4096 9223372036854771712 1% /tmp\n\
                  none 9223372036854771712 57344 9223372036854714368 1% /\n";
        assert_eq!(df_used(df), Some(57344 + 4096));
        assert_eq!(df_used("Filesystem ...\n"), None);
        assert_eq!(df_used("h\nnone x y z w /\n"), None);
        let mi = "MemTotal:        1048576 kB\nMemFree:         1033836 kB\n\
                  MemAvailable:    1033836 kB\nBuffers: 0 kB\nCached:  172 kB\n";
        assert_eq!(meminfo(mi), Some(((1048576 - 1033836) * 1024, 172 * 1024)));
        assert_eq!(meminfo("MemTotal: 10 kB\n"), None);
        assert_eq!(
            meminfo("MemTotal: 10 kB\nMemAvailable: 4 kB\n"),
            Some((6 * 1024, 0))
        );
        let v = view("base", 0);
        let m = metric_json(1_700_000_000_500, &v, 12.5, (3 * MIB, MIB), 4096);
        assert_eq!(m["timestampUnix"], 1_700_000_000);
        assert_eq!(m["timestamp"], "2023-11-14T22:13:20.5Z");
        assert_eq!(m["cpuCount"], 1);
        assert_eq!(m["cpuUsedPct"], 12.5);
        assert_eq!(
            (m["memUsed"].as_u64(), m["memCache"].as_u64()),
            (Some(3 * MIB), Some(MIB))
        );
        assert_eq!(m["memTotal"], 512 * MIB);
        assert_eq!(
            (m["diskUsed"].as_u64(), m["diskTotal"].as_u64()),
            (Some(4096), Some(512 * MIB))
        );
    }

    #[test]
    fn pause_bodies() {
        let body = |j: &str| serde_json::from_str::<PauseBody>(j).unwrap();
        for ok in [
            "{}",
            r#"{"memory": true}"#,
            r#"{"memory": null}"#,
            r#"{"memory": true, "requireHealthyGuest": true}"#,
            r#"{"strict": false, "mode": "memory"}"#,
            r#"{"mode": "full"}"#,
        ] {
            assert_eq!(pause_memory(&body(ok)), Ok(true), "{ok}");
        }
        for files in [
            r#"{"memory": false}"#,
            r#"{"mode": "filesystem"}"#,
            r#"{"memory": false, "mode": "filesystem", "requireHealthyGuest": true}"#,
        ] {
            assert_eq!(pause_memory(&body(files)), Ok(false), "{files}");
        }
        assert!(pause_memory(&body(r#"{"memory": true, "mode": "filesystem"}"#)).is_err());
        assert!(pause_memory(&body(r#"{"mode": "disk"}"#)).is_err());
        assert!(pause_memory(&body(r#"{"requireHealthyGuest": "yes"}"#)).is_err());
        assert!(pause_memory(&body(r#"{"other": 1}"#)).is_err());
        // Not a bool: refused by the body's own parse (a 400).
        assert!(serde_json::from_str::<PauseBody>(r#"{"memory": "no"}"#).is_err());
    }

    #[test]
    fn keys() {
        let mut h = HeaderMap::new();
        assert!(!key_ok(&h, "hx_ab12"));
        h.insert("x-api-key", HeaderValue::from_static("hx_ab12"));
        assert!(key_ok(&h, "hx_ab12"));
        h.insert("x-api-key", HeaderValue::from_static("e2b_ab12"));
        assert!(key_ok(&h, "hx_ab12"));
        h.insert("x-api-key", HeaderValue::from_static("e2b_ab13"));
        assert!(!key_ok(&h, "hx_ab12"));
    }
}
