//! `open_pr` against a GitHub-compatible REST API (`POST
//! /repos/{owner}/{repo}/pulls`), with the host-held token. After a crash
//! the broker asks the same API whether the pull request exists (`GET
//! /repos/{owner}/{repo}/pulls?head=owner:branch&state=all`) before it
//! would ever create a second one.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ForgeError {
    #[error("forge API: {0}")]
    Http(String),
    #[error("forge API answered {status}: {body}")]
    Status { status: u16, body: String },
    #[error("forge API is not configured (--broker-github-api)")]
    NotConfigured,
    #[error("{0}")]
    Invalid(String),
}

const TIMEOUT: Duration = Duration::from_secs(30);
const MAX_BODY: usize = 1 << 20;

pub struct Forge {
    /// `http://host:port` (and an optional path prefix).
    pub base: String,
    pub token: Option<String>,
}

/// `owner/repo` from a repository URL (the last two path segments).
pub fn owner_repo(url: &str) -> Option<(String, String)> {
    let path = url.split_once("://")?.1.split_once('/')?.1;
    let mut segs: Vec<&str> = path
        .trim_end_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let repo = segs.pop()?.trim_end_matches(".git");
    let owner = segs.pop()?;
    let ok = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    };
    (ok(owner) && ok(repo)).then(|| (owner.to_string(), repo.to_string()))
}

impl Forge {
    async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, ForgeError> {
        let rest = self
            .base
            .strip_prefix("http://")
            .ok_or_else(|| ForgeError::Invalid("the forge API URL must be http://".into()))?;
        let (hostport, prefix) = match rest.split_once('/') {
            Some((h, p)) => (h, format!("/{}", p.trim_end_matches('/'))),
            None => (rest, String::new()),
        };
        let hostport = hostport.to_string();
        let uri = format!("{prefix}{path}");
        let fut = async {
            let tcp = tokio::net::TcpStream::connect(&hostport)
                .await
                .map_err(|e| ForgeError::Http(e.to_string()))?;
            let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
                .await
                .map_err(|e| ForgeError::Http(e.to_string()))?;
            tokio::spawn(conn);
            let mut req = Request::builder()
                .method(method)
                .uri(&uri)
                .header("host", &hostport)
                .header("accept", "application/vnd.github+json")
                .header("user-agent", "hatchery-broker");
            if let Some(t) = &self.token {
                req = req.header("authorization", format!("Bearer {t}"));
            }
            let data = match body {
                Some(b) => {
                    req = req.header("content-type", "application/json");
                    Bytes::from(serde_json::to_vec(b).unwrap_or_default())
                }
                None => Bytes::new(),
            };
            let req = req
                .body(Full::new(data))
                .map_err(|e| ForgeError::Http(e.to_string()))?;
            let resp = tx
                .send_request(req)
                .await
                .map_err(|e| ForgeError::Http(e.to_string()))?;
            let status = resp.status().as_u16();
            let bytes = Limited::new(resp.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(|e| ForgeError::Http(e.to_string()))?
                .to_bytes();
            if !(200..300).contains(&status) {
                let b = String::from_utf8_lossy(&bytes);
                return Err(ForgeError::Status {
                    status,
                    body: b.chars().take(500).collect(),
                });
            }
            serde_json::from_slice(&bytes).map_err(|e| ForgeError::Http(format!("answer: {e}")))
        };
        tokio::time::timeout(TIMEOUT, fut)
            .await
            .map_err(|_| ForgeError::Http("timed out".into()))?
    }

    pub async fn create_pr(
        &self,
        owner: &str,
        repo: &str,
        pr: &Value,
    ) -> Result<Value, ForgeError> {
        self.call("POST", &format!("/repos/{owner}/{repo}/pulls"), Some(pr))
            .await
    }

    /// Pull requests from `owner:head`, in any state.
    pub async fn find_prs(
        &self,
        owner: &str,
        repo: &str,
        head: &str,
    ) -> Result<Vec<Value>, ForgeError> {
        let q = format!(
            "/repos/{owner}/{repo}/pulls?state=all&head={}",
            enc(&format!("{owner}:{head}"))
        );
        match self.call("GET", &q, None).await? {
            Value::Array(a) => Ok(a),
            _ => Err(ForgeError::Http("expected a list of pull requests".into())),
        }
    }
}

fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// What the broker keeps of a created pull request.
pub fn summary(v: &Value) -> Value {
    serde_json::json!({
        "number": v.get("number"),
        "html_url": v.get("html_url"),
        "state": v.get("state"),
        "head": v.pointer("/head/ref"),
        "base": v.pointer("/base/ref"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_and_repo() {
        assert_eq!(
            owner_repo("git://127.0.0.1:9/acme/demo.git"),
            Some(("acme".into(), "demo".into()))
        );
        assert_eq!(
            owner_repo("https://github.com/acme/demo"),
            Some(("acme".into(), "demo".into()))
        );
        assert_eq!(owner_repo("https://github.com/demo.git"), None);
        assert_eq!(owner_repo("https://h/a/b c.git"), None);
    }

    #[test]
    fn query_encoding() {
        assert_eq!(enc("acme:hatchery/ses_1"), "acme%3Ahatchery%2Fses_1");
    }
}
