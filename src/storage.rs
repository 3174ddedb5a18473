//! Where records live. The engine owns every state store rule; a backend only stores records
//! and swaps them atomically.
//!
//! The one write primitive is a conditional swap: replace a key's record (or its absence) only
//! if the stored version is still the one the engine read. [`Backend::swap_many`] does the same
//! for several keys at once, all or nothing (transactions). A Redis backend implements both
//! with a server-side script; the in-memory backend with a lock.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use crate::hlc::Hlc;

pub mod memory;

/// What is stored for one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub value: Bytes,
    /// The version of the last applied SET.
    pub version: Hlc,
    /// The highest fencing token a SET carried, if any.
    pub fencing: Option<Hlc>,
    /// Absolute expiry deadline, wall-clock milliseconds since the epoch.
    pub expires_at_ms: Option<u64>,
}

impl Record {
    pub fn is_expired(&self, now_ms: u64) -> bool {
        self.expires_at_ms.is_some_and(|d| d <= now_ms)
    }
}

/// One key's part of a swap.
#[derive(Debug, Clone)]
pub struct Swap {
    pub key: Bytes,
    /// The version the engine read: `None` means "the key must be absent".
    pub expected: Option<Hlc>,
    /// The new record, or `None` to delete the key.
    pub new: Option<Record>,
}

/// The outcome of a swap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SwapOutcome {
    Done,
    /// A stored version differed from `expected`: nothing was written; read again and retry.
    Conflict,
    /// The swap would create keys beyond `max_keys`: nothing was written.
    TooManyKeys,
}

/// A page of keys in key order.
#[derive(Debug, Clone, Default)]
pub struct KeyPage {
    pub keys: Vec<Bytes>,
    /// The last key examined, when more keys may follow it.
    pub resume_after: Option<Bytes>,
}

/// A failure of the storage itself (I/O, a lost connection): never a state store rule.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("storage i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("storage is corrupt: {0}")]
    Corrupt(String),
    #[error("storage backend: {0}")]
    Backend(String),
}

/// The contract every backend implements. All methods are atomic per call.
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// The stored record, expired or not (the engine decides what expiry means).
    async fn get(&self, key: &[u8]) -> Result<Option<Record>, StorageError>;

    /// Applies every swap or none. `max_keys` bounds the number of keys after the swap.
    async fn swap_many(&self, swaps: &[Swap], max_keys: Option<u64>) -> Result<SwapOutcome, StorageError>;

    /// Examines up to `examine` keys strictly after `after`, in byte order, and returns those
    /// that are not expired at `now_ms` and satisfy `keep`.
    async fn scan(
        &self,
        after: Option<&[u8]>,
        examine: usize,
        now_ms: u64,
        keep: &(dyn for<'k> Fn(&'k [u8]) -> bool + Sync),
    ) -> Result<KeyPage, StorageError>;

    /// Keys whose deadline is at or before `now_ms`, with their versions, earliest first.
    async fn expired(&self, now_ms: u64, limit: usize) -> Result<Vec<(Bytes, Hlc)>, StorageError>;

    /// The earliest expiry deadline stored, if any.
    async fn next_deadline(&self) -> Result<Option<u64>, StorageError>;

    /// Number of keys stored (expired ones that are not yet removed included).
    async fn len(&self) -> Result<u64, StorageError>;

    /// The highest version stored anywhere (to seed the clock after a restart).
    async fn max_version(&self) -> Result<Option<Hlc>, StorageError>;
}

/// A cheap handle on a backend.
#[derive(Clone)]
pub struct Store(Arc<dyn Backend>);

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Store")
    }
}

impl Store {
    pub fn new(backend: impl Backend) -> Store {
        Store(Arc::new(backend))
    }

    pub fn memory() -> Store {
        Store::new(memory::MemoryBackend::default())
    }

    pub fn backend(&self) -> &dyn Backend {
        &*self.0
    }
}

#[cfg(test)]
pub(crate) mod tests;
