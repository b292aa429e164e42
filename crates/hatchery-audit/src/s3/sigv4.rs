//! SigV4 in the `Authorization` header with a signed payload, for the
//! put. A presigned URL (rusty-s3's, kept for list and get, which carry
//! no body) signs the constant `UNSIGNED-PAYLOAD`, so the body it carries
//! is covered by TLS alone; here the body's SHA-256 is in the signature
//! and in `x-amz-content-sha256`, and the store recomputes it and refuses
//! a body that does not match (`XAmzContentSHA256Mismatch`).
//!
//! AWS's worked example for a single-chunk PUT is the unit test, so this
//! is checked against AWS's own numbers; end to end, the anchoring tests'
//! store recomputes every signature with botocore's signer.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;

const ALGORITHM: &str = "AWS4-HMAC-SHA256";

/// What signs a request: the access key and the region.
pub struct Signer<'a> {
    pub key_id: &'a str,
    pub secret: &'a str,
    pub token: Option<&'a str>,
    pub region: &'a str,
}

/// The lower-case hex SHA-256 of `data`.
pub fn sha256_hex(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    // Any key length is valid for HMAC: the error cannot happen.
    let mut m = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    m.update(data);
    m.finalize().into_bytes().to_vec()
}

/// S3's `UriEncode` of a path: every byte but the unreserved ones
/// (`A-Z a-z 0-9 - . _ ~`) and `/` as `%XX` (upper-case hex). The same
/// text is the request's path and the canonical request's, so what is
/// sent is what is signed.
pub fn encode_path(p: &str) -> String {
    let mut out = String::with_capacity(p.len());
    for b in p.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `YYYYMMDDTHHMMSSZ`, the form `x-amz-date` takes.
fn amz_date(at: OffsetDateTime) -> String {
    let at = at.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}{:02}{:02}T{:02}{:02}{:02}Z",
        at.year(),
        u8::from(at.month()),
        at.day(),
        at.hour(),
        at.minute(),
        at.second()
    )
}

impl Signer<'_> {
    /// The headers that sign a request without a query string: `method`
    /// to `path` (already [`encode_path`]d) at `host` (the `Host` header's
    /// value), with `headers` (signed too; lower-case names) and a body
    /// whose SHA-256 is `payload_sha256`. Returns what to add to the
    /// request: `x-amz-date`, `x-amz-content-sha256`, the session token
    /// if any, and `authorization`.
    pub fn sign(
        &self,
        method: &str,
        path: &str,
        host: &str,
        headers: &[(&str, &str)],
        payload_sha256: &str,
        at: OffsetDateTime,
    ) -> Vec<(&'static str, String)> {
        let date = amz_date(at);
        let day = &date[..8];
        let mut added: Vec<(&'static str, String)> = vec![
            ("x-amz-content-sha256", payload_sha256.to_string()),
            ("x-amz-date", date.clone()),
        ];
        if let Some(t) = self.token {
            added.push(("x-amz-security-token", t.to_string()));
        }
        let mut signed: Vec<(String, String)> = headers
            .iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v.trim().to_string()))
            .chain(std::iter::once(("host".to_string(), host.to_string())))
            .chain(added.iter().map(|(k, v)| (k.to_string(), v.clone())))
            .collect();
        signed.sort();
        let names = signed
            .iter()
            .map(|(k, _)| k.as_str())
            .collect::<Vec<_>>()
            .join(";");
        let canonical_headers: String = signed.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
        let canonical =
            format!("{method}\n{path}\n\n{canonical_headers}\n{names}\n{payload_sha256}");
        let scope = format!("{day}/{}/s3/aws4_request", self.region);
        let to_sign = format!(
            "{ALGORITHM}\n{date}\n{scope}\n{}",
            sha256_hex(canonical.as_bytes())
        );
        let key = [day, self.region, "s3", "aws4_request"]
            .iter()
            .fold(format!("AWS4{}", self.secret).into_bytes(), |k, part| {
                hmac(&k, part.as_bytes())
            });
        let signature = hex(&hmac(&key, to_sign.as_bytes()));
        added.push((
            "authorization",
            format!(
                "{ALGORITHM} Credential={}/{scope}, SignedHeaders={names}, Signature={signature}",
                self.key_id
            ),
        ));
        added
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AWS's example "PUT Object" (Signature Calculations for the
    /// Authorization Header: Transferring Payload in a Single Chunk, in
    /// the S3 API reference): the key `test$file.text` needs encoding.
    #[test]
    fn aws_put_object_example() {
        let body = b"Welcome to Amazon S3.";
        let hash = sha256_hex(body);
        assert_eq!(
            hash,
            "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072"
        );
        let path = encode_path("/test$file.text");
        assert_eq!(path, "/test%24file.text");
        let s = Signer {
            key_id: "AKIAIOSFODNN7EXAMPLE",
            secret: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            token: None,
            region: "us-east-1",
        };
        let at = OffsetDateTime::from_unix_timestamp(1_369_353_600).unwrap(); // 2013-05-24T00:00:00Z
        let h = s.sign(
            "PUT",
            &path,
            "examplebucket.s3.amazonaws.com",
            &[
                ("date", "Fri, 24 May 2013 00:00:00 GMT"),
                ("x-amz-storage-class", "REDUCED_REDUNDANCY"),
            ],
            &hash,
            at,
        );
        let get = |k: &str| h.iter().find(|(n, _)| *n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("x-amz-date"), Some("20130524T000000Z"));
        assert_eq!(get("x-amz-content-sha256"), Some(hash.as_str()));
        assert_eq!(
            get("authorization"),
            Some(
                "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, \
                 SignedHeaders=date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class, \
                 Signature=98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd"
            )
        );
    }

    #[test]
    fn a_session_token_is_signed_and_sent() {
        let s = Signer {
            key_id: "AKID",
            secret: "s",
            token: Some("tok"),
            region: "eu-west-1",
        };
        let h = s.sign(
            "PUT",
            "/b/k",
            "h",
            &[],
            &sha256_hex(b""),
            OffsetDateTime::UNIX_EPOCH,
        );
        assert!(h.contains(&("x-amz-security-token", "tok".to_string())));
        let auth = &h.iter().find(|(n, _)| *n == "authorization").unwrap().1;
        assert!(
            auth.contains("/19700101/eu-west-1/s3/aws4_request"),
            "{auth}"
        );
        assert!(
            auth.contains(
                "SignedHeaders=host;x-amz-content-sha256;x-amz-date;x-amz-security-token,"
            ),
            "{auth}"
        );
    }

    #[test]
    fn paths_encode_all_but_unreserved_and_slash() {
        assert_eq!(encode_path("a/b-c_d.e~f"), "a/b-c_d.e~f");
        assert_eq!(encode_path("a b+c=d&é"), "a%20b%2Bc%3Dd%26%C3%A9");
    }
}
