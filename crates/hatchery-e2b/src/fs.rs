//! envd's `filesystem.Filesystem` service. Hatchery's files API has read,
//! write, a flat list and remove; stat, mkdir, move, listing with depth and
//! watching are done by a small Python helper (`guest/fsop.py`; every
//! Hatchery template has python3) run in the sandbox as the requesting
//! user, so permissions are that user's, as in E2B.

use crate::backend::{OutputChunk, ProcSpec};
use crate::connect::{self, Code, ConnectError, Framing};
use crate::pb::filesystem::{
    watch_dir_response, CreateWatcherRequest, CreateWatcherResponse, EntryInfo, EventType,
    FileType, FilesystemEvent, GetWatcherEventsRequest, GetWatcherEventsResponse, ListDirRequest,
    ListDirResponse, MakeDirRequest, MakeDirResponse, MoveRequest, MoveResponse, RemoveRequest,
    RemoveResponse, RemoveWatcherRequest, RemoveWatcherResponse, StatRequest, StatResponse,
    WatchDirRequest, WatchDirResponse,
};
use crate::sandbox::Target;
use crate::state::{Shared, Watcher};
use crate::user;
use axum::body::Bytes;
use axum::extract::{Path, Request, State};
use axum::response::Response;
use axum::Extension;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

const HELPER: &str = include_str!("../guest/fsop.py");
/// How long one helper run may take.
const OP_TIMEOUT: Duration = Duration::from_secs(30);
/// Most entries one ListDir returns (Hatchery's listing cap).
pub const MAX_LIST_ENTRIES: usize = 10_000;
/// Deepest ListDir.
pub const MAX_DEPTH: u32 = 64;
/// Events one GetWatcherEvents returns at most; the rest wait for the next.
const KEEPALIVE: Duration = Duration::from_secs(50);

pub(crate) fn helper_argv(t: &Target, op: &str, args: &Value) -> Vec<String> {
    user::wrap(
        user::user_of(t),
        None,
        vec![
            "python3".into(),
            "-c".into(),
            HELPER.into(),
            op.into(),
            args.to_string(),
        ],
    )
}

fn fs_error(v: &Value) -> Option<ConnectError> {
    let kind = v.get("error")?.as_str()?;
    let msg = v["message"].as_str().unwrap_or(kind).to_string();
    let code = match kind {
        "not_found" => Code::NotFound,
        "exists" => Code::AlreadyExists,
        "permission" => Code::PermissionDenied,
        "not_dir" | "is_dir" | "not_empty" | "invalid" => Code::InvalidArgument,
        "no_space" => Code::ResourceExhausted,
        _ => Code::Internal,
    };
    Some(ConnectError::new(code, msg))
}

async fn run(s: &Shared, t: &Target, op: &str, args: Value) -> Result<Value, ConnectError> {
    let out = s
        .backend
        .exec(&t.sandbox, helper_argv(t, op, &args), None, OP_TIMEOUT)
        .await?;
    let v: Value = serde_json::from_slice(&out.stdout).map_err(|_| {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: String = err
            .chars()
            .rev()
            .take(300)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        ConnectError::new(
            Code::Internal,
            format!("filesystem helper failed (exit {}): {tail}", out.exit_code),
        )
    })?;
    match fs_error(&v) {
        Some(e) => Err(e),
        None => Ok(v),
    }
}

fn entry(v: &Value) -> EntryInfo {
    let ns = v["mtime_ns"].as_i64().unwrap_or(0);
    EntryInfo {
        name: v["name"].as_str().unwrap_or("").into(),
        r#type: match v["type"].as_str() {
            Some("file") => FileType::File,
            Some("dir") => FileType::Directory,
            Some("symlink") => FileType::Symlink,
            _ => FileType::Unspecified,
        } as i32,
        path: v["path"].as_str().unwrap_or("").into(),
        size: v["size"].as_i64().unwrap_or(0),
        mode: v["mode"].as_u64().unwrap_or(0) as u32,
        permissions: v["permissions"].as_str().unwrap_or("").into(),
        owner: v["owner"].as_str().unwrap_or("").into(),
        group: v["group"].as_str().unwrap_or("").into(),
        modified_time: Some(pbjson_types::Timestamp {
            seconds: ns.div_euclid(1_000_000_000),
            nanos: ns.rem_euclid(1_000_000_000) as i32,
        }),
        symlink_target: v["symlink_target"].as_str().map(Into::into),
        metadata: metadata_of(&v["metadata"]),
    }
}

