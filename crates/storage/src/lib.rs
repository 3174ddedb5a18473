//! Where records live. The engine owns every state store rule; a backend only stores records
//! and swaps them atomically.
//!
//! The one write primitive is a conditional swap: replace a key's record (or its absence) only
//! if the stored version is still the one the engine read (and, for a sliding read or an
//! expiry, the stored deadline is as [`DeadlineCheck`] asks). [`Backend::swap_many`] does the same
//! for several keys at once, all or nothing (transactions). The Redis backend implements both
//! with a server-side script; the in-memory backend with a lock.

pub mod dump;
use stategate_hlc as hlc;
#[cfg(feature = "redis")]
use stategate_net::tls;
use stategate_telemetry::metrics;
use stategate_telemetry::secret;

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use crate::hlc::Hlc;

pub mod durable;
pub mod log;
pub mod memory;
mod observed;
#[cfg(feature = "redis")]
pub mod redis;

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
    /// A sliding time to live: each read pushes the deadline out to this many ms past the read
    /// (the engine decides how, see `Engine::read`). Only with a deadline.
    pub slide_ms: Option<u64>,
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
    /// What the stored deadline must also be (compared with the version, in the same step).
    pub deadline: DeadlineCheck,
}

/// What a swap asks of the stored deadline besides the version. A sliding read moves a
/// deadline without a new version (`engine/sliding.rs`), so the version alone cannot tell the
/// record a reader or the expiry driver saw from the one stored since: replicas sharing a
/// store take no lock in common, and a swap decided earlier may land later.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeadlineCheck {
    /// Nothing: the version decides (every write but the two below).
    #[default]
    Any,
    /// A sliding read's extension: the new record's deadline must be later than the stored
    /// one, so a deadline only moves forward (of two slides, the one with the later deadline
    /// stands whichever lands last). No deadline counts as later than any; a stored record
    /// without one is never slid.
    Later,
    /// An expiry's removal: the stored deadline must still be this one (the one found passed).
    /// A slide of the same version moved it otherwise, and the key lives on.
    Still(u64),
}

impl DeadlineCheck {
    /// Whether a record whose deadline is `stored` may be replaced by `new` (`None`: removed).
    pub fn holds(self, stored: Option<u64>, new: Option<&Record>) -> bool {
        match self {
            DeadlineCheck::Any => true,
            DeadlineCheck::Later => match (stored, new.and_then(|r| r.expires_at_ms)) {
                (None, _) => false,
                (Some(_), None) => true,
                (Some(old), Some(new)) => new > old,
            },
            DeadlineCheck::Still(seen) => stored == Some(seen),
        }
    }
}

/// The outcome of a swap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SwapOutcome {
    Done,
    /// A stored version differed from `expected` (or a deadline failed its [`DeadlineCheck`]):
    /// nothing was written; read again and retry.
    Conflict,
    /// The swap would create keys beyond `max_keys`: nothing was written.
    TooManyKeys,
}

/// What [`Backend::write`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Written {
    /// Applied; `logged` is the shared change log's sequence number of the last change
    /// appended, when the backend has a shared log ([`Backend::change_log`]).
    Done { logged: Option<u64> },
    /// A stored version differed from `expected`: nothing was written.
    Conflict,
    /// The swap would create keys beyond `max_keys`: nothing was written.
    TooManyKeys,
    /// The request was applied before (by this or another replica): nothing was written, and
    /// this is the outcome stored with it then.
    Repeated(Bytes),
    /// A key would be created with a version not above this one, the highest a removal was
    /// issued (by a replica whose clock is ahead): nothing was written. The writer's clock must
    /// observe it, and the write be decided again. Only backends shared by several clocks
    /// (those with a shared log) answer it.
    Behind(Hlc),
}

