//! Capability tokens: what a candidate's link and a reviewer's link carry
//! instead of the API key. A token is 32 random bytes (`hxr_` + base64url);
//! only its SHA-256 is stored, with its scope (one session, or one round's
//! reviews) and its expiry. An altered token hashes to nothing stored, an
//! expired one is refused: both are 401.

use crate::store::{RoundStore, Scope, TokenRecord};
use crate::RoundsError;
use base64::Engine;
use rand::RngCore;
use sha2::{Digest, Sha256};

const PREFIX: &str = "hxr_";
/// base64url of 32 bytes without padding.
const BODY_LEN: usize = 43;

pub fn mint() -> String {
    let mut b = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut b);
    format!(
        "{PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
    )
}

pub fn hash(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub fn looks_like_token(s: &str) -> bool {
    s.strip_prefix(PREFIX).is_some_and(|b| {
        b.len() == BODY_LEN
            && b.bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
    })
}

/// The stored grant of `token`, if it is one of ours and has not expired.
pub async fn check(
    store: &dyn RoundStore,
    token: &str,
    now_ms: u64,
) -> Result<TokenRecord, RoundsError> {
    if !looks_like_token(token) {
        return Err(RoundsError::Unauthorized);
    }
    let rec = store
        .get_token(&hash(token))
        .await?
        .ok_or(RoundsError::Unauthorized)?;
    if rec.expires_at_ms <= now_ms {
        return Err(RoundsError::Unauthorized);
    }
    Ok(rec)
}

pub fn record(
    token: &str,
    scope: Scope,
    round_id: &str,
    session_id: Option<&str>,
    now_ms: u64,
    ttl_s: u64,
) -> TokenRecord {
    TokenRecord {
        hash: hash(token),
        scope,
        round_id: round_id.to_string(),
        session_id: session_id.map(str::to_string),
        created_at_ms: now_ms,
        expires_at_ms: now_ms + ttl_s * 1000,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::DbStore;

    #[tokio::test]
    async fn altered_and_expired_are_refused() {
        let s = DbStore::open(hatchery_db::Db::sqlite_memory().unwrap())
            .await
            .unwrap();
        let t = mint();
        assert!(looks_like_token(&t), "{t}");
        assert_ne!(mint(), t);
        let rec = record(&t, Scope::Reviewer, "rnd_a", None, 1000, 10);
        s.insert_token(&rec).await.unwrap();
        assert_eq!(check(&s, &t, 1000).await.unwrap().scope, Scope::Reviewer);
        // One changed character.
        let mut altered = t.clone().into_bytes();
        let last = altered.len() - 1;
        altered[last] = if altered[last] == b'A' { b'B' } else { b'A' };
        let altered = String::from_utf8(altered).unwrap();
        assert!(matches!(
            check(&s, &altered, 1000).await,
            Err(RoundsError::Unauthorized)
        ));
        assert!(matches!(
            check(&s, &t, 11_000).await,
            Err(RoundsError::Unauthorized)
        ));
        assert!(matches!(
            check(&s, "hx_apikey", 1000).await,
            Err(RoundsError::Unauthorized)
        ));
        assert_ne!(rec.hash, t, "only the hash is stored");
    }
}
