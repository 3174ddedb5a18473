//! Encryption at rest (`--encryption-key-file`): every log record and snapshot chunk is sealed
//! with XChaCha20-Poly1305 under the store's 32-byte key.
//!
//! Nonces are 24 bytes: 16 random bytes drawn when the store is opened, then a 64-bit counter
//! of the records sealed since. Within a process the counter never repeats; across opens (and
//! so across restarts, segments, a record cut as a torn tail and written again, a refused
//! write taken back) the random part differs, with odds of a repeat around 2^-64 even after
//! 2^32 opens. No nonce state is kept on disk, so nothing about it can be lost in a crash.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use chacha20poly1305::aead::AeadInOut;
use chacha20poly1305::{KeyInit, Tag, XChaCha20Poly1305, XNonce};
use zeroize::Zeroizing;

use crate::StorageError;

pub const KEY_LEN: usize = 32;
pub const NONCE_LEN: usize = 24;
pub const TAG_LEN: usize = 16;

/// The store's encryption key, as read from its file (the path is kept for messages).
#[derive(Clone)]
pub struct EncryptionKey {
    bytes: Zeroizing<[u8; KEY_LEN]>,
    path: PathBuf,
}

impl std::fmt::Debug for EncryptionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EncryptionKey({})", self.path.display())
    }
}

impl EncryptionKey {
    /// Reads a key file: exactly 32 bytes, in a regular file that other users can neither read
    /// nor write (readable by the group is allowed, with a warning: a service group).
    pub fn from_file(path: &Path) -> Result<EncryptionKey, StorageError> {
        let bad = |what: String| StorageError::Encryption(format!("encryption key file {}: {what}", path.display()));
        let meta = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
        if !meta.is_file() {
            return Err(bad("not a regular file".into()));
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o007 != 0 {
                return Err(bad(format!(
                    "other users can access it (mode {mode:04o}): run `chmod 600 {}` (Kubernetes: \
                     defaultMode: 0400 on the secret volume)",
                    path.display()
                )));
            }
            if mode & 0o070 != 0 {
                tracing::warn!(file = %path.display(), mode = format!("{mode:04o}"), "the encryption key file is readable by its group");
            }
        }
        let data = Zeroizing::new(std::fs::read(path).map_err(|e| bad(e.to_string()))?);
        let bytes: [u8; KEY_LEN] = data.as_slice().try_into().map_err(|_| {
            bad(format!(
                "it must hold exactly {KEY_LEN} bytes, it holds {} (create one with `head -c 32 /dev/urandom > {}`)",
                data.len(),
                path.display()
            ))
        })?;
        Ok(EncryptionKey {
            bytes: Zeroizing::new(bytes),
            path: path.to_owned(),
        })
    }

    /// A key from bytes; `label` stands for the file in messages.
    pub fn from_bytes(bytes: [u8; KEY_LEN], label: impl Into<PathBuf>) -> EncryptionKey {
        EncryptionKey {
            bytes: Zeroizing::new(bytes),
            path: label.into(),
        }
    }

    /// A fresh random key that lives in memory only (sealed paging tokens: valid until the
    /// process ends).
    pub fn random() -> Result<EncryptionKey, StorageError> {
        let mut bytes = Zeroizing::new([0u8; KEY_LEN]);
        getrandom::fill(bytes.as_mut_slice()).map_err(|e| StorageError::Encryption(format!("no randomness: {e}")))?;
        Ok(EncryptionKey {
            bytes,
            path: PathBuf::from("(a key in memory)"),
        })
    }

    /// The file the key came from.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Seals and opens records under one key.
pub struct Cipher {
    aead: XChaCha20Poly1305,
    /// Random per open: the first 16 bytes of every nonce sealed by this instance.
    prefix: [u8; 16],
    counter: AtomicU64,
    key_path: PathBuf,
}

impl std::fmt::Debug for Cipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cipher({})", self.key_path.display())
    }
}

/// A sealed message that does not open under this key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unauthentic;

impl Cipher {
    pub fn new(key: &EncryptionKey) -> Result<Cipher, StorageError> {
        let mut prefix = [0u8; 16];
        getrandom::fill(&mut prefix).map_err(|e| StorageError::Encryption(format!("no randomness for nonces: {e}")))?;
        Ok(Cipher {
            aead: XChaCha20Poly1305::new(&(*key.bytes).into()),
            prefix,
            counter: AtomicU64::new(0),
            key_path: key.path.clone(),
        })
    }

    pub fn key_path(&self) -> &Path {
        &self.key_path
    }

    fn next_nonce(&self) -> [u8; NONCE_LEN] {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let mut nonce = [0u8; NONCE_LEN];
        nonce[..16].copy_from_slice(&self.prefix);
        nonce[16..].copy_from_slice(&n.to_le_bytes());
        nonce
    }

    /// Seals `out[start..]` in place: it becomes nonce, ciphertext, tag.
    pub fn seal_tail(&self, out: &mut Vec<u8>, start: usize, aad: &[u8]) {
        let nonce = self.next_nonce();
        out.splice(start..start, nonce);
        let body = start + NONCE_LEN;
        let tag = self
            .aead
            .encrypt_inout_detached(&XNonce::from(nonce), aad, (&mut out[body..]).into())
            // Only a message over 256 GiB fails; frames are at most 1 GiB.
            .unwrap_or_default();
        out.extend_from_slice(&tag);
    }

    /// Opens a message sealed by [`Cipher::seal_tail`] (by any instance with the same key).
    pub fn open(&self, sealed: &[u8], aad: &[u8]) -> Result<Vec<u8>, Unauthentic> {
        if sealed.len() < NONCE_LEN + TAG_LEN {
            return Err(Unauthentic);
        }
        let (nonce, rest) = sealed.split_at(NONCE_LEN);
        let (body, tag) = rest.split_at(rest.len() - TAG_LEN);
        let nonce = XNonce::try_from(nonce).map_err(|_| Unauthentic)?;
        let tag = Tag::try_from(tag).map_err(|_| Unauthentic)?;
        let mut plain = body.to_vec();
        self.aead
            .decrypt_inout_detached(&nonce, aad, plain.as_mut_slice().into(), &tag)
            .map_err(|_| Unauthentic)?;
        Ok(plain)
    }
}
