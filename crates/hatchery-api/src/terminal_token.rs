//! Short-lived tokens that let a browser attach to one sandbox's terminal
//! without the API key: a browser cannot set an `Authorization` header on a
//! WebSocket, and the key must never reach a page.
//!
//! A token is `EXPIRES_MS.NONCE.MAC`: MAC is HMAC-SHA256, under a secret of
//! this daemon's, over the purpose, the sandbox id, the expiry and a random
//! nonce. So it opens only that sandbox's terminal, only until it expires
//! ([`TOKEN_TTL`] after it was made), and only once: the nonce of a token
//! that was used is remembered until its expiry and refused after that.

use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;
use std::collections::HashMap;
use std::sync::Mutex;

pub const TOKEN_TTL_MS: u64 = 60_000;
const PURPOSE: &[u8] = b"hatchery-terminal-v1";
/// Nonces remembered at most; a token past it is refused (tokens take a
/// key holder to mint and expire in a minute, so this is never reached by
/// honest use).
const MAX_REMEMBERED: usize = 100_000;

pub struct TerminalTokens {
    secret: Vec<u8>,
    /// Nonces of used tokens, with their expiry.
    used: Mutex<HashMap<String, u64>>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum TokenError {
    Malformed,
    Expired,
    BadSignature,
    Used,
}

impl TerminalTokens {
    pub fn new(secret: Vec<u8>) -> Self {
        TerminalTokens {
            secret,
            used: Mutex::new(HashMap::new()),
        }
    }

    fn mac(&self, sandbox: &str, expires_ms: u64, nonce: &str) -> Hmac<Sha256> {
        let mut m = Hmac::<Sha256>::new_from_slice(&self.secret).expect("any key size");
        for part in [
            PURPOSE,
            sandbox.as_bytes(),
            expires_ms.to_string().as_bytes(),
            nonce.as_bytes(),
        ] {
            m.update(&(part.len() as u32).to_be_bytes());
            m.update(part);
        }
        m
    }

    /// A token for `sandbox`'s terminal, and when it expires (ms since the
    /// epoch).
    pub fn issue(&self, sandbox: &str, now_ms: u64) -> (String, u64) {
        use base64::Engine;
        let mut raw = [0u8; 12];
        rand::thread_rng().fill_bytes(&mut raw);
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let nonce = b64.encode(raw);
        let expires = now_ms + TOKEN_TTL_MS;
        let mac = b64.encode(self.mac(sandbox, expires, &nonce).finalize().into_bytes());
        (format!("{expires}.{nonce}.{mac}"), expires)
    }

    /// Checks a token for `sandbox` and uses it up. Returns its nonce, for
    /// [`TerminalTokens::release`].
    pub fn redeem(&self, sandbox: &str, token: &str, now_ms: u64) -> Result<String, TokenError> {
        use base64::Engine;
        let mut parts = token.splitn(3, '.');
        let (Some(exp), Some(nonce), Some(mac)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(TokenError::Malformed);
        };
        let expires: u64 = exp.parse().map_err(|_| TokenError::Malformed)?;
        let mac = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(mac)
            .map_err(|_| TokenError::Malformed)?;
        if nonce.is_empty() || nonce.len() > 64 {
            return Err(TokenError::Malformed);
        }
        // Constant-time comparison (hmac's verify).
        self.mac(sandbox, expires, nonce)
            .verify_slice(&mac)
            .map_err(|_| TokenError::BadSignature)?;
        if now_ms > expires {
            return Err(TokenError::Expired);
        }
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        used.retain(|_, exp| *exp >= now_ms);
        if used.len() >= MAX_REMEMBERED || used.contains_key(nonce) {
            return Err(TokenError::Used);
        }
        used.insert(nonce.to_string(), expires);
        Ok(nonce.to_string())
    }

    /// Gives a redeemed token back when no terminal came of it (a full
    /// sandbox, a missing program), so the client can retry with it until
    /// it expires. A token still opens at most one terminal.
    pub fn release(&self, nonce: &str) {
        self.used
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(nonce);
    }
}

impl TokenError {
    pub fn message(&self) -> &'static str {
        match self {
            TokenError::Malformed => "terminal token is malformed",
            TokenError::Expired => "terminal token has expired (they last 60 s)",
            TokenError::BadSignature => "terminal token is not valid for this sandbox",
            TokenError::Used => "terminal token was used already (each opens one terminal)",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_opens_its_sandbox_once_until_it_expires() {
        let t = TerminalTokens::new(b"secret".to_vec());
        let (tok, exp) = t.issue("sbx_a", 1_000);
        assert_eq!(exp, 1_000 + TOKEN_TTL_MS);
        assert_eq!(
            t.redeem("sbx_b", &tok, 2_000),
            Err(TokenError::BadSignature)
        );
        assert_eq!(t.redeem("sbx_a", &tok, exp + 1), Err(TokenError::Expired));
        let nonce = t.redeem("sbx_a", &tok, 2_000).unwrap();
        assert_eq!(t.redeem("sbx_a", &tok, 2_001), Err(TokenError::Used));
        // Given back (nothing was opened with it): usable again, once.
        t.release(&nonce);
        assert!(t.redeem("sbx_a", &tok, 2_002).is_ok());
        assert_eq!(t.redeem("sbx_a", &tok, 2_003), Err(TokenError::Used));
        let (tok2, _) = t.issue("sbx_a", 1_000);
        assert_ne!(tok, tok2);
        assert!(t.redeem("sbx_a", &tok2, exp).is_ok());
    }

    #[test]
    fn tampering_and_other_secrets_are_refused() {
        let t = TerminalTokens::new(b"secret".to_vec());
        let other = TerminalTokens::new(b"other".to_vec());
        let (tok, exp) = t.issue("sbx_a", 1_000);
        assert_eq!(
            other.redeem("sbx_a", &tok, 2_000),
            Err(TokenError::BadSignature)
        );
        // A later expiry with the same MAC.
        let forged = tok.replacen(&exp.to_string(), &(exp + 600_000).to_string(), 1);
        assert_eq!(
            t.redeem("sbx_a", &forged, 2_000),
            Err(TokenError::BadSignature)
        );
        for bad in ["", "x", "1.2", "abc.def.ghi", "1.n.!!!"] {
            assert!(t.redeem("sbx_a", bad, 0).is_err(), "{bad}");
        }
    }

    #[test]
    fn hmac_matches_rfc_4231() {
        // Test case 2 of RFC 4231, through the same crate the tokens use.
        let mut m = Hmac::<Sha256>::new_from_slice(b"Jefe").unwrap();
        m.update(b"what do ya want for nothing?");
        let hex: String = m
            .finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
