//! The state store engine: every rule of the state store lives here, once.
//!
//! [`Engine::execute`] takes a [`Command`] and returns a [`Response`] (data, never wire bytes).
//! Writes to one key are serialised by a striped lock, so versions and change notifications of a
//! key come out in the order the changes were applied; storage is reached only through the
//! conditional swap of [`crate::storage::Backend`].

pub mod health;
use stategate_hlc as hlc;
use stategate_storage as storage;
use stategate_telemetry::metrics;

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use tokio::sync::{Mutex as AsyncMutex, MutexGuard, Notify};

use crate::hlc::{Clock, Hlc, HlcClock};
use crate::storage::{DeadlineCheck, Record, RequestMark, Store, Swap, Write, Written};

mod cache;
pub mod command;
mod error;
mod expiry;
pub mod feed;
pub mod notify;
mod observing;
mod owners;
pub mod proclamation;
mod reads;
mod shared;
mod sliding;
mod transact;
mod transfer;
pub mod watch;
mod writes;

pub use command::{Command, Del, DelCondition, Get, KeyFilter, KeyNotify, MGet, Meta, Scan, Set, SetCondition, VDel};
pub use error::EngineError;
pub use feed::{FeedEvent, FeedLimits, FeedReader, Lagged};
pub use notify::{Change, ChangeKind, KeyNotification, KeyNotifyReceiver, ObserverLimits};
pub use transfer::{ImportOptions, ImportReport};

use feed::Feed;
use notify::{KeyNotifySender, Observers};

/// How far ahead of the service clock a request timestamp or fencing token may be.
pub const MAX_CLOCK_SKEW_MS: u64 = 60_000;
/// The longest time to live a key may be given (100 years), on every door.
pub const MAX_TTL_MS: u64 = 100 * 365 * 24 * 3600 * 1000;

/// What a command returns, independent of any wire format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Applied (SET), registered or stopped (KEYNOTIFY).
    Ok,
    /// A condition was not met (NX, NEX, VDEL value mismatch): nothing changed.
    NotApplied,
    /// GET of a missing key.
    Nil,
    /// GET hit.
    Value(Bytes),
    /// DEL/VDEL: 1 deleted, 0 absent; KEYNOTIFY STOP of an unobserved key: 0.
    Int(i64),
    /// SCAN page; `token` is set when more pages follow.
    Keys { keys: Vec<Bytes>, token: Option<Bytes> },
    /// MGET: each key's entry in the order asked (`None`: absent), all as of one moment.
    Values(Vec<Option<Entry>>),
}

/// The id of a request that a transport may deliver more than once (an MQTT QoS 1
/// redelivery, possibly to another replica): a write carrying it is executed at most once
/// while its mark is kept, and a repeat gets the first outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId {
    pub id: Bytes,
    /// How long the mark is kept.
    pub ttl: std::time::Duration,
}

/// A reply plus the version that goes with it (`__ts`, ETag), if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub reply: Reply,
    pub version: Option<Hlc>,
}

impl Response {
    fn new(reply: Reply, version: Option<Hlc>) -> Response {
        Response { reply, version }
    }
}

/// A live key as the Dapr-style doors read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub value: Bytes,
    pub version: Hlc,
    /// Absolute expiry deadline, wall-clock milliseconds since the epoch.
    pub expires_at_ms: Option<u64>,
    /// The fencing token protecting the key, if any.
    pub fencing: Option<Hlc>,
}

/// One operation of an atomic transaction.
#[derive(Debug, Clone)]
pub enum TxOp {
    Set(Set),
    Del(Del),
}

impl TxOp {
    fn key(&self) -> &Bytes {
        match self {
            TxOp::Set(s) => &s.key,
            TxOp::Del(d) => &d.key,
        }
    }
}