/// The helper's `metadata` object (the file's `user.e2b.*` attributes,
/// prefix stripped) as a map; anything else is no metadata.
pub(crate) fn metadata_of(v: &Value) -> std::collections::HashMap<String, String> {
    v.as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

fn path_of(t: &Target, p: &str) -> Result<String, ConnectError> {
    user::resolve_path(user::user_of(t), p)
        .ok_or_else(|| ConnectError::new(Code::InvalidArgument, format!("invalid path {p:?}")))
}

pub async fn rpc(
    State(s): State<Arc<Shared>>,
    Extension(t): Extension<Target>,
    Path(method): Path<String>,
    req: Request,
) -> Response {
    if t.port != crate::sandbox::ENVD_PORT {
        return crate::sandbox::wrong_port(&t);
    }
    let framing = match connect::framing(req.headers()) {
        Ok(f) => f,
        Err(e) => return e.into_response_for(Framing::Unary),
    };
    let headers = req.headers().clone();
    let body = match crate::read_body(req, connect::MAX_MESSAGE_BYTES + 5).await {
        Ok(b) => b,
        Err(e) => return e.into_response_for(framing),
    };
    if method == "WatchDir" {
        return watch_dir(&s, &t, framing, &headers, &body)
            .await
            .unwrap_or_else(connect::stream_error);
    }
    if framing != Framing::Unary {
        return ConnectError::new(
            Code::InvalidArgument,
            "a unary method takes application/json",
        )
        .into_response_for(framing);
    }
    let res = match method.as_str() {
        "Stat" => call(&body, |r: StatRequest| async move {
            let v = run(&s, &t, "stat", json!({"path": path_of(&t, &r.path)?})).await?;
            Ok(StatResponse { entry: Some(entry(&v["entry"])) })
        })
        .await,
        "MakeDir" => call(&body, |r: MakeDirRequest| async move {
            let v = run(&s, &t, "mkdir", json!({"path": path_of(&t, &r.path)?})).await?;
            Ok(MakeDirResponse { entry: Some(entry(&v["entry"])) })
        })
        .await,
        "Move" => call(&body, |r: MoveRequest| async move {
            let args = json!({"source": path_of(&t, &r.source)?, "destination": path_of(&t, &r.destination)?});
            let v = run(&s, &t, "move", args).await?;
            Ok(MoveResponse { entry: Some(entry(&v["entry"])) })
        })
        .await,
        "ListDir" => call(&body, |r: ListDirRequest| async move {
            let depth = r.depth.max(1);
            if depth > MAX_DEPTH {
                return Err(ConnectError::new(Code::InvalidArgument, format!("depth is at most {MAX_DEPTH}")));
            }
            let args = json!({"path": path_of(&t, &r.path)?, "depth": depth, "limit": MAX_LIST_ENTRIES});
            let v = run(&s, &t, "list", args).await?;
            let entries = v["entries"].as_array().map(|a| a.iter().map(entry).collect()).unwrap_or_default();
            Ok(ListDirResponse { entries })
        })
        .await,
        "Remove" => call(&body, |r: RemoveRequest| async move {
            let p = path_of(&t, &r.path)?;
            if p == "/" {
                return Err(ConnectError::new(Code::InvalidArgument, "refusing to remove /"));
            }
            run(&s, &t, "remove", json!({"path": p})).await?;
            Ok(RemoveResponse {})
        })
        .await,
        "CreateWatcher" => call(&body, |r: CreateWatcherRequest| create_watcher(&s, &t, r)).await,
        "GetWatcherEvents" => call(&body, |r: GetWatcherEventsRequest| watcher_events(&s, &t, r)).await,
        "RemoveWatcher" => call(&body, |r: RemoveWatcherRequest| remove_watcher(&s, &t, r)).await,
        other => Err(ConnectError::new(
            Code::Unimplemented,
            format!("filesystem.Filesystem/{other} is not a method of this service"),
        )),
    };
    res.unwrap_or_else(|e| e.into_response_for(Framing::Unary))
}

async fn call<Req, Resp, F, Fut>(body: &[u8], f: F) -> Result<Response, ConnectError>
where
    Req: serde::de::DeserializeOwned,
    Resp: serde::Serialize,
    F: FnOnce(Req) -> Fut,
    Fut: std::future::Future<Output = Result<Resp, ConnectError>>,
{
    let req = connect::decode_request(Framing::Unary, body)?;
    Ok(connect::unary_response(&f(req).await?))
}

/// What a watch is asked for: `WatchDirRequest` and `CreateWatcherRequest`
/// carry the same fields.
struct WatchSpec<'a> {
    path: &'a str,
    recursive: bool,
    /// Each create, write and chmod event carries the entry's info (envd
    /// 0.6.3).
    include_entry: bool,
    /// Network filesystems (NFS, CIFS, SMB, FUSE) may be watched (envd
    /// 0.6.4); refused by default, as their events may never come.
    allow_network_mounts: bool,
}

