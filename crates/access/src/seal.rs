//! Sealed paging tokens. A SCAN or key-list page ends at the last key it examined, which may be
//! a key the caller may not read; its name must not reach the caller, so such a position goes
//! out encrypted under a key made at startup and comes back opaque.
//!
//! Each token is sealed with what it was issued for as associated data (the caller's principal,
//! the operation and the store: `Grant::position_token` builds it), so it opens only for the
//! same: a token handed to another principal, or replayed against another store or operation,
//! is refused like a forged one.
//!
//! The AEAD is the one encryption at rest uses (`storage::durable::Cipher`: XChaCha20-Poly1305,
//! RustCrypto): one stack for everything stategate seals. Its 24-byte nonces (a random prefix
//! per key and a counter) never repeat, however many tokens a long-running service issues.

use stategate_storage::durable::{Cipher, EncryptionKey};

/// Marks a sealed token; never a hex digit, so it cannot be mistaken for a plain one.
const MARK: char = 'S';

pub struct Sealer {
    cipher: Cipher,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sealer")
    }
}

impl Sealer {
    /// A sealer with a fresh random key (`None` when the system has no randomness).
    pub fn new() -> Option<Sealer> {
        let key = EncryptionKey::random().ok()?;
        Some(Sealer {
            cipher: Cipher::new(&key).ok()?,
        })
    }

    /// `position` as an opaque token that opens only with the same `bound_to`.
    pub fn seal(&self, position: &[u8], bound_to: &[u8]) -> String {
        let mut sealed = position.to_vec();
        self.cipher.seal_tail(&mut sealed, 0, bound_to);
        let mut out = String::with_capacity(1 + 2 * sealed.len());
        out.push(MARK);
        out.push_str(&hex::encode_upper(&sealed));
        out
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
        self.cipher.open(&bytes, bound_to).ok()
    }
}
