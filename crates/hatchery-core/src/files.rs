//! File transfer through the agent, and the path rules that keep every
//! request inside the sandbox.

use crate::agent_client::{expect_ok, guest_error, AgentClient, Channel};
use crate::CoreError;
use hatchery_agent_proto::{
    FileEntry, FileListRequest, FilePathRequest, FileReadRequest, FileWriteRequest, Frame, Kind,
};

const CHUNK: usize = 256 * 1024;

/// Longest any one file operation may take, end to end, before the host
/// gives up on it (504). Generous for the 64 MiB cap; the agent runs file
/// operations off its frame loop, so one that never finishes costs a guest
/// thread, never the sandbox's channel.
pub const FILE_OP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

async fn deadline<T>(
    what: &str,
    path: &str,
    fut: impl std::future::Future<Output = Result<T, CoreError>>,
) -> Result<T, CoreError> {
    match tokio::time::timeout(FILE_OP_TIMEOUT, fut).await {
        Ok(r) => r,
        Err(_) => Err(CoreError::GuestUnresponsive(format!(
            "file {what} of {path:?} did not finish within {}s",
            FILE_OP_TIMEOUT.as_secs()
        ))),
    }
}

/// Accepts only absolute, normalized paths: no `..`, no `.`, no empty
/// components, no NUL, bounded length. The agent resolves them inside the
/// sandbox's own filesystem view, so even a symlink planted by the guest
/// can only lead to another file of the same sandbox, never the host's.
pub fn validate_path(path: &str, max_len: usize) -> Result<(), CoreError> {
    let bad = |why: &str| Err(CoreError::Invalid(format!("path {path:?}: {why}")));
    if path.is_empty() {
        return bad("is empty");
    }
    if path.len() > max_len {
        return bad("is too long");
    }
    if !path.starts_with('/') {
        return bad("must be absolute");
    }
    if path.contains('\0') {
        return bad("contains NUL");
    }
    for comp in path.split('/').skip(1) {
        match comp {
            ".." => return bad("must not contain '..'"),
            "." => return bad("must not contain '.'"),
            "" if path != "/" => return bad("must not contain empty components or a trailing '/'"),
            c if c.len() > 255 => return bad("has a component over 255 bytes"),
            _ => {}
        }
    }
    Ok(())
}

fn map_guest(path: &str, e: CoreError) -> CoreError {
    match e {
        CoreError::Guest { code, message } => match code.as_str() {
            "not_found" => CoreError::FileNotFound(path.to_string()),
            "too_large" => CoreError::TooLarge(message),
            "is_a_directory" | "not_a_directory" => {
                CoreError::FileConflict(format!("{path}: {message}"))
            }
            "no_space" => CoreError::TooLarge(format!("sandbox disk full: {message}")),
            _ => CoreError::Guest { code, message },
        },
        other => other,
    }
}

/// Opens a channel and sends its first (JSON) request on it.
async fn request<T: serde::Serialize>(
    client: &AgentClient,
    kind: Kind,
    req: &T,
) -> Result<Channel, CoreError> {
    let ch = client.open();
    client
        .send(&Frame::json(ch.id, kind, req))
        .await
        .map_err(closed)?;
    Ok(ch)
}

fn closed(e: std::io::Error) -> CoreError {
    CoreError::GuestUnresponsive(e.to_string())
}

async fn write_inner(client: &AgentClient, path: &str, data: &[u8]) -> Result<(), CoreError> {
    let start = FileWriteRequest {
        path: path.to_string(),
        mode: 0o644,
    };
    let mut ch = request(client, Kind::FileWriteStart, &start).await?;
    for chunk in data.chunks(CHUNK) {
        client
            .send(&Frame::new(ch.id, Kind::FileData, chunk.to_vec()))
            .await
            .map_err(closed)?;
    }
    client
        .send(&Frame::new(ch.id, Kind::FileWriteEnd, vec![]))
        .await
        .map_err(closed)?;
    expect_ok(&mut ch)
        .await
        .map(drop)
        .map_err(|e| map_guest(path, e))
}