/// A conditional swap with what travels with it in the same atomic step: the changes for the
/// shared change log and the mark of the request it executes. A backend without a shared log
/// applies the swaps only (its engine publishes changes itself, and one process needs no
/// shared redelivery marks).
#[derive(Debug, Clone, Copy)]
pub struct Write<'a> {
    pub swaps: &'a [Swap],
    /// Keys that must still have these versions for anything to apply; nothing is written to
    /// them. With no swaps, the write only confirms that a decision taken from a cached record
    /// still holds. Only backends with a shared log take checks.
    pub checks: &'a [Check],
    pub max_keys: Option<u64>,
    /// Appended to the shared change log, in this order, if the swaps apply.
    pub changes: &'a [ChangeRecord],
    /// Stored if the swaps apply; when the request's mark exists already nothing is applied.
    pub request: Option<&'a RequestMark>,
}

/// A key's expected version, compared like a swap's and left as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub key: Bytes,
    /// `None`: the key must be absent.
    pub expected: Option<Hlc>,
}

/// The mark a write request leaves so that a redelivery of it, to any replica, is not executed
/// again: its id (unique per request, chosen by the door) and the engine's encoded outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestMark {
    pub id: Bytes,
    /// Empty: look for an earlier mark only, store none (a write that changes nothing).
    pub outcome: Bytes,
    /// How long the mark is kept.
    pub ttl_ms: u64,
}

/// One change as the shared change log carries it. A storage type: the engine converts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeRecord {
    pub key: Bytes,
    /// The key's new version; for a removal, the version issued for it.
    pub version: Hlc,
    pub kind: ChangeRecordKind,
}

impl ChangeRecord {
    /// Whether an import stored it, with the version it was exported with.
    pub fn imported(&self) -> bool {
        matches!(self.kind, ChangeRecordKind::Set { imported: true, .. })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChangeRecordKind {
    /// A new value; its deadline, if any (so every replica's expiry driver learns of it), and
    /// the fencing token the record keeps (so a replica's record cache holds the whole record).
    Set {
        value: Bytes,
        expires_at_ms: Option<u64>,
        fencing: Option<Hlc>,
        /// Stored by an import with the version it was exported with (not one the clock just
        /// issued): a history that may know that version already starts over instead of naming
        /// a second position with it (`engine/feed.rs`).
        imported: bool,
    },
    Delete,
    Expire,
}

/// Round trips to a storage server, by who waited for them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RoundTrips {
    /// Calls a request (or the expiry driver) waited for: reads, writes, scans.
    pub calls: u64,
    /// Calls of the replica's own background work: reading the shared log, membership.
    pub background: u64,
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
    /// The backend cannot be reached (a lost connection). A read changed nothing; a write
    /// whose answer was lost (sent before the connection failed) may have been applied.
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// No space left for a write; the write changed nothing and reads still work.
    #[error("storage full: {0}")]
    Full(String),
    /// Encryption at rest: a key file that cannot be used, a store written in the other mode
    /// (encrypted, opened without a key, or the reverse) or under another key.
    #[error("{0}")]
    Encryption(String),
}

/// Whether a backend takes writes right now ([`Backend::health`]). Readiness probes and metrics
/// report it; the doors learn of it from the errors of the calls themselves.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum StorageHealth {
    /// Reads and writes work.
    #[default]
    Ok,
    /// The disk is full (or over quota): reads work, writes are refused with
    /// [`StorageError::Full`]. The backend retries by itself and returns to `Ok` once a write
    /// fits again.
    Full { cause: String },
    /// A fault the backend cannot recover from (an I/O error while logging): every call fails
    /// until a restart recovers from disk.
    Failed { cause: String },
}

/// Which file of an online backup some bytes belong to (see [`OnlineBackup`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackupFile {
    /// `snap-<seq>.snap`: sent first, whole (none before the store's first compaction).
    Snapshot { seq: u64 },
    /// `log-<seq>.log`: the log segments after the snapshot, one after another.
    Log { seq: u64 },
}

/// Where an online backup goes, a file at a time: every byte of the snapshot, then of each
/// log segment in order. A sink that waits for a reader must bound the wait (the HTTP door's
/// `--backup-send-timeout`): the backup holds its files open until it ends.
pub trait BackupSink {
    fn write(&mut self, file: BackupFile, bytes: &[u8]) -> std::io::Result<()>;
}

/// What an online backup holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackupInfo {
    /// The first file's sequence number (the snapshot's, or the first segment's).
    pub seq: u64,
    /// Keys stored at the copy's point of the log.
    pub keys: u64,
    /// Log records replayed over the snapshot at restore.
    pub log_records: u64,
    pub snapshot_bytes: u64,
    pub log_bytes: u64,
}

