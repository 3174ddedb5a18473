//! Sealed paging tokens. A SCAN or key-list page ends at the last key it examined, which may be
//! a key the caller may not read; its name must not reach the caller, so such a position goes
//! out encrypted (ChaCha20-Poly1305 under a key made at startup) and comes back opaque.
//!
//! Each token is sealed with what it was issued for as associated data (the caller's principal,
//! the operation and the store: `Grant::position_token` builds it), so it opens only for the
//! same: a token handed to another principal, or replayed against another store or operation,
//! is refused like a forged one.

use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

/// Marks a sealed token; never a hex digit, so it cannot be mistaken for a plain one.
const MARK: char = 'S';

pub struct Sealer {
    key: LessSafeKey,
    rng: SystemRandom,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sealer")
    }
}

impl Sealer {
    /// A sealer with a fresh random key (`None` when the system has no randomness).
    pub fn new() -> Option<Sealer> {
        let rng = SystemRandom::new();
        let mut key = [0u8; 32];
        rng.fill(&mut key).ok()?;
        let key = LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, &key).ok()?);
        Some(Sealer { key, rng })
    }

    /// `position` as an opaque token that opens only with the same `bound_to`.
    pub fn seal(&self, position: &[u8], bound_to: &[u8]) -> Option<String> {
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill(&mut nonce).ok()?;
        let mut buf = position.to_vec();
        self.key
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(bound_to), &mut buf)
            .ok()?;
        let mut out = String::with_capacity(1 + 2 * (NONCE_LEN + buf.len()));
        out.push(MARK);
        out.push_str(&hex::encode_upper(nonce));
        out.push_str(&hex::encode_upper(&buf));
        Some(out)
    }

    /// Whether `token` is a sealed one (as opposed to a plain hex position).
    pub fn is_sealed(token: &[u8]) -> bool {
        token.first() == Some(&(MARK as u8))
    }

    /// The position inside a sealed token; `None` for anything this sealer did not make with
    /// this `bound_to`.
    pub fn open(&self, token: &[u8], bound_to: &[u8]) -> Option<Vec<u8>> {
        let body = token.strip_prefix(&[MARK as u8])?;
        let bytes = hex::decode(body).ok()?;
        if bytes.len() < NONCE_LEN {
            return None;
        }
        let (nonce, sealed) = bytes.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut buf = sealed.to_vec();
        let plain = self.key.open_in_place(nonce, Aad::from(bound_to), &mut buf).ok()?;
        Some(plain.to_vec())
    }
}