async fn read_inner(
    client: &AgentClient,
    path: &str,
    max_bytes: u64,
) -> Result<Vec<u8>, CoreError> {
    let req = FileReadRequest {
        path: path.to_string(),
        max_bytes,
    };
    let mut ch = request(client, Kind::FileRead, &req).await?;
    let mut data = Vec::new();
    loop {
        match ch.rx.recv().await {
            Some(f) if f.kind == Kind::FileChunk => {
                if data.len() + f.payload.len() > max_bytes as usize {
                    return Err(CoreError::TooLarge(format!(
                        "file is larger than {max_bytes} bytes"
                    )));
                }
                data.extend_from_slice(&f.payload);
            }
            Some(f) if f.kind == Kind::FileEof => return Ok(data),
            Some(f) if f.kind == Kind::Error => return Err(map_guest(path, guest_error(&f))),
            Some(_) => {}
            None => {
                return Err(CoreError::GuestUnresponsive(
                    "agent connection closed".into(),
                ))
            }
        }
    }
}

async fn list_inner(
    client: &AgentClient,
    path: &str,
    max_entries: u32,
) -> Result<Vec<FileEntry>, CoreError> {
    let req = FileListRequest {
        path: path.to_string(),
        max_entries,
    };
    let mut ch = request(client, Kind::FileList, &req).await?;
    let f = expect_ok(&mut ch).await.map_err(|e| map_guest(path, e))?;
    let mut entries: Vec<FileEntry> = f
        .parse()
        .map_err(|e| CoreError::GuestUnresponsive(format!("bad listing: {e}")))?;
    entries.truncate(max_entries as usize);
    Ok(entries)
}

async fn remove_inner(client: &AgentClient, path: &str) -> Result<(), CoreError> {
    let req = FilePathRequest {
        path: path.to_string(),
    };
    let mut ch = request(client, Kind::FileRemove, &req).await?;
    expect_ok(&mut ch)
        .await
        .map(drop)
        .map_err(|e| map_guest(path, e))
}

/// Writes `data` to `path` (a regular file, created or truncated).
pub async fn write(client: &AgentClient, path: &str, data: &[u8]) -> Result<(), CoreError> {
    deadline("write", path, write_inner(client, path, data)).await
}

/// Reads the regular file at `path`, up to `max_bytes`.
pub async fn read(client: &AgentClient, path: &str, max_bytes: u64) -> Result<Vec<u8>, CoreError> {
    deadline("read", path, read_inner(client, path, max_bytes)).await
}

/// Lists the directory at `path`, up to `max_entries`.
pub async fn list(
    client: &AgentClient,
    path: &str,
    max_entries: u32,
) -> Result<Vec<FileEntry>, CoreError> {
    deadline("list", path, list_inner(client, path, max_entries)).await
}

/// Removes `path` (a directory recursively).
pub async fn remove(client: &AgentClient, path: &str) -> Result<(), CoreError> {
    deadline("remove", path, remove_inner(client, path)).await
}

#[cfg(test)]
mod tests {
    use super::validate_path;

    #[test]
    fn path_rules() {
        for ok in ["/", "/work/a.py", "/a/b/c", "/tmp/..x", "/tmp/x.."] {
            assert!(validate_path(ok, 4096).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "a.py",
            "../etc/passwd",
            "/a/../../etc",
            "/a/./b",
            "/a//b",
            "/a/",
            "/a\0b",
        ] {
            assert!(validate_path(bad, 4096).is_err(), "{bad:?}");
        }
        assert!(validate_path(&format!("/{}", "a".repeat(256)), 4096).is_err());
        assert!(validate_path(&format!("/{}", "a".repeat(100)), 50).is_err());
    }
}