/// A consistent copy of a store as of one moment, taken while it serves (durable backend:
/// `durable/backup.rs`). Blocks the calling thread while it copies, at the sink's pace; holds
/// nothing up meanwhile (compaction goes on).
pub trait OnlineBackup {
    /// Sends the copy to `sink`: a data directory (a snapshot and the log segments after it)
    /// that recovery turns into the store's state at one point of its log.
    fn backup(&self, sink: &mut dyn BackupSink) -> Result<BackupInfo, StorageError>;
}

/// The contract every backend implements. All methods are atomic per call. A method added
/// here, with a default or not, must be forwarded by `observed.rs` (the metrics wrapper).
#[async_trait]
#[allow(clippy::len_without_is_empty)] // `len` is the key count for quotas, not a collection API
pub trait Backend: Send + Sync + 'static {
    /// The stored record, expired or not (the engine decides what expiry means).
    async fn get(&self, key: &[u8]) -> Result<Option<Record>, StorageError>;

    /// [`Backend::get`] for a write that does not look at the stored value: a backend may leave
    /// `value` empty (the memory index then copies nothing). Everything else is as `get`.
    async fn get_head(&self, key: &[u8]) -> Result<Option<Record>, StorageError> {
        self.get(key).await
    }

    /// The stored records of `keys` (expired or not), in order, all as of one moment: no swap
    /// is applied between the first read and the last (the point-in-time read of MGET).
    /// `None` when their values together exceed `max_value_bytes`: then no value is copied.
    async fn get_many(
        &self,
        keys: &[Bytes],
        max_value_bytes: usize,
    ) -> Result<Option<Vec<Option<Record>>>, StorageError>;

    /// Applies every swap or none. `max_keys` bounds the number of keys after the swap.
    async fn swap_many(&self, swaps: &[Swap], max_keys: Option<u64>) -> Result<SwapOutcome, StorageError>;

    /// [`Backend::swap_many`] with the changes for the shared change log and the request's
    /// mark, all in one atomic step. Without a shared log: the swaps only (and no checks).
    async fn write(&self, w: &Write<'_>) -> Result<Written, StorageError> {
        if !w.checks.is_empty() {
            return Err(StorageError::Backend("this backend takes no version checks".into()));
        }
        Ok(match self.swap_many(w.swaps, w.max_keys).await? {
            SwapOutcome::Done => Written::Done { logged: None },
            SwapOutcome::Conflict => Written::Conflict,
            SwapOutcome::TooManyKeys => Written::TooManyKeys,
        })
    }

    /// The stored record, and the stored outcome of `request` if a request with that id was
    /// applied before (in one round trip where the backend shares marks).
    async fn get_marked(
        &self,
        key: &[u8],
        request: Option<&[u8]>,
    ) -> Result<(Option<Record>, Option<Bytes>), StorageError> {
        let _ = request;
        Ok((self.get(key).await?, None))
    }

    /// The change log shared by every replica on this storage, if it has one. Then every change
    /// and every KEYNOTIFY registration goes through it, and each replica reads it back.
    fn change_log(&self) -> Option<Arc<dyn log::ChangeLog>> {
        None
    }

    /// Round trips to a storage server so far (a pipeline counts once), for measurements;
    /// `None` for a backend in this process.
    fn round_trips(&self) -> Option<RoundTrips> {
        None
    }

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

    /// Bytes of the stored values, where the backend keeps count (for metrics).
    async fn value_bytes(&self) -> Result<Option<u64>, StorageError> {
        Ok(None)
    }

    /// Whether what this backend acknowledges outlives the process: `false` for memory, `true`
    /// for the durable backend and Redis. The engine refuses a SET that asks for persistence
    /// (MQTT's `aio-persistence: true`) where it is `false`. No default: every backend says.
    fn persistent(&self) -> bool;

    /// The time every process sharing this backend agrees on, when it has one (Redis: the
    /// server's clock, see `redis/clock.rs`). Replicas on it take their versions, deadlines
    /// and expiry from it, so that a deadline means the same instant to all of them whatever
    /// their own clocks say. `None`: one process, its own clock.
    fn clock(&self) -> Option<Arc<dyn crate::hlc::Clock>> {
        None
    }

    /// Whether writes work right now; cheap (no I/O). Backends that cannot tell say `Ok`.
    fn health(&self) -> StorageHealth {
        StorageHealth::Ok
    }

    /// Changes of [`Backend::health`] as they happen, for those who wait for one (`None`: the
    /// backend's health never changes).
    fn health_changes(&self) -> Option<tokio::sync::watch::Receiver<StorageHealth>> {
        None
    }

    /// The backend's online backup, if it has one (durable only: Redis has its own, and memory
    /// has nothing to keep; `stategate export` works with every backend).
    fn online_backup(&self) -> Option<&dyn OnlineBackup> {
        None
    }
}