/// Limits the engine enforces.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Most keys stored (`None`: unlimited).
    pub max_keys: Option<u64>,
    /// Largest key, in bytes.
    pub max_key_bytes: usize,
    /// Largest value, in bytes.
    pub max_value_bytes: usize,
    /// Keys examined per SCAN page.
    pub scan_page: usize,
    /// Most keys one MGET reads. (Its answer is bounded like a GET's: `max_value_bytes` plus
    /// 1 KiB, versions and framing included.)
    pub mget_keys: usize,
    pub observers: ObserverLimits,
    /// The change history watchers read (and resume from).
    pub feed: FeedLimits,
    /// Bytes of recently seen records kept on shared storage, so that a write can skip its
    /// read (see [`cache`]); 0: none.
    pub record_cache_bytes: usize,
    /// How far past its time to live a read pushes a sliding deadline, in percent of it: a
    /// read stores a new deadline only once the stored one is nearer than the time to live,
    /// so a key read without pause is written once per this share of its time to live
    /// (0: on every read, exact). See [`sliding`].
    pub sliding_slack_percent: u32,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_keys: None,
            max_key_bytes: 64 * 1024,
            max_value_bytes: 4 * 1024 * 1024,
            scan_page: 1000,
            mget_keys: 1000,
            observers: ObserverLimits::default(),
            feed: FeedLimits::default(),
            record_cache_bytes: 64 * 1024 * 1024,
            sliding_slack_percent: 10,
        }
    }
}

const STRIPES: usize = 1024;
/// Conflicts are only possible when another process shares the storage; give up eventually.
const MAX_SWAP_ATTEMPTS: usize = 64;

/// A cheap, cloneable handle on the engine.
#[derive(Clone)]
pub struct Engine(Arc<Inner>);

struct Inner {
    store: Store,
    hlc: HlcClock,
    limits: Limits,
    feed: Arc<Feed>,
    observers: Mutex<Observers>,
    /// Keys with at least one KEYNOTIFY observer (read without the lock on every write).
    observed_keys: AtomicUsize,
    /// Where KEYNOTIFY notifications go (the MQTT door takes the receiving end).
    keynotify: OnceLock<KeyNotifySender>,
    stripes: Vec<AsyncMutex<()>>,
    hasher: std::collections::hash_map::RandomState,
    /// Woken when a write sets a deadline, so the expiry driver can look again.
    deadline_added: Notify,
    /// Keys removed because their deadline passed (for metrics).
    expired: AtomicU64,
    /// The change log shared with other replicas, when the storage has one.
    shared: Option<shared::SharedLog>,
    /// Records recently seen, on shared storage (writes start from them).
    cache: Option<cache::RecordCache>,
}

/// A handle that does not keep the engine alive (for callbacks that may outlive the service,
/// such as hooks the embedded broker keeps after its shutdown).
#[derive(Clone)]
pub struct WeakEngine(std::sync::Weak<Inner>);

impl WeakEngine {
    /// The engine, if it still runs.
    pub fn upgrade(&self) -> Option<Engine> {
        self.0.upgrade().map(Engine)
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("node", self.0.hlc.node()).finish()
    }
}

impl Engine {
    /// Opens the engine on `store`. The clock is raised past the highest stored version, so
    /// versions never go backwards across a restart.
    pub async fn open(
        store: Store,
        node_id: &str,
        clock: Arc<dyn Clock>,
        limits: Limits,
    ) -> Result<Engine, EngineError> {
        let hlc = HlcClock::new(node_id, clock);
        if let Some(max) = store.backend().max_version().await? {
            hlc.observe(&max);
        }
        // A version of its own names the feed's start (see `Feed::position_after`).
        let feed = Arc::new(Feed::new(limits.feed.clone(), hlc.now()));
        let (shared, cursor, observers) = match store.backend().change_log() {
            Some(log) => {
                let (shared, cursor, observers) = shared::SharedLog::open(log).await?;
                (Some(shared), Some(cursor), observers)
            }
            None => (None, None, Observers::default()),
        };
        let observed = observers.key_count();
        let cache = (shared.is_some() && limits.record_cache_bytes > 0)
            .then(|| cache::RecordCache::new(limits.record_cache_bytes));
        let engine = Engine(Arc::new(Inner {
            store,
            hlc,
            limits,
            feed,
            observers: Mutex::new(observers),
            observed_keys: AtomicUsize::new(observed),
            keynotify: OnceLock::new(),
            stripes: (0..STRIPES).map(|_| AsyncMutex::new(())).collect(),
            hasher: Default::default(),
            deadline_added: Notify::new(),
            expired: AtomicU64::new(0),
            shared,
            cache,
        }));
        if let (Some(shared), Some(cursor)) = (engine.shared(), cursor) {
            shared.follow(&engine, cursor);
        }
        Ok(engine)
    }

