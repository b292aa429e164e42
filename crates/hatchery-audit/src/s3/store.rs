//! The three requests anchoring needs: put a new object (write-once),
//! list the objects under the anchors' prefix, get one.

use super::{credentials, S3Error, S3Location};
use crate::line::AnchorLine;
use crate::verify::Head;
use bytes::Bytes;
use hatchery_tls::http::{self, Answer, Target, Trust};
use http_body_util::Full;
use rusty_s3::actions::{GetObject, ListObjectsV2, PutObject};
use rusty_s3::S3Action;
use std::path::PathBuf;
use std::time::Duration;

/// How long one request may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a presigned URL is valid: just the request.
const SIGNED_FOR: Duration = Duration::from_secs(300);
/// Caps on answers: a list page (1000 keys) and an anchor object (one
/// line per chain that moved in a round, about 150 bytes each).
pub const MAX_LIST_BYTES: usize = 4 << 20;
pub const MAX_OBJECT_BYTES: usize = 64 << 20;
/// Caps on one verification's reading: objects listed.
pub const MAX_OBJECTS: usize = 1_000_000;
/// An error answer's body, read for its `<Code>` and `<Message>`.
const MAX_ERROR_BYTES: usize = 64 << 10;

/// One request: a presigned URL, the headers it was signed with, a body,
/// and a cap on the answer's body.
struct Req<'a> {
    method: hyper::Method,
    url: &'a url::Url,
    headers: &'a [(&'a str, &'a str)],
    body: Bytes,
    max: usize,
}

impl<'a> Req<'a> {
    fn get(url: &'a url::Url, max: usize) -> Req<'a> {
        Req {
            method: hyper::Method::GET,
            url,
            headers: &[],
            body: Bytes::new(),
            max,
        }
    }
}

#[derive(Debug)]
pub struct S3Store {
    pub location: S3Location,
    bucket: rusty_s3::Bucket,
    credentials_file: PathBuf,
    /// What an https store's certificate is verified against: the
    /// system's bundle, or the operator's CA file (`with_ca_file`),
    /// loaded at the first https request (or by `check_trust`).
    trust: Trust,
}

impl S3Store {
    pub fn new(
        location: S3Location,
        region: &str,
        credentials_file: PathBuf,
    ) -> Result<S3Store, S3Error> {
        let bucket = rusty_s3::Bucket::new(
            location.endpoint.clone(),
            rusty_s3::UrlStyle::Path,
            location.bucket.clone(),
            region.to_string(),
        )
        .map_err(|source| S3Error::Bucket {
            bucket: location.bucket.clone(),
            endpoint: location.endpoint.to_string(),
            source,
        })?;
        Ok(S3Store {
            location,
            bucket,
            credentials_file,
            trust: Trust::default(),
        })
    }

    /// Verifies the store's certificate against the CAs in `bundle` (PEM)
    /// instead of the system's: a private CA, or a test's.
    pub fn with_ca_file(mut self, bundle: PathBuf) -> S3Store {
        self.trust = Trust::new(bundle);
        self
    }

    /// Loads the trust an https store is verified against now: a missing
    /// or empty CA file is refused at start, not at the first round.
    pub fn check_trust(&self) -> Result<(), S3Error> {
        if self.location.tls {
            self.trust.check().map_err(S3Error::Trust)?;
        }
        Ok(())
    }

    /// Reads the credentials file now (it is read again at each request,
    /// so a rotated key takes effect): a bad one is refused at start.
    pub fn check_credentials(&self) -> Result<(), S3Error> {
        credentials::read(&self.credentials_file)?;
        Ok(())
    }

    fn target(&self) -> Target<'_> {
        Target {
            addr: &self.location.hostport,
            host: &self.location.host,
            tls: self.location.tls,
        }
    }

    async fn send(&self, op: &'static str, key: &str, req: Req<'_>) -> Result<Answer, S3Error> {
        let http_err = |source: http::HttpError| S3Error::Http {
            op,
            key: key.to_string(),
            source,
        };
        let request = presigned(req.method, req.url, req.headers, req.body)
            .map_err(|e| http_err(e.into()))?;
        let fut = http::send(&self.trust, self.target(), request, req.max);
        match tokio::time::timeout(REQUEST_TIMEOUT, fut).await {
            Err(_) => Err(S3Error::Timeout {
                op,
                key: key.to_string(),
                within: REQUEST_TIMEOUT,
            }),
            Ok(Err(source)) => Err(http_err(source)),
            Ok(Ok(a)) => Ok(a),
        }
    }

