//! Where anchors go in the object store: `anchor_s3_url` parsed into an
//! endpoint, a bucket and a key prefix, and the key of each new object.

use time::OffsetDateTime;

/// `http(s)://host[:port]/BUCKET[/PREFIX]`, path-style (works with AWS,
/// MinIO, Ceph, moto, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Location {
    /// `scheme://host:port`, what the requests are signed for.
    pub endpoint: url::Url,
    pub tls: bool,
    /// The host a certificate must name (brackets kept for IPv6).
    pub host: String,
    /// What is dialled.
    pub hostport: String,
    pub bucket: String,
    /// Without leading or trailing `/`; may be empty.
    pub prefix: String,
}

#[derive(Debug, thiserror::Error)]
pub enum LocationError {
    /// The scheme and host (hatchery-tls's check, shared with the
    /// broker's endpoints).
    #[error("S3 URL {url:?}: {why}")]
    Origin {
        url: String,
        why: hatchery_tls::origin::OriginError,
    },
    #[error("S3 URL {url:?}: {why}")]
    Path { url: String, why: &'static str },
}

/// The key prefix may hold only these (no percent-encoding questions
/// between signing, listing and reading back).
fn prefix_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/')
}

/// S3's bucket naming rules (3-63 of lowercase letters, digits, `.`, `-`,
/// starting and ending with a letter or digit).
fn bucket_ok(b: &str) -> bool {
    (3..=63).contains(&b.len())
        && b.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-')
        && b.starts_with(|c: char| c.is_ascii_alphanumeric())
        && b.ends_with(|c: char| c.is_ascii_alphanumeric())
}

impl S3Location {
    pub fn parse(url: &str) -> Result<S3Location, LocationError> {
        let bad = |why| LocationError::Path {
            url: url.to_string(),
            why,
        };
        let rest = url.split_once("://").map_or("", |(_, r)| r);
        if rest.contains(['?', '#', '@']) {
            return Err(bad(
                "no query, fragment or user info (credentials go in the credentials file)",
            ));
        }
        let (origin, path) =
            hatchery_tls::origin::Origin::split(url).map_err(|why| LocationError::Origin {
                url: url.to_string(),
                why,
            })?;
        let path = path
            .strip_prefix('/')
            .ok_or_else(|| bad("no bucket: the URL's path must start with the bucket name"))?;
        let (bucket, prefix) = match path.split_once('/') {
            Some((b, p)) => (b, p.trim_matches('/')),
            None => (path, ""),
        };
        if !bucket_ok(bucket) {
            return Err(bad("the bucket name is not a valid S3 bucket name"));
        }
        if !prefix.chars().all(prefix_char)
            || prefix
                .split('/')
                .any(|s| s.is_empty() && !prefix.is_empty())
        {
            return Err(bad(
                "the key prefix may hold only letters, digits, '-', '_', '.' and single '/'",
            ));
        }
        let scheme = if origin.tls { "https" } else { "http" };
        let endpoint = url::Url::parse(&format!("{scheme}://{}", origin.hostport))
            .map_err(|_| bad("not a valid host"))?;
        Ok(S3Location {
            endpoint,
            tls: origin.tls,
            host: origin.host,
            hostport: origin.hostport,
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
        })
    }

    /// Where the rounds' objects are: `PREFIX/all/` (`all`: each object
    /// holds the heads of every chain that moved in that round).
    pub fn anchors_prefix(&self) -> String {
        if self.prefix.is_empty() {
            "all/".to_string()
        } else {
            format!("{}/all/", self.prefix)
        }
    }

    /// The key of one round's object: its time (so a listing comes in
    /// time order), this process's random `node` and the round's counter,
    /// so two daemons, or one restarted within the same nanosecond, never
    /// pick the same key.
    pub fn object_key(&self, at: OffsetDateTime, node: &str, n: u64) -> String {
        let at = at.to_offset(time::UtcOffset::UTC);
        format!(
            "{}{:04}{:02}{:02}T{:02}{:02}{:02}.{:09}Z-{node}-{n:010}.jsonl",
            self.anchors_prefix(),
            at.year(),
            u8::from(at.month()),
            at.day(),
            at.hour(),
            at.minute(),
            at.second(),
            at.nanosecond()
        )
    }
}

/// A random name for this process's objects (16 hex digits).
pub fn new_node() -> String {
    format!("{:016x}", rand::random::<u64>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let l = S3Location::parse("http://127.0.0.1:9000/audit-bucket/hx/prod/").unwrap();
        assert_eq!(l.endpoint.as_str(), "http://127.0.0.1:9000/");
        assert_eq!(
            (
                l.tls,
                l.hostport.as_str(),
                l.bucket.as_str(),
                l.prefix.as_str()
            ),
            (false, "127.0.0.1:9000", "audit-bucket", "hx/prod")
        );
        assert_eq!(l.anchors_prefix(), "hx/prod/all/");
        let l = S3Location::parse("https://s3.eu-west-1.amazonaws.com/anchors").unwrap();
        assert_eq!(
            (l.tls, l.hostport.as_str(), l.prefix.as_str()),
            (true, "s3.eu-west-1.amazonaws.com:443", "")
        );
        assert_eq!(l.anchors_prefix(), "all/");
        assert!(S3Location::parse("http://[::1]:9000/bkt").is_ok());
        assert!(S3Location::parse("http://localhost/bkt/p").is_ok());
        let e = S3Location::parse("http://10.0.0.1:9000/bkt").unwrap_err();
        assert!(e.to_string().contains("loopback"), "{e}");
        for bad in [
            "s3://bkt/p",
            "http://10.0.0.1:9000/bkt",
            "https://h",
            "https://h/",
            "https://h/Bad_Bucket",
            "https://h/ab",
            "https://h/bkt/p%20q",
            "https://h/bkt/a//b",
            "https://h:0/bkt",
            "https://h:x/bkt",
            "https://u:p@h/bkt",
            "https://h/bkt?x=1",
            "https://:9000/bkt",
        ] {
            assert!(S3Location::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn keys_sort_by_time_and_cannot_collide() {
        let l = S3Location::parse("http://127.0.0.1:9000/bkt/p").unwrap();
        let t = OffsetDateTime::from_unix_timestamp_nanos(1_796_000_000_123_456_789).unwrap();
        let k = l.object_key(t, "00000000000000ab", 7);
        assert_eq!(
            k,
            "p/all/20261130T005320.123456789Z-00000000000000ab-0000000007.jsonl"
        );
        let later = l.object_key(t + time::Duration::seconds(1), "00000000000000ab", 8);
        assert!(later > k);
        // Same instant, other process or next round: another key.
        assert_ne!(l.object_key(t, "00000000000000ac", 7), k);
        assert_ne!(l.object_key(t, "00000000000000ab", 8), k);
        assert_ne!(new_node(), new_node());
        assert_eq!(new_node().len(), 16);
    }
}
