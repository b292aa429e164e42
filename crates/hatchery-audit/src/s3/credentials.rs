//! The object store's access key, from a file only (never argv or the
//! config file): the AWS shared-credentials form,
//!
//! ```text
//! [default]
//! aws_access_key_id = AKIA...
//! aws_secret_access_key = ...
//! aws_session_token = ...      # optional
//! ```
//!
//! One profile: a second value for a key is refused rather than silently
//! picking one. Read at each use, so a rotated file takes effect at the
//! next anchoring.

use std::path::{Path, PathBuf};

/// A credentials file is a few lines; anything larger is not one.
pub const MAX_CREDENTIALS_BYTES: u64 = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("credentials file {}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("credentials file {}: over {MAX_CREDENTIALS_BYTES} bytes", .path.display())]
    TooLarge { path: PathBuf },
    #[error("credentials file {}: line {line} is not `key = value` or `[profile]`", .path.display())]
    Syntax { path: PathBuf, line: usize },
    #[error("credentials file {}: {key} is given twice (one profile only)", .path.display())]
    Repeated { path: PathBuf, key: &'static str },
    #[error("credentials file {}: no {key}", .path.display())]
    Missing { path: PathBuf, key: &'static str },
}

const KEY_ID: &str = "aws_access_key_id";
const SECRET: &str = "aws_secret_access_key";
const TOKEN: &str = "aws_session_token";

pub fn read(path: &Path) -> Result<rusty_s3::Credentials, CredentialsError> {
    use std::io::Read;
    let err = |source| CredentialsError::Read {
        path: path.into(),
        source,
    };
    let mut text = String::new();
    std::fs::File::open(path)
        .map_err(err)?
        .take(MAX_CREDENTIALS_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(err)?;
    if text.len() as u64 > MAX_CREDENTIALS_BYTES {
        return Err(CredentialsError::TooLarge { path: path.into() });
    }
    parse(path, &text)
}

fn parse(path: &Path, text: &str) -> Result<rusty_s3::Credentials, CredentialsError> {
    let (mut id, mut secret, mut token) = (None, None, None);
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if line.starts_with('[') && line.ends_with(']') {
            continue;
        }
        let (k, v) = line
            .split_once('=')
            .map(|(k, v)| (k.trim(), v.trim()))
            .filter(|(k, v)| !k.is_empty() && !v.is_empty())
            .ok_or_else(|| CredentialsError::Syntax {
                path: path.into(),
                line: i + 1,
            })?;
        let (name, slot) = match k.to_ascii_lowercase().as_str() {
            KEY_ID => (KEY_ID, &mut id),
            SECRET => (SECRET, &mut secret),
            TOKEN => (TOKEN, &mut token),
            // Other settings of the AWS form (region, output) are not ours.
            _ => continue,
        };
        if slot.replace(v.to_string()).is_some() {
            return Err(CredentialsError::Repeated {
                path: path.into(),
                key: name,
            });
        }
    }
    let missing = |key| CredentialsError::Missing {
        path: path.into(),
        key,
    };
    let id = id.ok_or_else(|| missing(KEY_ID))?;
    let secret = secret.ok_or_else(|| missing(SECRET))?;
    Ok(match token {
        Some(t) => rusty_s3::Credentials::new_with_token(id, secret, t),
        None => rusty_s3::Credentials::new(id, secret),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_aws_form() {
        let p = Path::new("/c");
        let c = parse(
            p,
            "# test\n[default]\naws_access_key_id = AKID\naws_secret_access_key=s3cr=t\nregion = x\n",
        )
        .unwrap();
        assert_eq!((c.key(), c.secret(), c.token()), ("AKID", "s3cr=t", None));
        let c = parse(
            p,
            "aws_access_key_id=a\naws_secret_access_key=b\naws_session_token=t",
        )
        .unwrap();
        assert_eq!(c.token(), Some("t"));
        assert!(matches!(
            parse(p, "aws_access_key_id=a\n"),
            Err(CredentialsError::Missing { key: SECRET, .. })
        ));
        assert!(matches!(
            parse(
                p,
                "[a]\naws_access_key_id=a\n[b]\naws_access_key_id=b\naws_secret_access_key=s"
            ),
            Err(CredentialsError::Repeated { key: KEY_ID, .. })
        ));
        assert!(matches!(
            parse(p, "aws_access_key_id a\n"),
            Err(CredentialsError::Syntax { line: 1, .. })
        ));
        assert!(matches!(
            parse(p, "aws_access_key_id =\n"),
            Err(CredentialsError::Syntax { .. })
        ));
    }

    #[test]
    fn size_cap() {
        let d = std::env::temp_dir().join(format!("hx-s3cred-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let f = d.join("c");
        let body = "aws_access_key_id=a\naws_secret_access_key=b\n";
        let pad = "#".repeat(MAX_CREDENTIALS_BYTES as usize - body.len());
        std::fs::write(&f, &format!("{pad}\n{body}")[1..]).unwrap();
        assert!(read(&f).is_ok(), "exactly the cap");
        std::fs::write(&f, format!("{pad}\n{body}")).unwrap();
        assert!(matches!(read(&f), Err(CredentialsError::TooLarge { .. })));
        assert!(matches!(
            read(&d.join("missing")),
            Err(CredentialsError::Read { .. })
        ));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