/// Which backend stores the records (`--storage`). Every backend is listed whatever cargo
/// features are on, so a `--storage` value can name a backend this build lacks and be told so.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum StorageKind {
    /// Volatile: everything is lost when the process stops (tests, caches).
    Memory,
    /// On disk under `--data-dir`, surviving restarts and crashes (see [`durable`]).
    #[default]
    Durable,
    /// A Redis or Valkey server shared by every replica (`redis://`, `rediss://`), or the
    /// primary Sentinel names (`redis+sentinel://`, `rediss+sentinel://`).
    Redis(RedisUrl),
}

/// A `redis://`, `rediss://`, `redis+sentinel://` or `rediss+sentinel://` URL. Its password is
/// never displayed: `Display` and `Debug` show `***` in its place, so configurations and
/// errors can be logged.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl(String);

impl RedisUrl {
    /// The URL as given, password included (only for connecting).
    pub fn expose(&self) -> &str {
        &self.0
    }

    fn scheme(&self) -> String {
        self.0
            .split_once("://")
            .map(|(s, _)| s)
            .unwrap_or("")
            .to_ascii_lowercase()
    }

    /// Whether the connection uses TLS.
    pub fn is_tls(&self) -> bool {
        matches!(self.scheme().as_str(), "rediss" | "rediss+sentinel")
    }

    /// Whether the URL names Sentinel nodes and a service rather than the server itself.
    pub fn is_sentinel(&self) -> bool {
        matches!(self.scheme().as_str(), "redis+sentinel" | "rediss+sentinel")
    }
}

impl std::fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&crate::secret::mask_url_password(&self.0))
    }
}

impl std::fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RedisUrl({self})")
    }
}

/// A `--storage` value that names no backend of this build.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseStorageKindError {
    #[error("unknown storage {0:?}: expected durable, memory or redis://host:port")]
    Unknown(String),
    #[error(
        "--storage {0}: this stategate was built without the cargo feature `redis` (build with `--features redis`)"
    )]
    RedisNotBuilt(RedisUrl),
}

impl std::str::FromStr for StorageKind {
    type Err = ParseStorageKindError;
    fn from_str(s: &str) -> Result<StorageKind, ParseStorageKindError> {
        let lower = s.to_ascii_lowercase();
        if ["redis://", "rediss://", "redis+sentinel://", "rediss+sentinel://"]
            .iter()
            .any(|scheme| lower.starts_with(scheme))
        {
            let url = RedisUrl(s.to_owned());
            return if cfg!(feature = "redis") {
                Ok(StorageKind::Redis(url))
            } else {
                Err(ParseStorageKindError::RedisNotBuilt(url))
            };
        }
        match lower.as_str() {
            "memory" => Ok(StorageKind::Memory),
            "durable" => Ok(StorageKind::Durable),
            _ => Err(ParseStorageKindError::Unknown(s.to_owned())),
        }
    }
}

