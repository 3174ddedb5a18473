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

pub mod durable;
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
    /// The backend cannot be reached (a lost connection); the request changed nothing.
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// No space left for a write; the write changed nothing and reads still work.
    #[error("storage full: {0}")]
    Full(String),
}

/// The contract every backend implements. All methods are atomic per call.
#[async_trait]
#[allow(clippy::len_without_is_empty)] // `len` is the key count for quotas, not a collection API
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

/// Which backend stores the records (`--storage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StorageKind {
    /// Volatile: everything is lost when the process stops (tests, caches).
    Memory,
    /// On disk under `--data-dir`, surviving restarts and crashes (see [`durable`]).
    #[default]
    Durable,
}

/// An unknown `--storage` value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown storage {0:?}: expected durable or memory")]
pub struct ParseStorageKindError(String);

impl std::str::FromStr for StorageKind {
    type Err = ParseStorageKindError;
    fn from_str(s: &str) -> Result<StorageKind, ParseStorageKindError> {
        match s.to_ascii_lowercase().as_str() {
            "memory" => Ok(StorageKind::Memory),
            "durable" => Ok(StorageKind::Durable),
            _ => Err(ParseStorageKindError(s.to_owned())),
        }
    }
}

/// Where and how records are stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageConfig {
    pub kind: StorageKind,
    pub data_dir: std::path::PathBuf,
    pub fsync: durable::FsyncMode,
    /// See [`durable::DurableOptions::segment_bytes`].
    pub segment_bytes: u64,
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

    /// Opens the configured backend (recovering a durable one from disk; blocks while it reads).
    pub fn open(config: &StorageConfig) -> Result<Store, StorageError> {
        Store::open_with_clock(config, Arc::new(crate::hlc::SystemClock))
    }

    /// [`Store::open`] with the service's clock (tests inject a manual one end to end).
    pub fn open_with_clock(config: &StorageConfig, clock: Arc<dyn crate::hlc::Clock>) -> Result<Store, StorageError> {
        match config.kind {
            StorageKind::Memory => Ok(Store::memory()),
            StorageKind::Durable => {
                let mut options = durable::DurableOptions::new(&config.data_dir);
                options.fsync = config.fsync;
                options.segment_bytes = config.segment_bytes;
                options.clock = clock;
                Ok(Store::new(durable::DurableBackend::open(options)?))
            }
        }
    }

    pub fn backend(&self) -> &dyn Backend {
        &*self.0
    }
}

#[cfg(test)]
pub(crate) mod tests;