    pub fn limits(&self) -> &Limits {
        &self.0.limits
    }

    /// A handle that does not keep the engine alive.
    pub fn downgrade(&self) -> WeakEngine {
        WeakEngine(Arc::downgrade(&self.0))
    }

    /// The service clock's wall time, ms since the epoch (what deadlines are compared with).
    pub fn now_ms(&self) -> u64 {
        self.0.hlc.wall_ms()
    }

    /// Makes the expiry driver look at the deadlines now (after the clock moved, in tests; when
    /// another replica may have added an earlier deadline).
    pub fn wake_expiry(&self) {
        self.0.deadline_added.notify_one();
    }

    /// A reader of every change applied from now on.
    pub fn subscribe(&self) -> FeedReader {
        self.0.feed.reader()
    }

    /// A reader of every change after the one with `version`, if the history still holds it.
    pub fn subscribe_after(&self, version: &Hlc) -> Option<FeedReader> {
        self.0.feed.reader_after(version)
    }

    /// Changes and bytes the history holds now.
    pub fn feed_held(&self) -> (usize, usize) {
        self.0.feed.held()
    }

    /// Round trips to the storage server so far, when it is remote (for measurements).
    pub fn storage_round_trips(&self) -> Option<crate::storage::RoundTrips> {
        self.0.store.backend().round_trips()
    }

    /// Executes one command.
    pub async fn execute(&self, cmd: Command) -> Result<Response, EngineError> {
        self.execute_request(cmd, None).await
    }

    /// Executes one command that `request` identifies: a write repeated with the same id (a
    /// redelivery, to this replica or another on shared storage) is not executed again, and
    /// gets the first outcome while the mark is kept.
    pub async fn execute_request(&self, cmd: Command, request: Option<&RequestId>) -> Result<Response, EngineError> {
        match cmd {
            Command::Set(c) => self.set(c, request).await,
            Command::Get(c) => self.get(c).await,
            Command::Del(c) => self.delete(c.key, c.fencing, c.condition, None, request).await,
            Command::VDel(c) => {
                self.delete(c.key, c.fencing, DelCondition::Always, Some(c.value), request)
                    .await
            }
            Command::KeyNotify(c) => self.keynotify(c).await,
            Command::Scan(c) => self.scan(c).await,
            Command::MGet(c) => self.mget(c).await,
        }
    }

    /// Applies `swaps` with their `changes` (and the request's mark) in one storage write; once
    /// applied, the changes are published: here, or through the shared log (and read back).
    /// Each change comes with the record it stores (`None`: a removal).
    async fn commit(
        &self,
        swaps: &[Swap],
        max_keys: Option<u64>,
        changes: Vec<(Change, Option<Record>)>,
        mark: Option<RequestMark>,
    ) -> Result<Written, EngineError> {
        self.commit_as(swaps, max_keys, changes, mark, false).await
    }