/// How the Redis backend connects and behaves (`--redis-*`). Plain data, so the configuration
/// builds without the `redis` feature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisOptions {
    /// Prefix of every Redis key the store uses (several stores can share one database).
    pub prefix: String,
    /// Bound on every call: connecting, waiting for a reconnection, an answer. Past it the
    /// call fails with [`StorageError::Unavailable`].
    pub timeout: std::time::Duration,
    /// After each write, wait (Redis `WAIT`) until this many replicas have it; 0 = do not wait.
    pub wait_replicas: u32,
    /// How long opening the store waits for Redis to answer before giving up.
    pub startup_wait: std::time::Duration,
    /// About how many entries the shared change log keeps (Redis trims it approximately).
    pub change_log_len: u64,
    /// A replica sending KEYNOTIFY notifications that has not renewed its membership for this
    /// long is dropped, and another takes its observers over.
    pub member_timeout: std::time::Duration,
}

impl Default for RedisOptions {
    fn default() -> RedisOptions {
        RedisOptions {
            prefix: "stategate:".into(),
            timeout: std::time::Duration::from_millis(1000),
            wait_replicas: 0,
            startup_wait: std::time::Duration::from_secs(60),
            change_log_len: 100_000,
            member_timeout: std::time::Duration::from_secs(5),
        }
    }
}

/// Where and how records are stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageConfig {
    pub kind: StorageKind,
    pub data_dir: std::path::PathBuf,
    pub fsync: durable::FsyncMode,
    /// The durable store's encryption key file (`--encryption-key-file`), read at open.
    pub encryption_key_file: Option<std::path::PathBuf>,
    /// See [`durable::DurableOptions::segment_bytes`].
    pub segment_bytes: u64,
    pub redis: RedisOptions,
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

    /// Opens the configured backend: recovers a durable one from disk (on a blocking thread),
    /// or connects to Redis and waits until it answers (bounded by
    /// [`RedisOptions::startup_wait`]), so the doors open only once the storage works.
    pub async fn open(config: &StorageConfig) -> Result<Store, StorageError> {
        Store::open_with_clock(config, Arc::new(crate::hlc::SystemClock)).await
    }

    /// [`Store::open`] with the service's clock (tests inject a manual one end to end).
    pub async fn open_with_clock(
        config: &StorageConfig,
        clock: Arc<dyn crate::hlc::Clock>,
    ) -> Result<Store, StorageError> {
        Store::open_observed(config, clock, &crate::metrics::Metrics::disabled()).await
    }

    /// [`Store::open_with_clock`], recording write latency (any backend) and group commits,
    /// fsyncs and snapshots (durable) in `metrics`.
    pub async fn open_observed(
        config: &StorageConfig,
        clock: Arc<dyn crate::hlc::Clock>,
        metrics: &crate::metrics::Metrics,
    ) -> Result<Store, StorageError> {
        let store = Store::open_backend(config, clock, metrics).await?;
        Ok(match metrics.is_enabled() {
            true => Store::new(observed::Observed::new(store, metrics.clone())),
            false => store,
        })
    }

    async fn open_backend(
        config: &StorageConfig,
        clock: Arc<dyn crate::hlc::Clock>,
        metrics: &crate::metrics::Metrics,
    ) -> Result<Store, StorageError> {
        match &config.kind {
            StorageKind::Memory => Ok(Store::memory()),
            StorageKind::Durable => {
                let mut options = durable::DurableOptions::new(&config.data_dir);
                options.fsync = config.fsync;
                options.segment_bytes = config.segment_bytes;
                options.clock = clock;
                options.encryption = match &config.encryption_key_file {
                    Some(path) => Some(durable::EncryptionKey::from_file(path)?),
                    None => None,
                };
                options.metrics = metrics.clone();
                let backend = tokio::task::spawn_blocking(move || durable::DurableBackend::open(options))
                    .await
                    .map_err(|e| StorageError::Backend(format!("the opening thread failed: {e}")))??;
                Ok(Store::new(backend))
            }
            #[cfg(feature = "redis")]
            StorageKind::Redis(url) => Ok(Store::new(redis::RedisBackend::open(url, &config.redis).await?)),
            #[cfg(not(feature = "redis"))]
            StorageKind::Redis(url) => Err(StorageError::Backend(
                ParseStorageKindError::RedisNotBuilt(url.clone()).to_string(),
            )),
        }
    }

    pub fn backend(&self) -> &dyn Backend {
        &*self.0
    }
}

#[cfg(test)]
pub(crate) mod tests;
