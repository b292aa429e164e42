//! `open_pr` against a GitHub-compatible REST API (`POST
//! /repos/{owner}/{repo}/pulls`), with the host-held token. After a crash
//! the broker asks the same API whether the pull request exists (`GET
//! /repos/{owner}/{repo}/pulls?head=owner:branch&state=all`) before it
//! would ever create a second one.

use crate::http_client::{self, Base, BaseError, HttpError, Trust};
use bytes::Bytes;
use http_body_util::Full;
use hyper::Request;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ForgeError {
    #[error("forge API")]
    Http(#[from] HttpError),
    #[error("forge API: timed out after {}s", TIMEOUT.as_secs())]
    Timeout,
    #[error("forge API")]
    Base(#[from] BaseError),
    #[error("forge API: the answer is not JSON")]
    Answer(#[source] serde_json::Error),
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
    /// `https://host[:port]` or, to a loopback address only, `http://`
    /// (and an optional path prefix): see [`Base`].
    pub base: String,
    pub token: Option<String>,
    pub trust: Arc<Trust>,
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
        let base = Base::parse(&self.base)?;
        let uri = format!("{}{path}", base.prefix);
        let fut = async {
            let mut req = Request::builder()
                .method(method)
                .uri(&uri)
                .header("host", &base.hostport)
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
            let req = req.body(Full::new(data)).map_err(HttpError::from)?;
            let a = http_client::send(&self.trust, base.target(), req, MAX_BODY).await?;
            let (status, bytes) = (a.status, a.body);
            if !(200..300).contains(&status) {
                let b = String::from_utf8_lossy(&bytes);
                return Err(ForgeError::Status {
                    status,
                    body: b.chars().take(500).collect(),
                });
            }
            serde_json::from_slice(&bytes).map_err(ForgeError::Answer)
        };
        tokio::time::timeout(TIMEOUT, fut)
            .await
            .map_err(|_| ForgeError::Timeout)?
    }

    pub async fn create_pr(
        &self,
        owner: &str,
        repo: &str,
        pr: &Value,
    ) -> Result<Value, ForgeError> {
        self.call(
            "POST",
            &format!("/repos/{}/{}/pulls", segment(owner), segment(repo)),
            Some(pr),
        )
        .await
    }

    /// Pull requests from `owner:head`, in any state: only those whose
    /// head really is that branch of that owner (a forge that ignores or
    /// widens the filter cannot make another PR count as this one).
    pub async fn find_prs(
        &self,
        owner: &str,
        repo: &str,
        head: &str,
    ) -> Result<Vec<Value>, ForgeError> {
        let q = format!(
            "/repos/{}/{}/pulls?{}",
            segment(owner),
            segment(repo),
            query(&[("state", "all"), ("head", &format!("{owner}:{head}"))])
        );
        match self.call("GET", &q, None).await? {
            Value::Array(a) => Ok(a
                .into_iter()
                .filter(|p| {
                    p.pointer("/head/ref").and_then(Value::as_str) == Some(head)
                        && p.pointer("/head/repo/owner/login")
                            .or_else(|| p.pointer("/head/user/login"))
                            .and_then(Value::as_str)
                            .is_none_or(|o| o.eq_ignore_ascii_case(owner))
                })
                .collect()),
            _ => Err(ForgeError::Invalid(
                "forge API: expected a list of pull requests".into(),
            )),
        }
    }
}

/// A query string, every name and value form-encoded (`&`, `#`, `=`, `+`,
/// spaces and the rest cannot end a value or start another parameter).
/// The broker builds no query string any other way.
pub fn query(pairs: &[(&str, &str)]) -> String {
    form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish()
}

/// One path segment, percent-encoded (owner and repo are checked plain
/// tokens already; this keeps it so if that check ever widens).
fn segment(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
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
        assert_eq!(
            query(&[("state", "all"), ("head", "acme:hatchery/ses_1")]),
            "state=all&head=acme%3Ahatchery%2Fses_1"
        );
        // Whatever the value, the query reads back as exactly these pairs.
        let nasty = "acme:x&head=acme:main#frag=1 two+three%26";
        let q = query(&[("state", "all"), ("head", nasty)]);
        assert!(!q.contains(['#', ' ']), "{q}");
        let back: Vec<(String, String)> =
            form_urlencoded::parse(q.as_bytes()).into_owned().collect();
        assert_eq!(
            back,
            vec![
                ("state".into(), "all".into()),
                ("head".into(), nasty.into())
            ]
        );
    }

    /// The PR lookup of crash recovery against a forge that answers by
    /// the query it parsed (as GitHub does): a branch name with `&`, `#`,
    /// `=` and spaces reaches it as one `head` value and matches only its
    /// own pull request, never the one of the branch it spells out after
    /// the `&` (the old way of pasting it in would have asked for that
    /// one); and a forge answering with other heads anyway is not
    /// believed.
    #[tokio::test]
    async fn the_pr_lookup_cannot_be_steered_to_another_pr() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let log = seen.clone();
        let prs = serde_json::json!([
            {"number": 1, "title": "t", "head": {"ref": "main", "repo": {"owner": {"login": "acme"}}}},
            {"number": 2, "title": "t", "head": {"ref": "x&head=acme:main#a=b c", "repo": {"owner": {"login": "acme"}}}},
            {"number": 3, "title": "t", "head": {"ref": "x&head=acme:main#a=b c", "repo": {"owner": {"login": "mallory"}}}},
        ]);
        tokio::spawn(async move {
            loop {
                let (mut c, _) = l.accept().await.unwrap();
                let mut buf = vec![0u8; 8192];
                let n = c.read(&mut buf).await.unwrap();
                let req = String::from_utf8_lossy(&buf[..n]).into_owned();
                let target = req.split(' ').nth(1).unwrap_or_default().to_string();
                log.lock().unwrap().push(target.clone());
                // The forge's filter: `head` as its query parser reads it
                // (a widening forge answers with everything for `all`).
                let q = target.split_once('?').map(|x| x.1).unwrap_or_default();
                let heads: Vec<String> = form_urlencoded::parse(q.as_bytes())
                    .filter(|(k, _)| k == "head")
                    .map(|(_, v)| v.into_owned())
                    .collect();
                let answer: Vec<&Value> = prs
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|p| {
                        heads.iter().any(|h| h == "acme:*")
                            || heads.iter().any(|h| {
                                h.split_once(':').map(|x| x.1)
                                    == p.pointer("/head/ref").and_then(Value::as_str)
                            })
                    })
                    .collect();
                let body = serde_json::to_vec(&answer).unwrap();
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = c.write_all(head.as_bytes()).await;
                let _ = c.write_all(&body).await;
            }
        });
        let f = Forge {
            base: format!("http://{addr}"),
            token: None,
            trust: Default::default(),
        };
        let branch = "x&head=acme:main#a=b c";
        let got = f.find_prs("acme", "demo", branch).await.unwrap();
        let numbers: Vec<u64> = got.iter().filter_map(|p| p["number"].as_u64()).collect();
        assert_eq!(numbers, vec![2], "only the branch's own PR, of its owner");
        let target = seen.lock().unwrap()[0].clone();
        assert!(!target.contains(['#', ' ']), "{target}");
        let q = target.split_once('?').unwrap().1;
        let pairs: Vec<(String, String)> =
            form_urlencoded::parse(q.as_bytes()).into_owned().collect();
        assert_eq!(
            pairs,
            vec![
                ("state".into(), "all".into()),
                ("head".into(), format!("acme:{branch}"))
            ]
        );
        // Pasted in unencoded (as issue 31 feared), the same name would
        // have asked for `main`'s PR as well.
        let pasted = format!("state=all&head=acme:{branch}");
        let heads: Vec<String> =
            form_urlencoded::parse(pasted.split('#').next().unwrap().as_bytes())
                .filter(|(k, _)| k == "head")
                .map(|(_, v)| v.into_owned())
                .collect();
        assert_eq!(heads, ["acme:x", "acme:main"]);
        // A forge that ignores the filter and lists everything: still only #2.
        let got = f.find_prs("acme", "demo", "*").await.unwrap();
        assert!(got.is_empty(), "{got:?}");
    }
}