    /// [`Engine::commit`]; `imported`: the changes keep versions the clock did not issue now
    /// (an import), so the history takes them only if no position has those names yet
    /// ([`feed::Feed::push_imported`]), here or on every replica that reads the shared log.
    async fn commit_as(
        &self,
        swaps: &[Swap],
        max_keys: Option<u64>,
        changes: Vec<(Change, Option<Record>)>,
        mark: Option<RequestMark>,
        imported: bool,
    ) -> Result<Written, EngineError> {
        let records: Vec<_> = match self.shared() {
            Some(_) => changes
                .iter()
                .map(|(c, r)| shared::record_of(c, r.as_ref(), imported))
                .collect(),
            None => Vec::new(),
        };
        let write = Write {
            swaps,
            checks: &[],
            max_keys,
            changes: &records,
            request: mark.as_ref(),
        };
        let written = self.0.store.backend().write(&write).await?;
        // Another replica's clock is ahead and removed a key with a later version than this
        // write's: the clock takes it in, so that the caller's retry issues a later one.
        if let Written::Behind(floor) = &written {
            self.0.hlc.observe(floor);
        }
        if let Written::Done { logged } = &written {
            if changes
                .iter()
                .any(|(_, r)| r.as_ref().is_some_and(|r| r.expires_at_ms.is_some()))
            {
                self.0.deadline_added.notify_one();
            }
            if let Some(cache) = &self.0.cache {
                for (c, r) in &changes {
                    cache.changed(&c.key, &c.version, r.as_ref());
                }
            }
            match self.shared() {
                Some(shared) => shared.wait_applied(*logged).await,
                None if imported => {
                    let changes: Vec<Change> = changes.into_iter().map(|(c, _)| c).collect();
                    for change in &changes {
                        self.notify_observers(change);
                    }
                    self.0.feed.push_imported(changes);
                }
                None => {
                    for (change, _) in changes {
                        self.publish(change);
                    }
                }
            }
        }
        Ok(written)
    }

    /// The mark a write request leaves, with the outcome it will have if applied.
    fn mark(&self, request: Option<&RequestId>, outcome: &Response) -> Option<RequestMark> {
        let request = request.filter(|_| self.shared().is_some())?;
        Some(RequestMark {
            id: request.id.clone(),
            outcome: shared::encode_outcome(outcome)?,
            ttl_ms: request.ttl.as_millis().try_into().unwrap_or(u64::MAX),
        })
    }

    fn stripe(&self, key: &[u8]) -> usize {
        (self.0.hasher.hash_one(key) as usize) % STRIPES
    }