async fn start_watch(s: &Shared, t: &Target, w: WatchSpec<'_>) -> Result<String, ConnectError> {
    let p = path_of(t, w.path)?;
    // The helper checks the directory (and its filesystem) before it
    // watches, so a bad path is an error of this call, not of a later poll.
    run(
        s,
        t,
        "watchable",
        json!({"path": p, "allow_network_mounts": w.allow_network_mounts}),
    )
    .await?;
    let argv = helper_argv(
        t,
        "watch",
        &json!({"path": p, "recursive": w.recursive, "include_entry": w.include_entry}),
    );
    let v = s
        .backend
        .start_process(
            &t.sandbox,
            ProcSpec {
                argv,
                env: Default::default(),
                timeout: None,
            },
        )
        .await?;
    s.backend.close_stdin(&t.sandbox, &v.id).await?;
    Ok(v.id)
}

fn parse_event(line: &[u8]) -> Option<FilesystemEvent> {
    let v: Value = serde_json::from_slice(line).ok()?;
    let ty = match v["type"].as_str()? {
        "create" => EventType::Create,
        "write" => EventType::Write,
        "remove" => EventType::Remove,
        "rename" => EventType::Rename,
        "chmod" => EventType::Chmod,
        _ => return None,
    };
    Some(FilesystemEvent {
        name: v["name"].as_str()?.into(),
        r#type: ty as i32,
        entry: v.get("entry").filter(|e| e.is_object()).map(entry),
    })
}

/// Splits output into lines, keeping an unfinished one for later.
fn lines(partial: &mut Vec<u8>, data: &[u8]) -> Vec<Vec<u8>> {
    partial.extend_from_slice(data);
    let mut out = vec![];
    while let Some(i) = partial.iter().position(|&b| b == b'\n') {
        let rest = partial.split_off(i + 1);
        let mut line = std::mem::replace(partial, rest);
        line.pop();
        out.push(line);
    }
    out
}

