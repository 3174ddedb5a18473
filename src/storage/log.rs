//! The change log that replicas on shared storage (Redis) share: every change, in the order the
//! swaps were applied, and every KEYNOTIFY registration change, in the same order. Each replica
//! reads it back to fill its own watch history and its copy of the registrations, so all
//! replicas see one sequence. Storage types only: the engine converts.

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use super::{ChangeRecord, StorageError};

/// One entry of the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    /// Position: consecutive numbers, one per entry.
    pub seq: u64,
    /// The [`ChangeLog::origin`] of the replica that appended it.
    pub origin: u64,
    pub body: LogBody,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogBody {
    Change(ChangeRecord),
    Observe(ObserverOp),
}

/// A change of the KEYNOTIFY registrations, as applied (already checked against the bounds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObserverOp {
    /// `client` (in broker session `session`, when known) observes `key`. A registration from
    /// another session of the same client first drops what the old session registered.
    Register {
        client: String,
        session: Option<u64>,
        key: Bytes,
    },
    Unregister {
        client: String,
        key: Bytes,
    },
    /// Every registration of `client` (only those of `session`, when given).
    DropClient {
        client: String,
        session: Option<u64>,
    },
}

/// The registrations of one client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    pub client: String,
    pub session: Option<u64>,
    pub keys: Vec<Bytes>,
}

/// Where a reader is: opaque to the engine, which only hands it back.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LogCursor {
    /// The backend's own id of the last entry read (empty: none yet).
    pub(crate) id: Bytes,
    /// Its sequence number (0: none yet).
    pub(crate) seq: u64,
    /// Its unique tag, to tell it from a different entry given the same number after the
    /// storage lost its tail (a restart without persistence).
    pub(crate) tag: Bytes,
}

impl LogCursor {
    pub fn seq(&self) -> u64 {
        self.seq
    }
}

/// A consistent starting point: the newest entry, and the registrations as of it.
#[derive(Debug, Clone)]
pub struct LogStart {
    pub cursor: LogCursor,
    pub registrations: Vec<Registration>,
}

/// What a read found.
#[derive(Debug, Clone)]
pub enum LogRead {
    /// Entries right after the cursor, in order (possibly none), and the cursor after them.
    Entries(Vec<LogEntry>, LogCursor),
    /// Entries after the cursor are gone (trimmed, or lost by the storage): start again.
    Gap,
}

/// The bounds of the registrations, checked where the registration is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObserverBounds {
    pub per_client: usize,
    pub total: usize,
}

/// What [`ChangeLog::observe`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObserveOutcome {
    Applied,
    /// Nothing to do (registered already, or nothing to remove).
    Unchanged,
    ClientFull,
    RegistryFull,
}

#[async_trait]
pub trait ChangeLog: Send + Sync + 'static {
    /// This process's id in the entries it appends (random per process).
    fn origin(&self) -> u64;

    /// How long a writer waits to read back its own change before answering anyway.
    fn patience(&self) -> Duration;

    /// The newest entry and the registrations as of it, read atomically.
    async fn start(&self) -> Result<LogStart, StorageError>;

    /// Up to `max` entries after `after`, waiting a while (about a second) for one.
    async fn read(&self, after: &LogCursor, max: usize) -> Result<LogRead, StorageError>;

    /// Applies a registration change to the shared registrations within `bounds`, and logs
    /// it. Also returns the sequence number of the last entry it logged, if any (a refused
    /// registration from a new session still logs the drop of the old session's).
    async fn observe(
        &self,
        op: &ObserverOp,
        bounds: ObserverBounds,
    ) -> Result<(ObserveOutcome, Option<u64>), StorageError>;

    /// Records when clients were last seen (ms since the epoch; 0: only asking) and returns,
    /// for each, about the latest time any replica recorded (0: none), so that the KEYNOTIFY
    /// idle timeout counts requests to every replica.
    async fn seen(&self, clients: &[(String, u64)]) -> Result<Vec<u64>, StorageError>;
}