    async fn lock(&self, key: &[u8]) -> MutexGuard<'_, ()> {
        self.0.stripes[self.stripe(key)].lock().await
    }

    fn check_skew(&self, ts: Option<&Hlc>, err: fn() -> EngineError) -> Result<(), EngineError> {
        match ts {
            Some(ts) if ts.ms > self.0.hlc.wall_ms().saturating_add(MAX_CLOCK_SKEW_MS) => Err(err()),
            _ => Ok(()),
        }
    }

    /// The fencing rule: a key protected by a token needs an equal or higher one.
    fn check_fencing(stored: Option<&Hlc>, given: Option<&Hlc>) -> Result<(), EngineError> {
        match (stored, given) {
            (None, _) => Ok(()),
            (Some(_), None) => Err(EngineError::FencingTokenRequired),
            (Some(s), Some(g)) if g < s => Err(EngineError::FencingTokenLower),
            (Some(_), Some(_)) => Ok(()),
        }
    }

    /// Whether a record read now is past its deadline (the clock is read only for records
    /// that have one).
    fn is_expired(&self, r: &Record) -> bool {
        r.expires_at_ms.is_some() && r.is_expired(self.0.hlc.wall_ms())
    }

    /// Reads a key under its stripe lock; an expired record is removed (observers are told) and
    /// reads as absent.
    async fn load_live(&self, key: &Bytes) -> Result<Option<Record>, EngineError> {
        match self.load_live_marked(key, None, true).await? {
            Loaded::Record(r) => Ok(r),
            Loaded::Repeated(_) => Err(contended()),
        }
    }

    /// [`Engine::load_live`] for a request that may be a repeat: its first outcome instead,
    /// when it was applied before. Without `value` the record's value may be left empty (a
    /// write that does not compare it; the memory index then copies nothing).
    async fn load_live_marked(
        &self,
        key: &Bytes,
        request: Option<&RequestId>,
        value: bool,
    ) -> Result<Loaded, EngineError> {
        let request = request.filter(|_| self.shared().is_some()).map(|r| &r.id[..]);
        let backend = self.0.store.backend();
        let (rec, mark) = match request {
            // The record cache keeps whole records, so with one every read takes the value.
            None if !value && self.0.cache.is_none() => (backend.get_head(key).await?, None),
            request => backend.get_marked(key, request).await?,
        };
        if let Some(outcome) = mark {
            return Ok(Loaded::Repeated(shared::decode_outcome(&outcome)?));
        }
        if let Some(cache) = &self.0.cache {
            cache.read(key, rec.as_ref());
        }
        let mut rec = rec;
        for _ in 0..MAX_SWAP_ATTEMPTS {
            match rec {
                Some(r) if self.is_expired(&r) => match self.remove(key, &r, ChangeKind::Expire, None).await? {
                    // Changed since the read, or slid by a reader on another replica (its
                    // deadline moved): what is stored now decides.
                    Removed::Lost => {
                        rec = backend.get(key).await?;
                        if let Some(cache) = &self.0.cache {
                            cache.read(key, rec.as_ref());
                        }
                    }
                    Removed::Done(_) | Removed::Repeated(_) => return Ok(Loaded::Record(None)),
                },
                other => return Ok(Loaded::Record(other)),
            }
        }
        Err(contended())
    }

    /// Deletes `key` whose current record is `cur` and publishes the change. Caller holds the lock.
    /// `Err(response)`: the request was applied before, with that outcome.
    async fn remove(
        &self,
        key: &Bytes,
        cur: &Record,
        kind: ChangeKind,
        request: Option<&RequestId>,
    ) -> Result<Removed, EngineError> {
        let version = self.0.hlc.next_after(&[&cur.version]);
        let deadline = match (&kind, cur.expires_at_ms) {
            // An expiry removes the deadline it found passed, not one a read moved since (a
            // slide keeps the version; another replica may have slid it).
            (ChangeKind::Expire, Some(d)) => DeadlineCheck::Still(d),
            _ => DeadlineCheck::Any,
        };
        let swap = Swap {
            key: key.clone(),
            expected: Some(cur.version.clone()),
            new: None,
            deadline,
        };
        let mark = self.mark(request, &Response::new(Reply::Int(1), Some(version.clone())));
        let change = Change {
            key: key.clone(),
            version: version.clone(),
            kind,
        };
        match self
            .commit(std::slice::from_ref(&swap), None, vec![(change, None)], mark)
            .await?
        {
            Written::Done { .. } => Ok(Removed::Done(version)),
            // Someone else (another node) changed it first: their change stands.
            Written::Conflict | Written::Behind(_) | Written::TooManyKeys => Ok(Removed::Lost),
            Written::Repeated(outcome) => Ok(Removed::Repeated(shared::decode_outcome(&outcome)?)),
        }
    }

    /// Tells the watchers (broadcast feed) and the KEYNOTIFY observers of a change. Called under
    /// the key's stripe lock, so each key's changes go out in order. Costs nothing when nobody
    /// listens.
    fn publish(&self, change: Change) {
        if matches!(change.kind, ChangeKind::Expire) {
            self.0.expired.fetch_add(1, Ordering::Relaxed);
        }
        self.notify_observers(&change);
        self.0.feed.push(change);
    }
}

use cache::{Confirmed, Start};

/// A key's live record, or the first outcome of a request applied before.
enum Loaded {
    Record(Option<Record>),
    Repeated(Response),
}

/// What a conditional removal did.
enum Removed {
    Done(Hlc),
    /// Another writer changed the key first.
    Lost,
    /// The request was applied before: its first outcome.
    Repeated(Response),
}

fn contended() -> EngineError {
    EngineError::Storage(crate::storage::StorageError::Backend(
        "the key kept changing under a conditional swap".into(),
    ))
}

#[cfg(test)]
mod tests;