async fn watch_dir(
    s: &Arc<Shared>,
    t: &Target,
    framing: Framing,
    h: &axum::http::HeaderMap,
    body: &[u8],
) -> Result<Response, ConnectError> {
    if framing != Framing::Stream {
        return Err(ConnectError::new(
            Code::InvalidArgument,
            "a streaming method takes application/connect+json",
        ));
    }
    let r: WatchDirRequest = connect::decode_request(framing, body)?;
    let deadline = connect::timeout(h)?.filter(|d| !d.is_zero());
    let spec = WatchSpec {
        path: &r.path,
        recursive: r.recursive,
        include_entry: r.include_entry,
        allow_network_mounts: r.allow_network_mounts,
    };
    let proc_id = start_watch(s, t, spec).await?;
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    let s = Arc::clone(s);
    let sandbox = t.sandbox.clone();
    tokio::spawn(async move {
        let msg = |e: watch_dir_response::Event| {
            connect::stream_message(&WatchDirResponse { event: Some(e) })
        };
        let (ctx, mut crx) = mpsc::channel::<OutputChunk>(16);
        let backend = Arc::clone(&s.backend);
        let (sb, pid) = (sandbox.clone(), proc_id.clone());
        let reader =
            tokio::spawn(async move { backend.read_process(&sb, &pid, 0, true, ctx).await });
        let mut partial = vec![];
        let mut started = false;
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + KEEPALIVE, KEEPALIVE);
        let until = deadline.map(|d| tokio::time::Instant::now() + d);
        let ended: Option<ConnectError> = loop {
            tokio::select! {
                c = crx.recv() => match c {
                    Some(c) if !c.stderr => {
                        for l in lines(&mut partial, &c.data) {
                            let m = if !started && l.starts_with(b"{\"started\"") {
                                started = true;
                                msg(watch_dir_response::Event::Start(watch_dir_response::StartEvent {}))
                            } else if let Some(e) = parse_event(&l) {
                                msg(watch_dir_response::Event::Filesystem(e))
                            } else {
                                continue;
                            };
                            if tx.send(m).await.is_err() { break; }
                        }
                    }
                    Some(_) => {}
                    None => break Some(ConnectError::new(Code::Internal, "the directory watcher ended")),
                },
                _ = tick.tick() => {
                    if tx.send(msg(watch_dir_response::Event::Keepalive(watch_dir_response::KeepAlive {}))).await.is_err() { break None; }
                }
                _ = tx.closed() => break None,
                _ = async { match until { Some(d) => tokio::time::sleep_until(d).await, None => std::future::pending().await } } => {
                    break Some(ConnectError::new(Code::DeadlineExceeded, "the watch reached its deadline"));
                }
            }
        };
        // Whichever way the stream ends, the watcher process goes with it.
        let _ = s.backend.signal_process(&sandbox, &proc_id, 9).await;
        reader.abort();
        if let Some(e) = ended {
            let _ = tx.send(connect::end_stream(Some(&e))).await;
        }
    });
    Ok(connect::stream_response(
        tokio_stream::wrappers::ReceiverStream::new(rx),
    ))
}