    /// Puts `body` at `key` only if no object is there (`If-None-Match: *`,
    /// which AWS S3, MinIO and moto honour; a store that ignores it still
    /// never sees the same key twice from us).
    pub async fn put_new(&self, key: &str, body: Bytes) -> Result<(), S3Error> {
        let creds = credentials::read(&self.credentials_file)?;
        let mut put = PutObject::new(&self.bucket, Some(&creds), key);
        put.headers_mut().insert("if-none-match", "*");
        let url = put.sign(SIGNED_FOR);
        let req = Req {
            method: hyper::Method::PUT,
            url: &url,
            headers: &[
                ("if-none-match", "*"),
                ("content-type", "application/x-ndjson"),
            ],
            body,
            max: MAX_ERROR_BYTES,
        };
        let a = self.send("put", key, req).await?;
        match a.status {
            200..=299 => Ok(()),
            412 => Err(S3Error::Exists {
                key: key.to_string(),
            }),
            _ => Err(refused("put", key, &a)),
        }
    }

    /// Every key under `prefix`, in the store's (lexicographic) order.
    pub async fn list(&self, prefix: &str) -> Result<Vec<String>, S3Error> {
        let creds = credentials::read(&self.credentials_file)?;
        let mut keys = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut list = ListObjectsV2::new(&self.bucket, Some(&creds));
            list.with_prefix(prefix);
            if let Some(t) = &token {
                list.with_continuation_token(t.as_str());
            }
            let url = list.sign(SIGNED_FOR);
            let a = self
                .send("list", prefix, Req::get(&url, MAX_LIST_BYTES))
                .await?;
            if a.status != 200 {
                return Err(refused("list", prefix, &a));
            }
            let page = ListObjectsV2::parse_response(&a.body).map_err(|e| S3Error::List {
                prefix: prefix.to_string(),
                source: Box::new(e),
            })?;
            for c in page.contents {
                // Keys come URL-encoded (encoding-type=url); ours need no
                // encoding, so any other key is decoded for the record.
                keys.push(
                    url::form_urlencoded::parse(format!("k={}", c.key).as_bytes())
                        .next()
                        .map(|(_, v)| v.into_owned())
                        .unwrap_or(c.key),
                );
            }
            if keys.len() > MAX_OBJECTS {
                return Err(S3Error::TooMany {
                    prefix: prefix.to_string(),
                    max: MAX_OBJECTS,
                });
            }
            match page.next_continuation_token {
                Some(t) if !t.is_empty() => token = Some(t),
                _ => return Ok(keys),
            }
        }
    }

    pub async fn get(&self, key: &str) -> Result<Bytes, S3Error> {
        let creds = credentials::read(&self.credentials_file)?;
        let url = GetObject::new(&self.bucket, Some(&creds), key).sign(SIGNED_FOR);
        let a = self
            .send("get", key, Req::get(&url, MAX_OBJECT_BYTES))
            .await?;
        if a.status != 200 {
            return Err(refused("get", key, &a));
        }
        Ok(a.body)
    }

    /// Every head anchored under the location's prefix, in key (time)
    /// order. A malformed line is an error: the objects are write-once,
    /// so damage there is itself a finding.
    pub async fn read_anchors(&self) -> Result<Vec<Head>, S3Error> {
        let mut heads = Vec::new();
        for key in self.list(&self.location.anchors_prefix()).await? {
            let body = self.get(&key).await?;
            heads.extend(parse_object(&key, &body)?);
        }
        Ok(heads)
    }
}

/// The heads in one anchor object (JSON lines, as the file has them).
pub fn parse_object(key: &str, body: &[u8]) -> Result<Vec<Head>, S3Error> {
    let text = std::str::from_utf8(body).map_err(|source| S3Error::Utf8 {
        key: key.to_string(),
        source,
    })?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            let a: AnchorLine = serde_json::from_str(l).map_err(|source| S3Error::Line {
                key: key.to_string(),
                line: i + 1,
                source,
            })?;
            Ok(Head {
                chain: a.chain,
                seq: a.seq,
                hash: a.hash,
            })
        })
        .collect()
}

