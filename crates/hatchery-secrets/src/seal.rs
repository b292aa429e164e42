//! One value sealed: ChaCha20-Poly1305 (ring) under the key file's key, a
//! fresh random 96-bit nonce per seal, the secret's name as associated
//! data (a sealed value copied onto another name's row does not open).
//! Stored form: nonce ‖ ciphertext ‖ tag.

use crate::key::SecretKey;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use zeroize::Zeroizing;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SealError {
    /// The stored bytes do not open under this key and name: a different
    /// key file, or a changed row.
    #[error("the sealed value does not open (wrong key file, or the row was altered)")]
    Open,
    #[error("sealing failed")]
    Seal,
}

fn key(k: &SecretKey) -> LessSafeKey {
    // A 32-byte key is always a valid ChaCha20-Poly1305 key.
    LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, k.bytes()).expect("32-byte key"))
}

pub fn seal(k: &SecretKey, name: &str, value: &[u8]) -> Result<Vec<u8>, SealError> {
    let mut nonce = [0u8; NONCE_LEN];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut nonce);
    let mut buf = value.to_vec();
    key(k)
        .seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(name.as_bytes()),
            &mut buf,
        )
        .map_err(|_| SealError::Seal)?;
    let mut out = nonce.to_vec();
    out.extend_from_slice(&buf);
    // The plaintext copy is gone with `buf` (now ciphertext).
    Ok(out)
}

pub fn open(k: &SecretKey, name: &str, sealed: &[u8]) -> Result<Zeroizing<Vec<u8>>, SealError> {
    if sealed.len() < NONCE_LEN {
        return Err(SealError::Open);
    }
    let (n, ct) = sealed.split_at(NONCE_LEN);
    let nonce = Nonce::try_assume_unique_for_key(n).map_err(|_| SealError::Open)?;
    let mut buf = Zeroizing::new(ct.to_vec());
    let len = key(k)
        .open_in_place(nonce, Aad::from(name.as_bytes()), &mut buf)
        .map_err(|_| SealError::Open)?
        .len();
    buf.truncate(len);
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_binding() {
        let k = SecretKey::from_bytes([7; 32]);
        let s = seal(&k, "GH", b"tok-123").unwrap();
        assert!(!s.windows(7).any(|w| w == b"tok-123"));
        assert_eq!(&open(&k, "GH", &s).unwrap()[..], b"tok-123");
        // Another name, another key, a flipped byte: none opens.
        assert_eq!(open(&k, "OTHER", &s), Err(SealError::Open));
        assert_eq!(
            open(&SecretKey::from_bytes([8; 32]), "GH", &s),
            Err(SealError::Open)
        );
        let mut bad = s.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert_eq!(open(&k, "GH", &bad), Err(SealError::Open));
        // Two seals of one value differ (fresh nonce).
        assert_ne!(seal(&k, "GH", b"tok-123").unwrap(), s);
    }
}