async fn create_watcher(
    s: &Shared,
    t: &Target,
    r: CreateWatcherRequest,
) -> Result<CreateWatcherResponse, ConnectError> {
    let spec = WatchSpec {
        path: &r.path,
        recursive: r.recursive,
        include_entry: r.include_entry,
        allow_network_mounts: r.allow_network_mounts,
    };
    let proc_id = start_watch(s, t, spec).await?;
    let id = format!("w_{}", &proc_id.trim_start_matches("proc_"));
    let w = Watcher {
        sandbox: t.sandbox.clone(),
        proc_id: proc_id.clone(),
        offset: 0,
        partial: vec![],
    };
    if !s.add_watcher(&id, w) {
        let _ = s.backend.signal_process(&t.sandbox, &proc_id, 9).await;
        return Err(ConnectError::new(
            Code::ResourceExhausted,
            "too many directory watchers; remove one first",
        ));
    }
    // Events count from when the watch is in place.
    for _ in 0..100 {
        let (tx, mut rx) = mpsc::channel(64);
        s.backend
            .read_process(&t.sandbox, &proc_id, 0, false, tx)
            .await?;
        let mut seen = false;
        while let Some(c) = rx.recv().await {
            seen |= !c.stderr && c.data.starts_with(b"{\"started\"");
        }
        if seen {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(CreateWatcherResponse { watcher_id: id })
}

fn watcher_for(s: &Shared, t: &Target, id: &str) -> Result<Watcher, ConnectError> {
    s.watcher(id)
        .filter(|w| w.sandbox == t.sandbox)
        .ok_or_else(|| ConnectError::new(Code::NotFound, format!("watcher {id} not found")))
}

async fn watcher_events(
    s: &Shared,
    t: &Target,
    r: GetWatcherEventsRequest,
) -> Result<GetWatcherEventsResponse, ConnectError> {
    let w = watcher_for(s, t, &r.watcher_id)?;
    let (tx, mut rx) = mpsc::channel(64);
    let backend = Arc::clone(&s.backend);
    let (sb, pid, off) = (w.sandbox.clone(), w.proc_id.clone(), w.offset);
    let reader = tokio::spawn(async move { backend.read_process(&sb, &pid, off, false, tx).await });
    let mut partial = w.partial;
    let mut offset = w.offset;
    let mut events = vec![];
    while let Some(c) = rx.recv().await {
        offset = offset.max(c.offset + c.data.len() as u64);
        if c.stderr {
            continue;
        }
        for l in lines(&mut partial, &c.data) {
            if let Some(e) = parse_event(&l) {
                events.push(e);
            }
        }
    }
    let info = reader
        .await
        .map_err(|_| ConnectError::new(Code::Internal, "watcher reader failed"))??;
    s.update_watcher(&r.watcher_id, offset, partial);
    if !info.running && events.is_empty() {
        return Err(ConnectError::new(
            Code::Internal,
            "the directory watcher ended",
        ));
    }
    Ok(GetWatcherEventsResponse { events })
}

async fn remove_watcher(
    s: &Shared,
    t: &Target,
    r: RemoveWatcherRequest,
) -> Result<RemoveWatcherResponse, ConnectError> {
    let w = watcher_for(s, t, &r.watcher_id)?;
    s.remove_watcher(&r.watcher_id);
    let _ = s.backend.signal_process(&w.sandbox, &w.proc_id, 9).await;
    Ok(RemoveWatcherResponse {})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_keep_the_unfinished_one() {
        let mut p = vec![];
        assert_eq!(lines(&mut p, b"a\nb"), vec![b"a".to_vec()]);
        assert_eq!(lines(&mut p, b"c\n\nd"), vec![b"bc".to_vec(), b"".to_vec()]);
        assert_eq!(p, b"d");
    }

    #[test]
    fn events_parse() {
        let e = parse_event(br#"{"name": "x/y", "type": "write"}"#).unwrap();
        assert_eq!(e.name, "x/y");
        assert_eq!(e.r#type, EventType::Write as i32);
        assert!(parse_event(b"junk").is_none());
        assert!(parse_event(br#"{"name": "x", "type": "bogus"}"#).is_none());
        assert!(e.entry.is_none());
    }

    #[test]
    fn events_carry_the_helpers_entry_with_its_metadata() {
        let line = br#"{"name": "a.txt", "type": "write", "entry": {"name": "a.txt", "type": "file",
            "path": "/home/user/w/a.txt", "size": 3, "mode": 420, "permissions": "-rw-r--r--",
            "owner": "user", "group": "user", "mtime_ns": 1500000000, "metadata": {"k": "v", "n": 1}}}"#;
        let e = parse_event(line).unwrap();
        let info = e.entry.unwrap();
        assert_eq!(info.path, "/home/user/w/a.txt");
        assert_eq!(info.r#type, FileType::File as i32);
        assert_eq!(info.modified_time.unwrap().nanos, 500_000_000);
        // Only string values are metadata.
        assert_eq!(
            info.metadata,
            std::collections::HashMap::from([("k".to_string(), "v".to_string())])
        );
        // An entry that is not an object is no entry.
        let e = parse_event(br#"{"name": "a", "type": "remove", "entry": null}"#).unwrap();
        assert!(e.entry.is_none());
    }

    #[test]
    fn no_metadata_is_an_empty_map() {
        assert!(metadata_of(&Value::Null).is_empty());
        assert!(metadata_of(&json!(["k"])).is_empty());
    }
}