/// The request for a presigned `url` (its path and query are the request
/// target), with the headers it was signed with and `body`.
fn presigned(
    method: hyper::Method,
    url: &url::Url,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Result<hyper::Request<Full<Bytes>>, hyper::http::Error> {
    let target = match url.query() {
        Some(q) => format!("{}?{q}", url.path()),
        None => url.path().to_string(),
    };
    let host = match url.port() {
        Some(p) => format!("{}:{p}", url.host_str().unwrap_or_default()),
        None => url.host_str().unwrap_or_default().to_string(),
    };
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(target)
        .header(hyper::header::HOST, host)
        .header(hyper::header::CONTENT_LENGTH, body.len());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.body(Full::new(body))
}

fn refused(op: &'static str, key: &str, a: &Answer) -> S3Error {
    let text = String::from_utf8_lossy(&a.body);
    let tag = |t: &str| {
        let open = format!("<{t}>");
        text.split_once(open.as_str())
            .and_then(|(_, rest)| rest.split_once(&format!("</{t}>")))
            .map(|(v, _)| v.chars().take(512).collect::<String>())
    };
    S3Error::Refused {
        op,
        key: key.to_string(),
        status: a.status,
        code: tag("Code").unwrap_or_else(|| "-".into()),
        message: tag("Message").unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_answers_name_the_code() {
        let a = Answer {
            status: 404,
            headers: Default::default(),
            body: Bytes::from_static(
                b"<?xml version=\"1.0\"?><Error><Code>NoSuchBucket</Code><Message>The specified bucket does not exist</Message></Error>",
            ),
        };
        let e = refused("put", "k", &a);
        assert!(
            matches!(&e, S3Error::Refused { status: 404, code, message, .. }
                if code == "NoSuchBucket" && message.contains("does not exist")),
            "{e:?}"
        );
        let e = refused(
            "put",
            "k",
            &Answer {
                status: 503,
                headers: Default::default(),
                body: Bytes::new(),
            },
        );
        assert!(matches!(&e, S3Error::Refused { code, .. } if code == "-"));
    }

    #[test]
    fn objects_are_anchor_lines() {
        let body = br#"{"anchored_at":"t","chain":"ses_a","seq":3,"hash":"ab"}

{"anchored_at":"t","chain":"ses_b","seq":1,"hash":"cd"}
"#;
        let h = parse_object("k", body).unwrap();
        assert_eq!(h.len(), 2);
        assert_eq!((h[1].chain.as_str(), h[1].seq), ("ses_b", 1));
        assert!(matches!(
            parse_object("k", b"{\"chain\":1}\n"),
            Err(S3Error::Line { line: 1, .. })
        ));
        assert!(matches!(
            parse_object("k", b"\xff"),
            Err(S3Error::Utf8 { .. })
        ));
    }

    #[test]
    fn requests_are_signed_for_the_bucket_and_the_write_once_header() {
        let loc = S3Location::parse("http://127.0.0.1:9000/bkt/p").unwrap();
        let s = S3Store::new(loc, "us-east-1", "/nonexistent".into()).unwrap();
        let creds = rusty_s3::Credentials::new("AKID", "secret");
        let mut put = PutObject::new(&s.bucket, Some(&creds), "p/all/x.jsonl");
        put.headers_mut().insert("if-none-match", "*");
        let url = put.sign(SIGNED_FOR);
        assert_eq!(url.path(), "/bkt/p/all/x.jsonl");
        let req = presigned(
            hyper::Method::PUT,
            &url,
            &[("if-none-match", "*")],
            Bytes::from_static(b"x"),
        )
        .unwrap();
        assert!(req
            .uri()
            .to_string()
            .starts_with("/bkt/p/all/x.jsonl?X-Amz-"));
        assert_eq!(req.headers()["host"], "127.0.0.1:9000");
        assert_eq!(req.headers()["content-length"], "1");
        let q: std::collections::HashMap<_, _> = url.query_pairs().into_owned().collect();
        assert_eq!(q["X-Amz-Algorithm"], "AWS4-HMAC-SHA256");
        assert!(
            q["X-Amz-Credential"].starts_with("AKID/")
                && q["X-Amz-Credential"].contains("/us-east-1/s3/")
        );
        assert_eq!(q["X-Amz-SignedHeaders"], "host;if-none-match");
        assert_eq!(q["X-Amz-Signature"].len(), 64);
        // A missing credentials file is an error before any request.
        assert!(matches!(
            s.check_credentials(),
            Err(S3Error::Credentials(_))
        ));
        // No TLS, no trust to load.
        assert!(s.check_trust().is_ok());
    }

    #[test]
    fn an_https_store_loads_its_ca_file_at_the_check() {
        let loc = S3Location::parse("https://s3.corp/bkt").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let s = S3Store::new(loc.clone(), "us-east-1", "/nonexistent".into())
            .unwrap()
            .with_ca_file(dir.path().join("missing.pem"));
        assert!(matches!(
            s.check_trust(),
            Err(S3Error::Trust(hatchery_tls::TrustError::Read(..)))
        ));
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec![]).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, params.self_signed(&key).unwrap().pem()).unwrap();
        let s = S3Store::new(loc, "us-east-1", "/nonexistent".into())
            .unwrap()
            .with_ca_file(ca);
        assert!(s.check_trust().is_ok());
    }
}
