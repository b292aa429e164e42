//! The three requests anchoring needs: put a new object (write-once),
//! list the objects under the anchors' prefix, get one.

use super::{credentials, sigv4, S3Error, S3Location};
use crate::line::AnchorLine;
use crate::verify::Head;
use bytes::Bytes;
use hatchery_tls::http::{self, Answer, Target, Trust};
use http_body_util::Full;
use rusty_s3::actions::{GetObject, ListObjectsV2};
use rusty_s3::S3Action;
use std::path::PathBuf;
use std::time::Duration;

/// How long one request may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a presigned URL (list, get) is valid: just the request.
const SIGNED_FOR: Duration = Duration::from_secs(300);
/// Caps on answers: a list page (1000 keys) and an anchor object (one
/// line per chain that moved in a round, about 150 bytes each).
pub const MAX_LIST_BYTES: usize = 4 << 20;
pub const MAX_OBJECT_BYTES: usize = 64 << 20;
/// Caps on one verification's reading: objects listed.
pub const MAX_OBJECTS: usize = 1_000_000;
/// An error answer's body, read for its `<Code>` and `<Message>`.
const MAX_ERROR_BYTES: usize = 64 << 10;

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

    /// Sends `request` and waits at most [`REQUEST_TIMEOUT`] for the
    /// answer, with at most `max` bytes of its body.
    async fn send(
        &self,
        op: &'static str,
        key: &str,
        request: Result<hyper::Request<Full<Bytes>>, hyper::http::Error>,
        max: usize,
    ) -> Result<Answer, S3Error> {
        let http_err = |source: http::HttpError| S3Error::Http {
            op,
            key: key.to_string(),
            source,
        };
        let request = request.map_err(|e| http_err(e.into()))?;
        let fut = http::send(&self.trust, self.target(), request, max);
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

    /// The put's request: path-style, signed in the `Authorization`
    /// header with the body's SHA-256 (s3::sigv4), so the store checks the
    /// body as well as who sent it.
    fn put_request(
        &self,
        creds: &rusty_s3::Credentials,
        key: &str,
        body: Bytes,
        at: time::OffsetDateTime,
    ) -> Result<hyper::Request<Full<Bytes>>, hyper::http::Error> {
        let path = format!(
            "/{}/{}",
            sigv4::encode_path(&self.location.bucket),
            sigv4::encode_path(key)
        );
        let host = host_header(&self.location.endpoint);
        let fixed = [
            ("content-type", "application/x-ndjson"),
            ("if-none-match", "*"),
        ];
        let signer = sigv4::Signer {
            key_id: creds.key(),
            secret: creds.secret(),
            token: creds.token(),
            region: self.bucket.region(),
        };
        let signed = signer.sign("PUT", &path, &host, &fixed, &sigv4::sha256_hex(&body), at);
        let mut req = hyper::Request::builder()
            .method(hyper::Method::PUT)
            .uri(path)
            .header(hyper::header::HOST, host)
            .header(hyper::header::CONTENT_LENGTH, body.len());
        for (k, v) in fixed {
            req = req.header(k, v);
        }
        for (k, v) in signed {
            req = req.header(k, v);
        }
        req.body(Full::new(body))
    }

    /// Puts `body` at `key` only if no object is there (`If-None-Match: *`,
    /// which AWS S3, MinIO and moto honour; a store that ignores it still
    /// never sees the same key twice from us).
    pub async fn put_new(&self, key: &str, body: Bytes) -> Result<(), S3Error> {
        let creds = credentials::read(&self.credentials_file)?;
        let req = self.put_request(&creds, key, body, time::OffsetDateTime::now_utc());
        let a = self.send("put", key, req, MAX_ERROR_BYTES).await?;
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
                .send("list", prefix, presigned_get(&url), MAX_LIST_BYTES)
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
            .send("get", key, presigned_get(&url), MAX_OBJECT_BYTES)
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

/// The `Host` header for `url`: its host, and its port unless the
/// scheme's default (what rusty-s3 signs a presigned URL for too).
fn host_header(url: &url::Url) -> String {
    match url.port() {
        Some(p) => format!("{}:{p}", url.host_str().unwrap_or_default()),
        None => url.host_str().unwrap_or_default().to_string(),
    }
}

/// The GET for a presigned `url` (its path and query are the request
/// target; it carries no body).
fn presigned_get(url: &url::Url) -> Result<hyper::Request<Full<Bytes>>, hyper::http::Error> {
    let target = match url.query() {
        Some(q) => format!("{}?{q}", url.path()),
        None => url.path().to_string(),
    };
    hyper::Request::builder()
        .method(hyper::Method::GET)
        .uri(target)
        .header(hyper::header::HOST, host_header(url))
        .header(hyper::header::CONTENT_LENGTH, 0)
        .body(Full::new(Bytes::new()))
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
        // The put: signed in its headers, the body's hash among them.
        let at = time::OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap();
        let req = s
            .put_request(&creds, "p/all/x.jsonl", Bytes::from_static(b"x"), at)
            .unwrap();
        assert_eq!(req.method(), hyper::Method::PUT);
        assert_eq!(req.uri().to_string(), "/bkt/p/all/x.jsonl");
        let h = req.headers();
        assert_eq!(h["host"], "127.0.0.1:9000");
        assert_eq!(h["content-length"], "1");
        assert_eq!(h["if-none-match"], "*");
        assert_eq!(h["x-amz-content-sha256"], sigv4::sha256_hex(b"x"));
        assert_eq!(h["x-amz-date"], "20231114T221320Z");
        let auth = h["authorization"].to_str().unwrap();
        assert!(
            auth.starts_with(
                "AWS4-HMAC-SHA256 Credential=AKID/20231114/us-east-1/s3/aws4_request, "
            ) && auth.contains(
                " SignedHeaders=content-type;host;if-none-match;x-amz-content-sha256;x-amz-date, "
            ),
            "{auth}"
        );
        // List and get: presigned (no body to sign).
        let url = GetObject::new(&s.bucket, Some(&creds), "p/all/x.jsonl").sign(SIGNED_FOR);
        let req = presigned_get(&url).unwrap();
        assert!(req
            .uri()
            .to_string()
            .starts_with("/bkt/p/all/x.jsonl?X-Amz-"));
        assert_eq!(req.headers()["host"], "127.0.0.1:9000");
        let q: std::collections::HashMap<_, _> = url.query_pairs().into_owned().collect();
        assert_eq!(q["X-Amz-Algorithm"], "AWS4-HMAC-SHA256");
        assert!(
            q["X-Amz-Credential"].starts_with("AKID/")
                && q["X-Amz-Credential"].contains("/us-east-1/s3/")
        );
        assert_eq!(q["X-Amz-SignedHeaders"], "host");
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
